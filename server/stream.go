package server

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/tailgate-dev/tailgate/policy"
	"github.com/tailgate-dev/tailgate/server/apierr"
)

// sseWriter owns the ResponseWriter of a streamed answer: every write and
// flush goes through it, under one lock, so the keep-alive timer and the
// relay never interleave. It sends a comment when the stream has been silent
// for the keep-alive interval (a slow first token must not look like a dead
// connection to proxies and clients), and commits the SSE headers with the
// first write. A stream ends badly in one place only: [sseWriter.fail].
type sseWriter struct {
	rw           http.ResponseWriter
	flusher      http.Flusher
	rc           *http.ResponseController
	flushRC      *http.ResponseController // rw's innermost writer: its Flush says when it failed
	writeTimeout time.Duration            // how long one write may block on a client that does not read
	keepAlive    time.Duration
	headers      func(http.Header) // route headers, set when the stream commits once armed

	mu        sync.Mutex
	armed     bool // routing is decided: headers may be read
	committed bool
	closed    bool // no write may follow: close or fail ran
	lastWrite time.Time
	deadline  time.Time // the write deadline set on the connection last
	timer     *time.Timer
	failed    error // the first write error (client gone)
}

// A stream's constant header values, shared by every stream: net/http only
// reads a handler's values (WriteHeader copies them, Header.Clone), and an
// append to a slice of capacity one copies it (Header.Set allocated one
// slice for each, three a stream).
var (
	eventStreamType = []string{"text/event-stream"}
	noCache         = []string{"no-cache"}
	noBuffering     = []string{"no"}
)

func newSSEWriter(rw http.ResponseWriter, keepAlive, writeTimeout time.Duration, headers func(http.Header)) *sseWriter {
	w := &sseWriter{rw: rw, keepAlive: keepAlive, writeTimeout: writeTimeout, headers: headers, lastWrite: time.Now()}
	w.flusher, _ = rw.(http.Flusher)
	w.rc = http.NewResponseController(rw)
	// echo's Response.Flush swallows the error of the flush under it, and a
	// ResponseController prefers it to unwrapping: flush the writer it wraps
	// (which Response.Flush would flush, the same way).
	inner := rw
	if er, ok := rw.(*echo.Response); ok {
		inner = er.Writer
	}
	w.flushRC = http.NewResponseController(inner)
	w.mu.Lock() // the timer may fire before the assignment below is visible
	w.timer = time.AfterFunc(keepAlive, w.keepAliveTick)
	w.mu.Unlock()
	return w
}

func (w *sseWriter) commitLocked() {
	if w.committed {
		return
	}
	w.committed = true
	h := w.rw.Header()
	h["Content-Type"], h["Cache-Control"], h["X-Accel-Buffering"] = eventStreamType, noCache, noBuffering
	if w.headers != nil && w.armed {
		w.headers(h)
	}
	w.rw.WriteHeader(http.StatusOK)
}

// routed says routing is decided, so the route headers may be sent with the
// commit (a keep-alive before it commits the stream without them).
func (w *sseWriter) routed() {
	w.mu.Lock()
	w.armed = true
	w.mu.Unlock()
}

// deadlineLocked bounds the next write: a client that stops reading fails
// the write instead of holding the stream (and everything it holds) forever.
// The deadline is moved only once less than 7/8 of writeTimeout is left
// before it, so a write may block between 7/8 of writeTimeout and all of
// it: setting it for every event (a poller timer changed per chunk) was 3 %
// of BenchmarkPacedStreams' CPU.
func (w *sseWriter) deadlineLocked(now time.Time) {
	if w.writeTimeout > 0 && w.deadline.Sub(now) < w.writeTimeout-w.writeTimeout/8 {
		w.deadline = now.Add(w.writeTimeout)
		_ = w.rc.SetWriteDeadline(w.deadline)
	}
}

// flushLocked sends what the events left in the connection's buffer. Its
// error counts as a write's: a client that stopped reading fails the flush
// at the write deadline (the events fit the buffer, so the writes did not),
// and that is a stalled client, not one that went away — http.Flusher's
// Flush would swallow it, and the request's context, cancelled as the
// server drops the connection, would speak instead.
func (w *sseWriter) flushLocked() error {
	if w.flusher == nil {
		return nil
	}
	if err := w.flushRC.Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) {
		w.failed = &clientError{err}
		return w.failed
	}
	return nil
}

// write sends whole events and flushes them.
func (w *sseWriter) write(evs ...[]byte) error { return w.send(true, evs...) }

