package sim

import (
	"encoding/json"
	"fmt"
	"unicode/utf8"
)

// Structured outputs: a chat, completions or responses request may
// constrain its text as vLLM's guided decoding does. The simulator reads
// the constraint where vLLM reads it and writes filler that satisfies it
// (see schema.go and regexfill.go):
//
//   - response_format {"type":"json_object"} and {"type":"json_schema",
//     "json_schema":{"name":…,"schema":…,"strict":…}}, on chat and on
//     completions: ChatCompletionRequest.to_sampling_params and
//     CompletionRequest.to_sampling_params turn them into
//     structured_outputs json_object / json
//     (vllm/entrypoints/openai/chat_completion/protocol.py@d5dba2d7 and
//     completion/protocol.py@d5dba2d7); they take precedence over a
//     structured_outputs the request also sets;
//   - text.format {"type":"json_schema"|"json_object", …} on responses
//     (readTextFormat);
//   - structured_outputs {"json"|"regex"|"choice"|"json_object": …}
//     (StructuredOutputsParams, vllm/sampling_params.py), at most one of
//     json, regex and choice, as check_structured_outputs_count requires;
//   - the fields vLLM took before structured_outputs (up to 0.11, removed
//     since): guided_json, guided_regex, guided_choice, guided_grammar,
//     read when structured_outputs is absent.
//
// grammar, guided_grammar and structural_tag are refused with a 400 that
// says so: the simulator cannot write filler for a grammar.
//
// The constrained text is cut into tokens of at most four bytes, the
// simulator's tokenizer, and ends with the end-of-sequence token: under a
// grammar that has finished, EOS is the only token a model may sample. A
// completion cap that leaves no room for the whole value ends the answer
// early with "length" and a cut-off value, as on vLLM.

type formatKind uint8

const (
	formatJSON formatKind = iota + 1 // a JSON schema
	formatJSONObject
	formatRegex
	formatChoice
)

// outputFormat is the constraint on a request's text.
type outputFormat struct {
	kind    formatKind
	schema  any // formatJSON: the decoded schema
	regex   string
	choices []string
}

// jsonObjectSchema is what json_object mode writes: any object will do,
// and a small one keeps within small completion caps.
var jsonObjectSchema = &jsonObject{
	keys: []string{"type", "properties", "required"},
	vals: map[string]any{
		"type":       "object",
		"properties": &jsonObject{keys: []string{"answer"}, vals: map[string]any{"answer": &jsonObject{vals: map[string]any{}}}},
		"required":   []any{"answer"},
	},
}

// fill returns the constrained text of a choice with hash h.
func (f *outputFormat) fill(h uint32) (string, error) {
	switch f.kind {
	case formatJSON:
		return fillDecoded(f.schema, h)
	case formatJSONObject:
		return fillDecoded(jsonObjectSchema, h)
	case formatRegex:
		return regexFill(f.regex, h)
	case formatChoice:
		return f.choices[h%uint32(len(f.choices))], nil
	}
	return "", nil
}

// readTextFormat reads a Responses request's constraint, nil when it has
// none, as ResponsesRequest.to_sampling_params does
// (vllm/entrypoints/openai/responses/protocol.py@010a69ce): text.format
// {"type":"json_schema","name","schema","strict"} becomes structured
// outputs json (a json_schema without a schema constrains nothing);
// structured_outputs is read as on chat; both at once is a 400 ("Cannot
// specify both structured_outputs and text.format"). One difference: that
// vLLM leaves text.format {"type":"json_object"} unconstrained, where the
// simulator writes an object, as chat's json_object does and as OpenAI's
// Responses API documents it — what a client asking for JSON mode reads.
func readTextFormat(r *reader) (*outputFormat, *apiError) {
	var text struct {
		Format *struct {
			Type   string          `json:"type"`
			Schema json.RawMessage `json:"schema"`
		} `json:"format"`
	}
	if raw, ok := r.raw["text"]; ok && !isNull(raw) {
		if json.Unmarshal(raw, &text) != nil {
			return nil, badRequest("text.format", "text.format must be an object such as {\"type\": \"json_schema\", \"name\": ..., \"schema\": {...}}")
		}
	}
	if text.Format == nil {
		return readOutputFormat(r)
	}
	if so, ok := r.raw["structured_outputs"]; ok && !isNull(so) {
		return nil, badRequest("text.format", "Cannot specify both structured_outputs and text.format")
	}
	var f *outputFormat
	switch text.Format.Type {
	case "json_schema":
		if len(text.Format.Schema) == 0 || isNull(text.Format.Schema) {
			return nil, nil
		}
		var aerr *apiError
		if f, aerr = schemaFormat(text.Format.Schema, "text.format.schema"); aerr != nil {
			return nil, aerr
		}
	case "json_object":
		f = &outputFormat{kind: formatJSONObject}
	default: // "text"
		return nil, nil
	}
	if _, err := f.fill(0); err != nil {
		return nil, badRequest("text.format.schema", err.Error())
	}
	return f, nil
}

