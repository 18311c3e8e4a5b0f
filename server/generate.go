package server

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"

	"tailgate/data"
	"tailgate/policy"
	"tailgate/router"
)

// call is one client request on its way through the gateway.
type call struct {
	id        string
	start     time.Time
	principal *policy.Principal
	ep        endpoint
	req       *parsedRequest
	ticket    *policy.Ticket
	mm        *modelMetrics

	stages        data.Stages
	usage         policy.Usage
	gotUsage      bool  // upstream reported usage
	relayedTokens int64 // content chunks relayed (for partial billing)
	firstToken    bool  // a token reached the client
	replica       string
	attempts      int
	outcome       string // ledger outcome; "" until decided
	errClass      string
	status        int
}

// handleGenerate serves POST /v1/chat/completions and /v1/completions.
func (s *Server) handleGenerate(ep endpoint) echo.HandlerFunc {
	return func(c echo.Context) error {
		cl := &call{start: time.Now(), id: s.newRequestID(), ep: ep, stages: data.UnknownStages(), status: http.StatusOK}
		h := c.Response().Header()
		h.Set("X-Request-Id", cl.id)
		s.m.inflight.Inc()
		defer s.m.inflight.Dec()

		p, err := s.authenticate(c)
		if err != nil {
			return writeError(c, toAPIError(err, ""))
		}
		cl.principal = p

		r := c.Request()
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

		res, err := s.reg.Do(r.Context(), pr.model, func(ctx context.Context, rep *router.Replica, n int) error {
			cl.attempts = n
			return s.attempt(ctx, c, cl, rep, n)
		})
		cl.attempts = res.Attempts
		return s.finish(c, cl, err)
	}
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
	if err != nil && cl.outcome == "" {
		switch {
		case c.Request().Context().Err() != nil:
			cl.outcome, cl.errClass, cl.status = "client_cancelled", "client_cancelled", 499
		case cl.firstToken:
			cl.outcome, cl.errClass = "midstream_error", "upstream_midstream"
		default:
			ae := toAPIError(err, cl.req.model)
			cl.outcome, cl.errClass, cl.status = "upstream_error", ae.Code, ae.Status
			if !c.Response().Committed {
				s.setRouteHeaders(c.Response().Header(), cl)
				_ = writeError(c, ae)
			}
		}
		if cl.outcome != "client_cancelled" {
			s.log.Warn("request failed", "request_id", cl.id, "model", cl.req.model, "replica", cl.replica,
				"attempts", cl.attempts, "outcome", cl.outcome, "err", err)
		}
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
		if cl.relayedTokens > 0 {
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
	if cl.principal == nil {
		return
	}
	row := data.LedgerRow{
		ID: cl.id, Time: cl.start, TenantID: cl.principal.TenantID, KeyID: cl.principal.KeyID,
		Upstream: cl.replica, PromptTokens: cl.usage.PromptTokens, CompletionTokens: cl.usage.CompletionTokens,
		CostMicros: cost, Status: cl.status, Outcome: cl.outcome, Error: cl.errClass,
		Attempts: cl.attempts, Stages: cl.stages,
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
