package sse

import (
	"bytes"
	"strconv"
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
	dataField   = []byte("data:")
	doneData    = []byte("[DONE]")
	quotedError = []byte(`"error"`)
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
// (vLLM's in-band error, {"error": {"message": …, "code": 500}}) or with
// "object": "error" (an error object sent bare).
//
// Keys are recognised however deep they are nested: no chunk vLLM or OpenAI
// sends has a key of those names outside its choices.
func Classify(ev []byte) Kind {
	p := Data(ev)
	if p == nil {
		return Comment
	}
	p = trimSpace(p)
	switch {
	case bytes.Equal(p, doneData):
		return Done
	case firstKeyIsError(p):
		return Error
	case hasOutput(p), find(p, keyFinish, nonNull) >= 0:
		return Token
	case bytes.Contains(p, quotedError) && isErrorObject(p):
		return Error
	}
	return Other
}

// Pieces counts the generated-output pieces in a Token event's payload (for
// partial billing when usage is missing): one per choice that carries
// content, text, reasoning, a tool call or a refusal. A choice that only
// finishes counts none, and so does a payload that is no Token.
func Pieces(payload []byte) int {
	p := payload
	// A chat choice holds one delta (or message) object: the bytes from one
	// such object to the next are one choice's.
	body := nameDelta
	at := objectOf(p, 0, body)
	if at < 0 && !isTextCompletion(p) {
		body = nameMessage
		at = objectOf(p, 0, body)
	}
	if at < 0 {
		return textPieces(p)
	}
	n := 0
	for at >= 0 {
		next := objectOf(p, at+1, body)
		end := len(p)
		if next >= 0 {
			end = next
		}
		if choiceHasOutput(p[at:end]) {
			n++
		}
		at = next
	}
	return n
}

// textPieces counts the completion choices in p with non-empty text: each
// choice has one text.
func textPieces(p []byte) int {
	at := find(p, keyText, anyValue)
	if at < 0 {
		return 0
	}
	if bytes.IndexByte(p[at:], '{') < 0 {
		// No object after the first text: it was the only choice.
		if passes(p[at:], nonEmptyString) {
			return 1
		}
		return 0
	}
	return count(p, keyText, nonEmptyString)
}

// hasOutput reports whether p holds a key whose value is generated output.
func hasOutput(p []byte) bool {
	// Most events are one delta that opens with its output: one scan.
	if at := objectOf(p, 0, nameDelta); at >= 0 && opensWithOutput(p[at:]) {
		return true
	}
	return find(p, keyText, nonEmptyString) >= 0 || hasChatOutput(p)
}

// choiceHasOutput reports whether the bytes of one chat choice, from its
// delta or message object on, hold output.
func choiceHasOutput(c []byte) bool {
	return opensWithOutput(c) || hasChatOutput(c)
}

// hasChatOutput reports whether b holds a chat output key with an output
// value.
func hasChatOutput(b []byte) bool {
	for _, k := range chatOutput {
		if find(b, k.key, k.test) >= 0 {
			return true
		}
	}
	return false
}

// opensWithOutput reports whether v starts with an object whose first key
// is an output key with an output value. False says nothing about the
// object's other keys.
func opensWithOutput(v []byte) bool {
	if len(v) == 0 || v[0] != '{' {
		return false
	}
	d := trimLeft(v[1:])
	if len(d) < 2 || d[0] != '"' {
		return false
	}
	d = d[1:]
	for _, k := range chatOutput {
		if bytes.HasPrefix(d, k.name) {
			at := valueStart(d, len(k.name))
			return at >= 0 && passes(d[at:], k.test)
		}
	}
	return false
}
