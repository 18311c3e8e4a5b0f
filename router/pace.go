package router

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"time"
)

// Hedging on decode pace, and the rest of an answer's life. A first-token
// hedge cannot catch an attempt whose first output comes in time and whose
// later outputs crawl (a replica that slows down, a stall that stretches
// every step). When nothing of the answer has reached the client yet — a
// JSON answer the gateway assembles from the engine's stream, a Batch API
// line — a second attempt may still start after the first attempt's first
// output, and whichever answer is whole first is delivered ([Call.Whole]).
// A pace hedge keeps the same books as a first-token hedge: attempt
// numbers, the replicas tried, in-flight slots, the losers, the metrics.

// brokeError marks an answer that broke after its first output.
type brokeError struct {
	err  error
	idle bool
}

func (e *brokeError) Error() string { return e.err.Error() }
func (e *brokeError) Unwrap() error { return e.err }

// ErrBroke wraps err to say an attempt's answer broke after its first
// output: its connection broke or the answer stopped before its end, or,
// with idle, no output came within the inter-token idle deadline. An idle
// replica is ejected ("idle_deadline"). An answer nothing of which reached
// the client is retried once on another replica within the retry budget
// (see [Call.Whole]), its replica ejected ("midstream") if the connection
// broke.
func ErrBroke(err error, idle bool) error { return &brokeError{err: err, idle: idle} }

// IsBroke reports whether err says an answer broke after its first output.
func IsBroke(err error) bool {
	var b *brokeError
	return errors.As(err, &b)
}

func brokeIdle(err error) bool {
	var b *brokeError
	return errors.As(err, &b) && b.idle
}

// Pace returns the decode pace the call's winner is held to (see
// [HedgeConfig.PaceLead]; a part of a group is held to a lower percentile,
// see partPercentile); false while the model's pace is not learnt.
func (c *Call) Pace() (Pace, bool) {
	if c.won == nil {
		return Pace{}, false
	}
	hm := c.hedgeModel()
	return c.reg.hedges.paceIn(hm, hm.budget.size(c.req.Group))
}

// observePace teaches the model's decode pace an attempt whose first
// output came at first and that had produced k more by last: when it was
// whole, or when a pace hedge beat it (then k by the time it was beaten is
// a lower bound of its pace, which keeps the percentile from drifting down
// to the hedges' paces). Nothing is learnt for k < 1.
func (c *Call) observePace(first, last time.Time, k int64) {
	if k < 1 {
		return
	}
	c.reg.hedges.observePaceIn(c.hedgeModel(), last.Sub(first)/time.Duration(k))
}

// hedgeModel returns the call's model's hedging: its pass's.
func (c *Call) hedgeModel() *hedgeModel {
	if c.p.hm != nil {
		return c.p.hm
	}
	return c.reg.hedges.model(c.req.Model)
}

// Progress reports that the winner, whose answer is being relayed, has
// produced k outputs after its first, the latest at at.
func (c *Call) Progress(k int64, at time.Time) {
	if c.won != nil {
		c.won.progress(k, at)
	}
}

// End reports how the winner's relayed answer ended: nil when it was whole
// (its decode pace is learnt), an [ErrBroke] error when it broke (an idle
// replica is ejected). Nothing is retried: the client has had its output.
func (c *Call) End(err error) {
	a := c.won
	if a == nil {
		return
	}
	c.ended(a, err)
	if err == nil {
		c.observePace(a.first, time.Unix(0, a.last.Load()), a.k.Load())
	}
}

// ended takes an answer's end out on its replica: one that went quiet
// is ejected.
func (c *Call) ended(a *attempt, err error) {
	if brokeIdle(err) {
		c.reg.Eject(a.rep, "idle_deadline")
	}
}

// blameBroken records that a, blamed for it, broke before its answer was
// whole: a connection that broke mid-answer is most likely a replica that
// died, out of routing until a probe says not.
func (c *Call) blameBroken(a *attempt) {
	a.broke = a.end
	if IsBroke(a.end) && !brokeIdle(a.end) {
		c.reg.Eject(a.rep, "midstream")
	}
}

