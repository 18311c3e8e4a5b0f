package sim

import (
	"encoding/json"
	"fmt"
	"net/http"
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
// text.format (json_schema, json_object) constrains the answer's text as
// chat's response_format does (readTextFormat, structured.go).
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
	{name: "structured_outputs", typ: tDict, nullable: true},
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
	if j.format, aerr = readTextFormat(rd); aerr != nil {
		return nil, aerr
	}
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
