package server

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"

	"tailgate/serving"
)

// sseWriter writes SSE events to the client, flushing each one at once, and
// sends a comment when the stream has been silent for the keep-alive
// interval (a slow first token must not look like a dead connection to
// proxies and clients). Headers are committed with the first write.
type sseWriter struct {
	s  *Server
	c  echo.Context
	cl *call

	mu        sync.Mutex
	committed bool
	closed    bool
	lastWrite time.Time
	timer     *time.Timer
	failed    error // the first write error (client gone)
}

func (s *Server) newSSEWriter(c echo.Context, cl *call) *sseWriter {
	w := &sseWriter{s: s, c: c, cl: cl, lastWrite: time.Now()}
	w.mu.Lock() // keepAlive may fire before the assignment below is visible
	w.timer = time.AfterFunc(s.cfg.KeepAlive, w.keepAlive)
	w.mu.Unlock()
	return w
}

func (w *sseWriter) commitLocked() {
	if w.committed {
		return
	}
	w.committed = true
	h := w.c.Response().Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	w.s.setRouteHeaders(h, w.cl)
	w.c.Response().WriteHeader(http.StatusOK)
}

// write sends whole events and flushes them.
func (w *sseWriter) write(evs ...[]byte) error { return w.send(true, evs...) }

// send writes whole events, flushing them when flush is set. The relay
// skips the flush only when the next event has already arrived, so nothing
// that reached the gateway ever waits.
func (w *sseWriter) send(flush bool, evs ...[]byte) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.failed != nil {
		return w.failed
	}
	w.commitLocked()
	for _, ev := range evs {
		if _, err := w.c.Response().Write(ev); err != nil {
			w.failed = err
			return err
		}
	}
	if flush {
		w.c.Response().Flush()
	}
	w.lastWrite = time.Now()
	return nil
}

// nextEventBuffered reports whether a whole next event is already in br.
func nextEventBuffered(br *bufio.Reader) bool {
	n := br.Buffered()
	if n == 0 {
		return false
	}
	b, _ := br.Peek(n)
	return bytes.Contains(b, []byte("\n\n"))
}

func (w *sseWriter) keepAlive() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed || w.failed != nil {
		return
	}
	if idle := time.Since(w.lastWrite); idle < w.s.cfg.KeepAlive {
		w.timer.Reset(w.s.cfg.KeepAlive - idle)
		return
	}
	w.commitLocked()
	if _, err := w.c.Response().Write([]byte(": keep-alive\n\n")); err != nil {
		w.failed = err
		return
	}
	w.c.Response().Flush()
	w.lastWrite = time.Now()
	w.timer.Reset(w.s.cfg.KeepAlive)
}

// close stops keep-alives; after it returns no write happens from the timer.
func (w *sseWriter) close() {
	w.timer.Stop()
	w.mu.Lock()
	w.closed = true
	w.mu.Unlock()
}

func (w *sseWriter) isCommitted() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.committed
}

var (
	dataPrefix    = []byte("data:")
	doneData      = []byte("[DONE]")
	usageMarker   = []byte(`"usage":{`)
	emptyChoices  = []byte(`"choices":[]`)
	contentMarker = []byte(`"content":"`)
	textMarker    = []byte(`"text":"`)
	emptyContent  = []byte(`"content":""`)
	emptyText     = []byte(`"text":""`)
	finishMarker  = []byte(`"finish_reason":"`)
	errorPrefix   = []byte(`{"error"`)
	timingPrefix  = []byte(serving.TimingComment)
	simQueue      = []byte(": sim-queue-ms=")
	readerPool    = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, 16<<10) }}

	errMidstream   = errors.New("upstream stream ended before [DONE]")
	errIdle        = errors.New("no token within the inter-token deadline")
	midstreamEvent = []byte(`data: {"error":{"message":"the model replica failed in the middle of the answer; the output is incomplete","type":"server_error","param":null,"code":"upstream_midstream_error"}}` + "\n\n")
)

// readEvent reads one SSE event (lines up to a blank line), verbatim,
// appending to buf (which may be reused between events).
func readEvent(br *bufio.Reader, buf []byte) ([]byte, error) {
	ev := buf[:0]
	for {
		line, err := br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			ev = append(ev, line...)
			continue
		}
		ev = append(ev, line...)
		if err != nil {
			return nil, err
		}
		if len(bytes.TrimRight(line, "\r\n")) == 0 {
			if len(bytes.TrimSpace(ev)) == 0 {
				ev = ev[:0] // stray blank line
				continue
			}
			return ev, nil
		}
	}
}

type eventKind int

