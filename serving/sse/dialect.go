package sse

import (
	"bytes"

	"github.com/tidwall/gjson"
)

// Dialect is the event vocabulary of an answer stream. Every dialect shares
// SSE's framing ([ReadEvent]); they differ in which event is the first
// token, which ends the answer and where usage is reported.
type Dialect uint8

const (
	// Chunks are OpenAI's chat and completion chunks (also vLLM's
	// transcription chunks): data lines only, the answer ends with
	// "data: [DONE]". See [Classify].
	Chunks Dialect = iota
	// ResponseEvents are the Responses API's typed events ("event:
	// response.output_text.delta" and a data line carrying the same
	// "type"): output comes in *.delta events, the answer ends with
	// response.completed (or response.incomplete), and no [DONE] follows.
	// Usage is reported only in that final event (response.usage).
	ResponseEvents
	// MessageEvents are Anthropic's Messages events as vLLM sends them:
	// message_start (with the prompt's usage), content_block_start / _delta /
	// _stop per block, message_delta (stop reason, output usage so far),
	// message_stop, then vLLM's "data: [DONE]". Output comes in
	// content_block_delta (text_delta, thinking_delta, input_json_delta).
	MessageEvents
)

// Final is the kind of an event that ends an answer without being [DONE]
// (response.completed, message_stop): a relay commits the answer's ledger
// row before it sends it. Only [Dialect.Classify] returns it.
const Final Kind = Error + 1

var eventField = []byte("event:")

// Name returns the value of an event's "event:" field, nil if it has none.
func Name(ev []byte) []byte {
	for len(ev) > 0 {
		var line []byte
		if i := bytes.IndexByte(ev, '\n'); i >= 0 {
			line, ev = ev[:i], ev[i+1:]
		} else {
			line, ev = ev, nil
		}
		if bytes.HasPrefix(line, eventField) {
			v := bytes.TrimSpace(line[len(eventField):])
			return v
		}
	}
	return nil
}

// Classify classifies one event of the dialect d; for [Chunks] it is
// [Classify]. An event without an "event:" field is named by its payload's
// "type".
func (d Dialect) Classify(ev []byte) Kind {
	if d == Chunks {
		return Classify(ev)
	}
	p := Data(ev)
	if p == nil {
		return Comment
	}
	p = trimSpace(p)
	if bytes.Equal(p, doneData) {
		return Done
	}
	name := Name(ev)
	if name == nil {
		name = []byte(gjson.GetBytes(p, "type").Str)
	}
	switch d {
	case ResponseEvents:
		switch string(name) {
		case "response.completed", "response.incomplete":
			return Final
		case "response.failed", "error":
			return Error
		}
		if bytes.HasSuffix(name, []byte(".delta")) {
			return Token
		}
	case MessageEvents:
		switch string(name) {
		case "content_block_delta":
			return Token
		case "message_stop":
			return Final
		case "error":
			return Error
		}
	}
	return Other
}

// Pieces counts the generated-output pieces of a Token event of dialect d
// (see [Pieces]): a typed dialect's delta event is one piece, one decoding
// step's output as vLLM sends them.
func (d Dialect) Pieces(payload []byte) int {
	if d == Chunks {
		return Pieces(payload)
	}
	return 1
}
