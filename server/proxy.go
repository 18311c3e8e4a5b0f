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
	"time"
	"unsafe"

	"github.com/labstack/echo/v4"
	"github.com/tidwall/gjson"

	"tailgate/data"
	"tailgate/policy"
	"tailgate/router"
	"tailgate/server/apierr"
	"tailgate/serving/sse"
)

// proxyEndpoint is an endpoint vLLM serves beside chat and completions
// (embeddings, the Responses API, rerank, score, tokenize, audio, Anthropic
// messages). The gateway reads what it needs to route and reserve (model,
// stream, the output cap), relays the engine's answer as it is, and bills the
// usage the engine reports in it.
type proxyEndpoint struct {
	path      string
	multipart bool   // a multipart/form-data body (audio)
	stream    bool   // the body may ask for an SSE answer ("stream": true)
	capField  string // the field capping output tokens; "" if the endpoint generates none
	generates bool   // reserve a completion (capField's value or the default max_tokens)
}

// proxyEndpoints are the endpoints proxied this way, by public path.
var proxyEndpoints = []proxyEndpoint{
	{path: "/v1/embeddings"},
	{path: "/v1/responses", stream: true, capField: "max_output_tokens", generates: true},
	{path: "/v1/messages", stream: true, capField: "max_tokens", generates: true},
	{path: "/v1/rerank"},
	{path: "/rerank"},
	{path: "/v2/rerank"},
	{path: "/v1/score"},
	{path: "/score"},
	{path: "/tokenize"},
	{path: "/detokenize"},
	{path: "/v1/audio/transcriptions", multipart: true, stream: true, generates: true},
	{path: "/v1/audio/translations", multipart: true, stream: true, generates: true},
}

// handleProxy serves one proxied endpoint: authenticate, read the body once
// (bounded, under a deadline), then the same admission, routing, ledger and
// error table as generation, with the engine's answer relayed unchanged.
func (s *Server) handleProxy(pe proxyEndpoint) echo.HandlerFunc {
	return func(c echo.Context) error {
		r := c.Request()
		s.m.inflight.Inc()
		defer s.m.inflight.Dec()
		p, err := s.authenticate(c)
		if err != nil {
			c.Response().Header().Set("X-Request-Id", s.newRequestID())
			return apierr.Reply(c, toAPIError(err, ""))
		}
		cl := s.newCall(endpoint{path: pe.path}, p)
		s.live.track(cl)
		defer s.live.untrack(cl)
		cl.noHedge = true // hedging waits for a first token these answers do not have
		out := newHTTPSink(s, c)
		out.set("X-Request-Id", cl.id)
		if err := askPriority(cl, r, out); err != nil {
			s.reject(cl, out, err)
			return nil
		}
		limit := s.cfg.MaxBodyBytes
		if pe.multipart {
			limit = s.cfg.MaxAudioBytes
		}
		body, ok := s.readBody(c, cl, out, limit)
		if !ok {
			return nil
		}
		defer s.bodies.release(int64(len(body)))
		s.serveProxy(r.Context(), cl, pe, body, r.Header.Get("Content-Type"), out)
		return nil
	}
}

// serveProxy is serve for a proxied endpoint.
func (s *Server) serveProxy(ctx context.Context, cl *call, pe proxyEndpoint, body []byte, ctype string, out *httpSink) {
	if err := s.ledger.Healthy(); err != nil {
		s.reject(cl, out, err)
		return
	}
	pr, ctype, err := s.parseProxied(pe, body, ctype)
	if err != nil {
		s.reject(cl, out, err)
		return
	}
	cl.noQueue = !pe.generates
	ticket := s.admit(ctx, cl, pr, out)
	if ticket == nil {
		return
	}
	defer ticket.Release()
	defer cl.slot.Release()
	cl.stages.Gateway = time.Since(cl.start)
	cl.routed = true
	res, err := s.reg.Do(ctx, router.Request{Hint: router.Hint{Model: pr.model}, Stream: pr.stream, NoHedge: true},
		func(ctx context.Context, rep *router.Replica, n int, reason router.AttemptReason) (router.Attempt, error) {
			i := cl.tries.begin(rep, reason)
			att, err := s.openProxied(ctx, cl, rep, ctype)
			cl.tries.opened(i, att, err, ctx.Err() != nil)
			return att, err
		})
	cl.attempts, cl.hedged = res.Attempts, res.Hedged
	if res.Replica != nil {
		cl.replica = res.Replica.ID
	}
	defer res.Finish()
	var w *sseWriter
	if err == nil {
		a := res.Attempt.(*proxied)
		cl.tries.win(a)
		defer a.Abort()
		cl.winner = res.Reason.String()
		cl.stages.Connect, cl.stages.UpstreamTTFT = a.connect, a.ttft
		cl.firstToken = true
		cl.stages.TTFT = time.Since(cl.start)
		if a.body != nil {
			cl.usage, cl.gotUsage = proxyUsage(a.body, policy.Usage{})
			cl.stages.Total = cl.stages.TTFT
			cl.outcome = data.OutcomeOK
			s.settle(ctx, cl, ticket, true) // committed before the answer leaves
			out.json(cl, a.body)
			return
		}
		w = out.stream(cl)
		defer w.close()
		w.routed()
		err = s.relayProxied(ctx, w, cl, a, ticket)
	}
	if cl.recorded {
		return
	}
	if ae := s.conclude(ctx, cl, err); ae != nil {
		if w != nil {
			w.fail(ae)
		} else {
			out.error(cl, ae)
		}
	}
	s.settle(ctx, cl, ticket, false)
}

