package sim

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
)

// job is a validated generation request: everything the generator needs,
// nothing of the prompt itself.
type job struct {
	chat         bool
	promptTokens int
	hash         uint32 // fnv32a of the prompt text; picks length and words
	limit        int    // completion cap in force
	minTokens    int
	ignoreEOS    bool

	stream          bool
	includeUsage    bool // final usage chunk
	continuousUsage bool // usage on every chunk
}

func (j *job) completionTokens() int {
	return completionTokens(j.hash, j.limit, j.minTokens, j.ignoreEOS)
}

// commonRequest holds the fields chat and completions requests share. Fields
// vLLM accepts but the simulator ignores (temperature, stop, …) are dropped by
// the decoder.
type commonRequest struct {
	Model         string         `json:"model"`
	MaxTokens     *int           `json:"max_tokens"`
	MinTokens     *int           `json:"min_tokens"`
	N             *int           `json:"n"`
	Stream        *bool          `json:"stream"`
	StreamOptions *streamOptions `json:"stream_options"`
	IgnoreEOS     *bool          `json:"ignore_eos"`
}

type streamOptions struct {
	// IncludeUsage defaults to true once stream_options is present, as in vLLM.
	IncludeUsage         *bool `json:"include_usage"`
	ContinuousUsageStats *bool `json:"continuous_usage_stats"`
}

type chatRequest struct {
	commonRequest
	Messages            []chatMessage `json:"messages"`
	MaxCompletionTokens *int          `json:"max_completion_tokens"`
}

type chatMessage struct {
	Role    *string         `json:"role"`
	Content json.RawMessage `json:"content"`
}

type contentPart struct {
	Type string  `json:"type"`
	Text *string `json:"text"`
}

type completionRequest struct {
	commonRequest
	Prompt json.RawMessage `json:"prompt"`
}

// exactFields are the field names the simulator reads, by object: vLLM
// (pydantic) matches them exactly, while encoding/json also takes "Stream"
// for "stream". exactCase drops such near-misses first, so the simulator
// reads a body exactly as vLLM does (extra fields ignored, the last copy of
// a repeated key kept).
var exactFields = []string{"model", "max_tokens", "min_tokens", "n", "stream", "stream_options", "ignore_eos",
	"messages", "max_completion_tokens", "prompt"}

var exactStreamOptions = []string{"include_usage", "continuous_usage_stats"}

// exactCase returns body without the keys that differ only in case from a
// field the simulator reads, at the top level and in stream_options.
func exactCase(body []byte) []byte {
	var top map[string]json.RawMessage
	if json.Unmarshal(body, &top) != nil {
		return body // the decoder reports the error
	}
	changed := dropNearMisses(top, exactFields)
	if so, ok := top["stream_options"]; ok {
		var inner map[string]json.RawMessage
		if json.Unmarshal(so, &inner) == nil && dropNearMisses(inner, exactStreamOptions) {
			top["stream_options"], _ = json.Marshal(inner)
			changed = true
		}
	}
	if !changed {
		return body
	}
	out, err := json.Marshal(top)
	if err != nil {
		return body
	}
	return out
}

func dropNearMisses(m map[string]json.RawMessage, fields []string) bool {
	changed := false
	for k := range m {
		for _, f := range fields {
			if k != f && strings.EqualFold(k, f) {
				delete(m, k)
				changed = true
				break
			}
		}
	}
	return changed
}

// parseChat validates a /v1/chat/completions body.
func (e *Engine) parseChat(body []byte) (*job, *apiError) {
	var req chatRequest
	if err := json.Unmarshal(exactCase(body), &req); err != nil {
		return nil, decodeError(err)
	}
	if aerr := e.checkModel(req.Model); aerr != nil {
		return nil, aerr
	}
	if req.Messages == nil {
		return nil, badRequest("messages", "messages: field required")
	}
	if len(req.Messages) == 0 {
		return nil, badRequest("messages", "messages must contain at least one message")
	}
	j := &job{chat: true, promptTokens: 3}
	h := uint32(fnvOffset)
	for i, m := range req.Messages {
		if m.Role == nil || *m.Role == "" {
			return nil, badRequest("messages", fmt.Sprintf("messages[%d].role: field required", i))
		}
		n, aerr := messageContent(m.Content, i, &h)
		if aerr != nil {
			return nil, aerr
		}
		j.promptTokens += messageTokens(n)
	}
	j.hash = h
	limit, param := req.MaxTokens, "max_tokens"
	if req.MaxCompletionTokens != nil {
		limit, param = req.MaxCompletionTokens, "max_completion_tokens"
	}
	if aerr := e.fill(j, &req.commonRequest, limit, param); aerr != nil {
		return nil, aerr
	}
	return j, nil
}