// comment sends an SSE comment line (which clients ignore) at once,
// committing the stream's headers if it was the first write.
func (w *sseWriter) comment(line string) error { return w.send(true, []byte(line)) }

// send writes whole events, flushing them when flush is set. The relay
// skips the flush only when the next event has already arrived, so nothing
// that reached the gateway ever waits.
func (w *sseWriter) send(flush bool, evs ...[]byte) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.failed != nil {
		return w.failed
	}
	if w.closed {
		return errStreamClosed
	}
	now := time.Now()
	w.deadlineLocked(now)
	w.commitLocked()
	for _, ev := range evs {
		if _, err := w.rw.Write(ev); err != nil {
			w.failed = &clientError{err}
			return w.failed
		}
	}
	if flush {
		if err := w.flushLocked(); err != nil {
			return err
		}
	}
	w.lastWrite = now
	return nil
}

func (w *sseWriter) keepAliveTick() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed || w.failed != nil {
		return
	}
	now := time.Now()
	if idle := now.Sub(w.lastWrite); idle < w.keepAlive {
		w.timer.Reset(w.keepAlive - idle)
		return
	}
	w.deadlineLocked(now)
	w.commitLocked()
	if _, err := w.rw.Write(keepAliveComment); err != nil {
		w.failed = &clientError{err}
		return
	}
	if w.flushLocked() != nil {
		return
	}
	w.lastWrite = now
	w.timer.Reset(w.keepAlive)
}

// fail ends the stream with ae and closes the writer; nothing, not even a
// keep-alive, can follow. If nothing was sent yet the client gets a plain
// HTTP error with ae's status; otherwise an in-band error event in the
// shape of the stream's API (apierr.Event: OpenAI's, or Anthropic's on the
// Messages API), the status line being long gone. It is the only way a stream ends
// badly; a second call does nothing.
func (w *sseWriter) fail(ae *apierr.Error) {
	w.timer.Stop()
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return
	}
	w.closed = true
	if w.failed != nil {
		return // the client is gone
	}
	w.deadlineLocked(time.Now())
	if !w.committed {
		w.committed = true
		if w.headers != nil && w.armed {
			w.headers(w.rw.Header())
		}
		apierr.Write(w.rw, ae)
		return
	}
	if _, err := w.rw.Write(apierr.Event(w.rw, ae)); err != nil {
		w.failed = &clientError{err}
		return
	}
	_ = w.flushLocked() // the stream ends here either way
}