// parseProxied reads what the gateway acts on from a proxied body: the model
// (required, to route), whether it streams, and the output cap. It returns
// the Content-Type of the body to forward (pr.body): a form is forwarded as
// the gateway wrote it again.
func (s *Server) parseProxied(pe proxyEndpoint, body []byte, ctype string) (*parsedRequest, string, error) {
	pr := &parsedRequest{body: body, sequences: 1}
	if pe.multipart {
		var err error
		if ctype, err = readProxiedForm(pr, body, ctype); err != nil {
			return nil, "", err
		}
	} else {
		if len(body) == 0 {
			return nil, "", apierr.BadRequest("", "request body is empty; send a JSON object")
		}
		if err := checkJSON(body, s.cfg.MaxJSONDepth); err != nil {
			return nil, "", err
		}
		v := gjson.Parse(unsafe.String(unsafe.SliceData(body), len(body)))
		if !v.IsObject() {
			return nil, "", apierr.BadRequest("", "request body must be a JSON object")
		}
		if m := v.Get("model"); m.Type == gjson.String {
			pr.model = m.Str
		}
		if st := v.Get("stream"); st.Exists() && st.Type != gjson.Null {
			if !isBool(st) {
				return nil, "", apierr.BadRequest("stream", "stream must be a boolean")
			}
			pr.stream = st.Type == gjson.True
		}
		if pe.capField != "" {
			if c := v.Get(pe.capField); c.Exists() && c.Type != gjson.Null {
				if c.Type != gjson.Number || c.Num != float64(int64(c.Num)) || c.Num < 1 || c.Num > 1<<31 {
					return nil, "", apierr.BadRequest(pe.capField, "%s must be a positive integer", pe.capField)
				}
				pr.maxTokens = int64(c.Num)
			}
		}
	}
	if pr.model == "" {
		return nil, "", apierr.BadRequest("model", "you must provide a model parameter (the gateway routes by it)")
	}
	if pr.stream && !pe.stream {
		return nil, "", apierr.BadRequest("stream", "%s does not stream", pe.path)
	}
	if pe.generates && pr.maxTokens == 0 {
		pr.maxTokens = s.maxTokensFor(pr.model)
	}
	pr.promptBound = int64(len(body)) + 16
	pr.promptEstimate = int64(len(body))/4 + 1
	return pr, ctype, nil
}

// readProxiedForm reads an audio request's form strictly (readForm) into
// pr: the model and whether it streams. pr.body becomes a form the gateway
// wrote, holding the model and stream it decided and the other fields and
// the file as sent; the returned Content-Type is that form's.
func readProxiedForm(pr *parsedRequest, body []byte, ctype string) (string, error) {
	f, err := readForm(body, ctype)
	if err != nil {
		return "", err
	}
	if p := f.part("model"); p != nil && p.file {
		return "", apierr.BadRequest("model", "model must be a text field, not a file")
	}
	pr.model, _ = f.value("model")
	if p := f.part("stream"); p != nil {
		v, _ := f.value("stream")
		switch {
		case p.file:
			return "", apierr.BadRequest("stream", "stream must be a text field, not a file")
		case strings.EqualFold(v, "true"):
			pr.stream = true
		case !strings.EqualFold(v, "false"):
			return "", apierr.BadRequest("stream", "stream must be true or false, not %q", v)
		}
		f.set("stream", strconv.FormatBool(pr.stream))
	}
	if pr.model != "" {
		f.set("model", pr.model)
	}
	pr.body, ctype = f.encode()
	return ctype, nil
}

// proxied is one attempt of a proxied request, held at its answer's
// headers (SSE) or with its whole body (anything else).
type proxied struct {
	resp    *http.Response
	cancel  context.CancelFunc
	body    []byte // a whole non-SSE answer
	connect time.Duration
	ttft    time.Duration
}

func (a *proxied) Abort() {
	a.cancel()
	if a.resp != nil {
		a.resp.Body.Close()
	}
}

