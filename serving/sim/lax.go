package sim

import (
	"encoding/json"
	"errors"
	"math"
	"strconv"
	"strings"
)

// vLLM reads request bodies with pydantic in lax mode: "0.5" is a valid
// temperature, 10.0 a valid max_tokens, "yes" a valid stream flag, while
// "hot", 1.5 or [] are not. Wrong types never reach vLLM's handlers: FastAPI
// answers 400 with every pydantic error of the body rendered in the message
// (vllm/entrypoints/serve/exception_handling/handlers/validation.py@4da14a5c,
// validation_exception_handler). This file reproduces the conversions and
// the errors for the fields the simulator reads and the common sampling
// fields it ignores, so a client sees the same 400 from the simulator as
// from vLLM.

// ftype is a field's pydantic type, as far as lax validation goes.
type ftype uint8

const (
	tStr   ftype = iota // str
	tInt                // int
	tFloat              // float
	tBool               // bool
	tList               // list[...] (items unchecked)
	tDict               // dict[...] (values unchecked)
	tModel              // a nested model (an object); fspec.model names it
	tStop               // str | list[str]
	tAny                // anything
)

// fspec describes one request field.
type fspec struct {
	name     string
	typ      ftype
	nullable bool   // None is valid
	required bool   // no default
	model    string // tModel: the class name in messages
}

// pyErr is one pydantic error as FastAPI reports it.
type pyErr struct {
	typ, loc, msg string
	input         string // the value as vLLM summarizes it (_summarize_error_input), unquoted
	ctx           string // the rendered ctx dict, "" for none
	param         string // a VLLMValidationError's parameter, which becomes the error's param
}

// render prints e as str() prints the error dict.
func (e pyErr) render() string {
	var s strings.Builder
	s.WriteString("{'type': " + pyRepr(e.typ) + ", 'loc': " + pyRepr(e.loc) + ", 'msg': " + pyRepr(e.msg) + ", 'input': " + pyRepr(e.input))
	if e.ctx != "" {
		s.WriteString(", 'ctx': " + e.ctx)
	}
	s.WriteString("}")
	return s.String()
}

// Bounds of vLLM's handler on what one error reports.
const (
	maxReportedErrors = 10
	maxErrorInput     = 200
	maxErrorChars     = 1000
)

// validationError renders errs as vLLM's 400 for a request that failed
// validation: type "Bad Request" (the HTTP phrase), param the
// VLLMValidationError's parameter or else the first error's location.
func validationError(errs []pyErr) *apiError {
	param := ""
	for _, e := range errs {
		if e.param != "" {
			param = e.param
			break
		}
	}
	if param == "" && len(errs) > 0 {
		param = errs[0].loc
	}
	label := "error"
	if len(errs) != 1 {
		label = "errors"
	}
	var m strings.Builder
	m.WriteString(strconv.Itoa(len(errs)) + " validation " + label + ":\n")
	for i, e := range errs {
		if i == maxReportedErrors {
			m.WriteString("  ...and " + strconv.Itoa(len(errs)-i) + " more " + label + "\n")
			break
		}
		text := e.render()
		if len(text) > maxErrorChars {
			text = text[:maxErrorChars] + "...[truncated]"
		}
		m.WriteString("  " + text + "\n")
	}
	return &apiError{status: 400, typ: "Bad Request", param: param, msg: strings.TrimRight(m.String(), " \n")}
}

// valueError is what a model validator raising VLLMValidationError(msg,
// parameter=param) becomes: a value_error on the whole body.
func valueError(r *reader, msg, param string) *apiError {
	full := msg
	if param != "" {
		full += " (parameter=" + param + ")"
	}
	return validationError([]pyErr{{
		typ:   "value_error",
		loc:   "body",
		msg:   "Value error, " + full,
		input: r.summary(),
		ctx:   "{'error': VLLMValidationError(" + pyRepr(msg) + ")}",
		param: param,
	}})
}

