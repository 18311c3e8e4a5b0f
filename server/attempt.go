package server

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"

	"github.com/tailgate-dev/tailgate/data"
	"github.com/tailgate-dev/tailgate/policy"
	"github.com/tailgate-dev/tailgate/router"
	"github.com/tailgate-dev/tailgate/server/apierr"
	"github.com/tailgate-dev/tailgate/server/strictjson"
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

// attemptTrace records, through httptrace, how far an attempt got. It lives
// in its upstream, and its hooks are set once per attempt (see init): the
// trace costs an attempt three closures and one context value. The connect
// stage is taken from GetConn to GotConn of a connection not reused, not
// from ConnectStart/ConnectDone: those are net hooks, for which
// httptrace.WithClientTrace builds a second trace and context value
// (BenchmarkGatewayOverhead's pprof: attemptTrace.clientTrace 5 and
// httptrace.WithClientTrace 3 allocations per request, 8 → 4 in all).
type attemptTrace struct {
	asked   atomic.Int64 // unix nanos when the transport was asked for a connection
	dialled atomic.Int64 // nanos from asking to a new connection in hand; 0: one was reused
	writing atomic.Int64 // unix nanos when the connection was in hand, the request about to be written
	wrote   atomic.Int64 // unix nanos when the request was fully written
	hooks   httptrace.ClientTrace
}

// stages sets u's connect stage and the start of its upstream clock.
func (t *attemptTrace) stages(u *upstream) {
	u.stages.Connect = time.Duration(t.dialled.Load()) // 0: a warm connection was reused
	// The upstream clock starts as the request starts out, not when the
	// write returned: the engine may be at work before this goroutine runs
	// again, and its own share (engine_ttft) must fit in upstream_ttft.
	u.wroteAt = u.sentAt
	if w := t.writing.Load(); w != 0 {
		u.wroteAt = time.Unix(0, w)
	}
}

// init sets t's hooks and returns ctx carrying them.
func (t *attemptTrace) init(ctx context.Context) context.Context {
	t.hooks = httptrace.ClientTrace{
		GetConn: func(string) { t.asked.Store(time.Now().UnixNano()) },
		GotConn: func(info httptrace.GotConnInfo) {
			now := time.Now().UnixNano()
			if a := t.asked.Load(); !info.Reused && a != 0 && now > a {
				t.dialled.Store(now - a)
			}
			t.writing.Store(now)
		},
		WroteRequest: func(info httptrace.WroteRequestInfo) {
			if info.Err == nil {
				t.wrote.Store(time.Now().UnixNano())
			}
		},
	}
	return httptrace.WithClientTrace(ctx, &t.hooks)
}

// open runs one attempt up to its first token, and records it in the
// call's attempt log. It writes nothing to the client: the router may run
// two at once and keep one.
func (s *Server) open(ctx context.Context, cl *call, rep *router.Replica, n int, reason router.AttemptReason) (router.Attempt, error) {
	i := cl.tries.begin(rep, reason)
	ctx = cl.trace.attempt(ctx, i, rep, reason)
	att, err := s.openAttempt(ctx, cl, rep, n, reason)
	cl.tries.opened(i, att, err, router.AttemptCancelled(ctx))
	if u, ok := att.(*upstream); ok {
		u.log, u.try = &cl.tries, i
	}
	return att, err
}

