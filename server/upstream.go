package server

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"

	"github.com/tailgate-dev/tailgate/data"
	"github.com/tailgate-dev/tailgate/policy"
	"github.com/tailgate-dev/tailgate/router"
	"github.com/tailgate-dev/tailgate/serving"
	"github.com/tailgate-dev/tailgate/serving/sse"
)

// An engine's answer is read in one place: [upstream.next]. It owns the
// reader and its buffer, the deadlines (first token, then idle; the whole
// answer for JSON assembled from a stream), the timing comments, usage, the
// count of output pieces and how the answer ended. Its three consumers only
// do their own work with each event: the attempt (attempt.go) buffers them
// up to the first token, the relay (stream.go) writes them to the client,
// the assembly (assemble.go) adds them to a JSON answer.

// upstream is one attempt's answer, held at its first token: for a JSON
// answer the whole body, for SSE (also the streams assembled into JSON) the
// events up to and including the first token and the reader positioned after
// them. It implements router.Attempt.
type upstream struct {
	rep     *router.Replica
	n       int
	reason  router.AttemptReason
	resp    *http.Response
	cancel  context.CancelFunc
	br      *bufio.Reader
	body    []byte   // JSON answer
	ctype   string   // its content type
	pending [][]byte // SSE events read before relaying began (first token last)
	done    bool     // [DONE] or the final event already among pending (last)
	final   bool     // the final event (not [DONE]) came: among pending, or read since
	// ended: the answer was read to its [DONE], so Abort keeps the
	// connection; aborted: Abort ran.
	ended, aborted bool

	// cut says what cancelled the attempt before its first token (the
	// first-token deadline, the replica's ejection); nil: nothing did.
	cut atomic.Pointer[error]

	// Set by follow, for reading past the first token.
	ctx        context.Context // ends when the reader's caller is gone
	idle       *idleTimer
	buf        []byte // the last event's buffer, reused for the next
	errorEvent []byte // an in-band error the replica sent mid-stream

	sentAt, wroteAt time.Time
	firstAt, lastAt time.Time   // when its first and its latest token came (streams)
	stages          data.Stages // connect, upstream_ttft, engine_*
	usage           policy.Usage
	gotUsage        bool
	perChoice       map[int64]int64 // n > 1: each choice's running completion tokens
	tokens          int64           // content events seen

	log *tryLog // the call's attempt log, and this attempt's index in it
	try int

	// What a traced call's span says of the answer (trace.go): the
	// engine's response id and finish reasons. Set only when the call is
	// traced.
	respID   string
	finishes []string

	tr  attemptTrace // how far the request got (httptrace)
	hdr [5]string    // the request's header values (openAttempt)
	// The request's parts (request).
	req  http.Request
	url  url.URL
	rb   requestBody
	sent []byte
}

var (
	usageMarker  = []byte(`"usage":{`)
	tokensMarker = []byte(`_tokens"`)
	emptyChoices = []byte(`"choices":[]`)
	timingPrefix = []byte(serving.TimingComment)
	simQueue     = []byte(": sim-queue-ms=")
	// readerPool: the readers of the engines' answers, one per stream that is
	// reading (a stream waiting for its next event lends its own, idleWait).
	// 2 KiB holds several events (a few hundred bytes each); a longer one is
	// read whole all the same (sse.ReadEvent copies every event out of it).
	// 16 KiB cost 14 KiB more per open stream, 4 KiB 2 KiB more
	// (TestOpenStreamMemoryIsBounded).
	readerPool = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, 2<<10) }}

	errTTFTDeadline   = errors.New("no first token before the deadline")
	errJSONDeadline   = errors.New("no answer before the deadline")
	errReplicaEjected = errors.New("replica ejected while waiting for its first token")
	errNoTokenEOF     = errors.New("stream ended before the first token")
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

// stream starts reading a streamed answer from resp.
func (u *upstream) stream(resp *http.Response) {
	u.br = readerPool.Get().(*bufio.Reader)
	u.br.Reset(resp.Body)
}

// next reads the answer's next event: how the gateway handles it, and the
// event as the client may see it (usage stripped when the client did not
// ask for it; nil for evDrop). Before follow, the events are the caller's
// to keep (the attempt buffers them); after it, an event is valid until the
// next call (its buffer is reused). A read that fails says why the answer
// ended: before follow, errNoTokenEOF or the read's error; after it, see
// [upstream.end].
func (u *upstream) next(cl *call) (eventKind, []byte, error) {
	raw, err := sse.ReadEvent(u.br, u.buf)
	if err != nil {
		if u.idle == nil {
			if errors.Is(err, io.EOF) {
				err = errNoTokenEOF
			}
			return evDrop, nil, err
		}
		return evDrop, nil, u.end(err)
	}
	if u.idle != nil {
		u.idle.event()
	}
	kind, ev := u.inspect(cl, raw)
	switch {
	case kind == evDrop, u.idle != nil:
		u.buf = raw // nothing keeps it past the next call
	default:
		u.buf = nil // pending keeps it
	}
	switch kind {
	case evDone:
		u.ended = true
	case evFinal:
		u.final = true
	case evError:
		if u.idle != nil && u.errorEvent == nil {
			u.errorEvent = bytes.Clone(ev)
		}
	}
	return kind, ev, nil
}

