package router

import (
	"context"
	"fmt"
	"time"
)

// Hedging on decode pace. A first-token hedge cannot catch an attempt
// whose first token comes in time and whose later tokens crawl (a replica
// that slows down, a stall that stretches every step). When nothing of the
// answer has reached the client yet — a JSON answer the gateway assembles
// from the engine's stream, a Batch API line — a second attempt may still
// start after the first attempt's first token, and whichever answer is
// whole first is delivered. The caller runs that race (it reads the
// answers); the router decides whether a hedge may start and keeps the
// same books as for a first-token hedge: attempt numbers, the replicas
// tried, in-flight slots, the losers, the metrics.

// Hedge is an attempt opened by [Result.PaceHedge] beside the request's
// winner, on another replica.
type Hedge struct {
	rep     *Replica
	n       int
	cancel  context.CancelFunc
	release func()
	started time.Time

	opened chan struct{} // closed once open returned
	att    Attempt
	err    error
}

// Opened is closed once the hedge has produced its first token or failed.
func (h *Hedge) Opened() <-chan struct{} { return h.opened }

// Attempt returns the hedge's attempt, or why it produced no first token;
// call it after Opened is closed.
func (h *Hedge) Attempt() (Attempt, error) { return h.att, h.err }

// Replica is where the hedge runs.
func (h *Hedge) Replica() *Replica { return h.rep }

// Pace returns the decode pace the request's winning attempt is held to
// (see [HedgeConfig.PaceLead]; a part of a group is held to a lower
// percentile, see partPercentile); false while the model's pace is not learnt.
// It does not say whether a hedge may start: PaceHedge decides that, and
// counts why not.
func (res *Result) Pace() (Pace, bool) {
	if res.reg == nil || res.Attempt == nil {
		return Pace{}, false
	}
	h, req := res.reg.hedges, res.req
	return h.pace(req.Model, h.budget(req.Model).size(req.Group))
}

// ObservePace teaches the model's decode pace an attempt of this request
// whose first token came at first and that had produced k more output
// tokens by last: when it was whole (streamed or assembled), or when a pace
// hedge beat it (then k tokens by the time it was beaten is a lower bound
// of its pace, which keeps the percentile from drifting down to the
// hedges' paces). Nothing is learnt for k < 1.
func (res *Result) ObservePace(first, last time.Time, k int64) {
	if res.reg == nil || k < 1 {
		return
	}
	res.reg.hedges.observePace(res.req.Model, last.Sub(first)/time.Duration(k))
}

// PaceHedge opens one more attempt of a decided request whose winning
// attempt has fallen behind its model's decode pace, on another replica,
// and returns it while it runs; nil when no hedge may start. A pace hedge
// obeys what a first-token hedge does: hedging on for the model, the
// request not opted out, the attempt limit, the model's hedge budget and
// burst (the request's group's pot while the group is in flight), the
// saturation and priority guards; a refused one is counted in
// tailgate_hedges_skipped_total with its reason.
//
// The hedge is meant for answers of which nothing reached the client: the
// caller reads both and, once one is whole, calls [Result.Decide].
func (res *Result) PaceHedge(ctx context.Context) *Hedge {
	if res.reg == nil || res.Attempt == nil {
		return nil
	}
	r, req := res.reg, res.req
	hs := r.hedges.settings(req.Model)
	if res.Attempts >= r.cfg.MaxAttempts {
		return nil
	}
	var (
		rep *Replica
		why string
	)
	switch {
	case req.NoHedge:
		why = skipOptOut
	case !hs.enabled:
		why = skipDisabled
	default:
		rep, why = r.hedgeTarget(req, res.tried)
		if why == "" {
			_, why = r.hedges.budget(req.Model).take(req.Group, hs.burst)
		}
	}
	if why != "" {
		r.m.skipped(req.Model, why)
		r.m.paceHedge(req.Model, "skipped")
		return nil
	}
	res.tried = append(res.tried, rep)
	res.Attempts++
	res.Hedged = true
	actx, cancel := context.WithCancel(ctx)
	h := &Hedge{rep: rep, n: res.Attempts, cancel: cancel, release: rep.acquire(req.Class), started: r.cfg.Now(), opened: make(chan struct{})}
	r.m.attempt(req.Model, ReasonHedge)
	open := res.open
	go func() {
		defer close(h.opened)
		func() {
			defer func() {
				if p := recover(); p != nil {
					h.err = fmt.Errorf("attempt panicked: %v", p)
				}
			}()
			h.att, h.err = open(actx, rep, h.n, ReasonHedge)
		}()
		switch now := r.cfg.Now(); {
		case h.err == nil:
			rep.markOK(now)
			rep.ObserveTTFT(now.Sub(h.started))
		case actx.Err() == nil: // not cancelled by the race's end
			r.blame(rep, h.err)
		}
	}()
	return h
}

// Decide ends the race between the request's winner and its pace hedge h.
// With hedgeWon, h's attempt becomes the winner (Replica, Attempt, N,
// Reason; Finish then gives back its slot) and the attempt it beat is
// cancelled and joins the losers; else h is cancelled (waiting for it to
// give up its first token if it is still opening) and joins the losers.
// The caller must have stopped reading the attempt that lost: it is
// aborted here.
func (res *Result) Decide(h *Hedge, hedgeWon bool) {
	model := res.req.Model
	if !hedgeWon {
		h.cancel()
		<-h.opened
		if h.att != nil {
			h.att.Abort()
		}
		h.release()
		res.lose(Lost{Replica: h.rep, N: h.n, Reason: ReasonHedge, Attempt: h.att, Err: h.err})
		res.reg.m.hedged(model, false)
		res.reg.m.paceHedge(model, "lost")
		return
	}
	beaten := Lost{Replica: res.Replica, N: res.N, Reason: res.Reason, Attempt: res.Attempt}
	res.Attempt.Abort()
	if res.finish != nil { // the beaten attempt's slot; the request stays in its group
		res.finish()
	}
	res.Replica, res.Attempt, res.N, res.Reason = h.rep, h.att, h.n, ReasonHedge
	res.finish = func() { h.release(); h.cancel() }
	res.lose(beaten)
	res.reg.m.hedged(model, true)
	res.reg.m.paceHedge(model, "won")
}

func (res *Result) lose(l Lost) {
	res.mu.Lock()
	res.lost = append(res.lost, l)
	res.mu.Unlock()
}
