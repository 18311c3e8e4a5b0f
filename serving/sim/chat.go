package sim

import (
	"net/http"
	"strconv"
	"time"
)

// The chat and completions answers, field for field as vLLM writes them.
// JSON answers are model_dump() of the response model (every field, nulls
// included); stream chunks are model_dump_json(exclude_unset=True), so a
// field appears when vLLM set it, even to null. Field order is the order of
// the pydantic models:
//
//   - chat: vllm/entrypoints/openai/chat_completion/protocol.py@002032ee
//     (ChatMessage, ChatCompletionResponse, ChatCompletionStreamResponse);
//     the chunks and their order: chat_completion/serving.py@006c49d4
//     (chat_completion_stream_generator, chat_completion_full_generator);
//   - deltas: vllm/entrypoints/generate/base/protocol.py@022e555d
//     (DeltaMessage, DeltaToolCall; tool_calls dropped when empty);
//   - usage: vllm/entrypoints/serve/engine/protocol.py@f1bf7bd0 (UsageInfo);
//   - completions: vllm/entrypoints/openai/completion/protocol.py@002032ee
//     and completion/serving.py@030ea52e.
//
// Pieces are appended to byte slices by hand: this is the per-token path.

// ReasoningField values: how a reasoning delta names its text.
const (
	ReasoningFieldReasoning = "reasoning"         // vLLM ≥ 0.12 (the default)
	ReasoningFieldContent   = "reasoning_content" // vLLM ≤ 0.10
	ReasoningFieldBoth      = "both"              // vLLM 0.11 to 0.1x: both, same text
)

// answerHead is what every chunk of one answer starts with:
// {"id":"…","object":"…","created":…,"model":…,
func (e *Engine) answerHead(prefix, id, object string) []byte {
	b := make([]byte, 0, 96+len(e.modelJSON)+len(id))
	b = append(b, `{"id":`...)
	b = appendJSONString(b, prefix+id)
	b = append(b, `,"object":"`...)
	b = append(b, object...)
	b = append(b, `","created":`...)
	b = strconv.AppendInt(b, time.Now().Unix(), 10)
	b = append(b, `,"model":`...)
	b = append(b, e.modelJSON...)
	return append(b, ',')
}

// requestID is vLLM's _base_request_id: the client's X-Request-Id header,
// else a random id (vllm/entrypoints/serve/engine/serving.py@4b5c627c).
func requestID(r *http.Request) string {
	if id := r.Header.Get("X-Request-Id"); id != "" {
		return id
	}
	return randomHex()
}

// chatEncoder renders /v1/chat/completions answers.
type chatEncoder struct {
	e       *Engine
	j       *job
	choices []*choice
	head    []byte
}

func (e *Engine) newChatEncoder(r *http.Request, j *job, choices []*choice) *chatEncoder {
	object := "chat.completion"
	if j.stream {
		object = "chat.completion.chunk"
	}
	return &chatEncoder{e: e, j: j, choices: choices, head: e.answerHead("chatcmpl-", requestID(r), object)}
}

func (c *chatEncoder) mediaType() string     { return "application/json" }
func (c *chatEncoder) open(b []byte) []byte  { return b }
func (c *chatEncoder) reasoningParser() bool { return c.e.cfg.ReasoningTokens > 0 }

// first appends one role chunk per choice, sent with the first token.
func (c *chatEncoder) first(b []byte) []byte {
	for _, ch := range c.choices {
		b = append(b, "data: "...)
		b = append(b, c.head...)
		b = append(b, `"choices":[{"index":`...)
		b = strconv.AppendInt(b, int64(ch.index), 10)
		b = append(b, `,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]`...)
		if c.j.continuousUsage {
			b = c.appendChunkUsage(b, 0, 0)
		}
		b = append(b, `,"prompt_token_ids":null,"prompt_text":null}`+"\n\n"...)
	}
	return b
}

// token appends the chunk of token k of choice ch.
func (c *chatEncoder) token(b []byte, ch *choice, k int) []byte { return c.chunk(b, ch, k, k+1) }

