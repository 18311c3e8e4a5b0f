package server

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/tidwall/gjson"

	"github.com/tailgate-dev/tailgate/data"
	"github.com/tailgate-dev/tailgate/policy"
	"github.com/tailgate-dev/tailgate/router"
	"github.com/tailgate-dev/tailgate/server/apierr"
	"github.com/tailgate-dev/tailgate/server/strictjson"
	"github.com/tailgate-dev/tailgate/serving"
	"github.com/tailgate-dev/tailgate/serving/sse"
)

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

var (
	errTTFTDeadline   = errors.New("no first token before the deadline")
	errJSONDeadline   = errors.New("no answer before the deadline")
	errReplicaEjected = errors.New("replica ejected while waiting for its first token")
	errNoTokenEOF     = errors.New("stream ended before the first token")
)

// relayError is a replica's client error (4xx but 429): its answer stands and
// is relayed to the client with the engine's status, in OpenAI's shape.
type relayError struct {
	status int
	body   []byte
}

func (e *relayError) Error() string { return fmt.Sprintf("upstream answered %d", e.status) }

// apiError renders the engine's answer as OpenAI's error shape. vLLM sends
// {"error":{"message","type","param","code":<the status as an integer>}}
// (older releases the same fields at the top level with "object":"error");
// OpenAI's clients expect code to be a string or null, so an integer code
// becomes null. A body that is not JSON becomes the message.
func (e *relayError) apiError() *apierr.Error {
	ae := &apierr.Error{Status: e.status, Type: "invalid_request_error"}
	if strictjson.Check(e.body, 0) != nil {
		ae.Message = strings.TrimSpace(string(e.body[:min(len(e.body), 1024)]))
	} else {
		v := gjson.ParseBytes(e.body)
		if inner := v.Get("error"); inner.IsObject() {
			v = inner
		}
		ae.Message = v.Get("message").String()
		if p := v.Get("param"); p.Type == gjson.String {
			ae.Param = p.Str
		}
		if c := v.Get("code"); c.Type == gjson.String {
			ae.Code = c.Str
		}
		if ae.Message == "" {
			if s := v.Get("error"); s.Type == gjson.String {
				ae.Message = s.Str // {"error":"Unauthorized"}
			}
		}
	}
	if ae.Message == "" {
		ae.Message = fmt.Sprintf("the model replica refused the request (%d %s)", e.status, http.StatusText(e.status))
	}
	return ae
}

// upstreamStatusError is a replica's answer with a status that is neither
// 200 nor a client error: a server error, or a refusal to take work (429,
// 503) with the Retry-After the engine asked for.
type upstreamStatusError struct {
	status     int
	retryAfter time.Duration
}

func (e *upstreamStatusError) Error() string { return fmt.Sprintf("upstream answered %d", e.status) }

// parseRetryAfter reads a Retry-After header: seconds or an HTTP date.
func parseRetryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if secs, err := strconv.Atoi(v); err == nil {
		return time.Duration(max(secs, 0)) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(t.Sub(now), 0)
	}
	return 0
}

// attemptTrace records, through httptrace, how far an attempt got.
type attemptTrace struct {
	connectStart atomic.Int64
	connectDone  atomic.Int64
	writing      atomic.Int64 // unix nanos when the connection was in hand, the request about to be written
	wrote        atomic.Int64 // unix nanos when the request was fully written
}

func (t *attemptTrace) clientTrace() *httptrace.ClientTrace {
	return &httptrace.ClientTrace{
		ConnectStart: func(string, string) { t.connectStart.Store(time.Now().UnixNano()) },
		ConnectDone:  func(string, string, error) { t.connectDone.Store(time.Now().UnixNano()) },
		GotConn:      func(httptrace.GotConnInfo) { t.writing.Store(time.Now().UnixNano()) },
		WroteRequest: func(info httptrace.WroteRequestInfo) {
			if info.Err == nil {
				t.wrote.Store(time.Now().UnixNano())
			}
		},
	}
}

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
	final   bool     // that last pending event is the final one, not [DONE]
	// ended: the answer was read to its [DONE], so Abort keeps the
	// connection; aborted: Abort ran.
	ended, aborted bool

	sentAt, wroteAt time.Time
	firstAt, lastAt time.Time   // when its first and its latest token came (streams)
	stages          data.Stages // connect, upstream_ttft, engine_*
	usage           policy.Usage
	gotUsage        bool
	perChoice       map[int64]int64 // n > 1: each choice's running completion tokens
	tokens          int64           // content events seen

	log *tryLog // the call's attempt log, and this attempt's index in it
	try int
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

