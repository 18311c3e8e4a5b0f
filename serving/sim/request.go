package sim

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
)

// endpoint is the API a generation request came through; it decides the
// wire format of the answer.
type endpoint uint8

const (
	epChat endpoint = iota
	epCompletion
	epResponses
	epMessages
	epTranscription
	epTranslation
)

// job is a validated generation request: everything the generator needs,
// nothing of the prompt itself.
type job struct {
	ep           endpoint
	promptTokens int
	hash         uint32   // fnv32a of the prompt text; picks lengths and words
	blocks       []uint64 // the prompt's block hashes, for prefix-cache hits (prefix.go)
	limit        int      // completion cap per choice
	minTokens    int
	ignoreEOS    bool
	n            int   // choices
	seed         int64 // the request's seed field, 0 when absent
	priority     int64 // the request's priority field (lower first), 0 when absent
	fixed        int   // > 0: the answer has exactly this many tokens (a transcript)

	stream          bool
	interval        int  // tokens a chunk may merge (chat and completions; else 1)
	includeUsage    bool // final usage chunk
	continuousUsage bool // usage on every chunk

	tools     []toolDef
	toolMode  toolMode
	toolName  string        // toolNamed: the function asked for
	afterTool bool          // the conversation ends with a tool result
	format    *outputFormat // structured outputs (response_format, …), nil if none
	reasons   bool          // the endpoint shows a reasoning phase (chat, responses, messages)

	// Endpoint details the encoders echo.
	resp  *responsesRequest
	audio *audioRequest
}

// latencyKey identifies what the request asks for, for
// [Config.LatencyFromContent]: its prompt's hash and its seed field, so the
// same prompt sampled with another seed is another draw.
func (j *job) latencyKey() uint64 {
	return uint64(j.hash)<<32 ^ splitmix(uint64(j.seed))
}

// defaultCompletionMaxTokens is /v1/completions' cap when a request sets
// none, as vLLM's; Config.DefaultMaxTokens is chat's.
const defaultCompletionMaxTokens = 16

// maxChoices bounds n: the simulator holds every choice of a request in
// memory at once.
const maxChoices = 128

// chatSpecs are the fields of vLLM's ChatCompletionRequest the simulator
// reads, plus the common sampling fields it ignores, in the model's order
// (vllm/entrypoints/openai/chat_completion/protocol.py@002032ee).
var chatSpecs = []fspec{
	{name: "messages", typ: tList, required: true},
	{name: "model", typ: tStr, nullable: true},
	{name: "frequency_penalty", typ: tFloat, nullable: true},
	{name: "logit_bias", typ: tDict, nullable: true},
	{name: "logprobs", typ: tBool, nullable: true},
	{name: "top_logprobs", typ: tInt, nullable: true},
	{name: "max_tokens", typ: tInt, nullable: true},
	{name: "max_completion_tokens", typ: tInt, nullable: true},
	{name: "n", typ: tInt, nullable: true},
	{name: "presence_penalty", typ: tFloat, nullable: true},
	{name: "response_format", typ: tDict, nullable: true},
	{name: "seed", typ: tInt, nullable: true},
	{name: "stop", typ: tStop, nullable: true},
	{name: "stream", typ: tBool, nullable: true},
	{name: "stream_options", typ: tModel, nullable: true, model: "StreamOptions"},
	{name: "temperature", typ: tFloat, nullable: true},
	{name: "top_p", typ: tFloat, nullable: true},
	{name: "tools", typ: tList, nullable: true},
	{name: "tool_choice", typ: tAny},
	{name: "include_reasoning", typ: tBool},
	{name: "parallel_tool_calls", typ: tBool, nullable: true},
	{name: "user", typ: tStr, nullable: true},
	{name: "use_beam_search", typ: tBool},
	{name: "top_k", typ: tInt, nullable: true},
	{name: "min_p", typ: tFloat, nullable: true},
	{name: "repetition_penalty", typ: tFloat, nullable: true},
	{name: "ignore_eos", typ: tBool},
	{name: "min_tokens", typ: tInt},
	{name: "skip_special_tokens", typ: tBool},
	{name: "echo", typ: tBool},
	{name: "stream_interval", typ: tInt, nullable: true},
	{name: "priority", typ: tInt},
}