func (s *Server) openAttempt(ctx context.Context, cl *call, rep *router.Replica, n int, reason router.AttemptReason) (router.Attempt, error) {
	// The router's cancel of the attempt is the attempt's own: no context
	// layer of its own (see router.AttemptCancel).
	cancel := router.AttemptCancel(ctx)
	if cancel == nil {
		ctx, cancel = context.WithCancel(ctx)
	}
	u := &upstream{rep: rep, n: n, reason: reason, cancel: cancel, stages: data.UnknownStages()}
	ok := false
	defer func() {
		if !ok {
			u.Abort()
		}
	}()

	tr := &u.tr
	req, err := u.request(tr.init(ctx), engineBody(cl, rep), cl.ep.path)
	if err != nil {
		return nil, router.ErrNotSent(err)
	}
	ctype := cl.req.ctype
	if ctype == "" {
		ctype = "application/json"
	}
	// The values live in u: Header.Set allocates a one-element slice for
	// each. Keys are in canonical form.
	nh := 0
	set := func(key, v string) {
		u.hdr[nh] = v
		req.Header[key] = u.hdr[nh : nh+1 : nh+1]
		nh++
	}
	set("Content-Type", ctype)
	set("X-Request-Id", cl.id)
	set("X-Idempotency-Key", idempotencyKey(cl))
	if !rep.Static && s.cfg.ClusterToken != "" {
		set("Authorization", "Bearer "+s.cfg.ClusterToken)
	}
	if cl.req.upstreamStream() {
		set("Accept", "text/event-stream")
	}
	cl.trace.inject(ctx, req.Header)

	// The first-token deadline, and ejection of the replica meanwhile (a
	// probe found it hung), both end the wait; the router retries elsewhere.
	// Callbacks, not a goroutine waiting for either: a goroutine per
	// attempt, woken at its end only to exit, was a scheduler round trip on
	// every request. The first to fire says why (upstream.noToken).
	timedOut := &errTTFTDeadline
	if !cl.req.upstreamStream() {
		timedOut = &errJSONDeadline
	}
	defer u.arm(s.deadlines(cl.req.model, cl.req.upstreamStream()), timedOut).Stop()
	defer rep.OnEjected(func() { u.cutBy(&errReplicaEjected) })()

	u.sentAt = time.Now()
	resp, err := s.transport.RoundTrip(req)
	if err != nil {
		if tr.wrote.Load() == 0 && u.cut.Load() == nil {
			return nil, router.ErrNotSent(err)
		}
		return nil, u.noToken(err)
	}
	u.resp = resp
	tr.stages(u)
	if resp.StatusCode != http.StatusOK {
		return nil, upstreamStatus(resp, u.noToken)
	}
	if !cl.req.upstreamStream() {
		body, err := readAnswer(resp)
		if err != nil {
			return nil, u.noToken(err)
		}
		u.whole(cl, resp, body)
		ok = true
		return u, nil
	}
	u.stream(resp)
	if err := u.firstToken(cl); err != nil {
		return nil, u.noToken(err)
	}
	ok = true
	return u, nil
}

// firstToken reads the answer up to its first token (or its end), keeping
// every event the client may see for the relay: an error event first is
// the attempt's failure.
func (u *upstream) firstToken(cl *call) error {
	for {
		kind, ev, err := u.next(cl)
		switch {
		case err != nil:
			return err
		case kind == evDrop:
			continue
		case kind == evError:
			// The event is what the client gets if no other attempt does better.
			return fmt.Errorf("error event before the first token: %s", bytes.TrimSpace(ev))
		}
		u.pending = append(u.pending, ev)
		if kind != evOther {
			u.done = kind != evToken
			u.firstAt = time.Now()
			u.stages.UpstreamTTFT = u.firstAt.Sub(u.wroteAt)
			return nil
		}
	}
}

// engineBody is the request body for rep: on a replica whose engine runs
// with priority scheduling (its worker says so), a chat or completions
// request carries its class as vLLM's priority field, a lower value served
// first (ChatCompletionRequest.priority and CompletionRequest.priority in
// vllm/entrypoints/openai/{chat_completion,completion}/protocol.py; the
// waiting queue is ordered by (priority, arrival),
// vllm/v1/core/sched/request_queue.py): interactive -1, batch 1, standard
// none (vLLM's default, 0). The class is the key's, lowered by the request
// if it asked; a client's own priority field was removed when the body was
// read (request.go), so it never overrides the class. Other replicas get the
// body as it is: an engine with the default policy (fcfs) refuses any
// priority but 0 with 400.
func engineBody(cl *call, rep *router.Replica) []byte {
	body := cl.req.body
	if !rep.PriorityScheduling() || (cl.ep.path != chatEndpoint.path && cl.ep.path != completionEndpoint.path) {
		return body
	}
	var v string
	switch cl.priority {
	case policy.ClassInteractive:
		v = "-1"
	case policy.ClassBatch:
		v = "1"
	default:
		return body
	}
	// A copy: the other attempts of the call may go to replicas without it.
	b, err := sjson.SetRawBytes(slices.Clone(body), "priority", []byte(v))
	if err != nil {
		return body // not an object: the engine refuses it as it is
	}
	return b
}

