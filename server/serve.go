package server

import (
	"context"
	"errors"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/tailgate-dev/tailgate/data"
	"github.com/tailgate-dev/tailgate/policy"
	"github.com/tailgate-dev/tailgate/router"
	"github.com/tailgate-dev/tailgate/server/apierr"
)

// call is one generation request on its way through the pipeline: what was
// asked and decided, and what happened. The pipeline ([Server.serve]) owns
// it; transports see it only through their sink.
type call struct {
	id        string
	start     time.Time
	principal *policy.Principal
	ep        endpoint
	ctype     string // the body's content type (a form's boundary)
	noHedge   bool   // the client asked for no hedge (x-tailgate-hedge: off)
	group     string // the fan-out it belongs to (x-tailgate-group), "" for none
	session   uint64 // hash of the session its x-session-affinity header names, 0 for none
	source    string // the client's source label for the latency budgets; "" for batch lines
	priority  policy.Class
	noQueue   bool          // never waits in the admission queue (it generates nothing)
	slot      *policy.Slot  // its place in the model's capacity, once admitted
	queueWait time.Duration // how long it waited for that; -1 until it reached the queue
	req       *parsedRequest
	mm        *modelMetrics
	// The key's concurrency slot and request, taken before the body was
	// read (nil for a batch line): admission completes it.
	entry *policy.Entry
	// budgeted: the body was read under the body budget (the public API),
	// and bodyHeld bytes of it are the call's, copyAhead of them for the
	// copy of the body forwarded (bodybudget.go).
	budgeted            bool
	bodyHeld, copyAhead int64

	// What happened: set while routing and relaying.
	stages        data.Stages
	usage         policy.Usage
	gotUsage      bool  // upstream reported usage
	relayedTokens int64 // content events relayed (for partial billing)
	overhead      int64 // tokens burned by losing hedges
	firstToken    bool  // output reached the client
	routed        bool  // the router was asked for a replica
	replica       string
	attempts      int
	hedged        bool
	winner        string // first, retry or hedge
	tries         tryLog // every attempt, for the ledger
	// prepaid: a batch line whose earlier run was billed for an answer
	// that was then lost; what this run uses is overhead, not billed.
	prepaid       bool
	prepaidTokens int64 // what a prepaid call used, set when it is settled
	// batchLine: a batch line, cancelled only by its executor's stop, which
	// runs the line again; such a cancel is the gateway's, never billed.
	batchLine bool
	// replayOf: the request a keyed request runs again, its gateway having
	// died running it (idempotency.go).
	replayOf string

	// How it ended: set once, by conclude (or reject).
	recorded bool // the ledger row is written (or committed)
	outcome  data.Outcome
	class    data.ErrorClass
	status   int

	// Its spans (trace.go); nil when tracing is off.
	trace *callTrace
	// hold is its stream's wait for capacity (see holdOptions).
	hold router.HoldOptions
}

func (s *Server) newCall(ep endpoint, p *policy.Principal) *call {
	cl := new(call)
	s.initCall(cl, ep, p)
	return cl
}

// initCall makes cl a new call of ep by p.
func (s *Server) initCall(cl *call, ep endpoint, p *policy.Principal) {
	*cl = call{id: s.newRequestID(), start: time.Now(), ep: ep, principal: p, stages: data.UnknownStages(), status: http.StatusOK, queueWait: -1}
	if p != nil {
		cl.priority = p.Class
	}
}

// sink is where the pipeline delivers an answer: the HTTP response of the
// public API, or a batch line. Exactly one of json, stream or error delivers
// the answer (a stream may still end with its writer's fail).
type sink interface {
	// rateLimits reports the key's rate-limit state once admission decided.
	rateLimits(policy.RateState)
	// stream returns the writer of a streamed answer; nil means this sink
	// cannot stream and the request is refused.
	stream(cl *call) *sseWriter
	// json delivers a whole answer.
	json(cl *call, body []byte)
	// error answers with ae; nothing was delivered before.
	error(cl *call, ae *apierr.Error)
}

