package sim

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strconv"
	"time"
)

// /v1/messages, Anthropic's Messages API as vLLM serves it: the request is
// turned into a chat request (system first, tool results as tool messages,
// tool_choice any → required, tool → named) and the chat answer converted
// back. A stream is vLLM's conversion of its own chat stream with
// continuous usage: message_start (input tokens) with the first token,
// content_block_start / _delta / _stop per block (thinking, text, tool_use),
// message_delta with the stop reason and usage, message_stop, then
// "data: [DONE]". Events are model_dump_json(exclude_unset=True), so
// message_start's message has no type or role; the JSON answer is
// model_dump(exclude_none=True). Errors raised while serving come in
// Anthropic's shape ({"type":"error","error":{…}}); validation errors keep
// vLLM's OpenAI shape, as the global handler writes them.
//
//   - vllm/entrypoints/anthropic/protocol.py@82df3f49,
//   - vllm/entrypoints/anthropic/serving.py@82df3f49 (message_stream_converter,
//     messages_full_converter),
//   - vllm/entrypoints/anthropic/api_router.py@42fa4c09.
//
// One difference: that vLLM forwards a tool call's argument pieces only when
// they come in the same chunk as the call's id, which with most tool
// parsers means never; the simulator sends every piece as an
// input_json_delta, which is what Anthropic clients need.

var messagesSpecs = []fspec{
	{name: "model", typ: tStr, required: true},
	{name: "messages", typ: tList, required: true},
	{name: "max_tokens", typ: tInt, required: true},
	{name: "metadata", typ: tDict, nullable: true},
	{name: "stop_sequences", typ: tList, nullable: true},
	{name: "stream", typ: tBool, nullable: true},
	{name: "system", typ: tAny},
	{name: "temperature", typ: tFloat, nullable: true},
	{name: "tool_choice", typ: tModel, nullable: true, model: "AnthropicToolChoice"},
	{name: "tools", typ: tList, nullable: true},
	{name: "top_k", typ: tInt, nullable: true},
	{name: "top_p", typ: tFloat, nullable: true},
}

// countTokensSpecs are AnthropicCountTokensRequest's fields: a Messages
// request's prompt, no generation parameters (protocol.py).
var countTokensSpecs = []fspec{
	{name: "model", typ: tStr, required: true},
	{name: "messages", typ: tList, required: true},
	{name: "system", typ: tAny},
	{name: "tool_choice", typ: tModel, nullable: true, model: "AnthropicToolChoice"},
	{name: "tools", typ: tList, nullable: true},
	{name: "chat_template_kwargs", typ: tDict, nullable: true},
}

// handlePostCountTokens is /v1/messages/count_tokens: the request's prompt
// read as /v1/messages reads it, its tokens counted as that prompt's
// (ChatPromptTokens), answered as AnthropicCountTokensResponse,
// {"input_tokens":n,"context_management":{"original_input_tokens":n}},
// with no usage (vllm/entrypoints/anthropic/serving.py, count_tokens;
// api_router.py: errors in Anthropic's shape).
func (e *Engine) handlePostCountTokens(w http.ResponseWriter, r *http.Request) {
	body, aerr := readJSONRequest(w, r)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	j, aerr := e.readMessages(body, true)
	if aerr != nil {
		if aerr.typ != "Bad Request" {
			writeAnthropicError(w, aerr)
		} else {
			writeError(w, aerr)
		}
		return
	}
	n := strconv.Itoa(j.promptTokens)
	writeJSON(w, http.StatusOK, []byte(`{"input_tokens":`+n+`,"context_management":{"original_input_tokens":`+n+`}}`))
}

func (e *Engine) handlePostMessages(w http.ResponseWriter, r *http.Request) {
	arrived := time.Now()
	body, aerr := readJSONRequest(w, r)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	j, aerr := e.parseMessages(body)
	if aerr != nil {
		if aerr.typ != "Bad Request" {
			writeAnthropicError(w, aerr)
		} else {
			writeError(w, aerr)
		}
		return
	}
	choices := e.plan(j)
	e.serveGeneration(w, r, j, choices, e.newMessagesEncoder(r, j, choices), arrived)
}