// completionSpecs: vLLM's CompletionRequest
// (vllm/entrypoints/openai/completion/protocol.py@002032ee).
var completionSpecs = []fspec{
	{name: "model", typ: tStr, nullable: true},
	{name: "prompt", typ: tAny},
	{name: "echo", typ: tBool, nullable: true},
	{name: "frequency_penalty", typ: tFloat, nullable: true},
	{name: "logit_bias", typ: tDict, nullable: true},
	{name: "logprobs", typ: tInt, nullable: true},
	{name: "max_tokens", typ: tInt, nullable: true},
	{name: "n", typ: tInt, nullable: true},
	{name: "presence_penalty", typ: tFloat, nullable: true},
	{name: "seed", typ: tInt, nullable: true},
	{name: "stop", typ: tStop, nullable: true},
	{name: "stream", typ: tBool, nullable: true},
	{name: "stream_options", typ: tModel, nullable: true, model: "StreamOptions"},
	{name: "suffix", typ: tStr, nullable: true},
	{name: "temperature", typ: tFloat, nullable: true},
	{name: "top_p", typ: tFloat, nullable: true},
	{name: "user", typ: tStr, nullable: true},
	{name: "use_beam_search", typ: tBool},
	{name: "top_k", typ: tInt, nullable: true},
	{name: "min_p", typ: tFloat, nullable: true},
	{name: "repetition_penalty", typ: tFloat, nullable: true},
	{name: "ignore_eos", typ: tBool},
	{name: "min_tokens", typ: tInt},
	{name: "skip_special_tokens", typ: tBool},
	{name: "stream_interval", typ: tInt, nullable: true},
	{name: "priority", typ: tInt},
}

// streamOptionSpecs: StreamOptions (vllm/entrypoints/generate/base/protocol.py@022e555d).
// Both default to False: since PR #36379 an empty stream_options asks for no
// usage.
var streamOptionSpecs = []fspec{
	{name: "include_usage", typ: tBool, nullable: true},
	{name: "continuous_usage_stats", typ: tBool, nullable: true},
}

// parseChat validates a /v1/chat/completions body.
func (e *Engine) parseChat(body []byte) (*job, *apiError) {
	r, aerr := readJSONBody(body)
	if aerr != nil {
		return nil, aerr
	}
	// Model validators that run on the raw body, before any field is
	// converted (ChatCompletionRequest.check_tool_usage,
	// validate_stream_options).
	if aerr := checkToolUsage(r); aerr != nil {
		return nil, aerr
	}
	if r.truthy("stream_options") && !r.truthy("stream") {
		return nil, valueError(r, "Stream options can only be defined when `stream=True`.", "stream_options")
	}
	r.check(chatSpecs)
	r.checkStreamInterval()
	so := r.checkNested("stream_options", streamOptionSpecs)
	msgs := r.checkMessages()
	tools := r.checkTools("tools", true)
	if len(r.errs) > 0 {
		return nil, validationError(r.errs)
	}
	model, _ := r.str("model")
	if aerr := e.checkModel(model); aerr != nil {
		return nil, aerr
	}
	if len(msgs) == 0 {
		return nil, badRequest("messages", "messages must contain at least one message")
	}
	j := &job{ep: epChat, promptTokens: 3, reasons: true}
	h := uint32(fnvOffset)
	var bh blockHasher
	if aerr := saltBlocks(r, &bh); aerr != nil {
		return nil, aerr
	}
	for i, m := range msgs {
		bh.beginMessage(m.role)
		n, aerr := messageContent(m.content, i, &h, &bh)
		if aerr != nil {
			return nil, aerr
		}
		bh.endMessage()
		j.promptTokens += messageTokens(n)
	}
	bh.generationPrompt()
	j.hash, j.blocks = h, bh.blocks
	j.afterTool = msgs[len(msgs)-1].role == "tool"
	limit, param := optInt(r, "max_tokens"), "max_tokens"
	if v := optInt(r, "max_completion_tokens"); v != nil {
		limit, param = v, "max_completion_tokens"
	}
	if aerr := e.fill(j, r, so, limit, param); aerr != nil {
		return nil, aerr
	}
	if j.format, aerr = readOutputFormat(r); aerr != nil {
		return nil, aerr
	}
	j.tools = tools
	j.toolMode, j.toolName = chatToolChoice(r, tools)
	return j, nil
}