// openProxied sends the body to rep and waits for the answer's headers; a
// non-SSE answer is read whole under the JSON deadline.
func (s *Server) openProxied(ctx context.Context, cl *call, rep *router.Replica, ctype string) (router.Attempt, error) {
	ctx, cancel := context.WithCancel(ctx)
	a := &proxied{cancel: cancel}
	ok := false
	defer func() {
		if !ok {
			a.Abort()
		}
	}()
	deadline := time.AfterFunc(s.cfg.JSONDeadline, cancel)
	defer deadline.Stop()
	tr := &attemptTrace{}
	req, err := http.NewRequestWithContext(httptrace.WithClientTrace(ctx, tr.clientTrace()), http.MethodPost, rep.URL+cl.ep.path, bytes.NewReader(cl.req.body))
	if err != nil {
		return nil, router.ErrNotSent(err)
	}
	req.Header.Set("Content-Type", ctype)
	req.Header.Set("X-Request-Id", cl.id)
	markReplayable(req, cl)
	if !rep.Static && s.cfg.ClusterToken != "" {
		req.Header.Set("Authorization", "Bearer "+s.cfg.ClusterToken)
	}
	sent := time.Now()
	resp, err := s.transport.RoundTrip(req)
	timedOut := func(err error) error {
		if ctx.Err() != nil && !deadline.Stop() {
			return router.ErrNoToken(fmt.Errorf("%w: %v", errJSONDeadline, err), "")
		}
		return router.ErrNoToken(err, "")
	}
	if err != nil {
		if tr.wrote.Load() == 0 {
			return nil, router.ErrNotSent(err)
		}
		return nil, timedOut(err)
	}
	a.resp = resp
	if cs, cd := tr.connectStart.Load(), tr.connectDone.Load(); cs != 0 && cd >= cs {
		a.connect = time.Duration(cd - cs)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, s.upstreamStatus(rep, resp, func(err error) error { return router.ErrNoToken(err, "") })
	}
	if !isEventStream(resp.Header) {
		body, err := io.ReadAll(io.LimitReader(resp.Body, maxUpstreamBody))
		if err != nil {
			return nil, timedOut(err)
		}
		a.body = body
	}
	a.ttft = time.Since(sent)
	ok = true
	return a, nil
}

// relayProxied relays an SSE answer event by event, keeping the usage the
// engine reports and an open ledger row, and commits the row at its end.
func (s *Server) relayProxied(ctx context.Context, w *sseWriter, cl *call, a *proxied, ticket *policy.Ticket) error {
	br := readerPool.Get().(*bufio.Reader)
	br.Reset(a.resp.Body)
	defer func() { br.Reset(nil); readerPool.Put(br) }()
	idle := s.idleDeadline(cl.req.model)
	timer := time.AfterFunc(idle, a.cancel)
	defer timer.Stop()
	s.ledger.Open(s.row(cl, cl.billable(), 0))
	var buf []byte
	for {
		ev, err := sse.ReadEvent(br, buf)
		if err != nil {
			switch {
			case ctx.Err() != nil:
				return ctx.Err()
			case errors.Is(err, io.EOF) && len(bytes.TrimSpace(ev)) == 0:
				// The engine ended the stream: commit, then the last flush.
				cl.outcome = data.OutcomeOK
				s.settle(ctx, cl, ticket, true)
				return w.write()
			}
			return &midstreamError{class: data.ClassMidstream, err: err}
		}
		buf = ev
		timer.Reset(idle)
		if p := sse.Data(ev); p != nil && bytes.Contains(p, []byte(`_tokens"`)) {
			cl.usage, cl.gotUsage = proxyUsage(p, cl.usage)
		}
		if err := w.send(!sse.NextBuffered(br), ev); err != nil {
			return err
		}
	}
}

// proxyUsage reads the usage an engine reports in a proxied answer or event,
// merged into what earlier events said: OpenAI's prompt/completion tokens,
// the Responses and Anthropic input/output tokens (at the top, under
// "response" or "message"), or only total_tokens (rerank, score) as prompt.
func proxyUsage(payload []byte, prev policy.Usage) (policy.Usage, bool) {
	v := gjson.ParseBytes(payload)
	u := v.Get("usage")
	if !u.IsObject() {
		u = v.Get("response.usage")
	}
	if !u.IsObject() {
		u = v.Get("message.usage")
	}
	if !u.IsObject() {
		return prev, prev != (policy.Usage{})
	}
	in := max(u.Get("prompt_tokens").Int(), u.Get("input_tokens").Int())
	outTok := max(u.Get("completion_tokens").Int(), u.Get("output_tokens").Int())
	if in == 0 && outTok == 0 {
		in = u.Get("total_tokens").Int()
	}
	return policy.Usage{PromptTokens: max(prev.PromptTokens, in), CompletionTokens: max(prev.CompletionTokens, outTok)}, true
}

func isEventStream(h http.Header) bool {
	return strings.HasPrefix(strings.TrimSpace(h.Get("Content-Type")), "text/event-stream")
}
