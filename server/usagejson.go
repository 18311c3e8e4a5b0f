package server

import (
	"bytes"
	"strings"

	"github.com/tidwall/gjson"
)

// A hand-written reader of the usage object vLLM puts on every chunk of a
// stream (the gateway asks for continuous usage): found from the chunk's
// end, read without gjson's walk, and cut out of the event in place when
// the client did not ask for it. Each step is measured against gjson and
// sjson in its comment; anything not shaped as vLLM writes it falls back
// to them.

var usageMember = []byte(`,"usage":{`)

// usageAtEnd returns the usage object of a chunk whose last member it is,
// where vLLM puts it (serving_chat.py builds each chunk's
// ChatCompletionStreamResponse, then sets chunk.usage, and pydantic dumps
// the fields in their declared order, usage last), and the simulated
// engine too; not Exists otherwise, and the caller looks for it anywhere.
// Found from the end, the object is parsed alone (by takeUsage) rather
// than the whole chunk read up to it: gjson's walk through every chunk
// was most of inspect's time in BenchmarkPacedStreams (0.08 of 0.10 s).
// `,"usage":{` cannot be inside a string (a quote there is escaped), and
// the object must close exactly where the chunk does, so a usage member of
// a nested object is not taken for the chunk's. Index is set, for
// cutUsage.
func usageAtEnd(payload []byte) gjson.Result {
	end := skipBack(payload, len(payload)) // the chunk's closing brace
	if end < 0 || payload[end] != '}' {
		return gjson.Result{}
	}
	i := bytes.LastIndex(payload[:end], usageMember)
	if i < 0 {
		return gjson.Result{}
	}
	vs := i + len(usageMember) - 1 // the object's opening brace
	obj := payload[vs:end]
	if objectEnd(obj) != len(obj) {
		return gjson.Result{}
	}
	return gjson.Result{Type: gjson.JSON, Raw: stringOf(obj), Index: vs}
}

// objectEnd returns the length of the JSON object p starts with (the index
// after its closing brace, strings skipped), -1 if p does not hold a whole
// one. It checks nesting only; takeUsage's reads check the rest.
func objectEnd[T string | []byte](p T) int {
	depth, inString := 0, false
	for i := 0; i < len(p); i++ {
		c := p[i]
		switch {
		case inString:
			switch c {
			case '\\':
				i++
			case '"':
				inString = false
			}
		case c == '"':
			inString = true
		case c == '{' || c == '[':
			depth++
		case c == '}' || c == ']':
			depth--
			if depth == 0 {
				return i + 1
			}
		}
	}
	return -1
}

// cutUsage removes the "usage" member (us, as gjson found it in payload)
// from the event ev in place, when ev is one "data: " line whose payload is
// in ev's own buffer: the gateway asks every stream for continuous usage,
// so without it every chunk of a client that did not was copied twice
// (sjson, then the event around it) — 15 % of BenchmarkStreamRelay's CPU
// went to that and to its garbage. The event is relayed before the next
// one is read into the buffer, so the change is seen by no one else. ok is
// false when the member is not shaped `,"usage":{…}` or `{"usage":{…},`,
// and then ev is unchanged.
func cutUsage(ev, payload []byte, us gjson.Result) ([]byte, bool) {
	const prefix = "data: "
	if len(ev) < len(prefix)+len(payload) || string(ev[:len(prefix)]) != prefix ||
		len(payload) == 0 || &ev[len(prefix)] != &payload[0] || us.Index <= 0 {
		return nil, false
	}
	vs, ve := us.Index, us.Index+len(us.Raw) // the value, in payload
	if ve > len(payload) || string(payload[vs:ve]) != us.Raw {
		return nil, false
	}
	i := skipBack(payload, vs)
	if i < 0 || payload[i] != ':' {
		return nil, false
	}
	i = skipBack(payload, i)
	const key = `"usage"`
	if i+1 < len(key) || string(payload[i+1-len(key):i+1]) != key {
		return nil, false
	}
	ks := i + 1 - len(key)
	i = skipBack(payload, ks)
	var from, to int
	switch {
	case i >= 0 && payload[i] == ',':
		from, to = i, ve // ,"usage":{…}
	case i >= 0 && payload[i] == '{':
		j := ve
		for j < len(payload) && isSpace(payload[j]) {
			j++
		}
		if j >= len(payload) || payload[j] != ',' {
			return nil, false // the only member: leave it to sjson
		}
		from, to = ks, j+1 // {"usage":{…},
	default:
		return nil, false
	}
	rest := payload[to:]
	n := len(prefix) + from
	n += copy(ev[n:], rest)
	ev = append(ev[:n], "\n\n"...)
	return ev, true
}

