package server

import (
	"bytes"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/tailgate-dev/tailgate/data"
	"github.com/tailgate-dev/tailgate/policy"
	"github.com/tailgate-dev/tailgate/server/apierr"
)

// Streams that resume. A keyed request's answer is recorded in an
// answerLog as the pipeline writes it, and every client of it — the one
// that sent it, a retry that joins it, one that reconnects — reads from the
// log, never from the run: the run goes on when a client drops, and a
// client that comes back with the same Idempotency-Key and a Last-Event-ID
// gets the events after that one and then the rest as they come. Each
// event of a keyed stream is sent with an id, "<request id>:<seq>" (seq
// from 1, the original request's id). A live stream's log is in memory
// until its run ends; a whole answer is kept as its key's record (database)
// for the retention window, and a stream is resumed from it as from the
// live log.

// answerLog records one answer as the pipeline writes it: an
// http.ResponseWriter (and Flusher) whose status, headers and bytes
// readers take from it. SSE comments (keep-alives) are counted, not kept.
// Events are kept end to end in one buffer.
type answerLog struct {
	id     string // the request that ran it
	model  string
	header http.Header // what the pipeline sets

	mu       sync.Mutex
	sent     http.Header // header as of WriteHeader
	status   int
	stream   bool
	buf      []byte // every event (or body chunk), end to end
	ends     []int  // where each event ends in buf
	comments int
	done     bool
	changed  chan struct{} // closed (and replaced) at every change
}

func newAnswerLog(id string) *answerLog {
	return &answerLog{id: id, header: make(http.Header), changed: make(chan struct{})}
}

// recordLog is the log of a kept answer.
func recordLog(r *data.IdemRecord) *answerLog {
	l := newAnswerLog(r.RequestID)
	l.model, l.status, l.done = r.Model, r.Status, true
	l.sent = http.Header{"Content-Type": {r.ContentType}}
	l.stream = strings.HasPrefix(r.ContentType, "text/event-stream")
	l.appendLocked(r.Body)
	return l
}

func (l *answerLog) Header() http.Header { return l.header }

func (l *answerLog) WriteHeader(status int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.writeHeaderLocked(status)
}

func (l *answerLog) writeHeaderLocked(status int) {
	if l.status != 0 {
		return
	}
	l.status, l.sent = status, l.header.Clone()
	l.stream = strings.HasPrefix(l.sent.Get("Content-Type"), "text/event-stream")
	l.changedLocked()
}

func (l *answerLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.writeHeaderLocked(http.StatusOK)
	if l.stream && len(p) > 0 && p[0] == ':' {
		l.comments++
	} else {
		l.appendLocked(p)
	}
	l.changedLocked()
	return len(p), nil
}

// appendLocked keeps p: a stream's as the events it holds (each ends with a
// blank line), anything else as one chunk.
func (l *answerLog) appendLocked(p []byte) {
	if len(p) == 0 {
		return
	}
	l.buf = append(l.buf, p...)
	if !l.stream {
		l.ends = append(l.ends, len(l.buf))
		return
	}
	start := len(l.buf) - len(p)
	for {
		i := bytes.Index(l.buf[start:], sseEnd)
		if i < 0 {
			if start < len(l.buf) {
				l.ends = append(l.ends, len(l.buf)) // an event without its blank line: kept whole
			}
			return
		}
		start += i + len(sseEnd)
		l.ends = append(l.ends, start)
	}
}

var sseEnd = []byte("\n\n")

// Flush does nothing: readers are woken by every write.
func (l *answerLog) Flush() {}

func (l *answerLog) changedLocked() {
	close(l.changed)
	l.changed = make(chan struct{})
}

// finish says the answer is whole (or ended).
func (l *answerLog) finish() {
	l.mu.Lock()
	l.done = true
	l.changedLocked()
	l.mu.Unlock()
}

func (l *answerLog) isStream() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.stream
}

// whole returns the answer once it is finished: its status, content type and
// bytes (a stream's events without keep-alives).
func (l *answerLog) whole() (status int, ctype string, body []byte) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.sent != nil {
		ctype = l.sent.Get("Content-Type")
	}
	return l.status, ctype, l.buf
}

// logView is what a reader takes from the log at once.
type logView struct {
	status   int
	header   http.Header
	stream   bool
	events   [][]byte // from the reader's position on
	comments int
	done     bool
	changed  <-chan struct{}
}