// reader is a request body read as vLLM reads it: an object whose field
// names match exactly (a repeated key keeps its last value), with the
// fields of the specs converted in lax mode.
type reader struct {
	raw  map[string]json.RawMessage
	loc  string // "body", or the path of a nested object
	errs []pyErr
	vals map[string]any // converted values of present, non-null fields
}

// readJSONBody parses body as the JSON object FastAPI hands to pydantic. The
// errors are FastAPI's: a missing body, invalid JSON, or a value that is no
// object.
func readJSONBody(body []byte) (*reader, *apiError) {
	trimmed := strings.TrimSpace(string(body))
	if trimmed == "" {
		return nil, validationError([]pyErr{{typ: "missing", loc: "body", msg: "Field required", input: "None"}})
	}
	var raw map[string]json.RawMessage
	err := json.Unmarshal(body, &raw)
	if _, ok := errors.AsType[*json.UnmarshalTypeError](err); ok || err == nil && raw == nil {
		return nil, validationError([]pyErr{{
			typ: "model_attributes_type", loc: "body",
			msg:   "Input should be a valid dictionary or object to extract fields from",
			input: summarize(json.RawMessage(trimmed)),
		}})
	}
	if err != nil {
		pos := len(body)
		if se, ok := errors.AsType[*json.SyntaxError](err); ok && se.Offset > 0 && int(se.Offset) < len(body) {
			pos = int(se.Offset) - 1
		}
		return nil, validationError([]pyErr{{
			typ: "json_invalid", loc: "body." + strconv.Itoa(pos), msg: "JSON decode error",
			input: "<dict of 0 items>", ctx: "{'error': 'Expecting value'}",
		}})
	}
	return &reader{raw: raw, loc: "body", vals: map[string]any{}}, nil
}

// nested returns a reader of the object in field name, nil if the field is
// absent, null or no object.
func (r *reader) nested(name string) *reader {
	v, ok := r.raw[name]
	if !ok || !isObject(v) {
		return nil
	}
	var raw map[string]json.RawMessage
	if json.Unmarshal(v, &raw) != nil {
		return nil
	}
	return &reader{raw: raw, loc: r.loc + "." + name, vals: map[string]any{}}
}

// summary is the body as the input of a body-level error.
func (r *reader) summary() string { return "<dict of " + strconv.Itoa(len(r.raw)) + " items>" }

// exact drops the keys that differ only in case from a field in specs:
// pydantic matches names exactly, encoding/json would not.
func (r *reader) exact(specs []fspec) {
	for k := range r.raw {
		for _, s := range specs {
			if k != s.name && strings.EqualFold(k, s.name) {
				delete(r.raw, k)
				break
			}
		}
	}
}

// check validates the fields of specs in order, recording errors and the
// converted values.
func (r *reader) check(specs []fspec) {
	r.exact(specs)
	for _, s := range specs {
		v, ok := r.raw[s.name]
		if !ok {
			if s.required {
				r.errs = append(r.errs, pyErr{typ: "missing", loc: r.loc + "." + s.name, msg: "Field required", input: r.summary()})
			}
			continue
		}
		if isNull(v) {
			if !s.nullable && s.typ != tAny {
				typ, msg := typeError(s)
				r.errs = append(r.errs, pyErr{typ: typ, loc: r.loc + "." + s.name, msg: msg, input: "None"})
			}
			continue
		}
		val, errs := convert(s, v, r.loc)
		if len(errs) > 0 {
			r.errs = append(r.errs, errs...)
			continue
		}
		r.vals[s.name] = val
	}
}

// typeError is the error for a value of the wrong JSON type.
func typeError(s fspec) (typ, msg string) {
	switch s.typ {
	case tStr:
		return "string_type", "Input should be a valid string"
	case tInt:
		return "int_type", "Input should be a valid integer"
	case tFloat:
		return "float_type", "Input should be a valid number"
	case tBool:
		return "bool_type", "Input should be a valid boolean"
	case tList:
		return "list_type", "Input should be a valid list"
	case tDict:
		return "dict_type", "Input should be a valid dictionary"
	case tModel:
		return "model_type", "Input should be a valid dictionary or instance of " + s.model
	}
	return "string_type", "Input should be a valid string"
}

