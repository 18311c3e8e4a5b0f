package server

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/tidwall/gjson"

	"tailgate/data"
	"tailgate/policy"
	"tailgate/router"
)

// call is one client request on its way through the gateway.
type call struct {
	id        string
	ctx       context.Context // the client's request context
	start     time.Time
	principal *policy.Principal
	ep        endpoint
	req       *parsedRequest
	ticket    *policy.Ticket
	mm        *modelMetrics

	stages        data.Stages
	usage         policy.Usage
	gotUsage      bool  // upstream reported usage
	relayedTokens int64 // content events relayed (for partial billing)
	overhead      int64 // tokens burned by losing hedges
	firstToken    bool  // a token reached the client
	replica       string
	attempts      int
	hedged        bool
	winner        string // first, retry or hedge
	outcome       string // ledger outcome; "" until decided
	errClass      string
	status        int
}

// handleGenerate serves POST /v1/chat/completions and /v1/completions.
func (s *Server) handleGenerate(ep endpoint) echo.HandlerFunc {
	return func(c echo.Context) error {
		r := c.Request()
		cl := &call{start: time.Now(), ctx: r.Context(), id: s.newRequestID(), ep: ep, stages: data.UnknownStages(), status: http.StatusOK}
		c.Response().Header().Set("X-Request-Id", cl.id)
		s.m.inflight.Inc()
		defer s.m.inflight.Dec()

		p, err := s.authenticate(c)
		if err != nil {
			return writeError(c, toAPIError(err, ""))
		}
		return s.generate(c, cl, p)
	}
}

// Generate runs one generation request for an already authenticated
// principal, exactly as the public API does (admission, routing, hedging,
// metering, ledger), writing the answer to c's response. Path must be
// /v1/chat/completions or /v1/completions. The batch executor uses it.
func (s *Server) Generate(c echo.Context, p *policy.Principal, path string) error {
	ep := chatEndpoint
	if path == completionEndpoint.path {
		ep = completionEndpoint
	}
	cl := &call{start: time.Now(), ctx: c.Request().Context(), id: s.newRequestID(), ep: ep, stages: data.UnknownStages(), status: http.StatusOK}
	c.Response().Header().Set("X-Request-Id", cl.id)
	return s.generate(c, cl, p)
}

func (s *Server) generate(c echo.Context, cl *call, p *policy.Principal) error {
	r := c.Request()
	h := c.Response().Header()
	ep := cl.ep
	cl.principal = p

	rc := http.NewResponseController(c.Response())
	_ = rc.SetReadDeadline(time.Now().Add(s.cfg.BodyTimeout))
	body, err := io.ReadAll(http.MaxBytesReader(c.Response(), r.Body, s.cfg.MaxBodyBytes))
	if err != nil {
		// The deadline stays in force, so the server's own drain of the
		// unread body fails fast too and the connection is closed.
		var (
			mbe *http.MaxBytesError
			ne  net.Error
		)
		switch {
		case errors.As(err, &mbe):
			return s.reject(c, cl, errBodyTooLarge)
		case errors.As(err, &ne) && ne.Timeout():
			return s.reject(c, cl, errBodyTimeout)
		}
		return s.reject(c, cl, badRequest("", "could not read the request body"))
	}
	_ = rc.SetReadDeadline(time.Time{})
	pr, err := parseRequest(ep, body, s.maxTokensFor)
	if err != nil {
		return s.reject(c, cl, err)
	}
	cl.req = pr
	switch {
	case !p.Allows(pr.model):
		return s.reject(c, cl, errModelNotAllowed(pr.model))
	case !s.reg.Known(pr.model):
		return s.reject(c, cl, errUnknownModel(pr.model))
	}
	cl.mm = s.m.model(pr.model)

	ticket, rs, err := s.gate.Admit(p, policy.Request{
		Model: pr.model, PromptEstimate: pr.promptEstimate, PromptBound: pr.promptBound, MaxTokens: pr.maxTokens,
	})
	setRateHeaders(h, rs)
	if err != nil {
		return s.reject(c, cl, err)
	}
	cl.ticket = ticket
	// Settle is once only: this releases the reservation and the concurrency
	// slot if anything below panics before finish settles the real usage.
	defer ticket.Release()

	var w *sseWriter
	if pr.stream {
		w = s.newSSEWriter(c, cl)
		defer w.close()
	}
	rreq := router.Request{
		Hint:    router.Hint{Model: pr.model, Prefix: pr.prefix},
		Stream:  pr.stream,
		NoHedge: strings.EqualFold(r.Header.Get("X-Tailgate-Hedge"), "off"),
	}
	if cl.stages.Gateway < 0 {
		cl.stages.Gateway = time.Since(cl.start)
	}
	res, err := s.reg.Do(cl.ctx, rreq, func(ctx context.Context, rep *router.Replica, n int, reason router.AttemptReason) (router.Attempt, error) {
		return s.open(ctx, cl, rep, n, reason)
	})
	cl.attempts, cl.hedged = res.Attempts, res.Hedged
	if res.Replica != nil {
		cl.replica = res.Replica.ID
	}
	defer res.Finish() // the winner's in-flight slot, even if the relay panics
	if err == nil {
		u := res.Attempt.(*upstream)
		defer u.Abort() // done with it: close the connection's body, free buffers
		cl.winner = res.Reason.String()
		cl.adopt(u)
		if pr.stream {
			err = s.relayStream(w, cl, u)
		} else {
			s.writeJSON(c, cl, u)
		}
		cl.adopt(u) // usage and timings learned while relaying
	}
	s.hedgeOverhead(cl, res)
	return s.finish(c, cl, err)
}