// follow starts reading the answer past its first token: ctx is the
// reader's (its end is the client's going away), idle the inter-token
// deadline, whole the whole answer's (zero for none). The caller must call
// unfollow when done.
func (u *upstream) follow(ctx context.Context, idle time.Duration, whole time.Time) {
	u.ctx = ctx
	u.idle = newIdleTimer(idle, whole, u.cancel)
}

func (u *upstream) unfollow() {
	if u.idle != nil {
		u.idle.stop()
	}
}

// end is the one classification of how an answer read past its first token
// ended, when a read failed with err: io.EOF for an answer that ended whole
// after its final event (a typed stream's end); ctx's error for a reader
// whose caller went away; errJSONDeadline past the whole-answer deadline;
// otherwise a *midstreamError — after an error event, the idle deadline
// (the router ejects the replica), an end before [DONE], a broken read.
func (u *upstream) end(err error) error {
	cause := u.idle.cause.Load()
	eof := errors.Is(err, io.EOF)
	switch {
	case u.ctx.Err() != nil:
		return u.ctx.Err()
	case cause == cutWhole:
		return errJSONDeadline
	case u.errorEvent != nil && eof && cause == 0:
		// A typed stream ends at its error event (response.failed).
		return u.errorEventEnd()
	case u.final && eof && cause == 0:
		u.ended = true // the answer ended after its final event
		return io.EOF
	case cause == cutIdle:
		return &midstreamError{class: data.ClassIdleDeadline, err: errors.New("no token within the inter-token deadline")}
	case eof:
		err = errors.New("upstream stream ended before [DONE]")
	}
	return &midstreamError{class: data.ClassMidstream, err: err}
}

// errorEventEnd is the end of an answer that carried an error event after
// its first token (relayed as the replica sent it), nil for one that did
// not.
func (u *upstream) errorEventEnd() error {
	if u.errorEvent == nil {
		return nil
	}
	return &midstreamError{class: data.ClassErrorEvent, err: fmt.Errorf("error event: %s", bytes.TrimSpace(u.errorEvent))}
}

// buffered reports whether the next event is already read from the
// connection (the relay flushes only when it is not).
func (u *upstream) buffered() bool { return sse.NextBuffered(u.br) }

// inspect classifies an upstream event (serving/sse decides what counts as
// a token: content, reasoning, a tool-call delta, a refusal, a finish) and
// learns usage and timings from it; it returns the event as the client may
// see it (usage stripped when the client did not ask for it). Past the
// first token of an answer assembled into JSON the assembler parses each
// chunk, usage included (takeUsage), so inspect neither reads nor cuts it.
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
	if cl.trace != nil && !cl.req.assemble { // an assembled answer's are the assembler's
		u.traceEvent(events, kind, payload)
	}
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
	if !cl.req.assemble || u.idle == nil {
		var drop bool
		if ev, drop = u.chunkUsage(cl, ev, payload); drop {
			return evDrop, nil
		}
	}
	if kind == sse.Token {
		u.lastAt = time.Now()
		u.tokens += int64(sse.Pieces(payload))
		return evToken, ev
	}
	return evOther, ev
}

