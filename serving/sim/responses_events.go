package sim

import (
	"bytes"
	"encoding/json"
	"strconv"
	"time"
)

// The /v1/responses answer: the ResponsesResponse object and its SSE
// events (see responses.go for the sources they follow).

// responsesEncoder renders /v1/responses answers.
type responsesEncoder struct {
	e   *Engine
	j   *job
	c   *choice
	req *responsesRequest
	seq int // the next event's sequence_number

	created  int64
	itemIDs  [3]string // reasoning, message, function call
	callID   string
	outIndex int     // output_index of the open item
	opened   bool    // an item was opened (and is open until closeItem)
	openKind tokKind // the open item: kReasoning, kContent or kToolName
}

func (e *Engine) newResponsesEncoder(j *job, choices []*choice) *responsesEncoder {
	return &responsesEncoder{
		e: e, j: j, c: choices[0], req: j.resp, created: time.Now().Unix(),
		itemIDs: [3]string{"msg_" + randomHex(), "msg_" + randomHex(), "fc_" + randomHex()},
		callID:  "call_" + randomHex(),
	}
}

func (x *responsesEncoder) mediaType() string { return "application/json" }

// event starts an SSE event of type typ and returns b with its data line
// opened; the caller appends the payload's fields up to sequence_number.
func (x *responsesEncoder) event(b []byte, typ string) []byte {
	b = append(b, "event: "...)
	b = append(b, typ...)
	return append(b, "\ndata: {"...)
}

// close ends the payload with sequence_number and type.
func (x *responsesEncoder) close(b []byte, typ string) []byte {
	b = x.seqField(b)
	b = append(b, `"type":"`...)
	b = append(b, typ...)
	return append(b, "\"}\n\n"...)
}

func (x *responsesEncoder) open(b []byte) []byte {
	for _, typ := range []string{"response.created", "response.in_progress"} {
		b = x.event(b, typ)
		b = append(b, `"response":`...)
		b = x.appendResponse(b, false)
		b = append(b, ',')
		b = x.close(b, typ)
	}
	return b
}

func (x *responsesEncoder) first(b []byte) []byte { return b }

func (x *responsesEncoder) token(b []byte, c *choice, k int) []byte {
	switch c.kind(k) {
	case kReasoning:
		if k == 0 {
			b = x.itemAdded(b, kReasoning)
			b = x.event(b, "response.reasoning_part.added")
			b = x.partHead(b, 0)
			b = append(b, `"part":{"text":"","type":"reasoning_text"},`...)
			b = x.close(b, "response.reasoning_part.added")
		}
		b = x.event(b, "response.reasoning_text.delta")
		b = append(b, `"content_index":0,"delta":`...)
		b = appendJSONString(b, c.text(k))
		b = append(b, `,"item_id":`...)
		b = appendJSONString(b, x.itemIDs[0])
		b = append(b, `,"output_index":`...)
		b = strconv.AppendInt(b, int64(x.outIndex), 10)
		b = append(b, ',')
		return x.close(b, "response.reasoning_text.delta")
	case kContent:
		if k == c.reasoning {
			b = x.closeItem(b)
			b = x.itemAdded(b, kContent)
			b = x.event(b, "response.content_part.added")
			b = x.partHead(b, 1)
			b = append(b, `"part":{"annotations":[],"text":"","type":"output_text","logprobs":[]},`...)
			b = x.close(b, "response.content_part.added")
		}
		b = x.event(b, "response.output_text.delta")
		b = append(b, `"content_index":0,"delta":`...)
		b = appendJSONString(b, c.text(k))
		b = append(b, `,"item_id":`...)
		b = appendJSONString(b, x.itemIDs[1])
		b = append(b, `,"logprobs":[],"output_index":`...)
		b = strconv.AppendInt(b, int64(x.outIndex), 10)
		b = append(b, ',')
		return x.close(b, "response.output_text.delta")
	case kToolName:
		b = x.closeItem(b)
		return x.itemAdded(b, kToolName)
	case kToolArgs:
		b = x.event(b, "response.function_call_arguments.delta")
		b = append(b, `"delta":`...)
		b = appendJSONString(b, c.text(k))
		b = append(b, `,"item_id":`...)
		b = appendJSONString(b, x.itemIDs[2])
		b = append(b, `,"output_index":`...)
		b = strconv.AppendInt(b, int64(x.outIndex), 10)
		b = append(b, ',')
		return x.close(b, "response.function_call_arguments.delta")
	}
	return b
}