const (
	evOther eventKind = iota // relay as is (role chunk, usage, ...)
	evToken                  // carries a token or a finish reason
	evDone                   // data: [DONE]
	evError                  // an error event
	evDrop                   // for the gateway only (timing comments, stripped usage)
)

// inspect classifies an upstream event and learns usage and timings from
// it; it returns the event as the client may see it (usage stripped when the
// client did not ask for it).
func (u *upstream) inspect(cl *call, ev []byte) (eventKind, []byte) {
	payload := eventData(ev)
	if payload == nil {
		switch {
		case bytes.HasPrefix(ev, timingPrefix), bytes.HasPrefix(ev, simQueue):
			parseTiming(&u.stages, bytes.TrimRight(ev, "\r\n"))
		}
		return evDrop, nil // upstream comments are not the client's business
	}
	if bytes.Equal(payload, doneData) {
		return evDone, ev
	}
	if bytes.HasPrefix(bytes.TrimSpace(payload), errorPrefix) {
		return evError, ev
	}
	if bytes.Contains(payload, usageMarker) {
		if us := gjson.GetBytes(payload, "usage"); us.IsObject() {
			u.usage.PromptTokens = us.Get("prompt_tokens").Int()
			u.usage.CompletionTokens = us.Get("completion_tokens").Int()
			u.gotUsage = true
			if !cl.req.wantUsage {
				if bytes.Contains(payload, emptyChoices) {
					return evDrop, nil // the usage chunk only the gateway wanted
				}
				if stripped, err := sjson.DeleteBytes(payload, "usage"); err == nil {
					ev = append(append([]byte("data: "), stripped...), "\n\n"...)
				}
			}
		}
	}
	if (bytes.Contains(payload, contentMarker) && !bytes.Contains(payload, emptyContent)) ||
		(bytes.Contains(payload, textMarker) && !bytes.Contains(payload, emptyText)) {
		u.tokens++
		return evToken, ev
	}
	if bytes.Contains(payload, finishMarker) {
		return evToken, ev
	}
	return evOther, ev
}

// eventData returns the payload of an event's data line, nil if it has none.
func eventData(ev []byte) []byte {
	for len(ev) > 0 {
		i := bytes.IndexByte(ev, '\n')
		var line []byte
		if i < 0 {
			line, ev = ev, nil
		} else {
			line, ev = ev[:i], ev[i+1:]
		}
		line = bytes.TrimRight(line, "\r")
		if bytes.HasPrefix(line, dataPrefix) {
			return bytes.TrimPrefix(line[len(dataPrefix):], []byte(" "))
		}
	}
	return nil
}

// relayStream relays the winning attempt: the events it buffered up to its
// first token, then the rest as they arrive, each flushed at once. An
// inter-token idle deadline catches a replica that hangs mid-answer.
func (s *Server) relayStream(w *sseWriter, cl *call, u *upstream) error {
	if err := w.write(u.pending...); err != nil {
		return err
	}
	cl.firstToken = true
	cl.stages.TTFT = time.Since(cl.start)
	u.pending = nil
	if u.done {
		return nil
	}

	idle := s.idleDeadline(cl.req.model)
	var idleFired atomic.Bool
	timer := time.AfterFunc(idle, func() { idleFired.Store(true); u.cancel() })
	defer timer.Stop()
	var buf []byte
	unflushed := false
	for {
		raw, err := readEvent(u.br, buf)
		if err != nil {
			if unflushed {
				_ = w.write()
			}
			return s.streamBroke(w, cl, u, err, idleFired.Load())
		}
		buf = raw
		timer.Reset(idle)
		kind, ev := u.inspect(cl, raw)
		switch kind {
		case evDrop:
			if unflushed && !nextEventBuffered(u.br) {
				_ = w.write()
				unflushed = false
			}
			continue
		case evDone:
			return w.write(ev)
		case evError:
			cl.outcome, cl.errClass = "midstream_error", "upstream_error_event"
		}
		flush := !nextEventBuffered(u.br)
		if err := w.send(flush, ev); err != nil {
			return err
		}
		unflushed = !flush
	}
}

// streamBroke ends a stream whose upstream failed after the first token:
// there is no silent retry now, only an honest in-band error event.
func (s *Server) streamBroke(w *sseWriter, cl *call, u *upstream, err error, idle bool) error {
	if cl.ctx.Err() != nil {
		return cl.ctx.Err() // the client went away; finish records it
	}
	if errors.Is(err, io.EOF) {
		err = errMidstream
	}
	if idle {
		err = errIdle
		s.reg.Eject(u.rep, "idle_deadline")
	}
	_ = w.write(midstreamEvent)
	cl.outcome, cl.errClass = "midstream_error", "upstream_midstream"
	if idle {
		cl.errClass = "idle_deadline"
	}
	return err
}
