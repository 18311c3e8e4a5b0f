package router

import (
	"context"
	"errors"
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// Call is one request's attempts, from the first to the end of the answer
// (see the package doc's diagram). [Registry.NewCall] makes it; [Call.Start]
// runs attempts until one has its first output; [Call.Whole] reads an answer
// the client sees only whole, racing a pace hedge and retrying a broken one;
// [Call.Progress] and [Call.End] are how the reader of a relayed answer
// reports it; [Call.Finish] gives back what the winner holds.
//
// The exported fields say how the request is served; read them once Start
// (or Whole) returned.
type Call struct {
	Replica  *Replica      // the winning replica (or the last one tried, on failure)
	Attempt  Attempt       // the winning attempt, nil on failure
	N        int           // the winning attempt's number in its pass
	Reason   AttemptReason // why the winner was made; ReasonRetry for the retry of a broken answer
	Attempts int           // attempts started
	Hedged   bool          // a hedge was started
	Held     time.Duration // how long Start waited for capacity (Request.Hold); 0 if it did not

	reg   *Registry
	req   Request
	open  OpenFunc
	tried []*Replica // replicas this pass may not go to (Exclude, and those tried)
	won   *attempt   // the winner, once there is one
	leave func()     // takes the request out of its group (see hedgeBudget.join)

	losers sync.WaitGroup // drains of losing attempts still running
	mu     sync.Mutex
	lost   []Lost

	p pass

	// The first attempts and replicas tried live here: one allocation for
	// the call instead of one per attempt and one for tried (pprof of
	// BenchmarkGatewayOverhead, router.(*Call).launch).
	attempts [2]attempt
	triedBuf [2]*Replica
	// firstRace is what the first hedged pass shares (see startPass), raced
	// once it is taken: a later pass makes its own, so a timer of the first
	// that fires late never reaches it.
	firstRace hedgeRace
	raced     bool
}

// pass is the state of one run of [Call.Start]: the attempts it started
// and the hedge timer. A call has one pass, two when a broken answer is
// retried.
type pass struct {
	outcomes chan *attempt // ended attempts, one slot each
	all      []*attempt
	buf      [2]*attempt
	started  int // attempts this pass started (numbered from 1)
	live     int // attempts running
	hedged   bool
	hm       *hedgeModel // the model's hedging, looked up once a pass
	hs       hedgeSettings
	hb       *hedgeBudget
	armed    bool          // a hedge may start
	delay    time.Duration // its delay
	first    time.Time     // the first attempt's start
	// inline runs attempts on the caller's goroutine (no hedge can start);
	// deferred, when set, takes the next attempt instead of running it:
	// the first attempt of a hedged request.
	inline   bool
	deferred **attempt
	timer    *time.Timer // the re-armed hedge delay, or a grace
	// held is a late original whose first output came while its hedge had
	// none yet, held back for the grace (see hedger.grace); graceC ends it.
	held   *attempt
	graceC <-chan time.Time
}

// NewCall returns the call of one request; nothing starts before Start.
func (r *Registry) NewCall(req Request, open OpenFunc) *Call {
	c := &Call{reg: r, req: req, open: open}
	// A copy: appending to tried never writes into the caller's array.
	c.tried = append(c.triedBuf[:0], req.Exclude...)
	return c
}

// Do makes the call of req and starts it: the call and Start's error.
func (r *Registry) Do(ctx context.Context, req Request, open OpenFunc) (*Call, error) {
	c := r.NewCall(req, open)
	return c, c.Start(ctx)
}

// Start serves the request up to its first output: it opens an attempt on
// a replica chosen by the selection policy; retries at once elsewhere when
// the attempt never reached its replica or was declined; retries within
// the budget when it reached the replica but produced no output; and, when
// hedging is on for the model and no output came within the hedge delay,
// opens a second attempt on another replica — the first to produce output
// wins and the other is cancelled. With Request.Hold it first waits for
// capacity that is coming, and waits once more and starts a second pass
// when every replica declined the first (the last began draining or going
// to sleep as the request reached it).
func (c *Call) Start(ctx context.Context) error {
	if err := c.hold(ctx); err != nil {
		return err
	}
	err := c.startPass(ctx)
	if c.req.Hold == nil || !(errors.Is(err, ErrNoReplica) || IsDeclined(err)) || ctx.Err() != nil || !c.reg.Holdable(c.req.Model) {
		return err
	}
	if err := c.hold(ctx); err != nil {
		return err
	}
	c.tried = append(c.triedBuf[:0], c.req.Exclude...)
	return c.startPass(ctx)
}

// hold waits, with Request.Hold, until a replica of the model is ready when
// none is but one is coming; nil: route now.
func (c *Call) hold(ctx context.Context) error {
	r, h := c.reg, c.req.Hold
	if h == nil || r.ReadyFor(c.req.Model) || !r.Holdable(c.req.Model) {
		return nil
	}
	start := r.cfg.Now()
	err := r.Hold(ctx, c.req.Model, c.req.Class, *h)
	c.Held += r.cfg.Now().Sub(start)
	if err == nil && h.Then != nil {
		err = h.Then()
	}
	if err != nil {
		return &HoldError{Err: err}
	}
	return nil
}

// startPass is one pass of attempts up to a first output (see Start).
func (c *Call) startPass(ctx context.Context) error {
	r, req := c.reg, c.req
	r.budget.Deposit()
	hm := r.hedges.model(req.Model)
	c.p = pass{hm: hm, hs: hm.s, hb: hm.budget}
	p := &c.p
	p.all = p.buf[:0]
	// A request stays in its group until its answer is relayed (Finish),
	// so the group's pot and size hold for pace hedges too.
	c.leave = p.hb.join(req.Group, p.hs.budget, p.hs.burst)
	defer func() {
		if c.won == nil {
			c.leave()
			c.leave = nil
		}
		r.m.routed(p.started)
		if p.timer != nil {
			p.timer.Stop()
		}
	}()
	p.outcomes = make(chan *attempt, r.cfg.MaxAttempts)

	// A part of a group is armed for the earliest any part may be due: its
	// group's size is not known yet (parts sent at once reach the router
	// one by one). When the delay passes, the part waits on if its group
	// turned out smaller (see partPercentile).
	size := 1
	if req.Group != "" {
		size = math.MaxInt
	}
	delay, learnt := r.hedges.delayIn(hm, req.Stream, size)
	p.delay, p.armed = delay, learnt && p.hs.enabled && !req.NoHedge
	if !p.armed {
		p.inline = true
		if err := c.pick(ctx, ReasonFirst); err != nil {
			return err
		}
		return c.decide(ctx, nil)
	}
	// A hedged request's first attempt also runs on the caller's
	// goroutine: most first outputs come before the hedge delay, and then
	// nothing else ever ran. Should the delay pass first, the timer's
	// goroutine takes over deciding the request — it starts the hedge and
	// cancels the loser — while this one waits for its attempt to end.
	// One allocation for what the caller and the timer share (pprof of
	// BenchmarkGatewayOverhead: the first attempt's variable, the state and
	// two channels were 5.4 allocations a hedged request; the state lives
	// in the call for its first pass).
	h := &c.firstRace
	if c.raced {
		h = new(hedgeRace)
	}
	c.raced = true
	h.tick = make(chan struct{}, 1)
	p.deferred = &h.first
	if err := c.pick(ctx, ReasonFirst); err != nil {
		return err
	}
	fire := func() {
		if !h.state.CompareAndSwap(running, takenOver) {
			h.tick <- struct{}{}
			return
		}
		defer func() {
			if p := recover(); p != nil {
				h.d = decided{panicky: p}
				h.tick <- struct{}{}
			}
		}()
		fired := make(chan struct{}, 1)
		fired <- struct{}{}
		h.d = decided{err: c.decide(ctx, fired)}
		h.tick <- struct{}{}
	}
	stop := r.afterFunc(delay, fire)
	defer stop.stop()
	c.run(h.first)
	if !h.state.CompareAndSwap(running, ended) {
		<-h.tick // the timer decided: h.d is set
		if h.d.panicky != nil {
			panic(h.d.panicky)
		}
		return h.d.err
	}
	return c.decide(ctx, h.tick)
}

// hedgeRace is what a hedged request's caller and its hedge timer share
// (see startPass): who decides, the first attempt, and one channel — the
// delay for a caller that decides, the end for one that waits while the
// timer decides (only one of the two ever uses it).
type hedgeRace struct {
	state atomic.Int32
	first *attempt
	tick  chan struct{}
	d     decided // set by the timer before its send on tick, when it decided
}

// Who decides a request whose first attempt runs on the caller's
// goroutine (see Start), and who races a watched answer (see Whole).
const (
	running   = iota // the first attempt (the watched answer) runs on the caller's goroutine
	takenOver        // the delay passed first (it fell behind): the timer decides
	ended            // the attempt ended first: the caller decides
)

// decided is how a request decided on the timer's goroutine ended.
type decided struct {
	err     error
	panicky any // a panic while deciding, raised again on the caller's goroutine
}

// afterFunc calls f on its own goroutine once d has passed, unless the
// returned timer is stopped first: a real timer, or Config.After's in tests.
func (r *Registry) afterFunc(d time.Duration, f func()) afterTimer {
	if r.cfg.After == nil {
		return afterTimer{t: time.AfterFunc(d, f)}
	}
	ch, done := r.cfg.After(d), make(chan struct{})
	go func() {
		select {
		case <-ch:
			f()
		case <-done:
		}
	}()
	return afterTimer{done: done}
}

// afterTimer is afterFunc's timer: a value, not a stop closure.
type afterTimer struct {
	t    *time.Timer
	done chan struct{}
}

func (a afterTimer) stop() {
	if a.t != nil {
		a.t.Stop()
		return
	}
	close(a.done)
}

// after returns a channel that receives once d has passed, re-arming the
// pass's one timer.
func (c *Call) after(d time.Duration) <-chan time.Time {
	if c.reg.cfg.After != nil {
		return c.reg.cfg.After(d)
	}
	p := &c.p
	if p.timer == nil {
		p.timer = time.NewTimer(d)
	} else {
		p.timer.Reset(d)
	}
	return p.timer.C
}

// pick starts an attempt of reason on the replica the selection policy
// picks among those the pass has not tried.
func (c *Call) pick(ctx context.Context, reason AttemptReason) error {
	// An interactive request goes to the best-scored replica of all.
	rep, err := c.reg.pick(c.req.Hint, c.tried, ClassInteractive, c.req.Class == ClassInteractive)
	if err == ErrNoReplica {
		return c.reg.noReplica(c.req.Hint.Model, c.tried) // why, for the client
	}
	if err != nil {
		return err
	}
	c.launch(ctx, rep, reason)
	return nil
}

// launch starts an attempt of reason on rep: on the caller's goroutine,
// deferred to it (see pass.deferred), or on its own.
func (c *Call) launch(ctx context.Context, rep *Replica, reason AttemptReason) {
	r, p := c.reg, &c.p
	c.tried = append(c.tried, rep)
	c.Attempts++
	p.started++
	a := c.newAttempt(rep, reason)
	a.withContext(ctx)
	a.out = p.outcomes
	p.all = append(p.all, a)
	p.live++
	r.m.attempt(c.req.Model, reason)
	if a.n == 1 {
		p.first = a.started
	}
	switch {
	case p.deferred != nil:
		*p.deferred, p.deferred = a, nil
	case p.inline:
		c.run(a)
	default:
		go c.run(a)
	}
}

// newAttempt returns the call's next attempt, numbered in its pass, on rep
// with its in-flight slot taken.
func (c *Call) newAttempt(rep *Replica, reason AttemptReason) *attempt {
	var a *attempt
	if i := c.Attempts - 1; i < len(c.attempts) {
		a = &c.attempts[i]
	} else {
		a = new(attempt)
	}
	a.n, a.rep, a.reason, a.started = c.p.started, rep, reason, c.reg.cfg.Now()
	rep.acquire(c.req.Class, &a.slot)
	return a
}

// run opens a and hands it to the pass's decision.
func (c *Call) run(a *attempt) {
	a.run(c.open, c.reg.cfg.Now)
	// Never blocks: the channel holds one outcome per possible attempt of
	// the attempt's pass (a later pass has its own).
	a.out <- a
}

// decide waits for the attempts' outcomes — and, on hedgeC, for the hedge
// delay — until the request has its first output or has failed.
func (c *Call) decide(ctx context.Context, hedgeC <-chan struct{}) error {
	r, req, p := c.reg, c.req, &c.p
	var last error
	var rearmC <-chan time.Time // a group part's delay, re-armed (see hedgeDue)
	for {
		select {
		case o := <-p.outcomes:
			p.live--
			if o.err == nil {
				now := r.cfg.Now()
				o.rep.markOK(now)
				o.rep.ObserveTTFT(now.Sub(o.started))
				if p.held != nil {
					// The hedge's first output came within the grace: it
					// wins, and the late original is the loser.
					r.m.graced(req.Model, "hedge")
					c.unhold()
					return c.win(o)
				}
				// The delay learns the request's time to first output as
				// the first attempt saw it: when a hedge won, the time the
				// original had waited by then, a lower bound of its own
				// (censored, but still above the delay, so the percentile
				// holds instead of drifting down to the hedges' times).
				waited := now.Sub(p.first)
				r.hedges.observeIn(p.hm, req.Stream, waited)
				if !p.armed && (req.NoHedge || !p.hs.enabled) {
					// A hedge would have started, but for the request or
					// the model's setting.
					if d, ok := r.hedges.delayIn(p.hm, req.Stream, p.hb.size(req.Group)); ok && waited > d {
						if req.NoHedge {
							r.m.skipped(req.Model, skipOptOut)
						} else {
							r.m.skipped(req.Model, skipDisabled)
						}
					}
				}
				if p.hedged && o.reason != ReasonHedge && p.live > 0 {
					if g := r.hedges.graceIn(p.hm, req.Stream, p.delay); g > 0 {
						p.held, p.graceC = o, c.after(g)
						continue
					}
				}
				return c.win(o)
			}
			o.release()
			o.stop()
			c.Replica = o.rep
			c.lose(o.lost())
			last = o.err
			if h := p.held; h != nil {
				if ctx.Err() != nil {
					c.unhold()
					c.drain()
					return last
				}
				// The hedge failed within the grace: the original stands.
				r.m.graced(req.Model, "original")
				p.held = nil
				return c.win(h)
			}
			if ctx.Err() != nil {
				c.drain()
				return last
			}
			class := ""
			r.blame(o.rep, o.err)
			switch {
			case IsNotSent(o.err):
				class = "not_sent"
			case IsDeclined(o.err):
				class = "declined"
			case IsNoToken(o.err):
				if p.live == 0 && r.budget.TakeRetry() {
					class = "no_token"
				}
			default: // final: the replica's answer stands
				c.drain()
				return o.err
			}
			if class != "" && p.live == 0 && p.started < r.cfg.MaxAttempts {
				if err := c.pick(ctx, ReasonRetry); err == nil {
					r.m.retry(req.Model, class)
					continue
				} else if class == "no_token" {
					r.budget.Refund()
				}
			}
			if p.live == 0 {
				c.drain()
				return last
			}
		case <-p.graceC:
			// No first output from the hedge within the grace: the
			// original wins after all.
			p.graceC = nil
			r.m.graced(req.Model, "original")
			h := p.held
			p.held = nil
			return c.win(h)
		case <-hedgeC:
			hedgeC = nil
			rearmC = c.hedgeDue(ctx)
		case <-rearmC:
			rearmC = c.hedgeDue(ctx)
		}
	}
}

// hedgeDue starts the pass's hedge once its delay passed — unless the
// attempts or the budget say no, or, for a part of a group, its group
// turned out smaller than armed for: then it returns the delay re-armed.
func (c *Call) hedgeDue(ctx context.Context) (rearm <-chan time.Time) {
	r, req, p := c.reg, c.req, &c.p
	if req.Group != "" {
		if d, _ := r.hedges.delayIn(p.hm, req.Stream, p.hb.size(req.Group)); d > p.delay {
			rearm = c.after(d - r.cfg.Now().Sub(p.first))
			p.delay = d
			return rearm
		}
	}
	if p.live != 1 || p.started >= r.cfg.MaxAttempts {
		return nil
	}
	rep, why := r.hedgeTarget(req, c.tried)
	if why == "" {
		_, why = p.hb.take(req.Group, p.hs.burst)
	}
	if why != "" {
		r.m.skipped(req.Model, why)
		return nil
	}
	c.launch(ctx, rep, ReasonHedge)
	p.hedged, c.Hedged = true, true
	return nil
}

// win makes a the request's answer and cancels the attempts still running.
func (c *Call) win(a *attempt) error {
	c.Replica, c.Attempt, c.N, c.Reason = a.rep, a.att, a.n, a.reason
	c.won = a
	c.reg.homeSession(c.req.Session, a.rep)
	if c.p.hedged {
		c.reg.m.hedged(c.req.Model, a.reason == ReasonHedge)
	}
	c.drain()
	return nil
}

// unhold makes the held original a loser: it had its first output, so it
// is aborted and counted like any loser of a close race.
func (c *Call) unhold() {
	h := c.p.held
	c.p.held = nil
	h.att.Abort()
	h.release()
	h.stop()
	c.lose(h.lost())
}

// drain cancels the pass's attempts but the winner and collects those
// still running as losers.
func (c *Call) drain() {
	p := &c.p
	for _, a := range p.all {
		if a != c.won {
			a.stop()
		}
	}
	pending, outcomes := p.live, p.outcomes
	if pending == 0 {
		return
	}
	c.losers.Add(1)
	go func() {
		defer c.losers.Done()
		for range pending {
			o := <-outcomes
			if o.att != nil {
				o.att.Abort()
			}
			c.reg.pushedBack(o.rep, o.err)
			o.release()
			c.lose(o.lost())
		}
	}()
}

func (c *Call) lose(l Lost) {
	c.mu.Lock()
	c.lost = append(c.lost, l)
	c.mu.Unlock()
}

// Finish gives back the winner's in-flight slot, cancels its context and
// takes the request out of its group. Safe to call more than once and on a
// failed call.
func (c *Call) Finish() {
	if a := c.won; a != nil {
		a.release() // once only, whoever calls it
		a.stop()
	}
	if c.leave != nil {
		c.leave()
		c.leave = nil
	}
}

// Losers waits until every losing attempt has ended and returns them.
func (c *Call) Losers() []Lost {
	c.losers.Wait()
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lost
}

// blame takes an attempt's failure out on its replica: one it never reached
// is ejected at once, one that reached it but produced no token counts as
// a failure (or ejects it, for a deadline that says it hung).
func (r *Registry) blame(rep *Replica, err error) {
	switch {
	case IsNotSent(err):
		r.Eject(rep, "connect")
	case IsDeclined(err):
		r.pushedBack(rep, err)
	case IsNoToken(err):
		if why := noTokenEject(err); why != "" {
			r.Eject(rep, why)
		} else {
			rep.markFailure(r.cfg.Now())
		}
	}
}

// pushedBack takes a [Declined] refusal's pushback out on its replica: out
// of selection for its RetryAfter, drained when it said it is draining.
func (r *Registry) pushedBack(rep *Replica, err error) {
	var d *Declined
	if !errors.As(err, &d) {
		return
	}
	if d.RetryAfter > 0 {
		rep.BackOff(r.cfg.Now().Add(d.RetryAfter))
	}
	if d.Draining {
		r.Drain(rep, "draining (told by the replica)")
	}
}

// hedgeTarget picks the replica a hedge of req would go to, or says why
// the hedge should not start: skipPriority when every other replica that
// could take it has attempts of a class higher than req's in flight (the
// hedge would add load where more urgent requests wait), skipSaturation
// when it would only queue — no other replica is free, the one it would go
// to had requests waiting for room in its engine's batch at its last
// heartbeat (requests the engine defers for their own sake do not count),
// or the gateway's own requests there already fill every engine slot
// (known once learnt, see [Replica.learnSlots]).
//
// A hedge is the escape from a stalled replica, so a session's does not
// follow the session (its first attempt went to the session's replica,
// which it must avoid): it goes by load and prefix alone, to a replica
// not tried.
func (r *Registry) hedgeTarget(req Request, tried []*Replica) (*Replica, string) {
	hint := req.Hint
	hint.Session = 0
	rep, err := r.pick(hint, tried, req.Class, req.Class == ClassInteractive)
	switch {
	case errors.Is(err, errOutranked):
		return nil, skipPriority
	case err != nil:
		return nil, skipSaturation
	case rep.Load().queued() >= r.hedges.cfg.MaxQueue || rep.full():
		return nil, skipSaturation
	}
	return rep, ""
}
