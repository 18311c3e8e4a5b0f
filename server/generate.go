package server

import (
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/tailgate-dev/tailgate/data"
	"github.com/tailgate-dev/tailgate/policy"
	"github.com/tailgate-dev/tailgate/server/apierr"
	"github.com/tailgate-dev/tailgate/serving"
)

// handleGenerate serves one public POST endpoint (chat, completions,
// responses, messages, embeddings, rerank, score, tokenize, audio): it
// authenticates, reads the body once under a deadline and a size bound, and
// hands the call to the one pipeline with the HTTP response as its sink.
func (s *Server) handleGenerate(ep endpoint) echo.HandlerFunc {
	return func(c echo.Context) error {
		r := c.Request()
		defer requestTask(r)()
		s.m.inflight.Inc()
		defer s.m.inflight.Dec()

		p, err := s.authenticate(c)
		if err != nil {
			c.Response().Header().Set("X-Request-Id", s.newRequestID())
			return apierr.Reply(c, toAPIError(err, ""))
		}
		// The call and its sink, one allocation (pprof of
		// BenchmarkGatewayOverhead: the call and the sink, one each).
		pub := new(publicCall)
		cl := &pub.cl
		s.initCall(cl, ep, p)
		cl.trace = s.traceCall(r, cl)
		defer cl.trace.end(cl)
		cl.noHedge = strings.EqualFold(headerValue(r.Header, "X-Tailgate-Hedge"), "off")
		cl.group = boundString(headerValue(r.Header, "X-Tailgate-Group"))
		cl.session = hashString(agentSession(r.Header))
		cl.source = s.sourceOf(r)
		live := s.live.track(cl)
		defer s.live.untrack(live)
		out := &pub.out
		*out = httpSink{s: s, c: c, h: c.Response().Header()}
		out.set("X-Request-Id", cl.id)
		if err := askPriority(cl, r, out); err != nil {
			s.reject(cl, out, err)
			return nil
		}

		// The key's own limits come before any shared resource: a request
		// its key may not make now takes no body bytes, hold or queue slot.
		entry, rs, err := s.gate.Enter(p)
		if err != nil {
			out.rateLimits(rs)
			s.reject(cl, out, err)
			return nil
		}
		cl.entry = entry
		defer entry.Leave() // nothing once admitted: the ticket holds it

		limit := s.cfg.MaxBodyBytes
		if ep.form {
			limit = s.cfg.MaxAudioBytes
		}
		cl.ctype = headerValue(r.Header, "Content-Type")
		cl.budgeted = true
		defer func() { s.bodies.release(p.TenantID, cl.bodyHeld) }()
		body, ok := s.readBody(c, cl, out, limit)
		if !ok {
			return nil
		}
		if key := headerValue(r.Header, idemHeader); key != "" && keyedEndpoint(ep) {
			s.serveKeyed(c, cl, key, body, out)
			return nil
		}
		s.serve(r.Context(), cl, body, out)
		return nil
	}
}

// readBody reads the request body once, at most limit bytes, under the body
// deadline and within its tenant's share of the budget of body bytes in
// flight; a body that fails is refused (and recorded) for cl, and false
// returned. On failure the deadline stays in force, so the server's own
// drain of the unread body fails fast too and the connection is closed.
// What the body holds of the budget is in cl.bodyHeld (a multipart form
// with a Content-Length reserves its re-encoded copy ahead, cl.copyAhead):
// the handler gives it back when its request ends.
func (s *Server) readBody(c echo.Context, cl *call, out sink, limit int64) ([]byte, bool) {
	r := c.Request()
	tenant := cl.principal.TenantID
	var grow *budgetedBody
	if n := r.ContentLength; n > 0 && n <= limit {
		need := n
		if cl.ep.form {
			need += n // the form is encoded again for the engine
		}
		if err := s.bodies.reserve(r.Context(), tenant, need); err != nil {
			s.reject(cl, out, bodyError(err))
			return nil, false
		}
		cl.bodyHeld, cl.copyAhead = need, need-n
	} else {
		grow = &budgetedBody{ReadCloser: r.Body, b: s.bodies, ctx: r.Context(), tenant: tenant}
		r.Body = grow
	}
	rc := http.NewResponseController(c.Response())
	_ = rc.SetReadDeadline(time.Now().Add(s.cfg.BodyTimeout))
	body, err := serving.ReadBody(c.Response(), r, limit)
	if grow != nil {
		cl.bodyHeld = grow.held
	}
	if err != nil {
		s.reject(cl, out, bodyError(err))
		return nil, false
	}
	_ = rc.SetReadDeadline(time.Time{})
	return body, true
}

// bodyError maps a failed body read to the client's error.
func bodyError(err error) error {
	var mbe *http.MaxBytesError
	var ae *apierr.Error
	switch {
	case errors.As(err, &ae):
		return ae
	case errors.As(err, &mbe):
		return errBodyTooLarge
	case isTimeout(err):
		return errBodyTimeout
	}
	return apierr.BadRequest("", "could not read the request body")
}