// message is what the simulator reads of a chat message.
type message struct {
	role    string
	content json.RawMessage
}

// checkMessages validates the messages list: each one an object with a
// string role and a string, null or list content. vLLM validates each
// message against a union of message types and reports every branch's
// error; the simulator reports the one that matters.
func (r *reader) checkMessages() []message {
	raw := r.rawVal("messages")
	if raw == nil {
		return nil
	}
	var items []json.RawMessage
	if json.Unmarshal(raw, &items) != nil {
		return nil
	}
	out := make([]message, 0, len(items))
	for i, it := range items {
		loc := r.loc + ".messages." + strconv.Itoa(i)
		var m struct {
			Role    json.RawMessage `json:"role"`
			Content json.RawMessage `json:"content"`
		}
		if !isObject(it) || json.Unmarshal(it, &m) != nil {
			r.errs = append(r.errs, pyErr{typ: "dict_type", loc: loc, msg: "Input should be a valid dictionary", input: summarize(it)})
			continue
		}
		switch {
		case m.Role == nil:
			r.errs = append(r.errs, pyErr{typ: "missing", loc: loc + ".role", msg: "Field required", input: summarize(it)})
			continue
		case !isString(m.Role):
			r.errs = append(r.errs, pyErr{typ: "string_type", loc: loc + ".role", msg: "Input should be a valid string", input: summarize(m.Role)})
			continue
		}
		c := m.Content
		if len(c) > 0 && !isNull(c) && !isString(c) && c[0] != '[' {
			r.errs = append(r.errs, pyErr{typ: "string_type", loc: loc + ".content", msg: "Input should be a valid string", input: summarize(c)})
			continue
		}
		s, _ := asString(m.Role)
		out = append(out, message{role: s, content: c})
	}
	return out
}

// checkStreamInterval applies stream_interval's constraint (Field(ge=1)) to
// a value that converted.
func (r *reader) checkStreamInterval() {
	if v, ok := r.int("stream_interval"); ok && v < 1 {
		r.errs = append(r.errs, pyErr{
			typ: "greater_than_equal", loc: r.loc + ".stream_interval",
			msg: "Input should be greater than or equal to 1", input: summarize(r.raw["stream_interval"]), ctx: "{'ge': 1}",
		})
		delete(r.vals, "stream_interval")
	}
}

// checkNested validates the object in field name against specs and returns
// its reader, nil when the field is absent or null.
func (r *reader) checkNested(name string, specs []fspec) *reader {
	n := r.nested(name)
	if n == nil {
		return nil
	}
	n.check(specs)
	r.errs = append(r.errs, n.errs...)
	return n
}

// messageContent folds a message's text into h (and bh, unless nil) and
// returns its length in bytes. Content is a string, null, or an array of
// text parts.
func messageContent(raw json.RawMessage, i int, h *uint32, bh *blockHasher) (int, *apiError) {
	if len(raw) == 0 || isNull(raw) {
		return 0, nil
	}
	if s, ok := asString(raw); ok {
		*h = fnvString(*h, s)
		if bh != nil {
			bh.write(s)
		}
		return len(s), nil
	}
	var parts []struct {
		Type string  `json:"type"`
		Text *string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return 0, badRequest("messages", fmt.Sprintf("messages[%d].content must be an array of text parts", i))
	}
	n := 0
	for k, p := range parts {
		if p.Type != "text" || p.Text == nil {
			return 0, badRequest("messages", fmt.Sprintf("messages[%d].content[%d]: only text parts are supported by the simulated engine", i, k))
		}
		*h = fnvString(*h, *p.Text)
		if bh != nil {
			bh.write(*p.Text)
		}
		n += len(*p.Text)
	}
	return n, nil
}

