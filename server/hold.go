package server

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/tailgate-dev/tailgate/data"
	"github.com/tailgate-dev/tailgate/policy"
	"github.com/tailgate-dev/tailgate/router"
	"github.com/tailgate-dev/tailgate/server/apierr"
)

// HoldConfig bounds how a request waits through a cold start: when its model
// has no ready replica but one is starting, or the fleet controller can
// start one, the request waits (the hold stage) instead of failing with 503
// no_replica. The zero value is [DefaultHold].
type HoldConfig struct {
	// Queue bounds the requests held per model; past it, 429 queue_full.
	// 0 means DefaultHold's; negative turns holding off (503 no_replica
	// at once, as before).
	Queue int
	// PerTenant bounds one tenant's share of each model's Queue; past it
	// the tenant's next request gets 429 queue_full while other tenants
	// are still held. 0 means a quarter of Queue, at least 1: a tenant's
	// burst during a cold start takes at most a quarter of the places, so
	// three more tenants at their share still leave room.
	PerTenant int
	// Timeout bounds one request's hold; past it, 503 no_replica with
	// Retry-After. 0 means DefaultHold's.
	Timeout time.Duration
	// Progress is how often a held stream is sent an SSE comment saying
	// what it waits for; 0 means DefaultHold's.
	Progress time.Duration
}

// DefaultHold: a vLLM engine of a 7–8B model loads from a local cache and
// captures its CUDA graphs in about 40–90 s on one GPU, so 120 s covers a
// cold start with room for a slow download's tail, while staying far
// inside the OpenAI SDKs' 10-minute request timeout. 128 held requests a
// model is a few seconds of a small team's peak traffic; each holds only
// its parsed body. Progress every 5 s keeps common proxy idle timeouts (30–
// 60 s) from cutting a held stream, and is frequent enough to watch.
var DefaultHold = HoldConfig{Queue: 128, Timeout: 120 * time.Second, Progress: 5 * time.Second}

func (c *HoldConfig) setDefaults() {
	if c.Queue == 0 {
		c.Queue = DefaultHold.Queue
	}
	if c.PerTenant <= 0 {
		c.PerTenant = max(c.Queue/4, 1)
	}
	c.PerTenant = min(c.PerTenant, max(c.Queue, 1))
	if c.Timeout <= 0 {
		c.Timeout = DefaultHold.Timeout
	}
	if c.Progress <= 0 {
		c.Progress = DefaultHold.Progress
	}
}

// retryHold is the Retry-After of a request refused while its model's
// capacity was starting: a replica on its way is usually seconds out.
const retryHold = 5 * time.Second

// holdOptions are how a call waits, before routing, until a replica of its
// model is ready when none is but one is coming (router.Request.Hold; nil
// when holding is off). A stream (w not nil) is sent a progress comment
// every HoldConfig.Progress, which commits its 200 before routing: a
// failure after that is an in-band error event. The wait is the call's
// hold stage; it bills nothing and is not part of any attempt's TTFT
// deadline.
//
// The options are the server's (s.hold, whose Then fails closed after the
// wait as before it: nothing starts that the ledger could not record), and
// a stream's own only when its model has no ready replica now: a stream
// whose ready replicas all decline waits once more with keep-alives but
// without progress comments, so that no request that routes at once pays
// for a progress callback.
func (s *Server) holdOptions(cl *call, w *sseWriter) *router.HoldOptions {
	if s.cfg.Hold.Queue < 0 {
		return nil
	}
	// Each call's own copy: the tenant's share of the queue is counted by
	// its tenant (router.HoldOptions.PerTenant).
	cl.hold = s.hold
	if cl.principal != nil {
		cl.hold.Tenant = cl.principal.TenantID
	}
	if w == nil || s.reg.ReadyFor(cl.req.model) {
		return &cl.hold
	}
	name := commentSafe(cl.req.model)
	cl.hold.Every = s.cfg.Hold.Progress
	cl.hold.Progress = func(state string, waited time.Duration) {
		_ = w.comment(fmt.Sprintf(": waiting for a replica of %s: %s, %d s\n\n", name, state, int(waited.Seconds())))
	}
	return &cl.hold
}

// refuseHeld answers and records a call whose hold ended without a ready
// replica (queue full, timeout, ledger down) or whose client went away.
func (s *Server) refuseHeld(ctx context.Context, cl *call, out sink, w *sseWriter, ticket *policy.Ticket, err error) {
	cl.stages.Total = time.Since(cl.start)
	if ctx.Err() != nil {
		cl.outcome, cl.class, cl.status = data.OutcomeClientCancelled, data.ClassClientCancelled, statusClientClosed
		s.record(cl, ticket.Settle(policy.Usage{}))
		return
	}
	ae := toAPIError(err, cl.req.model)
	cl.status, cl.outcome, cl.class = ae.Status, data.OutcomeRejected, data.ErrorClass(ae.Code)
	s.record(cl, ticket.Settle(policy.Usage{}))
	if w != nil {
		w.fail(ae) // a plain HTTP error if no progress went out yet
		return
	}
	out.error(cl, ae)
}

// holdError is the client's error for a hold that ended without a replica.
func holdError(err error, model string) *apierr.Error {
	if errors.Is(err, router.ErrHoldShare) {
		return &apierr.Error{Status: http.StatusTooManyRequests, Type: "requests", Code: "queue_full",
			Message:    fmt.Sprintf("no replica of the model %q is ready yet and this tenant's requests hold its share of the queue of waiting requests; retry later", model),
			RetryAfter: retryHold}
	}
	if errors.Is(err, router.ErrHoldFull) {
		return &apierr.Error{Status: http.StatusTooManyRequests, Type: "requests", Code: "queue_full",
			Message:    fmt.Sprintf("no replica of the model %q is ready yet and its queue of waiting requests is full; retry later", model),
			RetryAfter: retryHold}
	}
	e := *errNoReplica
	e.Message = fmt.Sprintf("no replica of the model %q became ready in time (one is starting); retry shortly", model)
	e.RetryAfter = retryHold
	return &e
}

// commentSafe keeps a client-chosen name on one comment line.
func commentSafe(s string) string {
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return -1
		}
		return r
	}, boundString(s))
}
