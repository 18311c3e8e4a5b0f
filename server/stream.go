package server

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/labstack/echo/v4"
	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"

	"github.com/tailgate-dev/tailgate/data"
	"github.com/tailgate-dev/tailgate/policy"
	"github.com/tailgate-dev/tailgate/server/apierr"
	"github.com/tailgate-dev/tailgate/serving"
	"github.com/tailgate-dev/tailgate/serving/sse"
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
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
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
// HTTP error with ae's status; otherwise an in-band error event in OpenAI's
// shape (the status line is long gone). It is the only way a stream ends
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
	ev := append(append([]byte("data: "), ae.Body()...), "\n\n"...)
	if _, err := w.rw.Write(ev); err != nil {
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
	usageMarker  = []byte(`"usage":{`)
	usageMember  = []byte(`,"usage":{`)
	tokensMarker = []byte(`_tokens"`)
	emptyChoices = []byte(`"choices":[]`)
	timingPrefix = []byte(serving.TimingComment)
	simQueue     = []byte(": sim-queue-ms=")
	// readerPool: the readers of the engines' answers, one per open stream.
	// 2 KiB holds several events (a few hundred bytes each); a longer one is
	// read whole all the same (sse.ReadEvent copies every event out of it).
	// 16 KiB cost 14 KiB more per open stream, 4 KiB 2 KiB more
	// (TestOpenStreamMemoryIsBounded).
	readerPool = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, 2<<10) }}

	keepAliveComment = []byte(": keep-alive\n\n")
	errStreamClosed  = errors.New("stream already ended")
)

// eventKind is how the gateway handles an upstream event.
type eventKind int

const (
	evOther eventKind = iota // relay as is (role chunk, usage, ...)
	evToken                  // carries generated output of any kind, or a finish reason
	evDone                   // data: [DONE]
	evError                  // an error event
	evFinal                  // the answer's last event before its end (response.completed, message_stop)
	evDrop                   // for the gateway only (timing comments, stripped usage)
)

// inspect classifies an upstream event (serving/sse decides what counts as
// a token: content, reasoning, a tool-call delta, a refusal, a finish) and
// learns usage and timings from it; it returns the event as the client may
// see it (usage stripped when the client did not ask for it).
func (u *upstream) inspect(cl *call, ev []byte) (eventKind, []byte) {
	events := cl.ep.events
	kind := events.Classify(ev)
	switch kind {
	case sse.Comment:
		switch {
		case bytes.HasPrefix(ev, timingPrefix), bytes.HasPrefix(ev, simQueue):
			parseTiming(&u.stages, bytes.TrimRight(ev, "\r\n"))
		}
		return evDrop, nil // upstream comments are not the client's business
	case sse.Done:
		return evDone, ev
	case sse.Error:
		return evError, ev
	}
	payload := sse.Data(ev)
	if events != sse.Chunks {
		// Typed events report usage in place (message_start, message_delta,
		// response.completed): learnt, never stripped.
		if bytes.Contains(payload, tokensMarker) {
			var ok bool
			if u.usage, ok = reportedUsage(payload, u.usage); ok {
				u.gotUsage = true
			}
		}
		switch kind {
		case sse.Token:
			u.lastAt = time.Now()
			u.tokens += int64(events.Pieces(payload))
			return evToken, ev
		case sse.Final:
			return evFinal, ev
		}
		return evOther, ev
	}
	if us, usageOnly := u.countUsage(cl, payload); us.Exists() {
		switch {
		case cl.req.assemble:
			// The assembler reads the usage chunk; nothing is relayed.
		case usageOnly && !cl.req.wantUsage:
			return evDrop, nil // the usage chunk only the gateway wanted
		case !usageOnly && !cl.req.wantContinuous:
			if cut, ok := cutUsage(ev, payload, us); ok {
				ev = cut
			} else if stripped, err := sjson.DeleteBytes(payload, "usage"); err == nil {
				ev = append(append([]byte("data: "), stripped...), "\n\n"...)
			}
		}
	}
	if kind == sse.Token {
		u.lastAt = time.Now()
		u.tokens += int64(sse.Pieces(payload))
		return evToken, ev
	}
	return evOther, ev
}