// publicCall is a call of the public API and its sink.
type publicCall struct {
	cl  call
	out httpSink
}

// httpSink delivers a call's answer as the public API's HTTP response.
type httpSink struct {
	s *Server
	c echo.Context
	h http.Header // c's response headers
	// vals backs the response's header values: Header.Set allocates a
	// one-element slice for each, and an answer sets about fifteen.
	vals [16]string
	n    int
}

// set sets a response header; key must be in canonical form.
func (o *httpSink) set(key, v string) {
	if o.n == len(o.vals) {
		o.h.Set(key, v)
		return
	}
	o.vals[o.n] = v
	o.h[key] = o.vals[o.n : o.n+1 : o.n+1]
	o.n++
}

func (o *httpSink) rateLimits(rs policy.RateState) { setRateHeaders(o, rs) }

func (o *httpSink) stream(cl *call) *sseWriter {
	return newSSEWriter(o.c.Response(), o.s.cfg.KeepAlive, o.s.cfg.ClientWriteTimeout, func(http.Header) { setRouteHeaders(o, cl) })
}

// json sends the winning attempt's JSON answer byte for byte.
func (o *httpSink) json(cl *call, body []byte) {
	// Content-Length and Server-Timing cut from one string.
	var buf [20 + timingBytes]byte
	b := strconv.AppendInt(buf[:0], int64(len(body)), 10)
	n := len(b)
	vals := string(appendServerTiming(b, cl))
	o.set("Content-Type", "application/json")
	o.set("Content-Length", vals[:n])
	setRouteHeaders(o, cl)
	o.set("Server-Timing", vals[n:])
	_ = http.NewResponseController(o.c.Response()).SetWriteDeadline(time.Now().Add(o.s.cfg.ClientWriteTimeout))
	o.c.Response().WriteHeader(http.StatusOK)
	_, _ = o.c.Response().Write(body)
	// Out now, not when the handler returns: what is left to do (the
	// upstream connection put back, the request's accounts closed) is
	// not the client's wait.
	_ = http.NewResponseController(o.c.Response()).Flush()
}

func (o *httpSink) error(cl *call, ae *apierr.Error) {
	if cl.outcome == data.OutcomeClientCancelled {
		return // nobody to tell
	}
	setRouteHeaders(o, cl)
	_ = apierr.Reply(o.c, ae)
}

// setRouteHeaders says which replica answered and how: x-tailgate-replica,
// -attempts, -hedged, -winner (for a routed call only).
func setRouteHeaders(o *httpSink, cl *call) {
	if !cl.routed {
		return
	}
	if cl.replica != "" {
		o.set("X-Tailgate-Replica", cl.replica)
	}
	o.set("X-Tailgate-Attempts", strconv.Itoa(max(cl.attempts, 1)))
	if cl.winner != "" {
		o.set("X-Tailgate-Hedged", strconv.FormatBool(cl.hedged))
		o.set("X-Tailgate-Winner", cl.winner)
	}
}

func setRateHeaders(o *httpSink, rs policy.RateState) {
	// The values are cut from one string: strconv's string of a number of
	// 100 or more is an allocation of its own, and four to seven of these
	// headers go out with every answer.
	var (
		buf  [160]byte
		keys [7]string
		ends [7]int
		n    int
	)
	b := buf[:0]
	add := func(key string, v []byte) {
		keys[n], ends[n] = key, len(v)
		n++
		b = v
	}
	if rs.LimitRequests > 0 {
		add("X-Ratelimit-Limit-Requests", strconv.AppendInt(b, rs.LimitRequests, 10))
		add("X-Ratelimit-Remaining-Requests", strconv.AppendInt(b, max(rs.RemainingRequests, 0), 10))
		add("X-Ratelimit-Reset-Requests", appendReset(b, rs.ResetRequests))
	}
	if rs.LimitTokens > 0 {
		add("X-Ratelimit-Limit-Tokens", strconv.AppendInt(b, rs.LimitTokens, 10))
		add("X-Ratelimit-Remaining-Tokens", strconv.AppendInt(b, max(rs.RemainingTokens, 0), 10))
		add("X-Ratelimit-Reset-Tokens", appendReset(b, rs.ResetTokens))
	}
	if !rs.BudgetResets.IsZero() {
		// The tenant's periodic budget: until it is whole again, as the
		// other resets are given (and the 429's message gives the time).
		add("X-Ratelimit-Reset-Budget", appendReset(b, time.Until(rs.BudgetResets)))
	}
	all, from := string(b), 0
	for i := range n {
		o.set(keys[i], all[from:ends[i]])
		from = ends[i]
	}
}

// appendReset appends a duration as OpenAI renders it in x-ratelimit-reset-*
// ("1s", "6m0s", "120ms").
func appendReset(b []byte, d time.Duration) []byte {
	if d <= 0 {
		return append(b, "0s"...)
	}
	if d < time.Second {
		return append(strconv.AppendInt(b, int64(d/time.Millisecond)+1, 10), "ms"...)
	}
	return append(b, d.Round(time.Millisecond).String()...)
}
