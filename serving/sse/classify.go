package sse

import (
	"bytes"
	"strconv"

	"github.com/tidwall/gjson"
)

// Kind is what an event means to a relay.
type Kind uint8

const (
	Comment Kind = iota // no data line (": keep-alive", timing comments)
	Other               // data that carries no generated output (role chunk, usage-only chunk, empty delta)
	Token               // data carrying generated output of any kind, or a finish_reason
	Done                // data: [DONE]
	Error               // data: {"error": ...}
)

var kindNames = [...]string{"Comment", "Other", "Token", "Done", "Error"}

func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return "Kind(" + strconv.Itoa(int(k)) + ")"
}

var (
	dataField = []byte("data:")
	doneData  = []byte("[DONE]")

	// Keys whose value, when it is a non-empty string, is generated output.
	// "reasoning" is current vLLM, "reasoning_content" vLLM before 0.12 and
	// other servers (0.11 to 0.1x sent both).
	keyContent   = []byte(`"content"`)
	keyText      = []byte(`"text"`)
	keyReasoning = []byte(`"reasoning"`)
	keyReasonCnt = []byte(`"reasoning_content"`)
	keyRefusal   = []byte(`"refusal"`)
	keyToolCalls = []byte(`"tool_calls"`) // output when a non-empty array
	keyFinish    = []byte(`"finish_reason"`)
	keyError     = []byte(`"error"`)
	keyDelta     = []byte(`"delta"`)
	keyMessage   = []byte(`"message"`)
)

// Data returns the payload of an event's data line, without "data:" and one
// optional space, nil if the event has none. An event with several data
// lines (never sent by vLLM or OpenAI) gets them joined by "\n" as SSE
// defines, in a new slice; otherwise the payload is a slice of ev.
func Data(ev []byte) []byte {
	var p []byte
	joined := false
	for len(ev) > 0 {
		var line []byte
		if i := bytes.IndexByte(ev, '\n'); i >= 0 {
			line, ev = ev[:i], ev[i+1:]
		} else {
			line, ev = ev, nil
		}
		if !bytes.HasPrefix(line, dataField) {
			continue
		}
		v := fieldValue(line) // never nil
		switch {
		case p == nil:
			p = v
		case !joined:
			p = append(append(append(make([]byte, 0, len(p)+1+len(v)), p...), '\n'), v...)
			joined = true
		default:
			p = append(append(p, '\n'), v...)
		}
	}
	return p
}

// fieldValue returns a data line's value: after "data:" and one optional
// space, without the line's CR.
func fieldValue(line []byte) []byte {
	v := line[len(dataField):]
	if len(v) > 0 && v[0] == ' ' {
		v = v[1:]
	}
	if n := len(v); n > 0 && v[n-1] == '\r' {
		v = v[:n-1]
	}
	return v
}

// Classify classifies one event. Token follows DESIGN: the first event
// carrying generated output of any kind: non-empty content (chat
// delta.content / message), text (completions), reasoning_content or
// reasoning, a tool-call delta (delta.tool_calls non-empty), a refusal; and
// also an event with a non-null finish_reason.
//
// An event is Error when its payload is an object with a non-null "error"
// (vLLM's in-band error, `{"error": {"message": …, "code": 500}}`) or with
// "object": "error" (an error object sent bare).
//
// Keys are recognised wherever they are nested: no chunk vLLM or OpenAI sends
// has a key of those names outside its choices.
func Classify(ev []byte) Kind {
	p := Data(ev)
	if p == nil {
		return Comment
	}
	p = trimSpace(p)
	if bytes.Equal(p, doneData) {
		return Done
	}
	if firstKeyIsError(p) {
		return Error
	}
	if hasOutput(p) || hasKey(p, keyFinish, nonNull) {
		return Token
	}
	if bytes.Contains(p, keyError) && isErrorObject(p) {
		return Error
	}
	return Other
}

// Pieces counts the generated-output pieces in a Token event's payload (for
// partial billing when usage is missing): one per choice that carries
// content, text, reasoning, a tool call or a refusal. A choice that only
// finishes counts none.
func Pieces(payload []byte) int {
	n := countOutput(payload)
	if n <= 1 {
		return n
	}
	// Several outputs: one chat choice with, say, reasoning and content, or
	// several choices. Count choices exactly unless there is plainly one.
	if countKeys(payload, keyDelta, anyValue)+countKeys(payload, keyMessage, anyValue) == 1 &&
		!hasKey(payload, keyText, anyValue) {
		return 1
	}
	return piecesParsed(payload)
}

// valueTest is what a key's value must look like to count.
type valueTest uint8