// countUsage learns the usage a chunk's payload carries: the running usage
// of continuous usage on every chunk, the totals on the usage-only chunk
// at the end. It returns the usage object (not Exists when the payload had
// none), and whether it was the usage-only chunk.
func (u *upstream) countUsage(cl *call, payload []byte) (us gjson.Result, usageOnly bool) {
	us = usageAtEnd(payload)
	if !us.Exists() {
		if !bytes.Contains(payload, usageMarker) {
			return gjson.Result{}, false
		}
		// Read in place: gjson.GetBytes copies the value it finds, an
		// allocation per chunk and the largest allocator per stream in
		// BenchmarkStreamRelay (1.76 of 20.7 MB allocated over 300 streams).
		// Nothing keeps us past this chunk; its buffer is reused after it.
		us = gjson.Get(unsafe.String(unsafe.SliceData(payload), len(payload)), "usage")
	}
	usageOnly = bytes.Contains(payload, emptyChoices)
	var index int64
	if !usageOnly && cl.req.sequences > 1 {
		index = gjson.GetBytes(payload, "choices.0.index").Int()
	}
	if !u.takeUsage(cl, us, usageOnly, index) {
		return gjson.Result{}, false
	}
	return us, usageOnly
}

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
	return gjson.Result{Type: gjson.JSON, Raw: unsafe.String(unsafe.SliceData(obj), len(obj)), Index: vs}
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

// takeUsage learns a chunk's usage object us (see countUsage); index is
// the chunk's choice, unless usageOnly. It reports whether us was usage.
func (u *upstream) takeUsage(cl *call, us gjson.Result, usageOnly bool, index int64) bool {
	if !us.IsObject() {
		return false
	}
	prompt, completion, ok := usageCounts(us.Raw)
	if !ok {
		prompt, completion = us.Get("prompt_tokens").Int(), us.Get("completion_tokens").Int()
	}
	u.usage.PromptTokens = prompt
	if !usageOnly && cl.req.sequences > 1 {
		// With n > 1, vLLM's running usage on a chunk counts only
		// that chunk's choice: bill the sum of every choice's latest.
		if u.perChoice == nil {
			u.perChoice = map[int64]int64{}
		}
		u.perChoice[index] = completion
		completion = 0
		for _, c := range u.perChoice {
			completion += c
		}
	}
	u.usage.CompletionTokens = completion
	u.gotUsage = true
	return true
}

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

// idleTimer is a stream's inter-token idle deadline: it calls cancel once
// no event came for idle. An event only notes its time; the timer, when it
// fires, re-arms itself for what is left (time.Timer.Reset on every event
// took its lock and the timer heap's for each chunk).
type idleTimer struct {
	idle   time.Duration
	start  time.Time    // monotonic base of last
	last   atomic.Int64 // the last event, in nanoseconds since start
	fired  atomic.Bool  // cancel was called
	mu     sync.Mutex   // t is set before the callback may read it
	t      *time.Timer
	done   bool // stopped: the callback neither re-arms nor cancels
	cancel func()
}

func newIdleTimer(idle time.Duration, cancel func()) *idleTimer {
	it := &idleTimer{idle: idle, start: time.Now(), cancel: cancel}
	it.mu.Lock()
	it.t = time.AfterFunc(idle, it.check)
	it.mu.Unlock()
	return it
}

// event notes that an event arrived now.
func (it *idleTimer) event() { it.last.Store(int64(time.Since(it.start))) }

func (it *idleTimer) check() {
	it.mu.Lock()
	defer it.mu.Unlock()
	if it.done {
		return
	}
	quiet := time.Since(it.start) - time.Duration(it.last.Load())
	if left := it.idle - quiet; left > 0 {
		it.t.Reset(left)
		return
	}
	it.fired.Store(true)
	it.cancel()
}

func (it *idleTimer) stop() {
	it.mu.Lock()
	it.done = true
	it.t.Stop()
	it.mu.Unlock()
}

// clientError is a failed write to the client: it went away or stopped
// reading for longer than the write timeout.
type clientError struct{ err error }