// partHead appends content_index, item_id and output_index.
func (x *responsesEncoder) partHead(b []byte, item int) []byte {
	b = append(b, `"content_index":0,"item_id":`...)
	b = appendJSONString(b, x.itemIDs[item])
	b = append(b, `,"output_index":`...)
	b = strconv.AppendInt(b, int64(x.outIndex), 10)
	return append(b, ',')
}

// itemAdded opens an output item of kind: response.output_item.added.
func (x *responsesEncoder) itemAdded(b []byte, kind tokKind) []byte {
	if x.opened {
		x.outIndex++
	}
	x.opened, x.openKind = true, kind
	b = x.event(b, "response.output_item.added")
	b = append(b, `"item":`...)
	b = x.appendItem(b, kind, false)
	b = append(b, `,"output_index":`...)
	b = strconv.AppendInt(b, int64(x.outIndex), 10)
	b = append(b, ',')
	return x.close(b, "response.output_item.added")
}

// appendItem appends an output item of kind, in progress or done.
func (x *responsesEncoder) appendItem(b []byte, kind tokKind, done bool) []byte {
	switch kind {
	case kReasoning:
		return x.appendReasoningItem(b, done)
	case kContent:
		return x.appendMessageItem(b, done)
	}
	return x.appendCallItem(b, done)
}

// seqField appends the sequence_number field and a comma.
func (x *responsesEncoder) seqField(b []byte) []byte {
	b = append(b, `"sequence_number":`...)
	b = strconv.AppendInt(b, int64(x.seq), 10)
	x.seq++
	return append(b, ',')
}

// closeItem appends the events that end the open item, if any.
func (x *responsesEncoder) closeItem(b []byte) []byte {
	if !x.opened {
		return b
	}
	c := x.c
	switch x.openKind {
	case kReasoning:
		text := c.reasoningText()
		b = x.event(b, "response.reasoning_text.done")
		b = x.partHead(b, 0)
		b = x.seqField(b)
		b = append(b, `"text":`...)
		b = appendJSONString(b, text)
		b = append(b, `,"type":"response.reasoning_text.done"}`+"\n\n"...)
		b = x.event(b, "response.reasoning_part.done")
		b = x.partHead(b, 0)
		b = append(b, `"part":{"text":`...)
		b = appendJSONString(b, text)
		b = append(b, `,"type":"reasoning_text"},`...)
		b = x.close(b, "response.reasoning_part.done")
	case kContent:
		text := c.contentText()
		b = x.event(b, "response.output_text.done")
		b = append(b, `"content_index":0,"item_id":`...)
		b = appendJSONString(b, x.itemIDs[1])
		b = append(b, `,"logprobs":[],"output_index":`...)
		b = strconv.AppendInt(b, int64(x.outIndex), 10)
		b = append(b, ',')
		b = x.seqField(b)
		b = append(b, `"text":`...)
		b = appendJSONString(b, text)
		b = append(b, `,"type":"response.output_text.done"}`+"\n\n"...)
		b = x.event(b, "response.content_part.done")
		b = x.partHead(b, 1)
		b = append(b, `"part":`...)
		b = appendOutputText(b, text)
		b = append(b, ',')
		b = x.close(b, "response.content_part.done")
	default:
		b = x.event(b, "response.function_call_arguments.done")
		b = append(b, `"arguments":`...)
		b = appendJSONString(b, c.args())
		b = append(b, `,"item_id":`...)
		b = appendJSONString(b, x.itemIDs[2])
		b = append(b, `,"name":`...)
		b = appendJSONString(b, c.call.name)
		b = append(b, `,"output_index":`...)
		b = strconv.AppendInt(b, int64(x.outIndex), 10)
		b = append(b, ',')
		b = x.close(b, "response.function_call_arguments.done")
	}
	b = x.event(b, "response.output_item.done")
	b = append(b, `"item":`...)
	b = x.appendItem(b, x.openKind, true)
	b = append(b, `,"output_index":`...)
	b = strconv.AppendInt(b, int64(x.outIndex), 10)
	b = append(b, ',')
	return x.close(b, "response.output_item.done")
}