// writeAnthropicError answers in AnthropicErrorResponse's shape.
func writeAnthropicError(w http.ResponseWriter, aerr *apiError) {
	b := append([]byte(nil), `{"type":"error","error":{"type":`...)
	b = appendJSONString(b, aerr.typ)
	b = append(b, `,"message":`...)
	b = appendJSONString(b, aerr.msg)
	writeJSON(w, aerr.status, append(b, "}}"...))
}

func (e *Engine) parseMessages(body []byte) (*job, *apiError) {
	return e.readMessages(body, false)
}

// readMessages reads a Messages request: a generation, or (count) the
// prompt alone of a count_tokens request.
func (e *Engine) readMessages(body []byte, count bool) (*job, *apiError) {
	rd, aerr := readJSONBody(body)
	if aerr != nil {
		return nil, aerr
	}
	if count {
		rd.check(countTokensSpecs)
	} else {
		rd.check(messagesSpecs)
	}
	// Field validators: a non-empty model, a positive max_tokens.
	if m, ok := rd.str("model"); ok && m == "" {
		rd.errs = append(rd.errs, pyErr{typ: "value_error", loc: "body.model", msg: "Value error, Model is required", input: "",
			ctx: "{'error': ValueError('Model is required')}"})
	}
	if v, ok := rd.int("max_tokens"); ok && v <= 0 {
		rd.errs = append(rd.errs, pyErr{typ: "value_error", loc: "body.max_tokens", msg: "Value error, max_tokens must be positive",
			input: strconv.FormatInt(v, 10), ctx: "{'error': ValueError('max_tokens must be positive')}"})
	}
	contents, afterTool := rd.readAnthropicMessages()
	tools := rd.checkTools("tools", false)
	if len(rd.errs) > 0 {
		return nil, validationError(rd.errs)
	}
	if sys := anthropicSystem(rd.raw["system"]); sys != "" {
		contents = append([]string{sys}, contents...)
	}
	model, _ := rd.str("model")
	if aerr := e.checkModel(model); aerr != nil {
		return nil, aerr
	}
	if len(contents) == 0 {
		return nil, badRequest("messages", "messages must contain at least one message")
	}
	j := &job{ep: epMessages, promptTokens: ChatPromptTokens(contents...), n: 1, reasons: true, afterTool: afterTool}
	h := uint32(fnvOffset)
	for _, c := range contents {
		h = fnvString(h, c)
	}
	j.hash = h
	j.tools = tools
	if count {
		return j, nil
	}
	maxTokens, _ := rd.int("max_tokens")
	limit := int(maxTokens)
	if aerr := e.fitContext(j, &limit, "max_tokens", false); aerr != nil {
		return nil, aerr
	}
	if j.stream = rd.bool("stream"); j.stream {
		j.includeUsage, j.continuousUsage = true, true
	}
	j.toolMode = toolNone
	if len(tools) > 0 {
		j.toolMode = toolAuto
		var tc struct {
			Type string `json:"type"`
			Name string `json:"name"`
		}
		if raw := rd.rawVal("tool_choice"); raw != nil && json.Unmarshal(raw, &tc) == nil {
			switch tc.Type {
			case "any":
				j.toolMode = toolRequired
			case "tool":
				j.toolMode, j.toolName = toolNamed, tc.Name
			}
		}
	}
	return j, nil
}

// readAnthropicMessages returns the texts of the messages (text blocks and
// tool results) and whether the last message carries a tool result.
func (r *reader) readAnthropicMessages() ([]string, bool) {
	var items []json.RawMessage
	if json.Unmarshal(r.rawVal("messages"), &items) != nil {
		return nil, false
	}
	var out []string
	afterTool := false
	for i, it := range items {
		var m struct {
			Role    *string         `json:"role"`
			Content json.RawMessage `json:"content"`
		}
		loc := "body.messages." + strconv.Itoa(i)
		if !isObject(it) || json.Unmarshal(it, &m) != nil {
			r.errs = append(r.errs, pyErr{typ: "model_type", loc: loc, msg: "Input should be a valid dictionary or instance of AnthropicMessage", input: summarize(it)})
			continue
		}
		if m.Role == nil || (*m.Role != "user" && *m.Role != "assistant") {
			r.errs = append(r.errs, pyErr{typ: "literal_error", loc: loc + ".role", msg: "Input should be 'user' or 'assistant'", input: summarize(jsonOrNull(it, "role"))})
			continue
		}
		afterTool = false
		if s, ok := asString(m.Content); ok {
			out = append(out, s)
			continue
		}
		var blocks []struct {
			Type    string          `json:"type"`
			Text    string          `json:"text"`
			Content json.RawMessage `json:"content"`
		}
		if json.Unmarshal(m.Content, &blocks) != nil {
			r.errs = append(r.errs, pyErr{typ: "string_type", loc: loc + ".content", msg: "Input should be a valid string", input: summarize(m.Content)})
			continue
		}
		var text []byte
		for _, bl := range blocks {
			switch bl.Type {
			case "text":
				text = append(text, bl.Text...)
			case "tool_result":
				out = append(out, contentText(bl.Content))
				afterTool = *m.Role == "user"
			}
		}
		if len(text) > 0 {
			out = append(out, string(text))
		}
	}
	return out, afterTool
}

