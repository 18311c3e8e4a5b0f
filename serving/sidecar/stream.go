package sidecar

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/tailgate-dev/tailgate/serving"
	"github.com/tailgate-dev/tailgate/serving/sse"
)

// maxPending bounds how much the relay gathers from events already at hand
// before writing them.
const maxPending = 32 << 10

// simQueuePrefix starts the simulated engine's queue-time comment line.
var simQueuePrefix = []byte(": sim-queue-ms=")

var readerPool = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, 16<<10) }}

// relayStream relays an SSE answer event by event, as the engine sent it,
// except that the simulator's queue-time comment is taken out and the
// timing comment is put in right before the first token event (the first
// event with generated output of any kind, or a finish_reason; see
// [sse.Classify]). Events are flushed as soon as the next one is not already
// at hand, so nothing waits in the sidecar for bytes still on their way.
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
		buf   []byte // the event being read, reused
		out   []byte // complete events not yet written
		timed bool   // the timing comment is out
	)
	for {
		ev, err := sse.ReadEvent(br, buf)
		if err != nil {
			// The body ended; pass on whatever came, even half an event.
			ev, _ = takeQueue(ev, &queue, &haveQueue)
			out = append(out, ev...)
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
		buf = ev
		ev, keep := takeQueue(ev, &queue, &haveQueue)
		if keep {
			if !timed && sse.Classify(ev) == sse.Token {
				timed = true
				ttft := time.Since(wroteAt)
				s.ttft.add(ttft)
				traceTTFT(r, ttft, queue, haveQueue)
				out = appendTiming(out, ttft, queue, haveQueue)
			}
			out = append(out, ev...)
		}
		if len(out) == 0 || (len(out) < maxPending && sse.NextBuffered(br)) {
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

// takeQueue takes the simulator's queue-time lines out of ev, in place, and
// records the time they report. keep is false when nothing of the event is
// left but its end.
func takeQueue(ev []byte, queue *time.Duration, have *bool) (rest []byte, keep bool) {
	if !bytes.Contains(ev, simQueuePrefix) {
		return ev, true
	}
	rest = ev[:0]
	for line := range bytes.Lines(ev) {
		if !bytes.HasPrefix(line, simQueuePrefix) {
			rest = append(rest, line...)
			continue
		}
		if q, ok := parseMillis(string(bytes.TrimRight(line[len(simQueuePrefix):], "\r\n"))); ok {
			*queue, *have = q, true
		}
	}
	return rest, !isBlank(rest)
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

// isBlank reports whether ev is an event's end alone: a blank line.
func isBlank(ev []byte) bool {
	return len(ev) == 1 && ev[0] == '\n' || len(ev) == 2 && ev[0] == '\r' && ev[1] == '\n'
}