// chunkUsage learns a chunk's usage and returns the chunk as the client may
// see it: without usage unless it asked, dropped (drop) when it was the
// usage-only chunk only the gateway wanted.
func (u *upstream) chunkUsage(cl *call, ev, payload []byte) (out []byte, drop bool) {
	us, usageOnly := u.countUsage(cl, payload)
	switch {
	case !us.Exists(), cl.req.assemble:
		// None; or the assembler reads the usage chunk, nothing is relayed.
	case usageOnly && !cl.req.wantUsage:
		return nil, true
	case !usageOnly && !cl.req.wantContinuous:
		if cut, ok := cutUsage(ev, payload, us); ok {
			return cut, false
		}
		if stripped, err := sjson.DeleteBytes(payload, "usage"); err == nil {
			return append(append([]byte("data: "), stripped...), "\n\n"...), false
		}
	}
	return ev, false
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
		us = gjson.Get(stringOf(payload), "usage")
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

// arm starts the first-token deadline (the whole answer's for JSON), which
// cancels the attempt with cause timedOut; the caller stops it.
func (u *upstream) arm(d time.Duration, timedOut *error) *time.Timer {
	return time.AfterFunc(d, func() { u.cutBy(timedOut) })
}

// cutBy cancels the attempt before its first token; the first cause holds.
func (u *upstream) cutBy(cause *error) {
	u.cut.CompareAndSwap(nil, cause)
	u.cancel()
}

// noToken is how an attempt that had no first token failed, for the
// router: declined when its replica was ejected meanwhile, no token
// otherwise (the deadline's class when it timed out).
func (u *upstream) noToken(err error) error {
	if w := u.cut.Load(); w != nil {
		switch *w {
		case errReplicaEjected:
			return router.ErrDeclined(*w)
		case errTTFTDeadline:
			return router.ErrNoToken(*w, "ttft_deadline")
		default:
			return router.ErrNoToken(*w, "")
		}
	}
	return router.ErrNoToken(err, "")
}

// Abort cancels the attempt and closes its connection — unless the answer
// was read to its [DONE]: then the rest of the body (the end of the chunked
// stream, which the engine sends just after) is read first, so that the
// connection goes back to the pool; closed early, it would be torn down and
// the next request would dial again. The client has its answer by then
// (sinks flush it), so this wait is not on its path.
func (u *upstream) Abort() {
	if u.aborted {
		return
	}
	u.aborted = true
	if u.log != nil {
		u.log.aborted(u.try)
	}
	if u.ended && u.resp != nil && u.br != nil {
		t := time.AfterFunc(keepWait, u.cancel)
		_, _ = io.Copy(io.Discard, io.LimitReader(u.br, 64<<10))
		t.Stop()
	}
	u.cancel()
	if u.resp != nil {
		u.resp.Body.Close()
	}
	u.release()
}

// keepWait bounds how long Abort waits for the end of a finished answer's
// body before it closes the connection instead of keeping it.
const keepWait = 100 * time.Millisecond

func (u *upstream) release() {
	if u.br != nil {
		u.br.Reset(nil)
		readerPool.Put(u.br)
		u.br = nil
	}
}

// What cut an answer read past its first token (idleTimer.cause).
const (
	cutIdle  = 1 // no event within the inter-token deadline
	cutWhole = 2 // the whole answer's deadline passed
)

// idleTimer is a stream's inter-token idle deadline, and the whole answer's
// when it has one: it calls cancel once no event came for idle, or at
// whole. An event only notes its time; the timer, when it fires, re-arms
// itself for what is left (time.Timer.Reset on every event took its lock
// and the timer heap's for each chunk).
type idleTimer struct {
	idle   time.Duration
	whole  time.Time    // zero: none
	start  time.Time    // monotonic base of last
	last   atomic.Int64 // the last event, in nanoseconds since start
	cause  atomic.Int32 // why cancel was called (cutIdle, cutWhole); 0: it was not
	mu     sync.Mutex   // t is set before the callback may read it
	t      *time.Timer
	done   bool // stopped: the callback neither re-arms nor cancels
	cancel func()
}

func newIdleTimer(idle time.Duration, whole time.Time, cancel func()) *idleTimer {
	it := &idleTimer{idle: idle, whole: whole, start: time.Now(), cancel: cancel}
	it.mu.Lock()
	it.t = time.AfterFunc(it.left(), it.check)
	it.mu.Unlock()
	return it
}

// event notes that an event arrived now.
func (it *idleTimer) event() { it.last.Store(int64(time.Since(it.start))) }

// left is how long until the earlier deadline.
func (it *idleTimer) left() time.Duration {
	quiet := time.Since(it.start) - time.Duration(it.last.Load())
	left := it.idle - quiet
	if !it.whole.IsZero() {
		left = min(left, time.Until(it.whole))
	}
	return left
}

func (it *idleTimer) check() {
	it.mu.Lock()
	defer it.mu.Unlock()
	if it.done {
		return
	}
	if left := it.left(); left > 0 {
		it.t.Reset(left)
		return
	}
	if !it.whole.IsZero() && !time.Now().Before(it.whole) {
		it.cause.Store(cutWhole)
	} else {
		it.cause.Store(cutIdle)
	}
	it.cancel()
}

func (it *idleTimer) stop() {
	it.mu.Lock()
	it.done = true
	it.t.Stop()
	it.mu.Unlock()
}

// midstreamError is a stream that broke after its first token reached the
// client: there is no silent retry then, only an honest in-band error event.
type midstreamError struct {
	class data.ErrorClass
	err   error
}

func (e *midstreamError) Error() string { return fmt.Sprintf("%s: %v", e.class, e.err) }
func (e *midstreamError) Unwrap() error { return e.err }

// maxUpstreamBody bounds a non-streaming answer read from a replica.
const maxUpstreamBody = 64 << 20

// readAnswer reads a non-streaming answer, at most maxUpstreamBody bytes:
// into one buffer of its Content-Length when the engine sent one (vLLM
// does), instead of io.ReadAll's doubling from 512 bytes (three buffers and
// 1.7 KB for a short chat answer in BenchmarkGatewayOverhead's profile).
func readAnswer(resp *http.Response) ([]byte, error) {
	n := resp.ContentLength
	if n < 0 || n > maxUpstreamBody {
		return io.ReadAll(io.LimitReader(resp.Body, maxUpstreamBody))
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(resp.Body, body); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF // the answer ended before its length
		}
		return nil, err
	}
	return body, nil
}