// readOutputFormat reads a request's constraint, nil when it has none.
// The constraint is tried once here, so a schema or regex the simulator
// cannot satisfy is a 400 before the request is scheduled.
func readOutputFormat(r *reader) (*outputFormat, *apiError) {
	f, aerr := readResponseFormat(r)
	if aerr == nil && f == nil {
		f, aerr = readStructuredOutputs(r)
	}
	if aerr != nil || f == nil {
		return nil, aerr
	}
	if _, err := f.fill(0); err != nil {
		return nil, badRequest(f.param(), err.Error())
	}
	return f, nil
}

func (f *outputFormat) param() string {
	switch f.kind {
	case formatRegex:
		return "structured_outputs.regex"
	case formatChoice:
		return "structured_outputs.choice"
	}
	return "response_format"
}

// readResponseFormat reads response_format (ResponseFormat,
// vllm/entrypoints/openai/engine/protocol.py: type is "text",
// "json_object" or "json_schema"; json_schema has a name, a schema and
// strict).
func readResponseFormat(r *reader) (*outputFormat, *apiError) {
	raw, ok := r.raw["response_format"]
	if !ok || isNull(raw) {
		return nil, nil
	}
	var rf struct {
		Type       string `json:"type"`
		JSONSchema *struct {
			Name   *string         `json:"name"`
			Schema json.RawMessage `json:"schema"`
		} `json:"json_schema"`
	}
	if !isObject(raw) || json.Unmarshal(raw, &rf) != nil {
		return nil, badRequest("response_format", "response_format must be an object such as {\"type\": \"json_object\"}")
	}
	switch rf.Type {
	case "text":
		return nil, nil
	case "json_object":
		return &outputFormat{kind: formatJSONObject}, nil
	case "json_schema":
		switch {
		case rf.JSONSchema == nil:
			return nil, badRequest("response_format.json_schema", "response_format of type json_schema needs a json_schema object: {\"name\": ..., \"schema\": {...}}")
		case rf.JSONSchema.Name == nil:
			return nil, badRequest("response_format.json_schema.name", "response_format.json_schema needs a name")
		case len(rf.JSONSchema.Schema) == 0 || isNull(rf.JSONSchema.Schema):
			return &outputFormat{kind: formatJSONObject}, nil
		}
		return schemaFormat(rf.JSONSchema.Schema, "response_format.json_schema.schema")
	case "structural_tag":
		return nil, badRequest("response_format", "the simulated engine does not support response_format of type structural_tag; use json_schema or json_object")
	}
	return nil, badRequest("response_format.type", fmt.Sprintf("response_format.type must be 'text', 'json_object', 'json_schema' or 'structural_tag', not %s", summarize(json.RawMessage(mustJSON(rf.Type)))))
}