func (x *responsesEncoder) end(b []byte) []byte {
	b = x.closeItem(b)
	b = x.event(b, "response.completed")
	b = append(b, `"response":`...)
	b = x.appendResponse(b, true)
	b = append(b, ',')
	return x.close(b, "response.completed")
}

func (x *responsesEncoder) body(b []byte) []byte { return x.appendResponse(b, true) }

// appendReasoningItem appends a ResponseReasoningItem.
func (x *responsesEncoder) appendReasoningItem(b []byte, done bool) []byte {
	b = append(b, `{"id":`...)
	b = appendJSONString(b, x.itemIDs[0])
	b = append(b, `,"summary":[],"type":"reasoning","content":`...)
	if !done {
		return append(b, `null,"encrypted_content":null,"status":"in_progress"}`...)
	}
	b = append(b, `[{"text":`...)
	b = appendJSONString(b, x.c.reasoningText())
	return append(b, `,"type":"reasoning_text"}],"encrypted_content":null,"status":"completed"}`...)
}

// appendMessageItem appends a ResponseOutputMessage.
func (x *responsesEncoder) appendMessageItem(b []byte, done bool) []byte {
	b = append(b, `{"id":`...)
	b = appendJSONString(b, x.itemIDs[1])
	if !done {
		return append(b, `,"content":[],"role":"assistant","status":"in_progress","type":"message","phase":null}`...)
	}
	b = append(b, `,"content":[`...)
	b = appendOutputText(b, x.c.contentText())
	return append(b, `],"role":"assistant","status":"completed","type":"message","phase":null}`...)
}

// appendCallItem appends a ResponseFunctionToolCall.
func (x *responsesEncoder) appendCallItem(b []byte, done bool) []byte {
	b = append(b, `{"arguments":`...)
	status := "in_progress"
	if done {
		b = appendJSONString(b, x.c.args())
		status = "completed"
	} else {
		b = append(b, `""`...)
	}
	b = append(b, `,"call_id":`...)
	b = appendJSONString(b, x.callID)
	b = append(b, `,"name":`...)
	b = appendJSONString(b, x.c.call.name)
	b = append(b, `,"type":"function_call","id":`...)
	b = appendJSONString(b, x.itemIDs[2])
	b = append(b, `,"caller":null,"namespace":null,"status":"`...)
	b = append(b, status...)
	return append(b, `"}`...)
}

// appendOutputText appends a finished ResponseOutputText.
func appendOutputText(b []byte, text string) []byte {
	b = append(b, `{"annotations":[],"text":`...)
	b = appendJSONString(b, text)
	return append(b, `,"type":"output_text","logprobs":null}`...)
}