// Whole reads the winner's answer to its end with read, for an answer the
// client sees only whole, and returns nil once an attempt's answer is
// whole: the call's winner is then that attempt. Meanwhile:
//   - when the winner falls behind its model's decode pace, a pace hedge
//     starts on another replica (if the hedge rules allow one) and the first
//     whole answer wins; the other attempt is cancelled and lost;
//   - when the answer breaks (an [ErrBroke] error) and the client is still
//     there, it starts once more on another replica, within the retry
//     budget: a new pass as [Call.Start] runs it, then that answer read
//     whole (not hedged on pace, not retried again); what the broken one
//     generated is among the losers.
//
// On failure it returns the original's failure (or, when no other replica
// could take the retry, what broke).
func (c *Call) Whole(ctx context.Context, read AssembleFunc) error {
	err := c.race(ctx, read, c.won)
	if err == nil || ctx.Err() != nil || !IsBroke(err) || !c.reg.budget.TakeRetry() {
		return err
	}
	a := c.won
	c.blameBroken(a)
	a.att.Abort()
	c.lose(a.lost())
	c.Finish()
	c.won, c.Attempt = nil, nil
	// Kept off the replica it broke on, whatever its state by then.
	c.tried = append(slices.Clip(c.req.Exclude), a.rep)
	before := c.Attempts
	if err2 := c.Start(ctx); err2 != nil {
		if c.Attempts == before {
			return err // no other replica to try: the client hears what broke
		}
		return err2
	}
	c.Reason = ReasonRetry
	w := c.won
	w.end = read(ctx, w.att, w.progress)
	c.ended(w, w.end)
	return w.end
}

// race reads a's answer on the caller's goroutine, watching its pace. Most
// answers keep their pace, and then nothing else ever ran. Should a fall
// behind, the watch's timer goroutine takes over the race — it starts the
// pace hedge and decides — while the caller's goroutine finishes (or is
// cancelled out of) a's read and waits for the decision.
func (c *Call) race(ctx context.Context, read AssembleFunc, a *attempt) error {
	results := make(chan *attempt, 2)
	var state atomic.Int32
	taken := make(chan decided, 1)
	var w *paceWatch
	if p, ok := c.Pace(); ok && !a.first.IsZero() {
		w = &paceWatch{reg: c.reg, a: a, pace: p}
		w.behind = func() {
			if !state.CompareAndSwap(running, takenOver) {
				return
			}
			defer func() {
				if p := recover(); p != nil {
					taken <- decided{panicky: p}
				}
			}()
			taken <- decided{err: c.paceRace(ctx, read, a, results)}
		}
		w.arm()
	}
	a.end = read(ctx, a.att, a.progress)
	c.ended(a, a.end)
	if !state.CompareAndSwap(running, ended) {
		results <- a
		d := <-taken
		if d.panicky != nil {
			panic(d.panicky)
		}
		return d.err
	}
	w.stop()
	if a.end == nil {
		c.observePace(a.first, time.Unix(0, a.last.Load()), a.k.Load())
	}
	return a.end
}

// paceRace races a pace hedge against u, which has fallen behind and is
// still being read on the caller's goroutine (its end comes on results),
// and returns when an answer is whole or none can be.
func (c *Call) paceRace(ctx context.Context, read AssembleFunc, u *attempt, results chan *attempt) error {
	h := c.paceHedge(ctx, read, results)
	running := 1 // reads not yet ended, the hedge's included
	if h != nil {
		running++
		c.reg.log.Debug("pace hedge: the answer fell behind its model's decode pace", "model", c.req.Model,
			"replica", u.rep.ID, "hedge_replica", h.rep.ID, "since_first_output", c.reg.cfg.Now().Sub(u.first))
	}
	var broken *attempt // the original, broken, while the hedge runs on
	for {
		r := <-results
		running--
		switch {
		case r == u && r.end == nil:
			c.observePace(u.first, time.Unix(0, u.last.Load()), u.k.Load())
			if h != nil {
				c.decidePace(h, false, results, running > 0)
			}
			return nil
		case r == h && r.err == nil && r.end == nil: // the hedge's answer is whole first
			if broken == nil {
				u.stop()
				<-results
				// Censored: the original's pace so far, at least the
				// threshold it fell behind.
				c.observePace(u.first, c.reg.cfg.Now(), max(u.k.Load(), 1))
			} else {
				c.blameBroken(u)
			}
			c.decidePace(h, true, results, false)
			return nil
		case h == nil:
			return r.end
		case r == h && r.err != nil: // the hedge produced no first output
			c.decidePace(h, false, results, false)
			h = nil
			if broken != nil {
				return broken.end
			}
		case r == u && running > 0:
			broken = r // the hedge may still make the answer
		default: // both failed: the client hears the original's failure
			if r == u {
				broken = r
			} else {
				if ctx.Err() == nil { // not the client going away
					c.blameBroken(h)
				}
				if running > 0 {
					continue // the original carries on alone
				}
			}
			c.decidePace(h, false, results, false)
			return broken.end
		}
	}
}

