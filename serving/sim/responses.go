package sim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"
)

// /v1/responses, the OpenAI Responses API as vLLM serves it for a model
// without harmony: one answer (a reasoning item when the engine has a
// reasoning phase, then a message or one function call), as JSON or as SSE
// events ("event: <type>" and a data line, no [DONE]).
//
//   - request and response models: vllm/entrypoints/openai/responses/protocol.py@c0bc5965
//     (ResponsesRequest, ResponsesResponse, ResponseUsage);
//   - serving: responses/serving.py@0001948b (responses_full_generator,
//     responses_stream_generator: response.created and response.in_progress
//     before generation, sequence numbers from 0, response.completed last,
//     status "incomplete" with incomplete_details.reason "max_output_tokens"
//     when the cap ended the answer);
//   - events and item ids (msg_, fc_, call_): responses/streaming_events.py@0d4d80b9;
//   - event and item fields, in order: openai-python's types
//     (src/openai/types/responses/*.py), written with model_dump_json().
//
// The request's tools, metadata, text and reasoning are echoed as sent
// (compacted), where vLLM echoes them re-serialized with every default.

// responsesRequest is what the answer echoes of the request.
type responsesRequest struct {
	id                                   string
	instructions, metadata, toolChoice   json.RawMessage
	tools, maxToolCalls, reasoning, text json.RawMessage
	user, serviceTier, truncation        json.RawMessage
	temperature, topP                    float64
	parallelToolCalls, background        bool
}

var responsesSpecs = []fspec{
	{name: "background", typ: tBool, nullable: true},
	{name: "include", typ: tList, nullable: true},
	{name: "input", typ: tAny, required: true},
	{name: "instructions", typ: tStr, nullable: true},
	{name: "max_output_tokens", typ: tInt, nullable: true},
	{name: "max_tool_calls", typ: tInt, nullable: true},
	{name: "metadata", typ: tDict, nullable: true},
	{name: "model", typ: tStr, nullable: true},
	{name: "logit_bias", typ: tDict, nullable: true},
	{name: "parallel_tool_calls", typ: tBool, nullable: true},
	{name: "previous_response_id", typ: tStr, nullable: true},
	{name: "reasoning", typ: tDict, nullable: true},
	{name: "service_tier", typ: tStr},
	{name: "store", typ: tBool, nullable: true},
	{name: "stream", typ: tBool, nullable: true},
	{name: "temperature", typ: tFloat, nullable: true},
	{name: "text", typ: tDict, nullable: true},
	{name: "tool_choice", typ: tAny},
	{name: "tools", typ: tList},
	{name: "top_logprobs", typ: tInt, nullable: true},
	{name: "top_p", typ: tFloat, nullable: true},
	{name: "top_k", typ: tInt, nullable: true},
	{name: "truncation", typ: tStr, nullable: true},
	{name: "user", typ: tStr, nullable: true},
}

func (e *Engine) handlePostResponses(w http.ResponseWriter, r *http.Request) {
	arrived := time.Now()
	body, aerr := readJSONRequest(w, r)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	j, aerr := e.parseResponses(body)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	choices := e.plan(j)
	e.serveGeneration(w, r, j, choices, e.newResponsesEncoder(j, choices), arrived)
}

