package sim

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"strconv"
)

// Tool calls follow one documented rule, so tests can predict them:
//
//   - no tools, or tool_choice "none": the answer is text;
//   - tool_choice "required": the choice calls tools[hash % len(tools)];
//   - a named tool_choice: the choice calls that function, and finishes
//     with "stop" as vLLM does for named calls;
//   - "auto" (the default when tools are given): the choice calls
//     tools[hash % len(tools)] unless the conversation ends with a tool
//     result, which it answers in text: an agent loop of call, result,
//     answer terminates.
//
// hash is the prompt's hash for choice 0 (and a mix of it for the others).
// The arguments are a value of the tool's parameters schema, written by
// the schema filler (schema.go): every required property and optional
// ones up to four, in schema order; words for strings, numbers for
// integers and numbers, true or false for booleans.

type toolMode uint8

const (
	toolNone toolMode = iota
	toolAuto
	toolRequired
	toolNamed
)

// toolDef is one function a request offers.
type toolDef struct {
	name   string
	params json.RawMessage // the JSON schema, nil if none
}

// toolCall is one call a choice makes: the delta with its name, then its
// arguments in pieces of at most four bytes (one token each).
type toolCall struct {
	id     string // "chatcmpl-tool-…", vLLM's make_tool_call_id
	name   string
	args   string
	pieces []string
}

// checkToolUsage is ChatCompletionRequest.check_tool_usage
// (vllm/entrypoints/openai/chat_completion/protocol.py@002032ee): a model
// validator on the raw body.
func checkToolUsage(r *reader) *apiError {
	tools, hasTools := r.raw["tools"]
	if hasTools && bytes.Equal(bytes.TrimSpace(tools), []byte("[]")) {
		return valueError(r, "`tools` must not be an empty array. Either provide at least one tool or omit the field entirely.", "tools")
	}
	tc, ok := r.raw["tool_choice"]
	if !ok || isNull(tc) {
		return nil
	}
	if s, _ := asString(tc); s == "none" {
		return nil
	}
	if !hasTools || isNull(tools) {
		return valueError(r, "When using `tool_choice`, `tools` must be set.", "tool_choice")
	}
	s, isStr := asString(tc)
	if isStr && (s == "auto" || s == "required") {
		return nil
	}
	if !isObject(tc) {
		return valueError(r, "Invalid value for `tool_choice`: "+pyStr(tc)+"! Only named tools, \"none\", \"auto\" or \"required\" are supported.", "tool_choice")
	}
	const usage = "Correct usage: `{\"type\": \"function\", \"function\": {\"name\": \"my_function\"}}`"
	var choice map[string]json.RawMessage
	_ = json.Unmarshal(tc, &choice)
	fn, ok := choice["function"]
	if !ok || !isObject(fn) {
		return valueError(r, "Invalid value for `function`: `"+pyStr(fn)+"` in `tool_choice`! "+usage, "tool_choice.function")
	}
	var f map[string]json.RawMessage
	_ = json.Unmarshal(fn, &f)
	name, ok := f["name"]
	if !ok {
		return valueError(r, "Expected field `name` in `function` in `tool_choice`! "+usage, "tool_choice.function.name")
	}
	if s, isStr := asString(name); !isStr || s == "" {
		return valueError(r, "Invalid `name` in `function`: `"+pyStr(name)+"` in `tool_choice`! "+usage, "tool_choice.function.name")
	}
	want, _ := asString(name)
	var list []struct {
		Function struct {
			Name string `json:"name"`
		} `json:"function"`
	}
	_ = json.Unmarshal(tools, &list)
	for _, t := range list {
		if t.Function.Name == want {
			return nil
		}
	}
	return valueError(r, "The tool specified in `tool_choice` does not match any of the specified `tools`", "tool_choice")
}

// pyStr is Python's str() of a JSON value, as an f-string prints it.
func pyStr(v json.RawMessage) string {
	if len(v) == 0 {
		return "None"
	}
	return summarize(v)
}

