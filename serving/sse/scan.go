package sse

import (
	"bytes"

	"github.com/tidwall/gjson"
)

// A key is searched for by its name and closing quote, without the opening
// quote, which must come right before the match, unescaped. The search jumps
// from one occurrence of the name's anchor, a byte rare in chunks, to the
// next: '"', the commonest byte of JSON, would stop it at every string.
//
// A quoted name followed by ':' is a key in valid JSON however deep it is
// nested: a string value is never followed by ':', and a quote inside a
// string is always escaped, so content that spells a key is never taken for
// one.
type key struct {
	name   []byte // e.g. `content"`
	anchor int    // index in name of the byte to jump by
}

func newKey(name string, anchor byte) key {
	return key{name: []byte(name + `"`), anchor: bytes.IndexByte([]byte(name), anchor)}
}

var (
	keyContent   = newKey("content", 't')
	keyText      = newKey("text", 'x')
	keyReasoning = newKey("reasoning", 'g')         // current vLLM
	keyReasonCnt = newKey("reasoning_content", 'g') // vLLM before 0.12 (0.11 to 0.1x sent both)
	keyRefusal   = newKey("refusal", 'f')
	keyToolCalls = newKey("tool_calls", '_')
	keyFinish    = newKey("finish_reason", 'f')
	keyObject    = newKey("object", 'j')

	// Objects are found by their '{' (see objectOf), not by an anchor.
	nameDelta   = []byte(`delta"`)
	nameMessage = []byte(`message"`)
	nameError   = []byte(`error"`) // only ever the first key, see firstKeyIsError
)

// isTextCompletion reports whether p's "object" is "text_completion": a
// short scan, since vLLM and OpenAI write "object" right after the id.
func isTextCompletion(p []byte) bool {
	at := find(p, keyObject, anyValue)
	return at >= 0 && bytes.HasPrefix(p[at:], []byte(`"text_completion"`))
}

// chatOutput are the keys of a chat delta or message whose value can be
// generated output, and what the value must be to be output.
var chatOutput = [...]struct {
	key
	test valueTest
}{
	{keyContent, nonEmptyString},
	{keyReasoning, nonEmptyString},
	{keyReasonCnt, nonEmptyString},
	{keyToolCalls, nonEmptyArray},
	{keyRefusal, nonEmptyString},
}

// valueTest is what a key's value must look like to count.
type valueTest uint8

const (
	anyValue       valueTest = iota
	nonEmptyString           // "…", not ""
	nonEmptyArray            // [x…], not []
	nonNull                  // anything but null
)

// find returns the offset in p of the first value of k that passes t, -1
// if there is none.
func find(p []byte, k key, t valueTest) int {
	c := k.name[k.anchor]
	for off := k.anchor; off < len(p); {
		i := bytes.IndexByte(p[off:], c)
		if i < 0 {
			return -1
		}
		i += off
		off = i + 1
		s := i - k.anchor // where the name would start
		end := s + len(k.name)
		if s < 1 || end > len(p) || p[s-1] != '"' || (s > 1 && p[s-2] == '\\') || !bytes.Equal(p[s:end], k.name) {
			continue
		}
		if at := valueStart(p, end); at >= 0 && passes(p[at:], t) {
			return at
		}
	}
	return -1
}

// objectOf returns the offset of the first '{' at or after from that opens
// the value of key name, -1 if there is none. It looks at each '{' (an
// object's start, or a brace inside a string, which no key precedes): few in
// a chunk, where the quote that starts a key is everywhere.
func objectOf(p []byte, from int, name []byte) int {
	for i := from; i < len(p); {
		j := bytes.IndexByte(p[i:], '{')
		if j < 0 {
			return -1
		}
		j += i
		i = j + 1
		k := j - 1
		for k >= 0 && isSpace(p[k]) {
			k--
		}
		if k < 0 || p[k] != ':' {
			continue
		}
		k--
		for k >= 0 && isSpace(p[k]) {
			k--
		}
		s := k + 1 - len(name) // where the name starts, after its opening quote
		if s < 1 || !bytes.Equal(p[s:k+1], name) || p[s-1] != '"' || (s > 1 && p[s-2] == '\\') {
			continue
		}
		return j
	}
	return -1
}

// count returns how many values of k in p pass t.
func count(p []byte, k key, t valueTest) int {
	n := 0
	for {
		at := find(p, k, t)
		if at < 0 {
			return n
		}
		n++
		p = p[at:]
	}
}

// valueStart returns the offset of the value of the key whose closing quote
// ends at p[off-1], -1 if no ':' follows (then it was no key).
func valueStart(p []byte, off int) int {
	for off < len(p) && isSpace(p[off]) {
		off++
	}
	if off == len(p) || p[off] != ':' {
		return -1
	}
	off++
	for off < len(p) && isSpace(p[off]) {
		off++
	}
	if off == len(p) {
		return -1
	}
	return off
}

func passes(v []byte, t valueTest) bool {
	switch t {
	case nonEmptyString:
		return len(v) > 1 && v[0] == '"' && v[1] != '"'
	case nonEmptyArray:
		if v[0] != '[' {
			return false
		}
		v = trimLeft(v[1:])
		return len(v) > 0 && v[0] != ']'
	case nonNull:
		return !bytes.HasPrefix(v, []byte("null"))
	}
	return true
}

// firstKeyIsError reports whether p is an object whose first key is a
// non-null "error", as vLLM writes its in-band errors.
func firstKeyIsError(p []byte) bool {
	if len(p) == 0 || p[0] != '{' {
		return false
	}
	v := trimLeft(p[1:])
	if len(v) == 0 || v[0] != '"' || !bytes.HasPrefix(v[1:], nameError) {
		return false
	}
	at := valueStart(v, 1+len(nameError))
	return at >= 0 && passes(v[at:], nonNull)
}

// isErrorObject reports whether p is an object with a non-null "error" or
// with "object": "error", wherever the key stands. It parses p, so it runs
// only for payloads that hold neither output nor a finish_reason.
func isErrorObject(p []byte) bool {
	r := gjson.GetManyBytes(p, "error", "object")
	return (r[0].Exists() && r[0].Type != gjson.Null) || (r[1].Type == gjson.String && r[1].Str == "error")
}

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