// chunk appends the chunk of tokens from to to-1 of choice ch, which share
// one kind of output (see choice.chunkEnd).
func (c *chatEncoder) chunk(b []byte, ch *choice, from, to int) []byte {
	b = append(b, "data: "...)
	b = append(b, c.head...)
	b = append(b, `"choices":[{"index":`...)
	b = strconv.AppendInt(b, int64(ch.index), 10)
	b = append(b, `,"delta":`...)
	b = c.appendDelta(b, ch, from, to)
	last := to == ch.total()
	if last {
		b = append(b, `,"logprobs":null,"finish_reason":"`...)
		b = append(b, ch.finish...)
		b = append(b, `","stop_reason":null,"token_ids":null}]`...)
	} else {
		b = append(b, `,"logprobs":null,"finish_reason":null,"token_ids":null}]`...)
	}
	if c.j.continuousUsage {
		b = c.appendChunkUsage(b, to, ch.reasoningBy(to))
	}
	if last && !c.j.includeUsage {
		// "Stamp the fingerprint on terminal chunks only."
		b = append(b, `,"system_fingerprint":`...)
		b = append(b, c.e.fingerprint...)
	}
	return append(b, "}\n\n"...)
}

// appendDelta appends the DeltaMessage of tokens from to to-1.
func (c *chatEncoder) appendDelta(b []byte, ch *choice, from, to int) []byte {
	switch ch.kind(from) {
	case kReasoning:
		w := ch.joined(from, to)
		switch c.e.cfg.ReasoningField {
		case ReasoningFieldContent:
			b = append(b, `{"reasoning_content":`...)
			b = appendJSONString(b, w)
		case ReasoningFieldBoth:
			b = append(b, `{"reasoning":`...)
			b = appendJSONString(b, w)
			b = append(b, `,"reasoning_content":`...)
			b = appendJSONString(b, w)
		default:
			b = append(b, `{"reasoning":`...)
			b = appendJSONString(b, w)
		}
		return append(b, '}')
	case kContent:
		b = append(b, `{"content":`...)
		b = appendJSONString(b, ch.joined(from, to))
		return append(b, '}')
	case kToolName:
		// The first delta of a call: id, type, index and the name
		// (vllm/tool_parsers/hermes_tool_parser.py@02bb669b).
		b = append(b, `{"tool_calls":[{"id":`...)
		b = appendJSONString(b, ch.call.id)
		b = append(b, `,"type":"function","index":0,"function":{"name":`...)
		b = appendJSONString(b, ch.call.name)
		return append(b, `}}]}`...)
	case kToolArgs:
		b = append(b, `{"tool_calls":[{"index":0,"function":{"arguments":`...)
		b = appendJSONString(b, ch.joined(from, to))
		return append(b, `}}]}`...)
	}
	if ch.call == nil {
		// A text's end-of-sequence token decodes to nothing.
		return append(b, `{"content":""}`...)
	}
	// The end-of-sequence token after a call: the tool parser sends an
	// empty delta.
	return append(b, "{}"...)
}

// appendChunkUsage appends a chunk's continuous usage: the choice's own
// tokens so far, as vLLM counts them (previous_num_tokens[i]).
func (c *chatEncoder) appendChunkUsage(b []byte, completion, reasoning int) []byte {
	b = append(b, `,"usage":`...)
	b = appendUsageCounts(b, c.j.promptTokens, completion)
	if c.reasoningParser() {
		b = append(b, `,"completion_tokens_details":{"reasoning_tokens":`...)
		b = strconv.AppendInt(b, int64(reasoning), 10)
		return append(b, "}}"...)
	}
	return append(b, `,"completion_tokens_details":null}`...)
}

// end appends the usage chunk (when asked for) and [DONE].
func (c *chatEncoder) end(b []byte) []byte {
	if c.j.includeUsage {
		n, r := totals(c.choices)
		b = c.e.appendUsageChunk(b, c.head, c.j.promptTokens, n, r, c.reasoningParser())
	}
	return append(b, "data: [DONE]\n\n"...)
}