// open runs one attempt up to its first token, and records it in the
// call's attempt log. It writes nothing to the client: the router may run
// two at once and keep one.
func (s *Server) open(ctx context.Context, cl *call, rep *router.Replica, n int, reason router.AttemptReason) (router.Attempt, error) {
	i := cl.tries.begin(rep, reason)
	ctx = cl.trace.attempt(ctx, i, rep, reason)
	att, err := s.openAttempt(ctx, cl, rep, n, reason)
	cl.tries.opened(i, att, err, ctx.Err() != nil)
	if u, ok := att.(*upstream); ok {
		u.log, u.try = &cl.tries, i
	}
	return att, err
}

func (s *Server) openAttempt(ctx context.Context, cl *call, rep *router.Replica, n int, reason router.AttemptReason) (router.Attempt, error) {
	ctx, cancel := context.WithCancel(ctx)
	u := &upstream{rep: rep, n: n, reason: reason, cancel: cancel, stages: data.UnknownStages()}
	ok := false
	defer func() {
		if !ok {
			u.Abort()
		}
	}()

	tr := &attemptTrace{}
	req, err := http.NewRequestWithContext(httptrace.WithClientTrace(ctx, tr.clientTrace()),
		http.MethodPost, rep.URL+cl.ep.path, bytes.NewReader(cl.req.body))
	if err != nil {
		return nil, router.ErrNotSent(err)
	}
	ctype := cl.req.ctype
	if ctype == "" {
		ctype = "application/json"
	}
	req.Header.Set("Content-Type", ctype)
	req.Header.Set("X-Request-Id", cl.id)
	markReplayable(req, cl)
	if !rep.Static && s.cfg.ClusterToken != "" {
		req.Header.Set("Authorization", "Bearer "+s.cfg.ClusterToken)
	}
	if cl.req.upstreamStream() {
		req.Header.Set("Accept", "text/event-stream")
	}
	cl.trace.inject(ctx, req.Header)

	// The first-token deadline, and ejection of the replica meanwhile (a
	// probe found it hung), both end the wait; the router retries elsewhere.
	// Callbacks, not a goroutine waiting for either: a goroutine per
	// attempt, woken at its end only to exit, was a scheduler round trip on
	// every request. The first to fire says why.
	var why atomic.Pointer[error]
	timedOut := errTTFTDeadline
	if !cl.req.upstreamStream() {
		timedOut = errJSONDeadline
	}
	deadline := time.AfterFunc(s.deadlines(cl.req.model, cl.req.upstreamStream()), func() {
		why.CompareAndSwap(nil, &timedOut)
		cancel()
	})
	defer deadline.Stop()
	defer rep.OnEjected(func() {
		why.CompareAndSwap(nil, &errReplicaEjected)
		cancel()
	})()
	fail := func(err error) error {
		if w := why.Load(); w != nil {
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

	u.sentAt = time.Now()
	resp, err := s.transport.RoundTrip(req)
	if err != nil {
		if tr.wrote.Load() == 0 && why.Load() == nil {
			return nil, router.ErrNotSent(err)
		}
		return nil, fail(err)
	}
	u.resp = resp
	u.stages.Connect = 0 // a warm connection was reused
	if cs, cd := tr.connectStart.Load(), tr.connectDone.Load(); cs != 0 && cd >= cs {
		u.stages.Connect = time.Duration(cd - cs)
	}
	// The upstream clock starts as the request starts out, not when the
	// write returned: the engine may be at work before this goroutine runs
	// again, and its own share (engine_ttft) must fit in upstream_ttft.
	u.wroteAt = u.sentAt
	if w := tr.writing.Load(); w != 0 {
		u.wroteAt = time.Unix(0, w)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, s.upstreamStatus(rep, resp, fail)
	}
	if !cl.req.upstreamStream() {
		body, err := readAnswer(resp)
		if err != nil {
			return nil, fail(err)
		}
		u.body, u.ctype = body, resp.Header.Get("Content-Type")
		u.stages.UpstreamTTFT = time.Since(u.wroteAt)
		if v, ok := parseMillis(resp.Header.Get(serving.HeaderEngineTTFT)); ok {
			u.stages.EngineTTFT = v
		}
		if v, ok := parseMillis(resp.Header.Get(serving.HeaderEngineQueue)); ok {
			u.stages.EngineQueue = v
		} else if v, ok := parseMillis(resp.Header.Get(serving.HeaderSimQueue)); ok {
			u.stages.EngineQueue = v
		}
		u.usage, u.gotUsage = reportedUsage(body, policy.Usage{})
		if cl.ep.generates && u.usage.CompletionTokens == 0 {
			// An engine that reports no output usage (no usage at all, or
			// a transcription's seconds): billed its estimated prompt and
			// the answer's text, as a stream without usage is billed its
			// pieces — not nothing.
			u.tokens = outputEstimate(body)
		}
		ok = true
		return u, nil
	}

	u.br = readerPool.Get().(*bufio.Reader)
	u.br.Reset(resp.Body)
	var spare []byte // a dropped event's buffer, for the next
	for {
		raw, err := sse.ReadEvent(u.br, spare)
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = errNoTokenEOF
			}
			return nil, fail(err)
		}
		spare = nil
		kind, ev := u.inspect(cl, raw)
		switch kind {
		case evDrop:
			spare = raw
			continue
		case evError:
			// An error before any token: the attempt failed; the event is
			// what the client gets if no other attempt does better.
			return nil, fail(fmt.Errorf("error event before the first token: %s", bytes.TrimSpace(ev)))
		}
		u.pending = append(u.pending, ev)
		if kind == evToken || kind == evDone || kind == evFinal {
			u.done = kind != evToken
			u.final = kind == evFinal
			u.ended = kind == evDone
			u.firstAt = time.Now()
			u.stages.UpstreamTTFT = u.firstAt.Sub(u.wroteAt)
			ok = true
			return u, nil
		}
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

// upstreamStatus classifies a non-200 answer.
func (s *Server) upstreamStatus(rep *router.Replica, resp *http.Response, fail func(error) error) error {
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	status := resp.StatusCode
	if status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable {
		err := &upstreamStatusError{status: status, retryAfter: min(parseRetryAfter(resp.Header.Get("Retry-After"), time.Now()), time.Minute)}
		if err.retryAfter > 0 {
			rep.BackOff(time.Now().Add(err.retryAfter))
		}
		if gjson.GetBytes(body, "error.code").String() == "replica_draining" {
			s.reg.Drain(rep, "draining (told by the replica)")
		}
		// Overloaded, draining or not ready: nothing ran; go elsewhere.
		return router.ErrDeclined(err)
	}
	if status >= 400 && status < 500 {
		return &relayError{status: status, body: body}
	}
	return fail(&upstreamStatusError{status: status})
}

// deadlines returns the first-token deadline for a model's streams (also
// those assembled into JSON), or the whole-answer deadline for JSON answers.
func (s *Server) deadlines(model string, stream bool) time.Duration {
	if !stream {
		return s.cfg.JSONDeadline
	}
	if d, ok := s.cfg.TTFTDeadlineByModel[model]; ok && d > 0 {
		return d
	}
	return s.cfg.TTFTDeadline
}

func (s *Server) idleDeadline(model string) time.Duration {
	if d, ok := s.cfg.IdleDeadlineByModel[model]; ok && d > 0 {
		return d
	}
	return s.cfg.IdleDeadline
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
		if d, ok := parseMillis(unsafe.String(unsafe.SliceData(v), len(v))); ok {
			*dst = d
		}
	}
}

// serverTiming renders the call's known stages as a Server-Timing header, in
// milliseconds.
func serverTiming(cl *call) string {
	var (
		b   strings.Builder
		num [24]byte
	)
	b.Grow(256) // every stage: "upstream_ttft;dur=1234.567, " is 28 bytes
	cl.stages.Each(func(_ int, name string, d time.Duration) {
		if d < 0 {
			return
		}
		if b.Len() > 0 {
			b.WriteString(", ")
		}
		b.WriteString(name)
		b.WriteString(";dur=")
		b.Write(strconv.AppendFloat(num[:0], float64(d)/float64(time.Millisecond), 'f', 3, 64))
	})
	return b.String()
}

// attemptSeq numbers upstream requests for their idempotency keys.
var attemptSeq atomic.Uint64

// markReplayable gives an upstream request an idempotency key, unique to
// the attempt, which is what lets Go's transport send it again on a fresh
// connection when a reused keep-alive connection turns out closed before
// the engine read it (vLLM closes idle ones after 5 s; Go resends no POST
// without such a key). Nothing is resent once an answer byte arrived.
func markReplayable(req *http.Request, cl *call) {
	req.Header.Set("X-Idempotency-Key", cl.id+"-"+strconv.FormatUint(attemptSeq.Add(1), 36))
}