// checkTools validates a list of tools: chat's nested form
// ({"type":"function","function":{"name":…,"parameters":…}}) when nested,
// else the flat form of the Responses API and Anthropic's Messages API
// ({"name":…,"parameters"|"input_schema":…}).
func (r *reader) checkTools(field string, nested bool) []toolDef {
	raw := r.rawVal(field)
	if raw == nil {
		return nil
	}
	var items []json.RawMessage
	if json.Unmarshal(raw, &items) != nil {
		return nil
	}
	var out []toolDef
	for i, it := range items {
		loc := r.loc + "." + field + "." + strconv.Itoa(i)
		var obj map[string]json.RawMessage
		if !isObject(it) || json.Unmarshal(it, &obj) != nil {
			r.errs = append(r.errs, pyErr{typ: "model_type", loc: loc, msg: "Input should be a valid dictionary or object to extract fields from", input: summarize(it)})
			continue
		}
		if nested {
			fn, ok := obj["function"]
			if !ok {
				r.errs = append(r.errs, pyErr{typ: "missing", loc: loc + ".function", msg: "Field required", input: summarize(it)})
				continue
			}
			obj = nil
			if !isObject(fn) || json.Unmarshal(fn, &obj) != nil {
				r.errs = append(r.errs, pyErr{typ: "model_type", loc: loc + ".function", msg: "Input should be a valid dictionary or instance of FunctionDefinition", input: summarize(fn)})
				continue
			}
			loc += ".function"
		}
		name, ok := obj["name"]
		switch {
		case !ok:
			if t, _ := asString(obj["type"]); !nested && t != "" && t != "function" && t != "custom" {
				continue // a built-in tool (web_search, …): never called
			}
			r.errs = append(r.errs, pyErr{typ: "missing", loc: loc + ".name", msg: "Field required", input: "<dict of " + strconv.Itoa(len(obj)) + " items>"})
			continue
		case !isString(name):
			r.errs = append(r.errs, pyErr{typ: "string_type", loc: loc + ".name", msg: "Input should be a valid string", input: summarize(name)})
			continue
		}
		s, _ := asString(name)
		params := obj["parameters"]
		if params == nil {
			params = obj["input_schema"]
		}
		out = append(out, toolDef{name: s, params: params})
	}
	return out
}

// chatToolChoice reads a valid chat tool_choice.
func chatToolChoice(r *reader, tools []toolDef) (toolMode, string) {
	if len(tools) == 0 {
		return toolNone, ""
	}
	tc, ok := r.raw["tool_choice"]
	if !ok {
		return toolAuto, ""
	}
	if s, isStr := asString(tc); isStr {
		switch s {
		case "auto":
			return toolAuto, ""
		case "required":
			return toolRequired, ""
		}
		return toolNone, ""
	}
	var named struct {
		Function struct {
			Name string `json:"name"`
		} `json:"function"`
		Name string `json:"name"` // the Responses API's flat form
	}
	if isObject(tc) && json.Unmarshal(tc, &named) == nil {
		if named.Function.Name != "" {
			return toolNamed, named.Function.Name
		}
		if named.Name != "" {
			return toolNamed, named.Name
		}
	}
	return toolNone, ""
}

// pickTool returns the tool a choice with hash h calls, nil for a text
// answer.
func (j *job) pickTool(h uint32) *toolDef {
	switch {
	case len(j.tools) == 0:
		return nil
	case j.toolMode == toolNamed:
		for i := range j.tools {
			if j.tools[i].name == j.toolName {
				return &j.tools[i]
			}
		}
		return nil
	case j.toolMode == toolRequired, j.toolMode == toolAuto && !j.afterTool:
		return &j.tools[h%uint32(len(j.tools))]
	}
	return nil
}

// newToolCall makes the call of tool t for a choice with hash h.
func newToolCall(t *toolDef, h uint32) *toolCall {
	args := toolArguments(t.params, h)
	return &toolCall{id: "chatcmpl-tool-" + randomHex(), name: t.name, args: args, pieces: splitTokens(args)}
}

// toolArguments renders the arguments of a call: a value of the tool's
// parameters schema (see schema.go), as vLLM's guided decoding constrains
// them for tool_choice "required" and named calls; "{}" without a schema
// or with one the filler cannot satisfy.
func toolArguments(schema json.RawMessage, h uint32) string {
	if len(schema) == 0 || isNull(schema) {
		return "{}"
	}
	args, err := fillSchema(schema, h)
	if err != nil {
		return "{}"
	}
	return args
}

// randomHex returns 32 random hex digits, the length of vLLM's random_uuid.
func randomHex() string {
	b := make([]byte, 0, 32)
	b = appendHex64(b, rand.Uint64())
	b = appendHex64(b, rand.Uint64())
	return string(b)
}