// adopt takes the winning attempt's stages and usage.
func (cl *call) adopt(u *upstream) {
	cl.replica = u.rep.ID
	st := u.stages
	cl.stages.Connect, cl.stages.UpstreamTTFT = st.Connect, st.UpstreamTTFT
	cl.stages.EngineTTFT, cl.stages.EngineQueue = st.EngineTTFT, st.EngineQueue
	if st.EngineTTFT >= 0 && st.UpstreamTTFT >= 0 {
		cl.stages.Network = max(st.UpstreamTTFT-st.EngineTTFT, 0)
	}
	cl.usage, cl.gotUsage, cl.relayedTokens = u.usage, u.gotUsage, u.tokens
}

// hedgeOverhead counts what losing attempts of a hedged request burned: the
// prompt of every attempt that reached its replica, plus the tokens it
// produced before it was cancelled. The tenant is not billed for them.
func (s *Server) hedgeOverhead(cl *call, res *router.Result) {
	if !res.Hedged {
		return
	}
	for _, l := range res.Losers() {
		switch {
		case l.Attempt != nil:
			cl.overhead += cl.req.promptEstimate + l.Attempt.(*upstream).tokens
		case router.IsNoToken(l.Err):
			cl.overhead += cl.req.promptEstimate
		}
	}
}

// writeJSON sends the winning attempt's JSON answer byte for byte.
func (s *Server) writeJSON(c echo.Context, cl *call, u *upstream) {
	now := time.Now()
	cl.firstToken = true
	cl.stages.TTFT = now.Sub(cl.start)
	cl.stages.Total = cl.stages.TTFT
	cl.adopt(u)
	h := c.Response().Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(u.body)))
	s.setRouteHeaders(h, cl)
	h.Set("Server-Timing", serverTiming(cl))
	c.Response().WriteHeader(http.StatusOK)
	_, _ = c.Response().Write(u.body)
}

func (s *Server) maxTokensFor(model string) int64 {
	if v, ok := s.cfg.MaxTokensByModel[model]; ok && v > 0 {
		return v
	}
	return s.cfg.DefaultMaxTokens
}

// reject answers a request that was refused before reaching any replica and
// records it (it has a tenant, so it has a ledger row).
func (s *Server) reject(c echo.Context, cl *call, err error) error {
	model := ""
	if cl.req != nil {
		model = cl.req.model
	}
	ae := toAPIError(err, model)
	cl.status = ae.Status
	cl.outcome = "rejected"
	cl.errClass = ae.Code
	cl.stages.Total = time.Since(cl.start)
	s.record(cl, 0)
	return writeError(c, ae)
}