func (e *Engine) parseResponses(body []byte) (*job, *apiError) {
	rd, aerr := readJSONBody(body)
	if aerr != nil {
		return nil, aerr
	}
	// ResponsesRequest's model validators on the raw body.
	if p, ok := rd.raw["prompt"]; ok && !isNull(p) {
		return nil, valueError(rd, "prompt template is not supported", "prompt")
	}
	if rd.truthy("background") {
		if s, ok := rd.raw["store"]; ok && !rd.truthy("store") && !isNull(s) {
			return nil, validationError([]pyErr{{typ: "value_error", loc: "body",
				msg: "Value error, background can only be used when `store` is true", input: rd.summary(),
				ctx: "{'error': ValueError('background can only be used when `store` is true')}"}})
		}
	}
	rd.check(responsesSpecs)
	contents, afterTool := rd.readResponsesInput()
	tools := rd.checkTools("tools", false)
	if len(rd.errs) > 0 {
		return nil, validationError(rd.errs)
	}
	model, _ := rd.str("model")
	if aerr := e.checkModel(model); aerr != nil {
		return nil, aerr
	}
	if id, ok := rd.str("previous_response_id"); ok {
		// vLLM stores no responses unless VLLM_ENABLE_RESPONSES_API_STORE=1.
		return nil, &apiError{status: http.StatusNotFound, typ: "invalid_request_error", param: "response_id",
			msg: fmt.Sprintf("Response with id '%s' not found.", id)}
	}
	if _, set := rd.raw["store"]; rd.bool("background") && (!set || rd.bool("store")) {
		return nil, &apiError{status: http.StatusBadRequest, typ: "invalid_request_error", param: "background",
			msg: "This vLLM engine does not support `store=True` and therefore does not support the background mode. To enable these features, set the environment variable `VLLM_ENABLE_RESPONSES_API_STORE=1` when launching the vLLM server."}
	}
	if instr, ok := rd.str("instructions"); ok {
		contents = append([]string{instr}, contents...)
	}
	j := &job{ep: epResponses, promptTokens: ChatPromptTokens(contents...), n: 1, reasons: true, afterTool: afterTool}
	h := uint32(fnvOffset)
	for _, c := range contents {
		h = fnvString(h, c)
	}
	j.hash = h
	if j.promptTokens >= e.cfg.MaxModelLen {
		return nil, &apiError{status: http.StatusBadRequest, typ: "invalid_request_error", param: "input",
			msg: fmt.Sprintf("The engine prompt length %d exceeds the max_model_len %d. Please reduce prompt.", j.promptTokens, e.cfg.MaxModelLen)}
	}
	j.limit = min(e.cfg.DefaultMaxTokens, e.cfg.MaxModelLen-j.promptTokens)
	if v, ok := rd.int("max_output_tokens"); ok {
		if v < 1 {
			return nil, badRequest("max_output_tokens", fmt.Sprintf("max_tokens must be at least 1, got %d.", v))
		}
		j.limit = min(int(v), e.cfg.MaxModelLen-j.promptTokens)
	}
	j.stream = rd.bool("stream")
	j.tools = tools
	j.toolMode, j.toolName = chatToolChoice(rd, tools)
	req := &responsesRequest{
		id:                "resp_" + randomHex(),
		instructions:      rd.raw["instructions"],
		metadata:          rd.raw["metadata"],
		toolChoice:        rd.raw["tool_choice"],
		tools:             rd.raw["tools"],
		maxToolCalls:      rd.raw["max_tool_calls"],
		reasoning:         rd.raw["reasoning"],
		text:              rd.raw["text"],
		user:              rd.raw["user"],
		serviceTier:       rd.raw["service_tier"],
		truncation:        rd.raw["truncation"],
		temperature:       1,
		topP:              1,
		parallelToolCalls: true,
		background:        rd.bool("background"),
	}
	if v, ok := rd.float("temperature"); ok {
		req.temperature = v
	}
	if v, ok := rd.float("top_p"); ok {
		req.topP = v
	}
	if _, ok := rd.vals["parallel_tool_calls"]; ok {
		req.parallelToolCalls = rd.bool("parallel_tool_calls")
	}
	j.resp = req
	return j, nil
}

// readResponsesInput returns the texts of the input's messages and tool
// outputs, and whether the input ends with a tool output.
func (r *reader) readResponsesInput() ([]string, bool) {
	v, ok := r.raw["input"]
	if !ok {
		return nil, false
	}
	if s, ok := asString(v); ok {
		return []string{s}, false
	}
	var items []json.RawMessage
	if len(v) == 0 || v[0] != '[' || json.Unmarshal(v, &items) != nil {
		r.errs = append(r.errs,
			pyErr{typ: "string_type", loc: "body.input", msg: "Input should be a valid string", input: summarize(v)},
			pyErr{typ: "list_type", loc: "body.input", msg: "Input should be a valid list", input: summarize(v)})
		return nil, false
	}
	var out []string
	afterTool := false
	for _, it := range items {
		var item struct {
			Type    string          `json:"type"`
			Role    string          `json:"role"`
			Content json.RawMessage `json:"content"`
			Output  json.RawMessage `json:"output"`
		}
		if json.Unmarshal(it, &item) != nil {
			continue
		}
		afterTool = item.Type == "function_call_output"
		switch {
		case afterTool:
			out = append(out, contentText(item.Output))
		case item.Role != "":
			out = append(out, contentText(item.Content))
		}
	}
	return out, afterTool
}

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