// serve runs one generation request of an authenticated principal, whose
// body has been read: parse, admit, route (with retries and hedging), relay,
// settle, record. ctx is the client's: when it ends, everything started
// upstream is cancelled. The ledger row is written whatever happens.
func (s *Server) serve(ctx context.Context, cl *call, body []byte, out sink) {
	// Fail closed: no answer starts that the ledger could not record.
	if err := s.ledger.Healthy(); err != nil {
		s.reject(cl, out, err)
		return
	}
	pr, err := parseRequest(cl.ep, body, cl.ctype, s.lim)
	if err != nil {
		s.reject(cl, out, err)
		return
	}
	if err := s.saltRequest(cl, pr); err != nil {
		s.reject(cl, out, err)
		return
	}
	if err := s.reserveCopy(ctx, cl, body, pr); err != nil {
		s.reject(cl, out, bodyError(err))
		return
	}
	// An answer that generates nothing never waits in the admission queue;
	// one relayed whole has no first token to hedge on.
	cl.noQueue = !cl.ep.generates
	if !pr.stream && !pr.wholeHedge {
		cl.noHedge = true
	}
	adm := cl.trace.admission(cl, pr)
	ticket := s.admit(ctx, cl, pr, out)
	adm.admitted(cl, ticket != nil)
	if ticket == nil {
		return
	}
	// Settle is once only: this releases the reservation and the concurrency
	// slot if anything below panics before the real usage is settled.
	defer ticket.Release()
	defer cl.slot.Release()

	var w *sseWriter
	if pr.stream {
		if w = out.stream(cl); w == nil {
			s.reject(cl, out, apierr.BadRequest("stream", "stream: true is not allowed here"))
			return
		}
		defer w.close()
	}
	// Stream: every answer the engine streams, JSON assembled here included,
	// is hedged on its time to first token.
	rreq := router.Request{Hint: router.Hint{Model: pr.model, Prefix: cl.prefixKey(pr), Session: cl.sessionKey(pr)}, Stream: pr.upstreamStream(), NoHedge: cl.noHedge, Group: cl.group, Class: routerClass(cl.priority),
		Hold: s.holdOptions(cl, w)}
	cl.stages.Gateway = time.Since(cl.start)
	cl.routed = true
	c := s.reg.NewCall(rreq, func(ctx context.Context, rep *router.Replica, n int, reason router.AttemptReason) (router.Attempt, error) {
		return s.open(ctx, cl, rep, n, reason)
	})
	// The call waits for capacity that is coming (see hold.go), before it
	// routes and once more if every replica declined its first pass.
	err = c.Start(ctx)
	cl.attempts, cl.hedged = c.Attempts, c.Hedged
	if c.Held > 0 {
		cl.stages.Hold = c.Held
	}
	if he, ok := errors.AsType[*router.HoldError](err); ok {
		if c.Attempts == 0 { // it never routed
			cl.routed, cl.stages.Gateway = false, -1
		}
		c.Finish()
		s.refuseHeld(ctx, cl, out, w, ticket, he.Err)
		return
	}
	if c.Replica != nil {
		cl.replica = c.Replica.ID
	}
	if err == nil {
		cl.replica, cl.winner = c.Replica.ID, c.Reason.String()
	}
	if w != nil {
		w.routed()
	}
	defer c.Finish() // the winner's in-flight slot, even if the relay panics
	if err == nil {
		u := c.Attempt.(*upstream)
		cl.tries.win(u)
		// Done with the winner, whichever it is by then: close the
		// connection's body, free buffers. The router aborts the others.
		defer func() { u.Abort() }()
		// An answer's ledger row is committed before its final bytes leave:
		// a gateway killed after that has the row, one killed before has an
		// open row (streams) or served nothing whole. A row the ledger cannot
		// commit stops the final bytes (an *unbilledError).
		done := func() error {
			cl.adopt(u)
			over := cl.overhead
			s.hedgeOverhead(cl, c)
			cl.outcome = data.OutcomeOK
			if err := s.settle(cl, ticket, true); err != nil {
				cl.overhead = over // counted again on the way out
				return err
			}
			return nil
		}
		switch {
		case pr.stream:
			err = s.relayStream(ctx, w, cl, u, ticket, done)
			cl.adopt(u) // usage and timings learned while relaying
			// Never hedged on pace (the client has its bytes), but its
			// pace is the model's; a replica that went quiet is ejected.
			c.Progress(u.tokens-1, u.lastAt)
			c.End(routerEnd(err))
		case pr.assemble:
			// Nothing reaches the client before the whole answer: the
			// router races a pace hedge against an answer that falls behind
			// its model's decode pace, and starts one that breaks once more
			// elsewhere (within the retry budget; what it generated is
			// overhead, not billed). Any other failure is a plain HTTP
			// error, nothing billed.
			err = c.Whole(ctx, func(ctx context.Context, att router.Attempt, progress func(int64, time.Time)) error {
				return s.assembleAttempt(ctx, cl, att.(*upstream), progress)
			})
			cl.attempts, cl.hedged = c.Attempts, c.Hedged
			s.markBroken(cl, c)
			if won, ok := c.Attempt.(*upstream); ok && won != u {
				u = won
				cl.tries.win(u)
				cl.replica, cl.winner = c.Replica.ID, c.Reason.String()
			}
			if err == nil {
				err = s.deliverJSON(cl, out, u.body, done)
			}
		default:
			err = s.deliverJSON(cl, out, u.body, done)
		}
	}
	if cl.recorded {
		return // committed before the final bytes; what happened after is the client's
	}
	s.hedgeOverhead(cl, c)
	if werr := w.writeFailure(); werr != nil && errors.Is(err, context.Canceled) {
		// A write to the client failed first (it stopped reading: the write
		// deadline); the server cancels the request as it drops the
		// connection, and the relay may see that before its own write
		// error. The client's failure is what happened.
		err = werr
	}
	if ae := s.conclude(ctx, cl, err); ae != nil {
		if w != nil {
			w.fail(ae)
		} else {
			out.error(cl, ae)
		}
	}
	s.settle(cl, ticket, false)
}