// finish settles a routed call: it answers the client if nothing was sent
// yet, settles the ticket with the real usage, and writes metrics and ledger.
func (s *Server) finish(c echo.Context, cl *call, err error) error {
	var rel *relayError
	switch {
	case err == nil:
	case errors.As(err, &rel):
		// The replica refused the request itself (a 4xx): its answer stands.
		cl.status, cl.outcome, cl.errClass = rel.status, "upstream_rejected", "upstream_"+strconv.Itoa(rel.status)
		if !c.Response().Committed {
			s.setRouteHeaders(c.Response().Header(), cl)
			if gjson.ValidBytes(rel.body) && gjson.GetBytes(rel.body, "error").Exists() {
				_ = c.Blob(rel.status, "application/json", rel.body)
			} else {
				_ = writeError(c, &apiError{Status: rel.status, Type: "invalid_request_error", Code: "upstream_rejected",
					Message: strings.TrimSpace(string(rel.body))})
			}
		}
	case cl.ctx.Err() != nil:
		cl.outcome, cl.errClass, cl.status = "client_cancelled", "client_cancelled", 499
	case cl.firstToken:
		if cl.outcome == "" {
			cl.outcome, cl.errClass = "midstream_error", "upstream_midstream"
		}
	default:
		ae := toAPIError(err, cl.req.model)
		cl.outcome, cl.errClass, cl.status = "upstream_error", ae.Code, ae.Status
		if !c.Response().Committed {
			s.setRouteHeaders(c.Response().Header(), cl)
			_ = writeError(c, ae)
		} else {
			// Only keep-alive comments went out: end the stream with an error event.
			_, _ = c.Response().Write([]byte(`data: {"error":{"message":` + strconv.Quote(ae.Message) +
				`,"type":"server_error","param":null,"code":"` + ae.Code + `"}}` + "\n\n"))
			c.Response().Flush()
		}
	}
	if err != nil && cl.outcome != "client_cancelled" && cl.outcome != "upstream_rejected" {
		s.log.Warn("request failed", "request_id", cl.id, "model", cl.req.model, "replica", cl.replica,
			"attempts", cl.attempts, "outcome", cl.outcome, "err", err)
	}
	if cl.outcome == "" {
		cl.outcome = "ok"
	}
	if cl.stages.Total < 0 {
		cl.stages.Total = time.Since(cl.start)
	}

	// Bill what was used: the engine's own count when it reported one, else
	// what reached the client (prompt estimated) — never the reservation.
	u := cl.usage
	if !cl.gotUsage {
		u = policy.Usage{}
		if cl.firstToken && cl.relayedTokens > 0 {
			u = policy.Usage{PromptTokens: cl.req.promptEstimate, CompletionTokens: cl.relayedTokens}
		}
	}
	cl.usage = u
	cost := cl.ticket.Settle(u)
	s.record(cl, cost)
	return nil
}

// record writes the call's metrics and ledger row.
func (s *Server) record(cl *call, cost int64) {
	model := "unknown"
	if cl.mm != nil {
		model = cl.mm.model
	}
	mm := s.m.model(model)
	mm.request(cl.status)
	st := cl.stages
	for i, d := range [8]time.Duration{st.Gateway, st.Connect, st.UpstreamTTFT, st.EngineQueue, st.EngineTTFT, st.Network, st.TTFT, st.Total} {
		if d >= 0 {
			s.m.stageObs[i].Observe(d.Seconds())
		}
	}
	if st.TTFT >= 0 {
		mm.ttft.Observe(st.TTFT.Seconds())
	}
	if cl.usage.PromptTokens > 0 {
		mm.prompt.Add(float64(cl.usage.PromptTokens))
	}
	if cl.usage.CompletionTokens > 0 {
		mm.completion.Add(float64(cl.usage.CompletionTokens))
	}
	if cl.overhead > 0 {
		mm.overhead.Add(float64(cl.overhead))
	}
	if cl.attempts > 0 {
		s.m.attemptsPer.Observe(float64(cl.attempts))
	}
	if cl.principal == nil {
		return
	}
	row := data.LedgerRow{
		ID: cl.id, Time: cl.start, TenantID: cl.principal.TenantID, KeyID: cl.principal.KeyID,
		Upstream: cl.replica, PromptTokens: cl.usage.PromptTokens, CompletionTokens: cl.usage.CompletionTokens,
		CostMicros: cost, Status: cl.status, Outcome: cl.outcome, Error: cl.errClass,
		Attempts: cl.attempts, Hedged: cl.hedged, HedgeOverheadTokens: cl.overhead, Stages: cl.stages,
	}
	if cl.req != nil {
		row.Model, row.Stream = cl.req.model, cl.req.stream
	}
	s.ledger.Add(row)
}

func setRateHeaders(h http.Header, rs policy.RateState) {
	if rs.LimitRequests > 0 {
		h.Set("X-Ratelimit-Limit-Requests", strconv.FormatInt(rs.LimitRequests, 10))
		h.Set("X-Ratelimit-Remaining-Requests", strconv.FormatInt(max(rs.RemainingRequests, 0), 10))
		h.Set("X-Ratelimit-Reset-Requests", formatReset(rs.ResetRequests))
	}
	if rs.LimitTokens > 0 {
		h.Set("X-Ratelimit-Limit-Tokens", strconv.FormatInt(rs.LimitTokens, 10))
		h.Set("X-Ratelimit-Remaining-Tokens", strconv.FormatInt(max(rs.RemainingTokens, 0), 10))
		h.Set("X-Ratelimit-Reset-Tokens", formatReset(rs.ResetTokens))
	}
}

// formatReset renders a duration as OpenAI does in x-ratelimit-reset-*
// ("1s", "6m0s", "120ms").
func formatReset(d time.Duration) string {
	if d <= 0 {
		return "0s"
	}
	if d < time.Second {
		return strconv.FormatInt(int64(d/time.Millisecond)+1, 10) + "ms"
	}
	return d.Round(time.Millisecond).String()
}