// body appends the JSON answer.
func (c *chatEncoder) body(b []byte) []byte {
	b = append(b, c.head...)
	b = append(b, `"choices":[`...)
	for i, ch := range c.choices {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"index":`...)
		b = strconv.AppendInt(b, int64(ch.index), 10)
		b = append(b, `,"message":{"role":"assistant","content":`...)
		switch {
		case ch.call != nil && c.j.toolMode == toolAuto:
			b = append(b, "null"...)
		case ch.call != nil:
			b = append(b, `""`...)
		case c.reasoningParser() && ch.content == 0:
			b = append(b, "null"...)
		default:
			b = appendJSONString(b, ch.contentText())
		}
		b = append(b, `,"refusal":null,"annotations":null,"audio":null,"function_call":null`...)
		if ch.call != nil {
			b = append(b, `,"tool_calls":[{"id":`...)
			b = appendJSONString(b, ch.call.id)
			b = append(b, `,"type":"function","function":{"name":`...)
			b = appendJSONString(b, ch.call.name)
			b = append(b, `,"arguments":`...)
			b = appendJSONString(b, ch.args())
			b = append(b, `}}]`...)
		}
		b = c.appendMessageReasoning(b, ch)
		b = append(b, `},"logprobs":null,"finish_reason":"`...)
		b = append(b, ch.finish...)
		b = append(b, `","stop_reason":null,"token_ids":null,"routed_experts":null}`...)
	}
	n, r := totals(c.choices)
	b = append(b, `],"service_tier":null,"system_fingerprint":`...)
	b = append(b, c.e.fingerprint...)
	b = append(b, `,"usage":`...)
	b = appendUsageCounts(b, c.j.promptTokens, n)
	b = append(b, `,"prompt_tokens_details":null,"completion_tokens_details":`...)
	if c.reasoningParser() {
		b = append(b, `{"reasoning_tokens":`...)
		b = strconv.AppendInt(b, int64(r), 10)
		b = append(b, '}')
	} else {
		b = append(b, "null"...)
	}
	return append(b, `},"prompt_logprobs":null,"prompt_token_ids":null,"prompt_text":null,"kv_transfer_params":null,"ec_transfer_params":null,"metrics":null}`...)
}

// appendMessageReasoning appends the message's reasoning field(s), the
// last of ChatMessage.
func (c *chatEncoder) appendMessageReasoning(b []byte, ch *choice) []byte {
	val := func(b []byte) []byte {
		if ch.reasoning == 0 {
			return append(b, "null"...)
		}
		return appendJSONString(b, ch.reasoningText())
	}
	switch c.e.cfg.ReasoningField {
	case ReasoningFieldContent:
		b = append(b, `,"reasoning_content":`...)
		return val(b)
	case ReasoningFieldBoth:
		b = append(b, `,"reasoning":`...)
		b = val(b)
		b = append(b, `,"reasoning_content":`...)
		return val(b)
	}
	b = append(b, `,"reasoning":`...)
	return val(b)
}

// completionEncoder renders /v1/completions answers.
type completionEncoder struct {
	e       *Engine
	j       *job
	choices []*choice
	head    []byte
}

func (e *Engine) newCompletionEncoder(r *http.Request, j *job, choices []*choice) *completionEncoder {
	return &completionEncoder{e: e, j: j, choices: choices, head: e.answerHead("cmpl-", requestID(r), "text_completion")}
}

func (c *completionEncoder) mediaType() string     { return "application/json" }
func (c *completionEncoder) open(b []byte) []byte  { return b }
func (c *completionEncoder) first(b []byte) []byte { return b }

func (c *completionEncoder) token(b []byte, ch *choice, k int) []byte {
	return c.chunk(b, ch, k, k+1)
}