// deliverJSON sends a whole JSON answer once done has committed its ledger
// row: the client-visible time to first token is the whole answer's. An
// answer whose row could not be committed is withheld: done's error is
// returned and nothing is sent.
func (s *Server) deliverJSON(cl *call, out sink, body []byte, done func() error) error {
	// Billed as delivered: the row committed first is the answer's.
	cl.firstToken = true
	cl.stages.TTFT = time.Since(cl.start)
	cl.stages.Total = cl.stages.TTFT
	if err := done(); err != nil {
		cl.firstToken, cl.stages.TTFT, cl.stages.Total = false, -1, -1
		return err
	}
	out.json(cl, body)
	return nil
}

// admit checks the parsed request against its key (the model allowed, known
// here), admits it (limits, budget reservation) and then waits, if the
// model's replicas are busy, for its class's turn in the admission queue —
// before any upstream attempt, holding no replica slot. nil means it was
// refused and answered. The caller must settle or release the ticket, and
// release cl.slot.
func (s *Server) admit(ctx context.Context, cl *call, pr *parsedRequest, out sink) *policy.Ticket {
	cl.req = pr
	switch {
	case !cl.principal.Allows(pr.model):
		s.refuseModel(cl, pr.model)
		s.reject(cl, out, errModelNotAllowed(pr.model))
		return nil
	case !s.reg.Known(pr.model) && !s.reg.Startable(pr.model):
		s.reject(cl, out, errUnknownModel(pr.model, s.usableModels(cl.principal)))
		return nil
	}
	cl.mm = s.m.model(pr.model)
	// The key's slot and request were taken before the body (a batch
	// line's, without an entry, are taken here).
	ticket, rs, err := s.gate.AdmitEntered(cl.principal, cl.entry, policy.Request{
		Model: pr.model, PromptEstimate: pr.promptEstimate, PromptBound: pr.promptBound, MaxTokens: pr.reservedCompletion(),
	})
	out.rateLimits(rs)
	if err != nil {
		s.reject(cl, out, err)
		return nil
	}
	if cl.noQueue {
		return ticket
	}
	slot, err := s.queue.Wait(ctx, pr.model, cl.priority, cl.principal.TenantID)
	if err != nil {
		// It took nothing: the reservation goes back before the answer.
		ticket.Release()
		var qe *policy.QueueError
		if errors.As(err, &qe) {
			cl.queueWait = qe.Wait
			s.reject(cl, out, queueError(qe))
			return nil
		}
		// The client went away while waiting; the ledger says so (499).
		cl.queueWait = time.Since(cl.start)
		cl.outcome, cl.class, cl.status = data.OutcomeClientCancelled, data.ClassClientCancelled, statusClientClosed
		cl.stages.Total = time.Since(cl.start)
		s.record(cl, 0)
		return nil
	}
	cl.slot, cl.queueWait = slot, slot.Waited
	s.m.queueWait[cl.priority].Observe(slot.Waited.Seconds())
	return ticket
}

