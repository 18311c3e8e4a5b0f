package server

import (
	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"

	"github.com/tailgate-dev/tailgate/policy"
	"github.com/tailgate-dev/tailgate/server/apierr"
	"github.com/tailgate-dev/tailgate/serving/sse"
)

// endpoint is one public POST endpoint as an adapter of the one pipeline
// ([Server.serve]): how its body is read and checked, what its worst case
// reserves, which events carry output, where the engine reports usage. The
// guarantees — fail closed, commit before the final bytes, an open row kept
// current while a stream runs, settle on every ending, the error table,
// hedging and retries — are the pipeline's, never an endpoint's own.
type endpoint struct {
	path string // public and upstream path, e.g. /v1/chat/completions
	chat bool
	// read parses and checks a body.
	read func(ep endpoint, body []byte, ctype string, lim parseLimits) (*parsedRequest, error)
	// events is the dialect of its streamed answers.
	events sse.Dialect
	// stream: the body may ask for an SSE answer.
	stream bool
	// capField caps output tokens ("" if it has none); generates: it
	// generates output, so a completion is reserved.
	capField  string
	generates bool
	form      bool // a multipart/form-data body (audio)
}

var (
	chatEndpoint       = endpoint{path: "/v1/chat/completions", read: readChat, chat: true, stream: true, generates: true}
	completionEndpoint = endpoint{path: "/v1/completions", read: readCompletions, stream: true, generates: true}
)

// endpoints are the public POST endpoints, each served by [Server.serve].
var endpoints = []endpoint{
	chatEndpoint,
	completionEndpoint,
	{path: "/v1/responses", read: readResponses, events: sse.ResponseEvents, stream: true, capField: "max_output_tokens", generates: true},
	{path: "/v1/messages", read: readMessages, events: sse.MessageEvents, stream: true, capField: "max_tokens", generates: true},
	{path: "/v1/messages/count_tokens", read: readCountTokens},
	{path: "/v1/embeddings", read: readShaped},
	{path: "/v1/rerank", read: readShaped},
	{path: "/rerank", read: readShaped},
	{path: "/v2/rerank", read: readShaped},
	{path: "/v1/score", read: readShaped},
	{path: "/score", read: readShaped},
	{path: "/tokenize", read: readShaped},
	{path: "/detokenize", read: readShaped},
	{path: "/v1/audio/transcriptions", read: readAudio, form: true, stream: true, generates: true},
	{path: "/v1/audio/translations", read: readAudio, form: true, stream: true, generates: true},
}

// readJSONObject checks a typed endpoint's JSON body (one reading only,
// bounded nesting, an object) and reads the fields every endpoint shares:
// model (required: the gateway routes by it) and stream.
func readJSONObject(ep endpoint, body []byte, lim parseLimits) (*parsedRequest, gjson.Result, error) {
	if len(body) == 0 {
		return nil, gjson.Result{}, apierr.BadRequest("", "request body is empty; send a JSON object")
	}
	if err := checkJSON(body, lim.maxDepth); err != nil {
		return nil, gjson.Result{}, err
	}
	v := gjson.Parse(stringOf(body))
	if !v.IsObject() {
		return nil, v, apierr.BadRequest("", "request body must be a JSON object")
	}
	pr := &parsedRequest{body: body, sequences: 1}
	switch m := v.Get("model"); {
	case !m.Exists():
		return nil, v, apierr.BadRequest("model", "you must provide a model parameter (the gateway routes by it)")
	case m.Type != gjson.String || m.Str == "":
		return nil, v, apierr.BadRequest("model", "model must be a non-empty string")
	default:
		pr.model = m.Str
	}
	if st := v.Get("stream"); st.Exists() && st.Type != gjson.Null {
		if !isBool(st) {
			return nil, v, apierr.BadRequest("stream", "stream must be a boolean")
		}
		pr.stream = st.Type == gjson.True
	}
	if pr.stream && !ep.stream {
		return nil, v, apierr.BadRequest("stream", "%s does not stream", ep.path)
	}
	// The engine's own priority field would let a request jump its queue
	// past the gateway's classes (vLLM's priority scheduling): the order is
	// the gateway's admission queue's, by the key's class.
	if v.Get("priority").Exists() {
		b, err := sjson.DeleteBytes(pr.body, "priority")
		if err != nil {
			return nil, v, apierr.BadRequest("priority", "request body cannot be edited: %v", err)
		}
		pr.body = b
	}
	pr.promptBound = int64(len(body)) + 16
	pr.promptEstimate = int64(len(body))/4 + 1
	return pr, v, nil
}

// readCap reads ep's output cap and, where the client set none, applies
// chat's rule: the model's default where it surely fits in the context,
// sent explicitly; else the rest of the context, reserved whole and left to
// the engine. media parts add their reservation to the prompt.
func readCap(ep endpoint, pr *parsedRequest, v gjson.Result, media int64, lim parseLimits) error {
	pr.promptBound += media * lim.mediaPart
	pr.promptEstimate += media * lim.mediaPart / 4
	c := v.Get(ep.capField)
	if c.Exists() && c.Type != gjson.Null {
		if c.Type != gjson.Number || c.Num != float64(int64(c.Num)) || c.Num < 1 || c.Num > 1<<31 {
			return apierr.BadRequest(ep.capField, "%s must be a positive integer", ep.capField)
		}
		pr.maxTokens = int64(c.Num)
		return nil
	}
	pr.maxTokens = lim.defaultMax(pr.model)
	var contextLen int64
	if lim.contextLen != nil {
		contextLen = lim.contextLen(pr.model)
	}
	if likely := int64(len(pr.body))/2 + 16 + media*lim.mediaPart; contextLen > 0 && likely+pr.maxTokens > contextLen {
		pr.maxTokens = contextLen
		return nil
	}
	b, err := sjson.SetBytes(pr.body, ep.capField, pr.maxTokens)
	if err != nil {
		return apierr.BadRequest(ep.capField, "request body cannot be edited: %v", err)
	}
	pr.body = b
	return nil
}

