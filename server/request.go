package server

import (
	"hash/fnv"

	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"

	"tailgate/server/apierr"
)

// endpoint is one of the OpenAI generation endpoints the gateway serves.
type endpoint struct {
	path string // upstream path, e.g. /v1/chat/completions
	chat bool
}

var (
	chatEndpoint       = endpoint{path: "/v1/chat/completions", chat: true}
	completionEndpoint = endpoint{path: "/v1/completions"}
)

// parsedRequest is what the gateway needs to know of a generation request.
// The body is kept as bytes and forwarded with minimal edits, so fields the
// gateway does not know reach the engine untouched.
type parsedRequest struct {
	body      []byte // as sent upstream
	model     string
	stream    bool
	wantUsage bool  // the client asked for the usage chunk
	maxTokens int64 // the completion cap in force (client's or the default)
	// promptBound is a guaranteed upper bound of the prompt's tokens: every
	// token of a byte-level tokenizer covers at least one byte, so the body's
	// length (plus room for template tokens) can never be exceeded.
	promptBound int64
	// promptEstimate is the likely prompt size (about 4 bytes a token), used
	// for token-per-minute limits and reconciled after the answer.
	promptEstimate int64
	// prefix hashes the prompt's leading part (the system prompt, or the
	// first 256 bytes) for prefix-affinity routing; 0 when empty.
	prefix uint64
}

// parseRequest validates body for ep and prepares what is sent upstream:
// the default max_tokens is applied when the client set none, and streams
// always ask upstream for usage (stripped again if the client did not ask).
func parseRequest(ep endpoint, body []byte, defaultMaxTokens func(model string) int64) (*parsedRequest, error) {
	if len(body) == 0 {
		return nil, apierr.BadRequest("", "request body is empty; send a JSON object")
	}
	if !gjson.ValidBytes(body) {
		return nil, apierr.BadRequest("", "request body is not valid JSON")
	}
	root := gjson.ParseBytes(body)
	if !root.IsObject() {
		return nil, apierr.BadRequest("", "request body must be a JSON object")
	}
	fields := gjson.GetManyBytes(body, "model", "stream", "max_tokens", "max_completion_tokens", "stream_options", "messages", "prompt", "n")
	model, stream, maxTok, maxCompl, streamOpts, messages, prompt, n := fields[0], fields[1], fields[2], fields[3], fields[4], fields[5], fields[6], fields[7]

	p := &parsedRequest{body: body}
	switch {
	case !model.Exists():
		return nil, apierr.BadRequest("model", "you must provide a model parameter")
	case model.Type != gjson.String || model.Str == "":
		return nil, apierr.BadRequest("model", "model must be a non-empty string")
	}
	p.model = model.Str
	if stream.Exists() && !isBool(stream) && stream.Type != gjson.Null {
		return nil, apierr.BadRequest("stream", "stream must be a boolean")
	}
	p.stream = stream.Type == gjson.True
	if ep.chat {
		if !messages.Exists() {
			return nil, apierr.BadRequest("messages", "you must provide a messages parameter")
		}
		if !messages.IsArray() || len(messages.Array()) == 0 {
			return nil, apierr.BadRequest("messages", "messages must be a non-empty array")
		}
		for i, m := range messages.Array() {
			if !m.IsObject() || m.Get("role").Type != gjson.String {
				return nil, apierr.BadRequest("messages", "messages[%d] must be an object with a string role", i)
			}
		}
	} else {
		if !prompt.Exists() {
			return nil, apierr.BadRequest("prompt", "you must provide a prompt parameter")
		}
		if prompt.Type != gjson.String && !prompt.IsArray() {
			return nil, apierr.BadRequest("prompt", "prompt must be a string or an array")
		}
	}
	if n.Exists() && (n.Type != gjson.Number || n.Int() != 1) && n.Type != gjson.Null {
		return nil, apierr.BadRequest("n", "only n=1 is supported")
	}
	for _, f := range []struct {
		name string
		v    gjson.Result
	}{{"max_tokens", maxTok}, {"max_completion_tokens", maxCompl}} {
		if f.v.Exists() && f.v.Type != gjson.Null {
			if f.v.Type != gjson.Number || f.v.Num != float64(int64(f.v.Num)) || f.v.Num < 1 {
				return nil, apierr.BadRequest(f.name, "%s must be a positive integer", f.name)
			}
			p.maxTokens = max(p.maxTokens, int64(f.v.Num))
		}
	}
	if streamOpts.Exists() && streamOpts.Type != gjson.Null {
		if !streamOpts.IsObject() {
			return nil, apierr.BadRequest("stream_options", "stream_options must be an object")
		}
		if !p.stream {
			return nil, apierr.BadRequest("stream_options", "stream_options is only allowed when stream is true")
		}
		p.wantUsage = streamOpts.Get("include_usage").Type == gjson.True
	}

	var err error
	if p.maxTokens == 0 {
		p.maxTokens = defaultMaxTokens(p.model)
		if p.body, err = sjson.SetBytes(p.body, "max_tokens", p.maxTokens); err != nil {
			return nil, apierr.BadRequest("", "request body cannot be edited: %v", err)
		}
	}
	if p.stream && !p.wantUsage {
		if p.body, err = sjson.SetBytes(p.body, "stream_options.include_usage", true); err != nil {
			return nil, apierr.BadRequest("stream_options", "stream_options cannot be edited: %v", err)
		}
	}
	p.prefix = prefixHash(ep, messages, prompt)
	p.promptBound = int64(len(body)) + 16
	p.promptEstimate = int64(len(body))/4 + 1
	return p, nil
}

func isBool(r gjson.Result) bool { return r.Type == gjson.True || r.Type == gjson.False }

// prefixBytes is how much of the prompt's start decides prefix affinity.
const prefixBytes = 256

// prefixHash hashes what an engine's prefix cache would share between
// requests: the first message (typically the system prompt) or the start of
// a completion prompt.
func prefixHash(ep endpoint, messages, prompt gjson.Result) uint64 {
	var lead string
	if ep.chat {
		first := messages.Get("0")
		lead = first.Get("role").Str + "\x00" + first.Get("content").Raw
	} else {
		lead = prompt.Raw
	}
	if len(lead) > prefixBytes {
		lead = lead[:prefixBytes]
	}
	if lead == "" || lead == "\x00" {
		return 0
	}
	h := fnv.New64a()
	h.Write([]byte(lead))
	return h.Sum64()
}