// conclude decides, in one place, how a routed call ended: its outcome,
// failure class and status, and the error the client must still be told
// (nil when the answer was delivered, the client is gone, or the failure was
// already relayed in-band).
func (s *Server) conclude(ctx context.Context, cl *call, err error) *apierr.Error {
	var (
		mid  *midstreamError
		cerr *clientError
		ae   *apierr.Error
	)
	var unbilled *unbilledError
	switch {
	case err == nil:
		cl.outcome = data.OutcomeOK
	case errors.As(err, &unbilled):
		// The answer was whole but its ledger row could not be committed,
		// so its final bytes did not go out. A JSON answer is withheld:
		// nothing is billed, what it cost is overhead. A stream is cut
		// before [DONE] and billed at what it delivered (its open row says
		// so if the gateway dies before the ledger is back).
		ae, cl.class = errLedgerUnavailable, data.ClassLedgerUnavailable
		if cl.req.stream {
			cl.outcome = data.OutcomeMidstream
		} else {
			if !cl.prepaid { // a prepaid run's tokens are overhead already
				// What the commit that failed would have billed.
				cl.overhead += cl.usage.PromptTokens + cl.usage.CompletionTokens
			}
			cl.outcome, cl.status = data.OutcomeWithheld, ae.Status
		}
	case errors.As(err, &cerr) && isTimeout(cerr):
		// The client stopped reading for longer than the write timeout: cut.
		cl.outcome, cl.class, cl.status = data.OutcomeClientCancelled, data.ClassClientStalled, statusClientClosed
	case ctx.Err() != nil, errors.As(err, &cerr):
		// The client went away: nobody to answer; the ledger says 499.
		cl.outcome, cl.class, cl.status = data.OutcomeClientCancelled, data.ClassClientCancelled, statusClientClosed
	case errors.As(err, &mid) && !cl.req.stream:
		// An answer assembled into JSON broke before anything was sent:
		// the client gets the error's own status.
		cl.outcome, cl.class = data.OutcomeMidstream, mid.class
		switch mid.class {
		case data.ClassErrorEvent:
			ae = errUpstream
		case data.ClassIdleDeadline:
			ae = errIdle
		default:
			ae = errMidstream
		}
		cl.status = ae.Status
	case errors.As(err, &mid):
		// The status line went out as 200 with the first token.
		cl.outcome, cl.class = data.OutcomeMidstream, mid.class
		switch mid.class {
		case data.ClassErrorEvent: // the replica's own error event was relayed
		case data.ClassIdleDeadline:
			ae = errIdle
		default:
			ae = errMidstream
		}
	default:
		ae = toAPIError(err, cl.req.model)
		cl.outcome, cl.class, cl.status = data.OutcomeUpstreamError, data.ErrorClass(ae.Code), ae.Status
		var rel *relayError
		if errors.As(err, &rel) {
			cl.outcome, cl.class = data.OutcomeUpstreamRejected, data.ClassUpstreamRejected
		}
		if ae == errInternal {
			cl.class = data.ClassInternal
		}
	}
	if err != nil && cl.outcome != data.OutcomeClientCancelled && cl.outcome != data.OutcomeUpstreamRejected {
		s.log.Warn("request failed", "request_id", cl.id, "model", cl.req.model, "replica", cl.replica,
			"attempts", cl.attempts, "outcome", cl.outcome, "class", cl.class, "err", err)
	}
	return ae
}