func (e *clientError) Error() string { return "write to client: " + e.err.Error() }
func (e *clientError) Unwrap() error { return e.err }

// midstreamError is a stream that broke after its first token reached the
// client: there is no silent retry then, only an honest in-band error event.
type midstreamError struct {
	class data.ErrorClass
	err   error
}

func (e *midstreamError) Error() string { return fmt.Sprintf("%s: %v", e.class, e.err) }
func (e *midstreamError) Unwrap() error { return e.err }

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
// first token, then the rest as they arrive, each flushed at once. An
// inter-token idle deadline catches a replica that hangs mid-answer. It
// keeps an open ledger row up to date while the stream runs and calls done
// (which commits the final row) before the last event, [DONE], goes out.
// It returns nil when the stream ended with [DONE], a *midstreamError when
// the replica broke it, done's error when the final row could not be
// committed ([DONE] withheld), or the client's error when the client went
// away.
func (s *Server) relayStream(ctx context.Context, w *sseWriter, cl *call, u *upstream, ticket *policy.Ticket, done func() error) error {
	pending := u.pending
	if u.done {
		pending = pending[:len(pending)-1] // [DONE] waits for the ledger
	}
	if err := w.write(pending...); err != nil {
		return err
	}
	cl.firstToken = true
	cl.stages.TTFT = time.Since(cl.start)
	// final: the answer's final event went out (its row committed first);
	// what may follow is [DONE] (Messages) or the end of the body (Responses).
	final := false
	if u.done {
		if err := done(); err != nil {
			return err
		}
		if err := w.write(u.pending[len(u.pending)-1]); err != nil || !u.final {
			return err
		}
		final = true
	}
	u.pending = nil
	s.openRow(cl, u, ticket)
	lastOpen := time.Now()

	idle := s.idleDeadline(cl.req.model)
	timer := newIdleTimer(idle, u.cancel)
	defer timer.stop()
	idleFired := &timer.fired
	var (
		buf        []byte
		unflushed  bool
		errorEvent []byte // an in-band error the replica sent mid-stream
	)
	for {
		raw, err := sse.ReadEvent(u.br, buf)
		if err != nil {
			if unflushed {
				_ = w.write()
			}
			switch {
			case ctx.Err() != nil:
				return ctx.Err() // the client went away
			case errorEvent != nil && errors.Is(err, io.EOF) && !idleFired.Load():
				// A typed stream ends at its error event (response.failed).
				return &midstreamError{class: data.ClassErrorEvent, err: fmt.Errorf("error event: %s", bytes.TrimSpace(errorEvent))}
			case final && errors.Is(err, io.EOF) && !idleFired.Load():
				u.ended = true // the answer ended after its final event
				return nil
			case idleFired.Load(): // the router ejects the replica
				return &midstreamError{class: data.ClassIdleDeadline, err: errors.New("no token within the inter-token deadline")}
			case errors.Is(err, io.EOF):
				err = errors.New("upstream stream ended before [DONE]")
			}
			return &midstreamError{class: data.ClassMidstream, err: err}
		}
		buf = raw
		timer.event()
		kind, ev := u.inspect(cl, raw)
		switch kind {
		case evDrop:
			if unflushed && !sse.NextBuffered(u.br) {
				_ = w.write()
				unflushed = false
			}
			continue
		case evFinal:
			if !final {
				if err := done(); err != nil {
					return err // not sent: the stream ends with the ledger's error
				}
				final = true
			}
		case evDone:
			u.ended = true
			if !final {
				if err := done(); err != nil {
					return err // no [DONE]: the stream ends with the ledger's error
				}
			}
			if err := w.write(ev); err != nil {
				return err
			}
			if errorEvent != nil {
				return &midstreamError{class: data.ClassErrorEvent, err: fmt.Errorf("error event: %s", bytes.TrimSpace(errorEvent))}
			}
			return nil
		case evError:
			// Relayed as the replica sent it; the stream still ends with [DONE].
			errorEvent = bytes.Clone(ev)
		}
		flush := !sse.NextBuffered(u.br)
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