// skipBack returns the index of the last byte before i in p that is not
// JSON white space, -1 if none.
func skipBack(p []byte, i int) int {
	for i--; i >= 0 && isSpace(p[i]); i-- {
	}
	return i
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// usageCounts reads a usage object's prompt_tokens and completion_tokens
// (0 when absent, as gjson reads them) from its own members, written as
// vLLM writes them: unsigned integers, each key once. ok is false for
// anything else (a sign, a fraction, an escaped or repeated key, a
// malformed object), and the caller reads it with gjson. Every chunk of a
// stream carries usage (the gateway asks for continuous usage), and
// gjson's two lookups, each walking the object and parsing its numbers as
// floats, were 1.5 % of the gateway's CPU with 500 streams open (perf,
// scripts/bench-streams.sh); this reads one in a third of their time
// (BenchmarkUsageCounts).
func usageCounts(obj string) (prompt, completion int64, ok bool) {
	i := skipSpace(obj, 0)
	if i >= len(obj) || obj[i] != '{' {
		return 0, 0, false
	}
	i = skipSpace(obj, i+1)
	if i < len(obj) && obj[i] == '}' {
		return 0, 0, skipSpace(obj, i+1) == len(obj)
	}
	seen := 0
	for i < len(obj) {
		if obj[i] != '"' {
			return 0, 0, false
		}
		end := strings.IndexByte(obj[i+1:], '"')
		if end < 0 {
			return 0, 0, false
		}
		key := obj[i+1 : i+1+end]
		if strings.IndexByte(key, '\\') >= 0 {
			return 0, 0, false
		}
		i = skipSpace(obj, i+2+end)
		if i >= len(obj) || obj[i] != ':' {
			return 0, 0, false
		}
		i = skipSpace(obj, i+1)
		var n int
		switch key {
		case "prompt_tokens":
			if seen&1 != 0 {
				return 0, 0, false // repeated: gjson takes the first
			}
			seen |= 1
			prompt, n = readUint(obj[i:])
		case "completion_tokens":
			if seen&2 != 0 {
				return 0, 0, false
			}
			seen |= 2
			completion, n = readUint(obj[i:])
		default:
			n = valueLen(obj[i:])
		}
		if n == 0 {
			return 0, 0, false
		}
		i = skipSpace(obj, i+n)
		if i >= len(obj) {
			return 0, 0, false
		}
		switch obj[i] {
		case '}':
			return prompt, completion, skipSpace(obj, i+1) == len(obj)
		case ',':
			i = skipSpace(obj, i+1)
		default:
			return 0, 0, false
		}
	}
	return 0, 0, false
}

// readUint reads the unsigned decimal integer s starts with, of at most 18
// digits and followed by the end of its value; n is its length, 0 if s
// does not start with one.
func readUint(s string) (v int64, n int) {
	for n < len(s) && n < 19 && s[n] >= '0' && s[n] <= '9' {
		v = v*10 + int64(s[n]-'0')
		n++
	}
	if n == 0 || n == 19 || (n < len(s) && s[n] != ',' && s[n] != '}' && !isSpace(s[n])) {
		return 0, 0
	}
	return v, n
}

// valueLen is the length of the JSON value s starts with (objects and
// arrays by objectEnd, strings to their closing quote, literals to the
// next delimiter); 0 when there is none.
func valueLen(s string) int {
	if s == "" {
		return 0
	}
	switch s[0] {
	case '{', '[':
		return max(objectEnd(s), 0)
	case '"':
		for i := 1; i < len(s); i++ {
			switch s[i] {
			case '\\':
				i++
			case '"':
				return i + 1
			}
		}
		return 0
	}
	n := 0
	for n < len(s) && s[n] != ',' && s[n] != '}' && s[n] != ']' && !isSpace(s[n]) {
		n++
	}
	return n
}

func skipSpace(s string, i int) int {
	for i < len(s) && isSpace(s[i]) {
		i++
	}
	return i
}