// paceHedge opens one more attempt of the call, whose winner has fallen
// behind its model's decode pace, on another replica, and reads its answer
// with read on its own goroutine: its end comes on results. nil when no
// hedge may start. A pace hedge obeys what a first-token hedge does:
// hedging on for the model, the request not opted out, the attempt limit,
// the model's hedge budget and burst (the request's group's pot while the
// group is in flight), the saturation and priority guards; a refused one is
// counted in tailgate_hedges_skipped_total with its reason.
func (c *Call) paceHedge(ctx context.Context, read AssembleFunc, results chan<- *attempt) *attempt {
	r, req := c.reg, c.req
	hm := c.hedgeModel()
	hs := hm.s
	if c.p.started >= r.cfg.MaxAttempts {
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
		rep, why = r.hedgeTarget(req, c.tried)
		if why == "" {
			_, why = hm.budget.take(req.Group, hs.burst)
		}
	}
	if why != "" {
		r.m.skipped(req.Model, why)
		r.m.paceHedge(req.Model, "skipped")
		return nil
	}
	c.tried = append(c.tried, rep)
	c.Attempts++
	c.p.started++
	c.Hedged = true
	h := c.newAttempt(rep, ReasonHedge)
	h.withContext(ctx)
	r.m.attempt(req.Model, ReasonHedge)
	go func() {
		h.run(c.open, r.cfg.Now)
		switch now := r.cfg.Now(); {
		case h.err == nil:
			rep.markOK(now)
			rep.ObserveTTFT(now.Sub(h.started))
			h.end = read(ctx, h.att, h.progress)
			c.ended(h, h.end)
		case ctx.Err() == nil && !h.stopped.Load(): // not cancelled by the race's end
			r.blame(rep, h.err)
		}
		results <- h
	}()
	return h
}

// decidePace ends the race between the call's winner and its pace hedge h.
// With hedgeWon, h becomes the winner (Finish then gives back its slot)
// and the attempt it beat, whose read has ended, is aborted and lost;
// else h is cancelled — its end awaited on results when wait — aborted and
// lost.
func (c *Call) decidePace(h *attempt, hedgeWon bool, results <-chan *attempt, wait bool) {
	model := c.req.Model
	if !hedgeWon {
		h.stop()
		if wait {
			<-results
		}
		if h.att != nil {
			h.att.Abort()
		}
		h.release()
		c.lose(h.lost())
		c.reg.m.hedged(model, false)
		c.reg.m.paceHedge(model, "lost")
		return
	}
	beaten := c.won
	beaten.att.Abort()
	beaten.release() // the beaten attempt's slot; the request stays in its group
	beaten.stop()
	c.Replica, c.Attempt, c.N, c.Reason = h.rep, h.att, h.n, ReasonHedge
	c.won = h
	c.reg.homeSession(c.req.Session, h.rep)
	c.lose(beaten.lost())
	c.reg.m.hedged(model, true)
	c.reg.m.paceHedge(model, "won")
}

// paceWatch calls behind, once, on a timer's goroutine when the attempt it
// watches has fallen behind its model's decode pace. Its timer is due when
// the attempt would be behind with the outputs it had when it was armed;
// when it fires, it looks again with those the attempt has by then and
// re-arms for the rest. The attempt's reader only stores its count: no
// timer is touched per output, and a watch on pace wakes about once per
// lead (PaceLead outputs, or Min).
type paceWatch struct {
	reg     *Registry
	a       *attempt
	pace    Pace
	behind  func()
	stopped atomic.Bool
	t       *time.Timer   // a real timer
	stopC   chan struct{} // with Config.After, closed by stop
}

// due returns how long until the attempt is behind with the outputs it has.
func (w *paceWatch) due() time.Duration {
	return w.a.first.Add(w.pace.Due(w.a.k.Load())).Sub(w.reg.cfg.Now())
}

func (w *paceWatch) arm() {
	if w.reg.cfg.After != nil {
		w.stopC = make(chan struct{})
		w.wait(w.due())
		return
	}
	// Set before it can fire: check reads it.
	w.t = time.AfterFunc(time.Hour, w.check)
	w.t.Reset(w.due())
}

// wait runs check once d has passed on Config.After's clock.
func (w *paceWatch) wait(d time.Duration) {
	ch := w.reg.cfg.After(d)
	go func() {
		select {
		case <-ch:
			w.check()
		case <-w.stopC:
		}
	}()
}

func (w *paceWatch) check() {
	if w.stopped.Load() {
		return
	}
	if d := w.due(); d > 0 {
		if w.t != nil {
			w.t.Reset(d)
		} else {
			w.wait(d)
		}
		return
	}
	if w.stopped.CompareAndSwap(false, true) {
		w.behind()
	}
}

// stop ends the watch: a call is hedged on pace once at most.
func (w *paceWatch) stop() {
	if w == nil || w.stopped.Swap(true) {
		return
	}
	if w.t != nil {
		w.t.Stop()
	} else {
		close(w.stopC)
	}
}