// appendResponse appends the ResponsesResponse: in progress and empty, or
// final with its output and usage.
func (x *responsesEncoder) appendResponse(b []byte, final bool) []byte {
	q, c := x.req, x.c
	status := "in_progress"
	if final {
		status = "completed"
		if c.finish == "length" {
			status = "incomplete"
		}
	}
	b = append(b, `{"id":`...)
	b = appendJSONString(b, q.id)
	b = append(b, `,"created_at":`...)
	b = strconv.AppendInt(b, x.created, 10)
	b = append(b, `,"incomplete_details":`...)
	if status == "incomplete" {
		b = append(b, `{"reason":"max_output_tokens"}`...)
	} else {
		b = append(b, "null"...)
	}
	b = append(b, `,"instructions":`...)
	b = appendRaw(b, q.instructions, "null")
	b = append(b, `,"metadata":`...)
	b = appendRaw(b, q.metadata, "null")
	b = append(b, `,"model":`...)
	b = append(b, x.e.modelJSON...)
	b = append(b, `,"object":"response","output":[`...)
	if final {
		n := 0
		if c.reasoning > 0 {
			b = x.appendReasoningItem(b, true)
			n++
		}
		if c.call != nil || c.content > 0 {
			if n > 0 {
				b = append(b, ',')
			}
			if c.call != nil {
				b = x.appendCallItem(b, true)
			} else {
				b = x.appendMessageItem(b, true)
			}
		}
	}
	b = append(b, `],"parallel_tool_calls":`...)
	b = strconv.AppendBool(b, q.parallelToolCalls)
	b = append(b, `,"temperature":`...)
	b = appendPyFloat(b, q.temperature)
	b = append(b, `,"tool_choice":`...)
	b = appendRaw(b, q.toolChoice, `"auto"`)
	b = append(b, `,"tools":`...)
	b = appendRaw(b, q.tools, "[]")
	b = append(b, `,"top_p":`...)
	b = appendPyFloat(b, q.topP)
	b = append(b, `,"background":`...)
	b = strconv.AppendBool(b, q.background)
	b = append(b, `,"max_output_tokens":`...)
	b = strconv.AppendInt(b, int64(x.j.limit), 10)
	b = append(b, `,"max_tool_calls":`...)
	b = appendRaw(b, q.maxToolCalls, "null")
	b = append(b, `,"previous_response_id":null,"prompt":null,"reasoning":`...)
	b = appendRaw(b, q.reasoning, "null")
	b = append(b, `,"service_tier":`...)
	b = appendRaw(b, q.serviceTier, `"auto"`)
	b = append(b, `,"status":"`...)
	b = append(b, status...)
	b = append(b, `","text":`...)
	b = appendRaw(b, q.text, "null")
	b = append(b, `,"top_logprobs":null,"truncation":`...)
	b = appendRaw(b, q.truncation, `"disabled"`)
	b = append(b, `,"usage":`...)
	if final {
		b = x.appendUsage(b)
	} else {
		b = append(b, "null"...)
	}
	b = append(b, `,"user":`...)
	b = appendRaw(b, q.user, "null")
	return append(b, `,"input_messages":null,"output_messages":null}`...)
}

// appendUsage appends ResponseUsage for the one turn.
func (x *responsesEncoder) appendUsage(b []byte) []byte {
	p, n := int64(x.j.promptTokens), int64(x.c.total())
	b = append(b, `{"input_tokens":`...)
	b = strconv.AppendInt(b, p, 10)
	b = append(b, `,"input_tokens_details":{"cached_tokens":0,"input_tokens_per_turn":[`...)
	b = strconv.AppendInt(b, p, 10)
	b = append(b, `],"cached_tokens_per_turn":[0]},"output_tokens":`...)
	b = strconv.AppendInt(b, n, 10)
	b = append(b, `,"output_tokens_details":{"reasoning_tokens":`...)
	b = strconv.AppendInt(b, int64(x.c.reasoning), 10)
	b = append(b, `,"tool_output_tokens":0,"output_tokens_per_turn":[`...)
	b = strconv.AppendInt(b, n, 10)
	b = append(b, `],"tool_output_tokens_per_turn":[0]},"total_tokens":`...)
	b = strconv.AppendInt(b, p+n, 10)
	return append(b, '}')
}

// appendRaw appends a request value compacted, or def when it is absent or
// null.
func appendRaw(b []byte, v json.RawMessage, def string) []byte {
	if len(v) == 0 || isNull(v) {
		return append(b, def...)
	}
	var buf bytes.Buffer
	if json.Compact(&buf, v) != nil {
		return append(b, def...)
	}
	return append(b, buf.Bytes()...)
}