func jsonOrNull(obj json.RawMessage, key string) json.RawMessage {
	var m map[string]json.RawMessage
	_ = json.Unmarshal(obj, &m)
	if v, ok := m[key]; ok {
		return v
	}
	return json.RawMessage("null")
}

// anthropicSystem returns the system prompt: a string, or its text blocks.
func anthropicSystem(raw json.RawMessage) string {
	if s, ok := asString(raw); ok {
		return s
	}
	return contentText(raw)
}

// messagesEncoder renders /v1/messages answers.
type messagesEncoder struct {
	e     *Engine
	j     *job
	c     *choice
	id    string
	block int     // index of the open content block, -1 when none
	kind  tokKind // the open block's kind
	sig   string  // the thinking block's signature
}

func (e *Engine) newMessagesEncoder(r *http.Request, j *job, choices []*choice) *messagesEncoder {
	return &messagesEncoder{e: e, j: j, c: choices[0], id: "chatcmpl-" + requestID(r), block: -1, sig: randomHex()}
}

func (m *messagesEncoder) mediaType() string    { return "application/json" }
func (m *messagesEncoder) open(b []byte) []byte { return b }

// sseEvent starts an SSE event of type typ and opens its data line.
func sseEvent(b []byte, typ string) []byte {
	b = append(b, "event: "...)
	b = append(b, typ...)
	b = append(b, "\ndata: "...)
	return b
}

func (m *messagesEncoder) first(b []byte) []byte {
	b = sseEvent(b, "message_start")
	b = append(b, `{"type":"message_start","message":{"id":`...)
	b = appendJSONString(b, m.id)
	b = append(b, `,"content":[],"model":`...)
	b = append(b, m.e.modelJSON...)
	b = append(b, `,"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":`...)
	b = strconv.AppendInt(b, int64(m.j.promptTokens), 10)
	return append(b, `,"output_tokens":0}}}`+"\n\n"...)
}

func (m *messagesEncoder) token(b []byte, c *choice, k int) []byte {
	kind := c.kind(k)
	switch kind {
	case kReasoning, kContent:
		if m.block < 0 || m.kind != kind {
			b = m.stopBlock(b)
			b = m.startBlock(b, kind, func(b []byte) []byte {
				if kind == kReasoning {
					return append(b, `{"type":"thinking","thinking":""}`...)
				}
				return append(b, `{"type":"text","text":""}`...)
			})
		}
		b = m.delta(b)
		if kind == kReasoning {
			b = append(b, `{"type":"thinking_delta","thinking":`...)
		} else {
			b = append(b, `{"type":"text_delta","text":`...)
		}
		b = appendJSONString(b, c.text(k))
		return m.endDelta(b)
	case kToolName:
		b = m.stopBlock(b)
		return m.startBlock(b, kind, func(b []byte) []byte {
			b = append(b, `{"type":"tool_use","id":`...)
			b = appendJSONString(b, c.call.id)
			b = append(b, `,"name":`...)
			b = appendJSONString(b, c.call.name)
			return append(b, `,"input":{}}`...)
		})
	case kToolArgs:
		b = m.delta(b)
		b = append(b, `{"type":"input_json_delta","partial_json":`...)
		b = appendJSONString(b, c.text(k))
		return m.endDelta(b)
	}
	return b
}