const (
	anyValue       valueTest = iota
	nonEmptyString           // "…", not ""
	nonEmptyArray            // [x…], not []
	nonNull                  // anything but null
)

func hasOutput(p []byte) bool {
	return hasKey(p, keyContent, nonEmptyString) ||
		hasKey(p, keyText, nonEmptyString) ||
		hasKey(p, keyReasoning, nonEmptyString) ||
		hasKey(p, keyReasonCnt, nonEmptyString) ||
		hasKey(p, keyToolCalls, nonEmptyArray) ||
		hasKey(p, keyRefusal, nonEmptyString)
}

func countOutput(p []byte) int {
	return countKeys(p, keyContent, nonEmptyString) +
		countKeys(p, keyText, nonEmptyString) +
		countKeys(p, keyReasoning, nonEmptyString) +
		countKeys(p, keyReasonCnt, nonEmptyString) +
		countKeys(p, keyToolCalls, nonEmptyArray) +
		countKeys(p, keyRefusal, nonEmptyString)
}

func hasKey(p, key []byte, t valueTest) bool {
	for off := 0; ; {
		i := bytes.Index(p[off:], key)
		if i < 0 {
			return false
		}
		off += i + len(key)
		if v, ok := valueAfter(p, off); ok && passes(v, t) {
			return true
		}
	}
}

func countKeys(p, key []byte, t valueTest) int {
	n := 0
	for off := 0; ; {
		i := bytes.Index(p[off:], key)
		if i < 0 {
			return n
		}
		off += i + len(key)
		if v, ok := valueAfter(p, off); ok && passes(v, t) {
			n++
		}
	}
}

// valueAfter returns the bytes from the value of the key whose quoted name
// ends at p[off]; ok is false when no ':' follows, so the quoted name was no
// key. In valid JSON a quoted name followed by ':' is always a key, however
// deep: a string value is never followed by ':', and a quote inside a string
// is always escaped, so content that spells a key cannot be taken for one.
func valueAfter(p []byte, off int) (v []byte, ok bool) {
	v = trimLeft(p[off:])
	if len(v) == 0 || v[0] != ':' {
		return nil, false
	}
	return trimLeft(v[1:]), true
}

func passes(v []byte, t valueTest) bool {
	switch t {
	case nonEmptyString:
		return len(v) > 1 && v[0] == '"' && v[1] != '"'
	case nonEmptyArray:
		if len(v) == 0 || v[0] != '[' {
			return false
		}
		v = trimLeft(v[1:])
		return len(v) > 0 && v[0] != ']'
	case nonNull:
		return len(v) > 0 && !bytes.HasPrefix(v, []byte("null"))
	}
	return true
}

// firstKeyIsError reports whether p is an object whose first key is "error",
// as vLLM writes its in-band errors.
func firstKeyIsError(p []byte) bool {
	if len(p) == 0 || p[0] != '{' {
		return false
	}
	v := trimLeft(p[1:])
	if !bytes.HasPrefix(v, keyError) {
		return false
	}
	val, ok := valueAfter(v, len(keyError))
	return ok && passes(val, nonNull)
}

// isErrorObject reports whether p is an object with a non-null "error" or
// with "object": "error", wherever the key stands.
func isErrorObject(p []byte) bool {
	r := gjson.GetManyBytes(p, "error", "object")
	return (r[0].Exists() && r[0].Type != gjson.Null) || (r[1].Type == gjson.String && r[1].Str == "error")
}

// piecesParsed counts the choices with output by parsing p.
func piecesParsed(p []byte) int {
	n := 0
	gjson.GetBytes(p, "choices").ForEach(func(_, c gjson.Result) bool {
		if choiceHasOutput(c) {
			n++
		}
		return true
	})
	return n
}

func choiceHasOutput(c gjson.Result) bool {
	if nonEmptyStr(c.Get("text")) {
		return true
	}
	for _, m := range [...]string{"delta", "message"} {
		d := c.Get(m)
		if !d.IsObject() {
			continue
		}
		for _, k := range [...]string{"content", "reasoning", "reasoning_content", "refusal"} {
			if nonEmptyStr(d.Get(k)) {
				return true
			}
		}
		if tc := d.Get("tool_calls"); tc.IsArray() && len(tc.Array()) > 0 {
			return true
		}
	}
	return false
}

func nonEmptyStr(r gjson.Result) bool { return r.Type == gjson.String && r.Str != "" }

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

func trimLeft(b []byte) []byte {
	for len(b) > 0 && isSpace(b[0]) {
		b = b[1:]
	}
	return b
}

func trimSpace(b []byte) []byte {
	b = trimLeft(b)
	for len(b) > 0 && isSpace(b[len(b)-1]) {
		b = b[:len(b)-1]
	}
	return b
}