// upstreamStatus classifies a non-200 answer.
func upstreamStatus(resp *http.Response, fail func(error) error) error {
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	status := resp.StatusCode
	if status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable {
		err := &upstreamStatusError{status: status, retryAfter: min(parseRetryAfter(headerValue(resp.Header, "Retry-After"), time.Now()), time.Minute)}
		// Overloaded, draining or not ready: nothing ran; the router backs
		// the replica off or drains it as it asked, and goes elsewhere.
		return &router.Declined{Err: err, RetryAfter: err.retryAfter,
			Draining: gjson.GetBytes(body, "error.code").String() == "replica_draining"}
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

// serverTiming renders the call's known stages as a Server-Timing header, in
// milliseconds.
func serverTiming(cl *call) string {
	var buf [timingBytes]byte
	return string(appendServerTiming(buf[:0], cl))
}

// timingBytes holds every stage: "upstream_ttft;dur=1234.567, " is 28 bytes.
const timingBytes = 256

// appendServerTiming appends serverTiming's value to b: each known stage's
// milliseconds to the microsecond (rounded half up), in integers
// (strconv.AppendFloat's 'f' formatting was 0.15 % of the gateway's CPU
// samples at 1000 JSON requests a second).
func appendServerTiming(b []byte, cl *call) []byte {
	start := len(b)
	cl.stages.Each(func(_ int, name string, d time.Duration) {
		if d < 0 {
			return
		}
		if len(b) > start {
			b = append(b, ", "...)
		}
		b = append(append(b, name...), ";dur="...)
		us := (int64(d) + 500) / 1000
		b = append(strconv.AppendInt(b, us/1000, 10), '.')
		frac := us % 1000
		b = append(b, byte('0'+frac/100), byte('0'+frac/10%10), byte('0'+frac%10))
	})
	return b
}

// request builds the attempt's POST of body to path on its replica, its
// parts held in u: the URL copied from the replica's, parsed once; the
// body's reader; the request itself, copied once by WithContext (what
// http.NewRequestWithContext cost besides was 7 allocations a request in
// BenchmarkGatewayOverhead's pprof: the URL's string and parse, the reader,
// its NopCloser and the request). Its header map is empty.
func (u *upstream) request(ctx context.Context, body []byte, path string) (*http.Request, error) {
	base, err := u.rep.BaseURL()
	if err != nil {
		return nil, err
	}
	u.url = *base
	if base.Path != "" || base.RawPath != "" || base.RawQuery != "" || base.Fragment != "" || base.Opaque != "" || base.ForceQuery {
		p, err := url.Parse(u.rep.URL + path)
		if err != nil {
			return nil, err
		}
		u.url = *p
	} else {
		u.url.Path = path
	}
	u.sent = body
	u.rb.Reset(body)
	u.req = http.Request{Method: http.MethodPost, URL: &u.url, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: make(http.Header, len(u.hdr)+1), Host: u.url.Host, ContentLength: int64(len(body)), Body: &u.rb, GetBody: u.getBody}
	if len(body) == 0 {
		u.req.Body, u.req.GetBody = http.NoBody, nil
	}
	return u.req.WithContext(ctx), nil
}

// getBody is the request's body again, for a transport that sends it again
// (a reused connection found closed before the engine read it).
func (u *upstream) getBody() (io.ReadCloser, error) {
	return io.NopCloser(bytes.NewReader(u.sent)), nil
}

// requestBody is an attempt's request body: a reader of its bytes.
type requestBody struct{ bytes.Reader }

func (*requestBody) Close() error { return nil }

// attemptSeq numbers upstream requests for their idempotency keys.
var attemptSeq atomic.Uint64

// idempotencyKey is an upstream request's X-Idempotency-Key, unique to the
// attempt, which is what lets Go's transport send it again on a fresh
// connection when a reused keep-alive connection turns out closed before
// the engine read it (vLLM closes idle ones after 5 s; Go resends no POST
// without such a key). Nothing is resent once an answer byte arrived.
func idempotencyKey(cl *call) string {
	var buf [64]byte
	b := append(append(buf[:0], cl.id...), '-')
	return string(strconv.AppendUint(b, attemptSeq.Add(1), 36))
}