// settle bills what was used — the engine's own count when it reported
// one, else what reached the client (prompt estimated), never the
// reservation — and records the call; with commit, it waits until the row
// is committed (the answer's final bytes go out after it). If the ledger
// cannot commit it, settle settles and records nothing and returns an
// *unbilledError: the caller stops the answer and settles again.
func (s *Server) settle(cl *call, ticket *policy.Ticket, commit bool) error {
	if cl.stages.Total < 0 {
		cl.stages.Total = time.Since(cl.start)
	}
	if cl.prepaid && cl.prepaidTokens == 0 {
		u := cl.used()
		cl.prepaidTokens = u.PromptTokens + u.CompletionTokens
	}
	cl.usage = cl.billable()
	if !commit || cl.principal == nil {
		s.record(cl, ticket.Settle(cl.usage))
		return nil
	}
	// The client's going away does not stop the row. A ledger that cannot
	// write gives it back; one that is only slow keeps it queued (the
	// writer's CommitWait).
	lc := cl.trace.commit()
	err := s.ledger.Commit(context.Background(), s.finalRow(cl, ticket.Cost(cl.usage)))
	lc.committed(err)
	if err != nil {
		if errors.Is(err, data.ErrLedgerUnavailable) {
			s.log.Warn("answer stopped before its final bytes: its ledger row could not be committed", "request_id", cl.id, "err", err)
			return &unbilledError{err: err}
		}
		s.log.Warn("answer delivered before its ledger row was committed; the row is queued", "request_id", cl.id, "err", err)
	}
	s.observe(cl, ticket.Settle(cl.usage))
	cl.recorded = true
	return nil
}

// unbilledError stops a whole answer before its final bytes: its ledger row
// could not be committed.
type unbilledError struct{ err error }

func (e *unbilledError) Error() string { return "ledger row not committed: " + e.err.Error() }
func (e *unbilledError) Unwrap() error { return e.err }

// billable is the usage to bill now: the engine's count when it reported
// one, else what reached the client with an estimated prompt.
func (cl *call) billable() policy.Usage {
	if cl.outcome == data.OutcomeWithheld || cl.prepaid {
		return policy.Usage{} // generated, never delivered; or paid for already
	}
	return cl.used()
}

// used is what the call used: the engine's count when it reported one,
// and never less output than the pieces relayed (an engine that reports
// usage only at the end — Responses, Messages — was cut before it did, or
// reported less than it sent); the prompt estimated where the engine said
// nothing of it (an audio answer's is its decoded duration). A client that
// left before the first token, once its request reached an engine, is
// billed the prompt that engine was given to prefill (a batch line the
// executor's stop cancelled is not: the line runs again).
func (cl *call) used() policy.Usage {
	u := policy.Usage{}
	if cl.gotUsage {
		u = cl.usage
	}
	switch {
	case cl.firstToken:
		u.CompletionTokens = max(u.CompletionTokens, cl.relayedTokens)
		if u.PromptTokens == 0 {
			u.PromptTokens = cl.req.promptEstimate
		}
	case !cl.gotUsage && cl.outcome == data.OutcomeClientCancelled && !cl.batchLine && cl.tries.reachedEngine():
		u.PromptTokens = cl.req.promptEstimate
	}
	return u
}

// openRow records a stream in progress: a durable row, replaced by the
// final one, that a gateway killed mid-stream settles at start-up as
// interrupted, billed at what it says.
func (s *Server) openRow(cl *call, u *upstream, ticket *policy.Ticket) {
	cl.adopt(u)
	usage := cl.billable()
	s.ledger.Open(s.row(cl, usage, ticket.Cost(usage)))
}