func (m *messagesEncoder) startBlock(b []byte, kind tokKind, block func([]byte) []byte) []byte {
	m.block++
	m.kind = kind
	b = sseEvent(b, "content_block_start")
	b = append(b, `{"type":"content_block_start","content_block":`...)
	b = block(b)
	b = append(b, `,"index":`...)
	b = strconv.AppendInt(b, int64(m.block), 10)
	return append(b, "}\n\n"...)
}

func (m *messagesEncoder) delta(b []byte) []byte {
	b = sseEvent(b, "content_block_delta")
	return append(b, `{"type":"content_block_delta","delta":`...)
}

func (m *messagesEncoder) endDelta(b []byte) []byte {
	b = append(b, `},"index":`...)
	b = strconv.AppendInt(b, int64(m.block), 10)
	return append(b, "}\n\n"...)
}

// stopBlock ends the open block; a thinking block gets its signature
// first.
func (m *messagesEncoder) stopBlock(b []byte) []byte {
	if m.block < 0 || m.kind == kEOS {
		return b
	}
	if m.kind == kReasoning {
		b = m.delta(b)
		b = append(b, `{"type":"signature_delta","signature":`...)
		b = appendJSONString(b, m.sig)
		b = m.endDelta(b)
	}
	b = sseEvent(b, "content_block_stop")
	b = append(b, `{"type":"content_block_stop","index":`...)
	b = strconv.AppendInt(b, int64(m.block), 10)
	m.kind = kEOS // closed
	return append(b, "}\n\n"...)
}

// stopReason maps a finish reason as vLLM's stop_reason_map does.
func stopReason(finish string) string {
	switch finish {
	case "length":
		return "max_tokens"
	case "tool_calls":
		return "tool_use"
	}
	return "end_turn"
}

func (m *messagesEncoder) end(b []byte) []byte {
	b = m.stopBlock(b)
	b = sseEvent(b, "message_delta")
	b = append(b, `{"type":"message_delta","delta":{"stop_reason":"`...)
	b = append(b, stopReason(m.c.finish)...)
	b = append(b, `"},"usage":{"input_tokens":`...)
	b = strconv.AppendInt(b, int64(m.j.promptTokens), 10)
	b = append(b, `,"output_tokens":`...)
	b = strconv.AppendInt(b, int64(m.c.total()), 10)
	b = append(b, "}}\n\n"...)
	b = sseEvent(b, "message_stop")
	b = append(b, `{"type":"message_stop"}`+"\n\n"...)
	return append(b, "data: [DONE]\n\n"...)
}

func (m *messagesEncoder) body(b []byte) []byte {
	c := m.c
	b = append(b, `{"id":`...)
	b = appendJSONString(b, m.id)
	b = append(b, `,"type":"message","role":"assistant","content":[`...)
	n := 0
	sep := func(b []byte) []byte {
		if n++; n > 1 {
			return append(b, ',')
		}
		return b
	}
	if c.reasoning > 0 {
		b = sep(b)
		b = append(b, `{"type":"thinking","thinking":`...)
		b = appendJSONString(b, c.reasoningText())
		b = append(b, `,"signature":`...)
		b = appendJSONString(b, m.sig)
		b = append(b, '}')
	}
	if text := c.contentText(); text != "" {
		b = sep(b)
		b = append(b, `{"type":"text","text":`...)
		b = appendJSONString(b, text)
		b = append(b, '}')
	}
	if c.call != nil {
		b = sep(b)
		b = append(b, `{"type":"tool_use","id":`...)
		b = appendJSONString(b, c.call.id)
		b = append(b, `,"name":`...)
		b = appendJSONString(b, c.call.name)
		b = append(b, `,"input":`...)
		var in bytes.Buffer
		if json.Compact(&in, []byte(c.args())) != nil || !isObject(in.Bytes()) {
			in.Reset()
			in.WriteString("{}")
		}
		b = append(b, in.Bytes()...)
		b = append(b, '}')
	}
	b = append(b, `],"model":`...)
	b = append(b, m.e.modelJSON...)
	b = append(b, `,"stop_reason":"`...)
	b = append(b, stopReason(c.finish)...)
	b = append(b, `","usage":{"input_tokens":`...)
	b = strconv.AppendInt(b, int64(m.j.promptTokens), 10)
	b = append(b, `,"output_tokens":`...)
	b = strconv.AppendInt(b, int64(c.total()), 10)
	return append(b, "}}"...)
}