// convert applies pydantic's lax conversion of one JSON value of field s
// in the object at path at.
func convert(s fspec, v json.RawMessage, at string) (any, []pyErr) {
	fail := func(typ, msg string) (any, []pyErr) {
		return nil, []pyErr{{typ: typ, loc: s.at(at), msg: msg, input: summarize(v)}}
	}
	wrong := func() (any, []pyErr) { return fail(typeError(s)) }
	switch s.typ {
	case tAny:
		return v, nil
	case tStr:
		if str, ok := asString(v); ok {
			return str, nil
		}
		return wrong()
	case tList:
		if len(v) > 0 && v[0] == '[' {
			return v, nil
		}
		return wrong()
	case tDict, tModel:
		if isObject(v) {
			return v, nil
		}
		return wrong()
	case tStop:
		if str, ok := asString(v); ok {
			return []string{str}, nil
		}
		var items []json.RawMessage
		if len(v) == 0 || v[0] != '[' || json.Unmarshal(v, &items) != nil {
			return nil, []pyErr{
				{typ: "string_type", loc: s.at(at), msg: "Input should be a valid string", input: summarize(v)},
				{typ: "list_type", loc: s.at(at), msg: "Input should be a valid list", input: summarize(v)},
			}
		}
		out := make([]string, 0, len(items))
		errs := []pyErr{{typ: "string_type", loc: s.at(at), msg: "Input should be a valid string", input: summarize(v)}}
		for i, it := range items {
			str, ok := asString(it)
			if !ok {
				errs = append(errs, pyErr{typ: "string_type", loc: s.at(at) + "." + strconv.Itoa(i), msg: "Input should be a valid string", input: summarize(it)})
			}
			out = append(out, str)
		}
		if len(errs) > 1 {
			return nil, errs
		}
		return out, nil
	case tInt:
		switch {
		case isNumber(v):
			if isIntLiteral(v) {
				if n, err := strconv.ParseInt(string(v), 10, 64); err == nil {
					return n, nil
				}
			}
			f, err := strconv.ParseFloat(string(v), 64)
			if err != nil || math.IsInf(f, 0) || f != math.Trunc(f) || math.Abs(f) > 1<<62 {
				return fail("int_from_float", "Input should be a valid integer, got a number with a fractional part")
			}
			return int64(f), nil
		case v[0] == '"':
			str, _ := asString(v)
			n, err := strconv.ParseInt(strings.TrimSpace(str), 10, 64)
			if err != nil {
				return fail("int_parsing", "Input should be a valid integer, unable to parse string as an integer")
			}
			return n, nil
		case string(v) == "true":
			return int64(1), nil
		case string(v) == "false":
			return int64(0), nil
		}
		return wrong()
	case tFloat:
		switch {
		case isNumber(v):
			f, err := strconv.ParseFloat(string(v), 64)
			if err != nil {
				return wrong()
			}
			return f, nil
		case v[0] == '"':
			str, _ := asString(v)
			str = strings.TrimSpace(str)
			f, err := strconv.ParseFloat(str, 64)
			if err != nil || strings.HasPrefix(strings.TrimLeft(str, "+-"), "0x") {
				return fail("float_parsing", "Input should be a valid number, unable to parse string as a number")
			}
			return f, nil
		case string(v) == "true":
			return 1.0, nil
		case string(v) == "false":
			return 0.0, nil
		}
		return wrong()
	case tBool:
		switch {
		case string(v) == "true":
			return true, nil
		case string(v) == "false":
			return false, nil
		case isNumber(v):
			f, err := strconv.ParseFloat(string(v), 64)
			if err == nil && (f == 0 || f == 1) {
				return f == 1, nil
			}
			return fail("bool_parsing", "Input should be a valid boolean, unable to interpret input")
		case v[0] == '"':
			str, _ := asString(v)
			switch strings.ToLower(str) {
			case "0", "off", "f", "false", "n", "no":
				return false, nil
			case "1", "on", "t", "true", "y", "yes":
				return true, nil
			}
			return fail("bool_parsing", "Input should be a valid boolean, unable to interpret input")
		}
		return wrong()
	}
	return wrong()
}