// readResponses reads a Responses API request. Its stored-response features
// would let the engine keep state the gateway neither bills nor binds to a
// tenant (a background run billed nothing, another tenant's conversation
// continued by id): they are refused, and store is sent as false.
func readResponses(ep endpoint, body []byte, _ string, lim parseLimits) (*parsedRequest, error) {
	pr, v, err := readJSONObject(ep, body, lim)
	if err != nil {
		return nil, err
	}
	if b := v.Get("background"); b.Type == gjson.True {
		return nil, apierr.BadRequest("background", "background responses are not served through the gateway (it bills what it relays); send background: false")
	}
	if p := v.Get("previous_response_id"); p.Exists() && p.Type != gjson.Null {
		return nil, apierr.BadRequest("previous_response_id", "previous_response_id is not served through the gateway: send the conversation's items in input")
	}
	if c := v.Get("conversation"); c.Exists() && c.Type != gjson.Null {
		return nil, apierr.BadRequest("conversation", "conversation is not served through the gateway: send the conversation's items in input")
	}
	switch s := v.Get("store"); {
	case s.Type == gjson.True:
		return nil, apierr.BadRequest("store", "store: true is not served through the gateway (responses are not kept); send store: false")
	case !s.Exists() || s.Type != gjson.False:
		if pr.body, err = sjson.SetBytes(pr.body, "store", false); err != nil {
			return nil, apierr.BadRequest("store", "request body cannot be edited: %v", err)
		}
	}
	var media int64
	countParts := func(content gjson.Result) {
		content.ForEach(func(_, part gjson.Result) bool {
			switch part.Get("type").Str {
			case "input_text", "output_text", "text", "refusal", "":
			default: // input_image, input_file, input_audio, …
				media++
			}
			return true
		})
	}
	if in := v.Get("input"); in.IsArray() {
		in.ForEach(func(_, item gjson.Result) bool {
			if c := item.Get("content"); c.IsArray() {
				countParts(c)
			} else if t := item.Get("type").Str; t == "input_image" || t == "input_file" || t == "input_audio" {
				media++
			}
			return true
		})
	}
	if err := readCap(ep, pr, v, media, lim); err != nil {
		return nil, err
	}
	pr.session = sessionName(v.Get("prompt_cache_key"), v.Get("user"))
	return pr, nil
}

// readMessages reads an Anthropic Messages request.
func readMessages(ep endpoint, body []byte, _ string, lim parseLimits) (*parsedRequest, error) {
	pr, v, err := readJSONObject(ep, body, lim)
	if err != nil {
		return nil, err
	}
	var media int64
	v.Get("messages").ForEach(func(_, m gjson.Result) bool {
		m.Get("content").ForEach(func(_, part gjson.Result) bool {
			switch part.Get("type").Str {
			case "image", "document":
				media++
			}
			return true
		})
		return true
	})
	if err := readCap(ep, pr, v, media, lim); err != nil {
		return nil, err
	}
	pr.session = sessionName(v.Get("metadata.user_id"))
	return pr, nil
}

// reportedUsage reads the usage an engine reports in an answer or an event,
// merged into what earlier events said: OpenAI's prompt/completion tokens,
// the Responses and Anthropic input/output tokens (at the top, under
// "response" or "message"), only total_tokens (rerank, score) as prompt, or
// a transcription's duration in seconds (Whisper's encoder tokens).
func reportedUsage(payload []byte, prev policy.Usage) (policy.Usage, bool) {
	// A string view of the payload: only numbers are read from it, so
	// nothing aliases it afterwards (ParseBytes would copy a whole answer).
	v := gjson.Parse(stringOf(payload))
	u := v.Get("usage")
	if !u.IsObject() {
		u = v.Get("response.usage")
	}
	if !u.IsObject() {
		u = v.Get("message.usage")
	}
	if !u.IsObject() {
		return prev, false
	}
	in, out := usageTokens(u)
	return policy.Usage{PromptTokens: max(prev.PromptTokens, in), CompletionTokens: max(prev.CompletionTokens, out)}, true
}

// usageTokens reads a usage object's prompt and completion tokens, in one
// walk of it (a Get for each of its members walked it seven times).
func usageTokens(u gjson.Result) (in, out int64) {
	var m [len(usageKeys)]gjson.Result
	members(u, usageKeys[:], m[:])
	in = max(m[0].Int(), m[1].Int())
	out = max(m[2].Int(), m[3].Int())
	if in == 0 && out == 0 {
		in = m[4].Int()
	}
	if m[5].Str == "duration" {
		in = audioTokensPerSecond * m[6].Int()
	}
	return in, out
}

// usageKeys are the members of a usage object usageTokens reads, in the
// order of its m.
var usageKeys = [...]string{"prompt_tokens", "input_tokens", "completion_tokens", "output_tokens", "total_tokens", "type", "seconds"}
