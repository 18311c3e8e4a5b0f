package server

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"sync"
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

// write sends one whole event and flushes it.
func (w *sseWriter) write(ev []byte) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.failed != nil {
		return w.failed
	}
	w.commitLocked()
	if _, err := w.c.Response().Write(ev); err != nil {
		w.failed = err
		return err
	}
	w.c.Response().Flush()
	w.lastWrite = time.Now()
	return nil
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
	dataPrefix     = []byte("data:")
	doneData       = []byte("[DONE]")
	usageMarker    = []byte(`"usage":{`)
	emptyChoices   = []byte(`"choices":[]`)
	contentMarker  = []byte(`"content":"`)
	textMarker     = []byte(`"text":"`)
	emptyContent   = []byte(`"content":""`)
	emptyText      = []byte(`"text":""`)
	errorMarker    = []byte(`"error"`)
	timingPrefix   = []byte(serving.TimingComment)
	readerPool     = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, 16<<10) }}
	errMidstream   = errors.New("upstream stream ended before [DONE]")
	midstreamEvent = []byte(`data: {"error":{"message":"the model replica failed in the middle of the answer; the output is incomplete","type":"server_error","param":null,"code":"upstream_midstream_error"}}` + "\n\n")
)

// relayStream relays an SSE answer event by event, exactly as the replica
// sent it, except for the usage chunk, which the gateway always asks for and
// strips again when the client did not. It learns the usage on the way.
func (s *Server) relayStream(ctx context.Context, c echo.Context, cl *call, resp *http.Response, wroteAt time.Time) error {
	w := s.newSSEWriter(c, cl)
	defer w.close()
	br := readerPool.Get().(*bufio.Reader)
	br.Reset(resp.Body)
	defer func() { br.Reset(nil); readerPool.Put(br) }()

	var ev []byte // the event being assembled, lines included verbatim
	for {
		line, err := br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			ev = append(ev, line...)
			continue
		}
		if len(line) > 0 {
			ev = append(ev, line...)
		}
		if err != nil {
			return s.streamEnded(ctx, w, cl, err)
		}
		if len(bytes.TrimRight(line, "\r\n")) != 0 {
			continue // the event goes on
		}
		done, err := s.relayEvent(w, cl, ev, wroteAt)
		ev = ev[:0]
		if err != nil {
			return err
		}
		if done {
			cl.stages.Total = time.Since(cl.start)
			return nil
		}
	}
}

// relayEvent handles one complete event; done is true after [DONE].
func (s *Server) relayEvent(w *sseWriter, cl *call, ev []byte, wroteAt time.Time) (done bool, err error) {
	payload := eventData(ev)
	if payload == nil { // a comment or a field we do not interpret
		if bytes.HasPrefix(ev, timingPrefix) {
			parseTiming(cl, bytes.TrimRight(ev, "\r\n"))
			return false, nil // the sidecar's report is for the gateway only
		}
		return false, w.write(ev)
	}
	if bytes.Equal(payload, doneData) {
		return true, w.write(ev)
	}
	if bytes.Contains(payload, usageMarker) {
		if u := gjson.GetBytes(payload, "usage"); u.IsObject() {
			cl.usage.PromptTokens = u.Get("prompt_tokens").Int()
			cl.usage.CompletionTokens = u.Get("completion_tokens").Int()
			cl.gotUsage = true
			if !cl.req.wantUsage {
				if bytes.Contains(payload, emptyChoices) {
					return false, nil // the usage chunk only the gateway wanted
				}
				stripped, serr := sjson.DeleteBytes(payload, "usage")
				if serr == nil {
					ev = append(append(append([]byte{}, "data: "...), stripped...), "\n\n"...)
				}
			}
		}
	}
	hasToken := (bytes.Contains(payload, contentMarker) && !bytes.Contains(payload, emptyContent)) ||
		(bytes.Contains(payload, textMarker) && !bytes.Contains(payload, emptyText))
	if hasToken {
		cl.relayedTokens++
	}
	if !cl.firstToken && (hasToken || bytes.HasPrefix(bytes.TrimSpace(payload), []byte(`{"error"`))) {
		cl.stages.UpstreamTTFT = time.Since(wroteAt)
		if cl.stages.EngineTTFT >= 0 {
			cl.stages.Network = max(cl.stages.UpstreamTTFT-cl.stages.EngineTTFT, 0)
		}
	}
	if err := w.write(ev); err != nil {
		return false, err
	}
	if !cl.firstToken && hasToken {
		cl.firstToken = true
		cl.stages.TTFT = time.Since(cl.start)
	}
	if bytes.Contains(payload, errorMarker) && gjson.GetBytes(payload, "error").IsObject() {
		cl.outcome, cl.errClass = "midstream_error", "upstream_error_event"
	}
	return false, nil
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

// streamEnded handles the upstream body ending before [DONE].
func (s *Server) streamEnded(ctx context.Context, w *sseWriter, cl *call, err error) error {
	cl.stages.Total = time.Since(cl.start)
	if ctx.Err() != nil {
		return ctx.Err() // the client went away; finish records it
	}
	if errors.Is(err, io.EOF) {
		err = errMidstream
	}
	if w.isCommitted() {
		// The client already has a 200 (and maybe tokens): the only honest
		// thing left is an in-band error event.
		_ = w.write(midstreamEvent)
		cl.outcome, cl.errClass = "midstream_error", "upstream_midstream"
	}
	return &upstreamError{err: err}
}