// at returns the location of field s in the object at path prefix.
func (s fspec) at(prefix string) string {
	if s.name == "" {
		return prefix
	}
	return prefix + "." + s.name
}

// Typed getters of converted values; ok is false when the field is absent,
// null or invalid.

func (r *reader) str(name string) (string, bool) {
	v, ok := r.vals[name].(string)
	return v, ok
}

func (r *reader) int(name string) (int64, bool) {
	v, ok := r.vals[name].(int64)
	return v, ok
}

func (r *reader) float(name string) (float64, bool) {
	v, ok := r.vals[name].(float64)
	return v, ok
}

func (r *reader) bool(name string) bool {
	v, _ := r.vals[name].(bool)
	return v
}

func (r *reader) rawVal(name string) json.RawMessage {
	v, _ := r.vals[name].(json.RawMessage)
	return v
}

// truthy is Python's truth value of a field's raw JSON, as the model
// validators that run before conversion see it.
func (r *reader) truthy(name string) bool {
	v, ok := r.raw[name]
	if !ok {
		return false
	}
	switch s := strings.TrimSpace(string(v)); s {
	case "null", "false", "0", "\"\"", "[]", "{}":
		return false
	default:
		if isNumber(json.RawMessage(s)) {
			f, err := strconv.ParseFloat(s, 64)
			return err != nil || f != 0
		}
		if strings.HasPrefix(s, "[") || strings.HasPrefix(s, "{") {
			var xs []any
			if json.Unmarshal(v, &xs) == nil {
				return len(xs) > 0
			}
			var m map[string]any
			if json.Unmarshal(v, &m) == nil {
				return len(m) > 0
			}
		}
		return true
	}
}

// summarize renders a value as vLLM's _summarize_error_input does before
// str() prints it: strings as they are (cut at 200 characters), containers
// by their size, other values as Python's str() prints them.
func summarize(v json.RawMessage) string {
	v = json.RawMessage(strings.TrimSpace(string(v)))
	if len(v) == 0 {
		return "None"
	}
	switch v[0] {
	case '"':
		s, _ := asString(v)
		if len(s) > maxErrorInput {
			return s[:maxErrorInput] + "...[truncated]"
		}
		return s
	case '[':
		var xs []json.RawMessage
		_ = json.Unmarshal(v, &xs)
		return "<list of " + strconv.Itoa(len(xs)) + " items>"
	case '{':
		var m map[string]json.RawMessage
		_ = json.Unmarshal(v, &m)
		return "<dict of " + strconv.Itoa(len(m)) + " items>"
	case 't':
		return "True"
	case 'f':
		return "False"
	case 'n':
		return "None"
	}
	if isIntLiteral(v) {
		return strings.TrimPrefix(string(v), "+")
	}
	f, err := strconv.ParseFloat(string(v), 64)
	if err != nil {
		return string(v)
	}
	return string(appendPyFloat(nil, f))
}

func asString(v json.RawMessage) (string, bool) {
	if len(v) == 0 || v[0] != '"' {
		return "", false
	}
	var s string
	if json.Unmarshal(v, &s) != nil {
		return "", false
	}
	return s, true
}

func isNull(v json.RawMessage) bool { return strings.TrimSpace(string(v)) == "null" }

func isObject(v json.RawMessage) bool { return len(v) > 0 && v[0] == '{' }

func isNumber(v json.RawMessage) bool {
	return len(v) > 0 && (v[0] == '-' || v[0] >= '0' && v[0] <= '9')
}

// isIntLiteral reports whether a JSON number is written as an integer, which
// Python's json module reads as an int (else as a float).
func isIntLiteral(v json.RawMessage) bool {
	return isNumber(v) && !strings.ContainsAny(string(v), ".eE")
}