// parseCompletion validates a /v1/completions body.
func (e *Engine) parseCompletion(body []byte) (*job, *apiError) {
	r, aerr := readJSONBody(body)
	if aerr != nil {
		return nil, aerr
	}
	// CompletionRequest's raw-body validators, in the order pydantic runs
	// them (the last defined first).
	if p, ok := r.raw["prompt"]; (!ok || isNull(p) || string(p) == `""`) && !r.truthy("prompt_embeds") {
		return nil, valueError(r, "Either prompt or prompt_embeds must be provided and non-empty.", "prompt")
	}
	if r.truthy("stream_options") && !r.truthy("stream") {
		return nil, valueError(r, "Stream options can only be defined when `stream=True`.", "stream_options")
	}
	r.check(completionSpecs)
	r.checkStreamInterval()
	so := r.checkNested("stream_options", streamOptionSpecs)
	if len(r.errs) > 0 {
		return nil, validationError(r.errs)
	}
	model, _ := r.str("model")
	if aerr := e.checkModel(model); aerr != nil {
		return nil, aerr
	}
	prompt, aerr := promptText(r.raw["prompt"])
	if aerr != nil {
		return nil, aerr
	}
	var bh blockHasher
	if aerr := saltBlocks(r, &bh); aerr != nil {
		return nil, aerr
	}
	bh.id(tokBOS)
	bh.write(prompt)
	bh.endText()
	j := &job{
		ep:           epCompletion,
		promptTokens: TextPromptTokens(prompt),
		hash:         fnvString(fnvOffset, prompt),
		blocks:       bh.blocks,
	}
	if aerr := e.fill(j, r, so, optInt(r, "max_tokens"), "max_tokens"); aerr != nil {
		return nil, aerr
	}
	if j.format, aerr = readOutputFormat(r); aerr != nil {
		return nil, aerr
	}
	return j, nil
}