func (c *completionEncoder) chunk(b []byte, ch *choice, from, to int) []byte {
	b = append(b, "data: "...)
	b = append(b, c.head...)
	b = append(b, `"choices":[{"index":`...)
	b = strconv.AppendInt(b, int64(ch.index), 10)
	b = append(b, `,"text":`...)
	b = appendJSONString(b, ch.joined(from, to))
	last := to == ch.total()
	if last {
		b = append(b, `,"logprobs":null,"finish_reason":"`...)
		b = append(b, ch.finish...)
		b = append(b, `","stop_reason":null,"prompt_token_ids":null,"token_ids":null}]`...)
	} else {
		b = append(b, `,"logprobs":null,"finish_reason":null,"stop_reason":null,"prompt_token_ids":null,"token_ids":null}]`...)
	}
	if c.j.continuousUsage {
		b = append(b, `,"usage":`...)
		b = appendUsageCounts(b, c.j.promptTokens, to)
		b = append(b, '}')
	}
	if last && !c.j.includeUsage {
		b = append(b, `,"system_fingerprint":`...)
		b = append(b, c.e.fingerprint...)
	}
	return append(b, "}\n\n"...)
}

func (c *completionEncoder) end(b []byte) []byte {
	if c.j.includeUsage {
		n, _ := totals(c.choices)
		b = c.e.appendUsageChunk(b, c.head, c.j.promptTokens, n, 0, false)
	}
	return append(b, "data: [DONE]\n\n"...)
}

func (c *completionEncoder) body(b []byte) []byte {
	b = append(b, c.head...)
	b = append(b, `"choices":[`...)
	for i, ch := range c.choices {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"index":`...)
		b = strconv.AppendInt(b, int64(ch.index), 10)
		b = append(b, `,"text":`...)
		b = appendJSONString(b, ch.contentText())
		b = append(b, `,"logprobs":null,"finish_reason":"`...)
		b = append(b, ch.finish...)
		b = append(b, `","stop_reason":null,"token_ids":null,"prompt_logprobs":null,"prompt_token_ids":null,"routed_experts":null}`...)
	}
	n, _ := totals(c.choices)
	b = append(b, `],"service_tier":null,"system_fingerprint":`...)
	b = append(b, c.e.fingerprint...)
	b = append(b, `,"usage":`...)
	b = appendUsageCounts(b, c.j.promptTokens, n)
	return append(b, `,"prompt_tokens_details":null,"completion_tokens_details":null},"kv_transfer_params":null,"ec_transfer_params":null,"metrics":null}`...)
}

// totals returns the completion and reasoning tokens of all choices.
func totals(choices []*choice) (n, reasoning int) {
	for _, c := range choices {
		n += c.total()
		reasoning += c.reasoning
	}
	return n, reasoning
}

// appendUsageChunk appends the last event of a stream that asked for usage
// (stream_options.include_usage): no choices, the token counts (with the
// reasoning tokens when withReasoning), the system fingerprint.
func (e *Engine) appendUsageChunk(b, head []byte, prompt, completion, reasoning int, withReasoning bool) []byte {
	b = append(b, "data: "...)
	b = append(b, head...)
	b = append(b, `"choices":[],"usage":`...)
	b = appendUsageCounts(b, prompt, completion)
	if withReasoning {
		b = append(b, `,"completion_tokens_details":{"reasoning_tokens":`...)
		b = strconv.AppendInt(b, int64(reasoning), 10)
		b = append(b, '}')
	}
	b = append(b, `},"system_fingerprint":`...)
	b = append(b, e.fingerprint...)
	return append(b, "}\n\n"...)
}

// appendUsageCounts appends an open UsageInfo object with its three counts,
// in the model's order: {"prompt_tokens":…,"total_tokens":…,"completion_tokens":…
func appendUsageCounts(b []byte, prompt, completion int) []byte {
	b = append(b, `{"prompt_tokens":`...)
	b = strconv.AppendInt(b, int64(prompt), 10)
	b = append(b, `,"total_tokens":`...)
	b = strconv.AppendInt(b, int64(prompt+completion), 10)
	b = append(b, `,"completion_tokens":`...)
	return strconv.AppendInt(b, int64(completion), 10)
}

func appendHex64(b []byte, v uint64) []byte {
	const digits = "0123456789abcdef"
	for shift := 60; shift >= 0; shift -= 4 {
		b = append(b, digits[(v>>uint(shift))&0xf])
	}
	return b
}