// messageContent folds a message's text into h and returns its length in
// bytes. Content is a string, null, or an array of text parts.
func messageContent(raw json.RawMessage, i int, h *uint32) (int, *apiError) {
	if len(raw) == 0 || string(raw) == "null" {
		return 0, nil
	}
	switch raw[0] {
	case '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return 0, badRequest("messages", fmt.Sprintf("messages[%d].content is not a valid string", i))
		}
		*h = fnvString(*h, s)
		return len(s), nil
	case '[':
		var parts []contentPart
		if err := json.Unmarshal(raw, &parts); err != nil {
			return 0, badRequest("messages", fmt.Sprintf("messages[%d].content must be an array of text parts", i))
		}
		n := 0
		for k, p := range parts {
			if p.Type != "text" || p.Text == nil {
				return 0, badRequest("messages", fmt.Sprintf("messages[%d].content[%d]: only text parts are supported by the simulated engine", i, k))
			}
			*h = fnvString(*h, *p.Text)
			n += len(*p.Text)
		}
		return n, nil
	}
	return 0, badRequest("messages", fmt.Sprintf("messages[%d].content must be a string or an array of text parts", i))
}

// parseCompletion validates a /v1/completions body.
func (e *Engine) parseCompletion(body []byte) (*job, *apiError) {
	var req completionRequest
	if err := json.Unmarshal(exactCase(body), &req); err != nil {
		return nil, decodeError(err)
	}
	if aerr := e.checkModel(req.Model); aerr != nil {
		return nil, aerr
	}
	prompt, aerr := promptText(req.Prompt)
	if aerr != nil {
		return nil, aerr
	}
	j := &job{
		promptTokens: TextPromptTokens(prompt),
		hash:         fnvString(fnvOffset, prompt),
	}
	if aerr := e.fill(j, &req.commonRequest, req.MaxTokens, "max_tokens"); aerr != nil {
		return nil, aerr
	}
	return j, nil
}

// promptText accepts a string or an array holding exactly one string. Batched
// prompts and token-id prompts, which vLLM also takes, are refused rather
// than answered in a shape real vLLM would not send.
func promptText(raw json.RawMessage) (string, *apiError) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", badRequest("prompt", "prompt: field required")
	}
	switch raw[0] {
	case '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return "", badRequest("prompt", "prompt is not a valid string")
		}
		return s, nil
	case '[':
		var list []string
		if err := json.Unmarshal(raw, &list); err != nil {
			return "", badRequest("prompt", "prompt must be a string or an array of strings; token ids are not supported by the simulated engine")
		}
		if len(list) != 1 {
			return "", badRequest("prompt", "the simulated engine serves exactly one prompt per request")
		}
		return list[0], nil
	}
	return "", badRequest("prompt", "prompt must be a string or an array of strings")
}

func (e *Engine) checkModel(model string) *apiError {
	if model != "" && model != e.cfg.Model {
		return &apiError{
			status: 404,
			typ:    "NotFoundError",
			param:  "model",
			msg:    fmt.Sprintf("The model `%s` does not exist.", model),
		}
	}
	return nil
}