// readStructuredOutputs reads structured_outputs, or the guided_* fields
// of older vLLMs when it is absent.
func readStructuredOutputs(r *reader) (*outputFormat, *apiError) {
	fields := map[string]json.RawMessage{}
	prefix := "structured_outputs."
	if raw, ok := r.raw["structured_outputs"]; ok && !isNull(raw) {
		if !isObject(raw) || json.Unmarshal(raw, &fields) != nil {
			return nil, badRequest("structured_outputs", "structured_outputs must be an object such as {\"json\": {...}}")
		}
	} else {
		prefix = ""
		for _, k := range []string{"json", "regex", "choice", "grammar", "json_object"} {
			if v, ok := r.raw["guided_"+k]; ok {
				fields[k] = v
			}
		}
	}
	name := func(k string) string {
		if prefix == "" {
			return "guided_" + k
		}
		return prefix + k
	}
	set := func(k string) bool { v, ok := fields[k]; return ok && !isNull(v) }
	n := 0
	for _, k := range []string{"json", "regex", "choice"} {
		if set(k) {
			n++
		}
	}
	switch {
	case n > 1:
		return nil, badRequest("structured_outputs", "You can only use one kind of constraints for structured outputs ('json', 'regex' or 'choice').")
	case set("grammar"):
		return nil, badRequest(name("grammar"), "the simulated engine does not support grammar constraints; use a JSON schema, a regex or a choice")
	case set("structural_tag"):
		return nil, badRequest(name("structural_tag"), "the simulated engine does not support structural_tag constraints; use a JSON schema, a regex or a choice")
	case set("json"):
		v := fields["json"]
		if s, ok := asString(v); ok { // a schema may come as JSON text
			v = json.RawMessage(s)
		}
		return schemaFormat(v, name("json"))
	case set("regex"):
		s, ok := asString(fields["regex"])
		if !ok {
			return nil, badRequest(name("regex"), name("regex")+" must be a string")
		}
		return &outputFormat{kind: formatRegex, regex: s}, nil
	case set("choice"):
		var list []string
		if json.Unmarshal(fields["choice"], &list) != nil || len(list) == 0 {
			return nil, badRequest(name("choice"), name("choice")+" must be a non-empty list of strings")
		}
		return &outputFormat{kind: formatChoice, choices: list}, nil
	case set("json_object"):
		if string(fields["json_object"]) == "true" {
			return &outputFormat{kind: formatJSONObject}, nil
		}
	}
	return nil, nil
}

// schemaFormat decodes a JSON schema.
func schemaFormat(raw json.RawMessage, param string) (*outputFormat, *apiError) {
	s, err := decodeOrdered(raw)
	if err != nil {
		return nil, badRequest(param, "the JSON schema is not valid JSON: "+err.Error())
	}
	return &outputFormat{kind: formatJSON, schema: s}, nil
}

func mustJSON(s string) []byte { return appendJSONString(nil, s) }

// splitTokens cuts text into the simulator's tokens: at most four bytes,
// never inside a character.
func splitTokens(s string) []string {
	var out []string
	for len(s) > 0 {
		n := 0
		for n < len(s) {
			_, size := utf8.DecodeRuneInString(s[n:])
			if n > 0 && n+size > 4 {
				break
			}
			n += size
		}
		out = append(out, s[:n])
		s = s[n:]
	}
	return out
}

// planStructured gives choice c the constrained text of j's format within
// budget tokens: the text's tokens, then EOS. As in vLLM's check_stop
// (vllm/v1/core/sched/utils.py), reaching the cap ends the request with
// "length" before its EOS is looked at.
func (e *Engine) planStructured(j *job, c *choice, budget int) {
	text, err := j.format.fill(c.hash)
	if err != nil { // tried at parse time; unreachable but harmless
		text = ""
	}
	c.out = splitTokens(text)
	need := len(c.out)
	if !e.cfg.NoEOSToken {
		need++
	}
	c.content = min(need, budget)
	c.finish = "stop"
	if c.reasoning+c.content >= j.limit {
		c.finish = "length"
	}
	c.eos = c.finish == "stop" && !e.cfg.NoEOSToken && c.content > 1
}

// structuredToken is token i of a structured answer: a piece of its text,
// or nothing for the EOS.
func (c *choice) structuredToken(i int) string {
	if i < len(c.out) {
		return c.out[i]
	}
	return ""
}