// reject answers a request that was refused before reaching any replica and
// records it (it has a tenant, so it has a ledger row).
func (s *Server) reject(cl *call, out sink, err error) {
	model := ""
	if cl.req != nil {
		model = cl.req.model
	}
	ae := toAPIError(err, model)
	cl.status, cl.outcome, cl.class = ae.Status, data.OutcomeRejected, data.ErrorClass(ae.Code)
	cl.stages.Total = time.Since(cl.start)
	s.record(cl, 0)
	out.error(cl, ae)
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

// hedgeOverhead counts what the call's losing attempts burned, as their
// engines count it: one that lost a race (a hedge, the original it beat)
// or broke before its answer was whole, its prompt and the tokens it was
// seen to produce (continuous usage) before it ended. One cancelled before
// its first token costs nothing counted: vLLM counts a prompt when its
// first token comes (vllm/v1/metrics/stats.py
// IterationStats.update_from_output) and output per step, so a loser still
// queued or in prefill adds to neither vllm:prompt_tokens_total nor
// vllm:generation_tokens_total. What remains unseen is a close race:
// tokens the engine made after the last chunk read — a first token in
// flight when the loser was cancelled, a prompt and a token or two. The
// tenant is not billed for any of it.
func (s *Server) hedgeOverhead(cl *call, c *router.Call) {
	for _, l := range c.Losers() {
		if l.Attempt != nil {
			cl.overhead += l.Attempt.(*upstream).burnt(cl)
		}
	}
}

// markBroken records in the call's attempt log the attempts the router
// blamed for breaking before their answer was whole.
func (s *Server) markBroken(cl *call, c *router.Call) {
	for _, l := range c.Losers() {
		if l.Attempt != nil && l.Err != nil {
			cl.tries.broke(l.Attempt, l.Err)
		}
	}
}

// burnt is what an attempt that is not billed cost its engine: the
// engine's own running count when it reported one, else the estimated
// prompt and the output pieces relayed.
func (u *upstream) burnt(cl *call) int64 {
	if u.gotUsage {
		return u.usage.PromptTokens + u.usage.CompletionTokens
	}
	return cl.req.promptEstimate + u.tokens
}

func (s *Server) maxTokensFor(model string) int64 {
	if v, ok := s.cfg.MaxTokensByModel[model]; ok && v > 0 {
		return v
	}
	return s.cfg.DefaultMaxTokens
}

// record writes the call's metrics and ledger row.
func (s *Server) record(cl *call, cost int64) {
	if row, ok := s.observe(cl, cost); ok {
		s.ledger.Add(row)
	}
	cl.recorded = true
}

// observe counts the call in the metrics and returns its ledger row; false
// means it gets none (no principal, or a refusal past the rejected-rows
// rate).
func (s *Server) observe(cl *call, cost int64) (data.LedgerRow, bool) {
	mm := cl.mm
	if mm == nil {
		mm = s.m.model("unknown")
	}
	mm.request(cl.status)
	cl.stages.Each(func(i int, _ string, d time.Duration) {
		if d >= 0 {
			s.m.stageObs[i].Observe(d.Seconds())
		}
	})
	if cl.stages.TTFT >= 0 {
		mm.observeTTFT(cl.req != nil && cl.req.stream, cl.stages.TTFT)
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
	s.m.observeGenAI(cl)
	s.observeSLO(cl)
	if cl.principal == nil {
		return data.LedgerRow{}, false
	}
	if cl.outcome == data.OutcomeRejected && !s.rejectedRows.Allow() {
		s.m.rowsSkipped.Inc()
		return data.LedgerRow{}, false
	}
	return s.finalRow(cl, cost), true
}

// finalRow is the call's final ledger row: as it stands, with every attempt.
func (s *Server) finalRow(cl *call, cost int64) data.LedgerRow {
	row := s.row(cl, cl.usage, cost)
	row.AttemptLog = cl.attemptLog()
	return row
}

// row is the call's ledger row as it stands.
func (s *Server) row(cl *call, usage policy.Usage, cost int64) data.LedgerRow {
	row := data.LedgerRow{
		ID: cl.id, Time: cl.start, TenantID: cl.principal.TenantID, KeyID: cl.principal.KeyID,
		Upstream: cl.replica, PromptTokens: usage.PromptTokens, CompletionTokens: usage.CompletionTokens,
		CostMicros: cost, Status: cl.status, Outcome: cl.outcome, Error: cl.class,
		Attempts: cl.attempts, Hedged: cl.hedged, HedgeOverheadTokens: cl.overhead, Stages: cl.stages,
		Priority: cl.priority.String(), QueueWait: cl.queueWait, Endpoint: cl.ep.path,
	}
	if cl.req != nil {
		row.Model, row.Stream = boundString(cl.req.model), cl.req.stream
	}
	row.HedgeOverheadTokens += cl.prepaidTokens
	row.ReplayOf = cl.replayOf
	return row
}

// maxStoredString bounds a client-chosen string (a model name) in a ledger
// row: the body may be megabytes, the row stays small.
const maxStoredString = 256

func boundString(v string) string {
	if len(v) <= maxStoredString {
		return v
	}
	return strings.ToValidUTF8(v[:maxStoredString], "") + "…"
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout() || errors.Is(err, os.ErrDeadlineExceeded)
}