// fill checks the sampling and streaming fields and completes j. limit is the
// request's completion cap (nil: none given), param the field it came from.
func (e *Engine) fill(j *job, req *commonRequest, limit *int, param string) *apiError {
	if req.N != nil && *req.N != 1 {
		return badRequest("n", "n must be 1: the simulated engine generates one choice per request")
	}
	maxLen := e.cfg.MaxModelLen
	if limit != nil {
		if *limit < 1 {
			return badRequest(param, fmt.Sprintf("%s must be at least 1, got %d.", param, *limit))
		}
		if j.promptTokens+*limit > maxLen {
			return badRequest(param, fmt.Sprintf(
				"This model's maximum context length is %d tokens. However, you requested %d tokens (%d in the messages, %d in the completion). Please reduce the length of the messages or completion.",
				maxLen, j.promptTokens+*limit, j.promptTokens, *limit))
		}
		j.limit = *limit
	} else {
		if j.promptTokens >= maxLen {
			return badRequest("messages", fmt.Sprintf(
				"This model's maximum context length is %d tokens. However, your request has %d input tokens. Please reduce the length of the input messages.",
				maxLen, j.promptTokens))
		}
		j.limit = min(e.cfg.DefaultMaxTokens, maxLen-j.promptTokens)
	}
	if req.MinTokens != nil {
		if *req.MinTokens < 0 {
			return badRequest("min_tokens", fmt.Sprintf("min_tokens must be greater than or equal to 0, got %d.", *req.MinTokens))
		}
		if *req.MinTokens > j.limit {
			return badRequest("min_tokens", fmt.Sprintf("min_tokens must be less than or equal to max_tokens=%d, got %d.", j.limit, *req.MinTokens))
		}
		j.minTokens = *req.MinTokens
	}
	j.ignoreEOS = req.IgnoreEOS != nil && *req.IgnoreEOS
	j.stream = req.Stream != nil && *req.Stream
	if so := req.StreamOptions; so != nil {
		if !j.stream {
			return badRequest("stream_options", "Stream options can only be defined when `stream=True`.")
		}
		j.includeUsage = so.IncludeUsage == nil || *so.IncludeUsage
		j.continuousUsage = j.includeUsage && so.ContinuousUsageStats != nil && *so.ContinuousUsageStats
	}
	return nil
}

// decodeError turns a JSON decoding error into a 400 that names the field and
// the expected JSON type, never a Go type.
func decodeError(err error) *apiError {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		// Fields of the embedded commonRequest carry its Go name as a prefix.
		field := strings.TrimPrefix(te.Field, "commonRequest.")
		if field == "" {
			return badRequest("", "request body must be a JSON object")
		}
		return badRequest(field, fmt.Sprintf("%s: expected %s, got %s", field, jsonKind(te.Type), te.Value))
	}
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return badRequest("", fmt.Sprintf("request body is not valid JSON: %s at offset %d", se.Error(), se.Offset))
	}
	return badRequest("", "request body is not valid JSON")
}

func jsonKind(t reflect.Type) string {
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == nil {
		return "a value"
	}
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "a boolean"
	case reflect.Int, reflect.Int64, reflect.Int32:
		return "an integer"
	case reflect.Float64, reflect.Float32:
		return "a number"
	case reflect.Slice, reflect.Array:
		return "an array"
	default:
		return "an object"
	}
}

// Reading is what the engine understood of a generation request: the
// fields that decide routing, limits and billing.
type Reading struct {
	Model        string
	Stream       bool
	IncludeUsage bool
	MaxTokens    int // the completion cap in force
	N            int
}

// ReadRequest reads a chat (or completions) body exactly as the engine's
// handlers do, without running it. The gateway's differential fuzz test
// compares it with the gateway's own reading of the body it forwards.
func (e *Engine) ReadRequest(chat bool, body []byte) (Reading, error) {
	var (
		j    *job
		aerr *apiError
		req  commonRequest
	)
	if chat {
		j, aerr = e.parseChat(body)
	} else {
		j, aerr = e.parseCompletion(body)
	}
	if aerr != nil {
		return Reading{}, errors.New(aerr.msg)
	}
	_ = json.Unmarshal(exactCase(body), &req)
	n := 1
	if req.N != nil {
		n = *req.N
	}
	return Reading{Model: req.Model, Stream: j.stream, IncludeUsage: j.includeUsage, MaxTokens: j.limit, N: n}, nil
}
