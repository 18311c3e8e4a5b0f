package sidecar

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net/http"
	"sync"
	"time"

	"tailgate/serving"
)

// maxPending bounds how much the relay gathers from events already at hand
// before writing them.
const maxPending = 32 << 10

// simQueuePrefix starts the simulated engine's queue-time comment line.
const simQueuePrefix = ": sim-queue-ms="

var readerPool = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, 16<<10) }}

// relayStream relays an SSE answer event by event, as the engine sent it,
// except that the simulator's queue-time comment is taken out and the
// timing comment is put in right before the first event that carries a
// token. Events are flushed as soon as the next one is not already at hand,
// so nothing waits in the sidecar for bytes still on their way.
func (s *Sidecar) relayStream(w http.ResponseWriter, r *http.Request, resp *http.Response, wroteAt time.Time) {
	h := w.Header()
	copyResponseHeader(h, resp.Header)
	h.Del("Content-Length")
	queue, haveQueue := simQueue(resp.Header)
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	flush := func() error {
		if err := rc.Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) {
			return err
		}
		return nil
	}
	if flush() != nil {
		return
	}

	br := readerPool.Get().(*bufio.Reader)
	br.Reset(resp.Body)
	defer func() { br.Reset(nil); readerPool.Put(br) }()

	var (
		ev       []byte // the event being assembled, lines verbatim
		out      []byte // complete events not yet written
		stripped bool   // ev lost a queue-time line
		long     bool   // in the middle of a line longer than br's buffer
		timed    bool   // the timing comment is out
	)
	for {
		line, err := br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			ev = append(ev, line...)
			long = true
			continue
		}
		wasLong := long
		long = false
		if err != nil {
			// The body ended; pass on whatever came, even half an event.
			out = append(append(out, ev...), line...)
			if len(out) > 0 {
				_, _ = w.Write(out)
				_ = flush()
			}
			if !errors.Is(err, io.EOF) && r.Context().Err() == nil {
				// The engine broke off: make the client see a broken
				// stream, not a clean end.
				s.log.Warn("engine stream broke off", "path", r.URL.Path, "err", err)
				panic(http.ErrAbortHandler)
			}
			return
		}
		if !wasLong && bytes.HasPrefix(line, []byte(simQueuePrefix)) {
			if q, ok := parseMillis(string(bytes.TrimRight(line[len(simQueuePrefix):], "\r\n"))); ok {
				queue, haveQueue = q, true
			}
			stripped = true
			continue
		}
		ev = append(ev, line...)
		if wasLong || !isBlank(line) {
			continue // the event goes on
		}

		switch {
		case stripped && len(ev) == len(line):
			// Nothing was left of the event but its end.
		case !timed && hasToken(ev):
			timed = true
			ttft := time.Since(wroteAt)
			s.ttft.add(ttft)
			out = appendTiming(out, ttft, queue, haveQueue)
			out = append(out, ev...)
		default:
			out = append(out, ev...)
		}
		ev, stripped = ev[:0], false
		if len(out) == 0 || (len(out) < maxPending && eventAtHand(br)) {
			continue
		}
		if _, err := w.Write(out); err != nil {
			return // the client went away; closing the body aborts the engine
		}
		if flush() != nil {
			return
		}
		out = out[:0]
	}
}

// appendTiming appends the timing comment event of the wire contract.
func appendTiming(b []byte, ttft, queue time.Duration, haveQueue bool) []byte {
	b = append(b, serving.TimingComment...)
	b = append(b, "engine_ttft_ms="...)
	b = appendMillis(b, ttft)
	if haveQueue {
		b = append(b, " engine_queue_ms="...)
		b = appendMillis(b, queue)
	}
	return append(b, "\n\n"...)
}

func isBlank(line []byte) bool {
	return len(line) == 1 || (len(line) == 2 && line[0] == '\r')
}

// eventAtHand reports whether br already holds the whole next event, so
// reading it cannot block.
func eventAtHand(br *bufio.Reader) bool {
	b, _ := br.Peek(br.Buffered())
	return bytes.HasPrefix(b, []byte("\n")) || bytes.HasPrefix(b, []byte("\r\n")) ||
		bytes.Contains(b, []byte("\n\n")) || bytes.Contains(b, []byte("\n\r\n"))
}

var (
	dataField     = []byte("data:")
	contentMarker = []byte(`"content":"`)
	textMarker    = []byte(`"text":"`)
	reasonMarker  = []byte(`"reasoning_content":"`)
	toolMarker    = []byte(`"tool_calls":[{`)
)

// hasToken reports whether an event carries generated output: a non-empty
// content, text or reasoning delta, or a tool call. The role chunk that
// opens a chat stream (content "") does not.
func hasToken(ev []byte) bool {
	if !bytes.Contains(ev, dataField) {
		return false
	}
	return nonEmpty(ev, contentMarker) || nonEmpty(ev, textMarker) ||
		nonEmpty(ev, reasonMarker) || bytes.Contains(ev, toolMarker)
}

// nonEmpty reports whether some occurrence of marker (a key and the opening
// quote of its string value) is followed by a non-empty string.
func nonEmpty(b, marker []byte) bool {
	for {
		i := bytes.Index(b, marker)
		if i < 0 {
			return false
		}
		b = b[i+len(marker):]
		if len(b) > 0 && b[0] != '"' {
			return true
		}
	}
}