// whole takes a JSON answer: its body, timings from the engine's headers,
// and usage as the engine reported it.
func (u *upstream) whole(cl *call, resp *http.Response, body []byte) {
	u.body, u.ctype = body, headerValue(resp.Header, "Content-Type")
	u.stages.UpstreamTTFT = time.Since(u.wroteAt)
	if v, ok := parseMillis(headerValue(resp.Header, serving.HeaderEngineTTFT)); ok {
		u.stages.EngineTTFT = v
	}
	if v, ok := parseMillis(headerValue(resp.Header, serving.HeaderEngineQueue)); ok {
		u.stages.EngineQueue = v
	} else if v, ok := parseMillis(headerValue(resp.Header, serving.HeaderSimQueue)); ok {
		u.stages.EngineQueue = v
	}
	u.usage, u.gotUsage = reportedUsage(body, policy.Usage{})
	if cl.trace != nil {
		u.traceAnswer(body)
	}
	if cl.ep.generates && u.usage.CompletionTokens == 0 {
		// An engine that reports no output usage (no usage at all, or
		// a transcription's seconds): billed its estimated prompt and
		// the answer's text, as a stream without usage is billed its
		// pieces — not nothing.
		u.tokens = outputEstimate(body)
	}
}

// outputEstimate is a JSON answer's output in tokens, at about 4 bytes a
// token (as the prompt is estimated), for an engine that reported no usage:
// the text of every choice — content, reasoning (once, under either name),
// refusal, tool calls' names and arguments, a completion's text.
func outputEstimate(body []byte) int64 {
	if len(body) == 0 {
		return 0
	}
	if body[firstNonSpace(body)] != '{' { // plain text (a transcript)
		return (int64(len(body)) + 3) / 4
	}
	var n int64
	str := func(v gjson.Result) {
		if v.Type == gjson.String {
			n += int64(len(v.Raw) - 2)
		}
	}
	str(gjson.GetBytes(body, "text")) // a transcription
	gjson.GetBytes(body, "choices").ForEach(func(_, c gjson.Result) bool {
		str(c.Get("text"))
		m := c.Get("message")
		str(m.Get("content"))
		str(m.Get("refusal"))
		if r := m.Get("reasoning"); r.Type == gjson.String {
			str(r)
		} else {
			str(m.Get("reasoning_content"))
		}
		m.Get("tool_calls").ForEach(func(_, tc gjson.Result) bool {
			str(tc.Get("function.name"))
			str(tc.Get("function.arguments"))
			return true
		})
		return true
	})
	return (n + 3) / 4
}

// headerValue is h.Get(key) for a key in canonical form (checked by
// TestHeaderKeysReadDirectlyAreCanonical): a direct look-up, without Get's
// canonicalisation of the key on every call (0.33 % of the gateway's CPU
// samples in a perf profile at 1000 JSON requests a second). net/http's
// server and reader and hop's reader store names in canonical form.
func headerValue(h http.Header, key string) string {
	if v := h[key]; len(v) > 0 {
		return v[0]
	}
	return ""
}

// parseMillis parses a decimal number of milliseconds.
func parseMillis(v string) (time.Duration, bool) {
	if v == "" {
		return 0, false
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || f < 0 || f > 1e9 {
		return 0, false
	}
	return time.Duration(f * float64(time.Millisecond)), true
}

// parseTiming reads a timing comment: the sidecar's
// ": tailgate-timing engine_ttft_ms=12.3 engine_queue_ms=0.2", or the sim
// engine's ": sim-queue-ms=0.2" when it is a static upstream.
func parseTiming(st *data.Stages, comment []byte) {
	rest := bytes.TrimPrefix(comment, []byte(":"))
	for len(rest) > 0 {
		var f []byte
		f, rest, _ = bytes.Cut(bytes.TrimLeft(rest, " \t"), []byte(" "))
		k, v, _ := bytes.Cut(f, []byte("="))
		var dst *time.Duration
		switch string(k) {
		case "engine_ttft_ms":
			dst = &st.EngineTTFT
		case "engine_queue_ms", "sim-queue-ms":
			dst = &st.EngineQueue
		default:
			continue
		}
		// A view, not a copy: parseMillis keeps nothing of it.
		if d, ok := parseMillis(stringOf(v)); ok {
			*dst = d
		}
	}
}