// writeFailure returns the first failed write to the client, or nil (also
// for a nil writer: a JSON answer).
func (w *sseWriter) writeFailure() error {
	if w == nil {
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.failed
}

// close stops keep-alives; after it returns nothing more is written.
func (w *sseWriter) close() {
	w.timer.Stop()
	w.mu.Lock()
	w.closed = true
	w.mu.Unlock()
}

var (
	keepAliveComment = []byte(": keep-alive\n\n")
	errStreamClosed  = errors.New("stream already ended")
)

// clientError is a failed write to the client: it went away or stopped
// reading for longer than the write timeout.
type clientError struct{ err error }

func (e *clientError) Error() string { return "write to client: " + e.err.Error() }
func (e *clientError) Unwrap() error { return e.err }

// openRowEvery is how often a stream's open ledger row is brought up to
// date with what the client has received: a gateway killed mid-stream
// loses the output of at most this long plus [OpenRowWait] (120 ms, as
// with the 100 ms and the ledger's 20 ms batching this replaced) from the
// bill. Each refresh replaces the row in the writer's queue, so a stream
// costs the ledger at most one row write per interval.
const openRowEvery = 60 * time.Millisecond

// OpenRowWait is the longest the ledger writer holds open rows' refreshes
// while no other row is queued (data.LedgerConfig.RefreshInterval): with
// 500 streams open, one transaction every 60 ms instead of every 20 ms
// writes a third of the WAL pages, for the same rows (the refreshes touch
// most of the ledger's pages each time).
const OpenRowWait = 60 * time.Millisecond

// relayStream relays the winning attempt: the events it buffered up to its
// first token, then the rest as they arrive (read by [upstream.next]), each
// flushed at once unless the next one is already here. An inter-token idle
// deadline catches a replica that hangs mid-answer. It keeps an open ledger
// row up to date while the stream runs and calls done (which commits the
// final row) before the answer's final event or [DONE] goes out. It returns
// nil when the stream ended whole, a *midstreamError when the replica broke
// it, done's error when the final row could not be committed (the final
// bytes withheld), or the client's error when the client went away.
func (s *Server) relayStream(ctx context.Context, w *sseWriter, cl *call, u *upstream, ticket *policy.Ticket, done func() error) error {
	if err := s.relayPending(w, cl, u, done); err != nil || u.ended {
		return err
	}
	// committed: done ran; what may follow is [DONE] (Messages) or the end
	// of the body (Responses).
	committed := u.done
	s.openRow(cl, u, ticket)
	lastOpen := time.Now()
	u.follow(ctx, s.idleDeadline(cl.req.model), time.Time{})
	defer u.unfollow()
	unflushed := false
	var waiter answerWaiter
	if u.resp != nil {
		waiter, _ = u.resp.Body.(answerWaiter)
	}
	for {
		if waiter != nil && u.br.Buffered() == 0 {
			idleWait(u, waiter)
		}
		kind, ev, err := u.next(cl)
		if err != nil {
			if unflushed {
				_ = w.write()
			}
			if err == io.EOF { // whole: it ended after its final event
				return nil
			}
			return err
		}
		switch kind {
		case evDrop:
			if unflushed && !u.buffered() {
				_ = w.write()
				unflushed = false
			}
			continue
		case evFinal, evDone:
			// The row is committed before the final bytes go out; a row
			// that cannot be is the stream's end, those bytes withheld.
			if !committed {
				committed = true
				if err := done(); err != nil {
					return err
				}
			}
			if kind == evDone {
				if err := w.write(ev); err != nil {
					return err
				}
				return u.errorEventEnd()
			}
		}
		flush := !u.buffered()
		if err := w.send(flush, ev); err != nil {
			return err
		}
		unflushed = !flush
		if kind == evToken && time.Since(lastOpen) >= openRowEvery {
			if err := s.ledger.Healthy(); err != nil {
				// Its row cannot be kept current: the stream ends here with
				// ledger_unavailable rather than run on unrecorded, billed at
				// what it delivered once the ledger is back.
				return &unbilledError{err: err}
			}
			s.openRow(cl, u, ticket)
			lastOpen = time.Now()
		}
	}
}

// answerWaiter is an engine's answer that can wait for its next byte without
// reading it (serving/hop's body).
type answerWaiter interface{ Wait() }

// readBufs is an open stream's read state between two events: its event
// reader (2 KiB) and the buffer the last event was copied into. A stream
// waiting for its engine's next event holds neither: it waits on the
// engine connection's own read buffer ([answerWaiter]), and they wait in
// idleBufs for whichever stream reads next. With 500 streams a chunk every
// 50 ms, a handful are in use at any instant instead of 500 of each.
type readBufs struct {
	br  *bufio.Reader
	buf []byte
}

var (
	idleBufs  sync.Pool // *readBufs holding a reader and a buffer
	emptyBufs sync.Pool // *readBufs holding nothing, for the next idleWait
)

// idleWait waits for u's next byte from its engine without holding the
// stream's read buffers: they go to idleBufs during the wait, and u takes
// a pair from there (or a new reader) once the byte is there. u's reader
// must hold nothing buffered. A read that fails meanwhile ends the wait;
// the read that follows it says how.
func idleWait(u *upstream, w answerWaiter) {
	rb, _ := emptyBufs.Get().(*readBufs)
	if rb == nil {
		rb = new(readBufs)
	}
	u.br.Reset(nil)
	rb.br, rb.buf = u.br, u.buf[:0]
	u.br, u.buf = nil, nil
	idleBufs.Put(rb)

	w.Wait()

	if rb, _ = idleBufs.Get().(*readBufs); rb != nil {
		u.br, u.buf = rb.br, rb.buf
		rb.br, rb.buf = nil, nil
		emptyBufs.Put(rb)
	} else {
		u.br = readerPool.Get().(*bufio.Reader)
	}
	u.br.Reset(u.resp.Body)
}

// relayPending sends the events the attempt read up to its first token;
// when the last of them ended the answer (its final event or [DONE]), done
// commits the row before it goes out.
func (s *Server) relayPending(w *sseWriter, cl *call, u *upstream, done func() error) error {
	all, pending := u.pending, u.pending
	u.pending = nil
	if u.done {
		pending = pending[:len(pending)-1] // the final bytes wait for the ledger
	}
	if err := w.write(pending...); err != nil {
		return err
	}
	cl.firstToken = true
	cl.stages.TTFT = time.Since(cl.start)
	if !u.done {
		return nil
	}
	if err := done(); err != nil {
		return err
	}
	return w.write(all[len(all)-1])
}