// promptText accepts a string or an array holding exactly one string. Batched
// prompts and token-id prompts, which vLLM also takes, are refused rather
// than answered in a shape real vLLM would not send.
func promptText(raw json.RawMessage) (string, *apiError) {
	if s, ok := asString(raw); ok {
		return s, nil
	}
	var list []string
	if len(raw) == 0 || raw[0] != '[' || json.Unmarshal(raw, &list) != nil {
		return "", badRequest("prompt", "prompt must be a string or an array of strings; token ids are not supported by the simulated engine")
	}
	if len(list) != 1 {
		return "", badRequest("prompt", "the simulated engine serves exactly one prompt per request")
	}
	return list[0], nil
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

// saltBlocks applies the request's cache_salt, which vLLM requires to be
// a non-empty string when set (check_cache_salt_support).
func saltBlocks(r *reader, bh *blockHasher) *apiError {
	raw, ok := r.raw["cache_salt"]
	if !ok || isNull(raw) {
		return nil
	}
	s, isStr := asString(raw)
	if !isStr || s == "" {
		return valueError(r, "Parameter 'cache_salt' must be a non-empty string if provided.", "")
	}
	bh.salt(s)
	return nil
}

// optInt returns an int field's value, nil when absent or null.
func optInt(r *reader, name string) *int {
	v, ok := r.int(name)
	if !ok {
		return nil
	}
	n := int(v)
	return &n
}

// fill checks the limits, choices and streaming fields and completes j.
// limit is the request's completion cap (nil: none given), param the field
// it came from; so is the stream_options reader, nil when absent.
func (e *Engine) fill(j *job, r *reader, so *reader, limit *int, param string) *apiError {
	j.n = 1
	if v := optInt(r, "n"); v != nil {
		switch {
		case *v < 1:
			return badRequest("n", fmt.Sprintf("n must be at least 1, got %d.", *v))
		case *v > maxChoices:
			return badRequest("n", fmt.Sprintf("the simulated engine generates at most %d choices, got n=%d", maxChoices, *v))
		}
		j.n = *v
	}
	// An explicit null is pydantic's None, not the field's default: vLLM's
	// completions then generate up to the rest of the context, not 16.
	_, null := r.raw["max_tokens"]
	if aerr := e.fitContext(j, limit, param, null && limit == nil); aerr != nil {
		return aerr
	}
	if v := optInt(r, "min_tokens"); v != nil {
		if *v < 0 {
			return badRequest("min_tokens", fmt.Sprintf("min_tokens must be greater than or equal to 0, got %d.", *v))
		}
		if *v > j.limit {
			return badRequest("min_tokens", fmt.Sprintf("min_tokens must be less than or equal to max_tokens=%d, got %d.", j.limit, *v))
		}
		j.minTokens = *v
	}
	j.seed, _ = r.int("seed")
	j.priority, _ = r.int("priority")
	if j.priority != 0 && !e.cfg.PriorityScheduling {
		// vLLM's engine raises a ValueError, answered 400 (see
		// Config.PriorityScheduling).
		return badRequest("", fmt.Sprintf("Got priority %d but Priority scheduling is not enabled.", j.priority))
	}
	j.ignoreEOS = r.bool("ignore_eos")
	j.stream = r.bool("stream")
	// stream_interval "raises the server's --stream-interval for this
	// request. Values below the server setting are clamped up to it."
	j.interval = e.cfg.StreamInterval
	if v := optInt(r, "stream_interval"); v != nil {
		j.interval = max(j.interval, *v)
	}
	if so != nil && j.stream {
		j.includeUsage = so.bool("include_usage")
		j.continuousUsage = j.includeUsage && so.bool("continuous_usage_stats")
	}
	return nil
}

// fitContext sets j.limit from the request's cap (nil: none) and refuses
// prompts that do not fit, as vLLM's renderer does
// (vllm/renderers/params.py@017638d7, TokenizeParams._token_len_check):
// the prompt may use the context length minus the requested output.
//
// noDefault (an explicit "max_tokens": null) leaves a completion without
// CompletionRequest's default of 16: it may use the rest of the context.
func (e *Engine) fitContext(j *job, limit *int, param string, noDefault bool) *apiError {
	maxLen := e.cfg.MaxModelLen
	out := 0
	if limit != nil {
		if *limit < 1 {
			return badRequest(param, fmt.Sprintf("%s must be at least 1, got %d.", param, *limit))
		}
		out = *limit
	}
	if out > maxLen {
		// The missing space and the doubled name are vLLM's.
		return badRequest(param, fmt.Sprintf("%s=%dcannot be greater than max_model_len=max_total_tokens=%d. Please request fewer output tokens.", param, out, maxLen))
	}
	if j.promptTokens > maxLen-out {
		return badRequest("input_tokens", fmt.Sprintf(
			"You passed %d input tokens and requested %d output tokens. However, the model's context length is only %d tokens, resulting in a maximum input length of %d tokens. Please reduce the length of the input prompt.",
			j.promptTokens, out, maxLen, maxLen-out))
	}
	switch {
	case limit != nil:
		j.limit = *limit
	case j.promptTokens >= maxLen:
		return badRequest("max_tokens", "max_tokens must be at least 1, got 0.")
	case j.ep == epCompletion && !noDefault:
		// CompletionRequest.max_tokens defaults to 16
		// (vllm/entrypoints/openai/completion/protocol.py@d5dba2d7).
		j.limit = min(defaultCompletionMaxTokens, maxLen-j.promptTokens)
	default:
		j.limit = min(e.cfg.DefaultMaxTokens, maxLen-j.promptTokens)
	}
	return nil
}

func isString(v json.RawMessage) bool { return len(v) > 0 && v[0] == '"' }

// Reading is what the engine understood of a generation request: the
// fields that decide routing, limits and billing.
type Reading struct {
	Model        string
	Stream       bool
	IncludeUsage bool
	MaxTokens    int // the completion cap in force, per choice
	N            int
}

// ReadRequest reads a chat (or completions) body exactly as the engine's
// handlers do, without running it. The gateway's differential fuzz test
// compares it with the gateway's own reading of the body it forwards.
func (e *Engine) ReadRequest(chat bool, body []byte) (Reading, error) {
	var (
		j    *job
		aerr *apiError
	)
	if chat {
		j, aerr = e.parseChat(body)
	} else {
		j, aerr = e.parseCompletion(body)
	}
	if aerr != nil {
		return Reading{}, errors.New(aerr.msg)
	}
	r, _ := readJSONBody(body)
	r.check([]fspec{{name: "model", typ: tStr, nullable: true}})
	model, _ := r.str("model")
	return Reading{Model: model, Stream: j.stream, IncludeUsage: j.includeUsage, MaxTokens: j.limit, N: j.n}, nil
}
