package sim

import (
	"math/rand/v2"
	"strconv"
)

// Responses are appended to byte slices by hand: every piece is either a
// number, a pre-encoded JSON string (the model name) or ASCII that needs no
// escaping (ids, the word list), and this keeps the per-token cost to a few
// appends. Field order follows what vLLM sends.

// response holds what is fixed for one request's answer.
type response struct {
	chat         bool
	head         []byte // `{"id":"…","object":"…","created":…,"model":"…",` for chunks or the full body
	promptTokens int
	limit        int
	includeUsage bool
	perChunk     bool // usage on every chunk (continuous_usage_stats)
}

func (e *Engine) newResponse(j *job) *response {
	prefix, object := "cmpl-", "text_completion"
	if j.chat {
		prefix, object = "chatcmpl-", "chat.completion"
		if j.stream {
			object = "chat.completion.chunk"
		}
	}
	b := make([]byte, 0, 128+len(e.modelJSON))
	b = append(b, `{"id":"`...)
	b = append(b, prefix...)
	b = appendHex64(b, rand.Uint64())
	b = appendHex64(b, rand.Uint64())
	b = append(b, `","object":"`...)
	b = append(b, object...)
	b = append(b, `","created":`...)
	b = strconv.AppendInt(b, nowUnix(), 10)
	b = append(b, `,"model":`...)
	b = append(b, e.modelJSON...)
	b = append(b, ',')
	return &response{
		chat:         j.chat,
		head:         b,
		promptTokens: j.promptTokens,
		limit:        j.limit,
		includeUsage: j.includeUsage,
		perChunk:     j.continuousUsage,
	}
}

func (r *response) finishReason(n int) string {
	if n >= r.limit {
		return "length"
	}
	return "stop"
}

// appendBody appends the non-streaming answer of n tokens.
func (r *response) appendBody(b []byte, hash uint32, n int) []byte {
	b = append(b, r.head...)
	if r.chat {
		b = append(b, `"choices":[{"index":0,"message":{"role":"assistant","content":"`...)
	} else {
		b = append(b, `"choices":[{"index":0,"text":"`...)
	}
	for i := range n {
		b = append(b, word(hash, i)...)
	}
	b = append(b, `"`...)
	if r.chat {
		b = append(b, `,"tool_calls":[]}`...)
	}
	b = append(b, `,"logprobs":null,"finish_reason":"`...)
	b = append(b, r.finishReason(n)...)
	b = append(b, `","stop_reason":null}],"usage":`...)
	b = appendUsage(b, r.promptTokens, n)
	b = b[:len(b)-1] // reopen usage for its details field
	b = append(b, `,"prompt_tokens_details":null},"prompt_logprobs":null}`...)
	return b
}

// appendRoleChunk appends the chat stream's opening event.
func (r *response) appendRoleChunk(b []byte) []byte {
	b = append(b, "data: "...)
	b = append(b, r.head...)
	b = append(b, `"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]`...)
	return r.closeChunk(b, 0)
}

// appendTokenChunk appends the event carrying token w, the i-th (0-based);
// last marks the answer's final token, which carries the finish reason.
func (r *response) appendTokenChunk(b []byte, w string, i int, last bool) []byte {
	b = append(b, "data: "...)
	b = append(b, r.head...)
	if r.chat {
		b = append(b, `"choices":[{"index":0,"delta":{"content":"`...)
		b = append(b, w...)
		b = append(b, `"},"logprobs":null,"finish_reason":`...)
	} else {
		b = append(b, `"choices":[{"index":0,"text":"`...)
		b = append(b, w...)
		b = append(b, `","logprobs":null,"finish_reason":`...)
	}
	switch {
	case last:
		b = append(b, '"')
		b = append(b, r.finishReason(i+1)...)
		b = append(b, `","stop_reason":null}]`...)
	case r.chat:
		b = append(b, `null}]`...)
	default:
		b = append(b, `null,"stop_reason":null}]`...)
	}
	return r.closeChunk(b, i+1)
}

// closeChunk ends a chunk event, with usage so far when the client asked for
// continuous usage stats.
func (r *response) closeChunk(b []byte, generated int) []byte {
	if r.perChunk {
		b = append(b, `,"usage":`...)
		b = appendUsage(b, r.promptTokens, generated)
	}
	return append(b, "}\n\n"...)
}

// appendEnd appends the usage event (when asked for) and the [DONE] marker.
func (r *response) appendEnd(b []byte, n int) []byte {
	if r.includeUsage {
		b = append(b, "data: "...)
		b = append(b, r.head...)
		b = append(b, `"choices":[],"usage":`...)
		b = appendUsage(b, r.promptTokens, n)
		b = append(b, "}\n\n"...)
	}
	return append(b, "data: [DONE]\n\n"...)
}

func appendUsage(b []byte, prompt, completion int) []byte {
	b = append(b, `{"prompt_tokens":`...)
	b = strconv.AppendInt(b, int64(prompt), 10)
	b = append(b, `,"total_tokens":`...)
	b = strconv.AppendInt(b, int64(prompt+completion), 10)
	b = append(b, `,"completion_tokens":`...)
	b = strconv.AppendInt(b, int64(completion), 10)
	return append(b, '}')
}

func appendHex64(b []byte, v uint64) []byte {
	const digits = "0123456789abcdef"
	for shift := 60; shift >= 0; shift -= 4 {
		b = append(b, digits[(v>>uint(shift))&0xf])
	}
	return b
}