// view returns the log from event from on. The events alias the log's
// buffer, which only ever grows by appending: what they hold never changes.
func (l *answerLog) view(from int) logView {
	l.mu.Lock()
	defer l.mu.Unlock()
	v := logView{status: l.status, header: l.sent, stream: l.stream, comments: l.comments, done: l.done, changed: l.changed}
	for i := from; i < len(l.ends); i++ {
		start := 0
		if i > 0 {
			start = l.ends[i-1]
		}
		v.events = append(v.events, l.buf[start:l.ends[i]:l.ends[i]])
	}
	return v
}

// deliver sends the answer in log to the client of c as it is recorded,
// until it is whole or the client goes away: a stream event by event as
// they come (after the from-th; each with its id), anything else whole once
// it is. A replay says so (Idempotent-Replayed, and whose answer it is).
func (s *Server) deliver(c echo.Context, log *answerLog, from int, replay bool) error {
	rw := c.Response()
	rc := http.NewResponseController(rw)
	ctx := c.Request().Context()
	committed, comments, seq := false, 0, from
	var idLine []byte
	for {
		v := log.view(seq)
		if v.done && v.status == 0 {
			// The run ended before any answer (cancelled with nobody reading).
			return apierr.Reply(c, errIdemCancelled)
		}
		if !committed && v.status != 0 && (v.stream || v.done) {
			h := rw.Header()
			for k, vs := range v.header {
				if k != "X-Request-Id" && k != "Request-Id" {
					h[k] = vs
				}
			}
			if replay {
				h.Set(idemReplayed, "true")
				h.Set(idemOriginal, log.id)
			}
			if v.stream {
				h.Del("Content-Length")
			} else {
				n := 0
				for _, ev := range v.events {
					n += len(ev)
				}
				h.Set("Content-Length", strconv.Itoa(n))
			}
			rw.WriteHeader(v.status)
			committed = true
		}
		if committed {
			_ = rc.SetWriteDeadline(time.Now().Add(s.cfg.ClientWriteTimeout))
			switch {
			case v.stream:
				for _, ev := range v.events {
					seq++
					idLine = strconv.AppendInt(append(append(append(idLine[:0], "id: "...), log.id...), ':'), int64(seq), 10)
					idLine = append(idLine, '\n')
					if _, err := rw.Write(idLine); err != nil {
						return err
					}
					if _, err := rw.Write(ev); err != nil {
						return err
					}
				}
				if len(v.events) == 0 && v.comments > comments {
					if _, err := rw.Write(keepAliveComment); err != nil {
						return err
					}
				}
				comments = v.comments
				if err := rc.Flush(); err != nil {
					return err
				}
			case v.done:
				for _, ev := range v.events {
					if _, err := rw.Write(ev); err != nil {
						return err
					}
				}
				return rc.Flush()
			}
		}
		if v.done {
			return nil
		}
		select {
		case <-v.changed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// recordSink is the pipeline's sink for a keyed request: the answer goes
// to its log (rw), which its clients read.
type recordSink struct {
	s  *Server
	rw http.ResponseWriter
	hs *httpSink // sets headers in the log's header
}

func newRecordSink(s *Server, rw http.ResponseWriter) *recordSink {
	return &recordSink{s: s, rw: rw, hs: &httpSink{s: s, h: rw.Header()}}
}

func (o *recordSink) rateLimits(rs policy.RateState) { setRateHeaders(o.hs, rs) }

func (o *recordSink) stream(cl *call) *sseWriter {
	o.setModel(cl)
	return newSSEWriter(o.rw, o.s.cfg.KeepAlive, 0, func(http.Header) { setRouteHeaders(o.hs, cl) })
}

func (o *recordSink) json(cl *call, body []byte) {
	o.setModel(cl)
	o.hs.set("Content-Type", "application/json")
	o.hs.set("Content-Length", strconv.Itoa(len(body)))
	setRouteHeaders(o.hs, cl)
	o.hs.set("Server-Timing", serverTiming(cl))
	o.rw.WriteHeader(http.StatusOK)
	_, _ = o.rw.Write(body)
}

func (o *recordSink) error(cl *call, ae *apierr.Error) {
	if cl.outcome == data.OutcomeClientCancelled {
		return // nobody reads it
	}
	setRouteHeaders(o.hs, cl)
	apierr.Write(o.rw, ae)
}

// setModel notes the answer's model in its log, for its replays' rows.
func (o *recordSink) setModel(cl *call) {
	if cl.req == nil {
		return
	}
	l, ok := o.rw.(*answerLog)
	if u, isWrap := o.rw.(interface{ Unwrap() http.ResponseWriter }); isWrap {
		l, ok = u.Unwrap().(*answerLog)
	}
	if ok {
		l.mu.Lock()
		l.model = cl.req.model
		l.mu.Unlock()
	}
}

// modelName is the answer's model ("" before it is known).
func (l *answerLog) modelName() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.model
}
