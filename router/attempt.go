package router

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// AttemptReason says why an attempt was made.
type AttemptReason int

const (
	ReasonFirst AttemptReason = iota
	ReasonRetry
	ReasonHedge
)

func (a AttemptReason) String() string {
	switch a {
	case ReasonRetry:
		return "retry"
	case ReasonHedge:
		return "hedge"
	}
	return "first"
}

// Attempt is an attempt that got as far as its first token (or, for an
// answer that is not streamed, the whole answer). Abort cancels it by
// closing its connection.
type Attempt interface {
	Abort()
}

// OpenFunc starts attempt n on rep and returns once it has produced its
// first token. It must not write anything to the client: the router may run
// two at once and keeps only the winner. Failures are classified with
// [ErrNotSent], [ErrDeclined] or [ErrNoToken]; any other error is final
// (the replica's answer stands, e.g. a 400) and ends the request.
type OpenFunc func(ctx context.Context, rep *Replica, n int, reason AttemptReason) (Attempt, error)

// Request is what the router needs to know of one request.
type Request struct {
	Hint
	// Stream tells streamed answers (hedged on time to first token) from
	// JSON answers (hedged on time to the whole answer).
	Stream bool
	// NoHedge opts this request out of hedging (callers whose requests are
	// not safe to duplicate, or a client's x-tailgate-hedge: off).
	NoHedge bool
	// Group names the fan-out this request is a part of (the client's
	// x-tailgate-group header), "" for none. Parts of one group pool their
	// hedge budget and may hedge together past the burst (see hedgeBudget).
	Group string
	// Class is the request's priority class; the zero value is standard.
	// Its attempts count in their replica's in-flight attempts of that
	// class, and its hedge never goes to a replica that has attempts of a
	// higher class in flight (the hedge is skipped with reason "priority"
	// when no other replica is free of them). An interactive request's
	// attempts go to the best-scored replica of all, not the better of two
	// drawn at random, so it finds the free slot batch work left.
	Class Class
	// Exclude are replicas this request must not go to, for any attempt —
	// first, retry or hedge — however well they score (e.g. the replica
	// an answer already broke on, when the caller starts it again); nil
	// for none. Do never changes the slice.
	Exclude []*Replica
}

// Lost is an attempt that did not produce the answer.
type Lost struct {
	Replica *Replica
	N       int
	Reason  AttemptReason
	// Attempt is non-nil when the attempt had produced a first token before
	// it was cancelled (it lost a close race).
	Attempt Attempt
	Err     error
}

// Result tells how a request was served. Call Finish when the winner's
// answer has been relayed.
type Result struct {
	Replica  *Replica // the winning replica (or the last one tried, on failure)
	Attempt  Attempt  // the winning attempt, nil on failure
	N        int      // the winning attempt's number
	Reason   AttemptReason
	Attempts int  // attempts started
	Hedged   bool // a hedge was started

	finish     func()
	leave      func() // takes the request out of its group (see hedgeBudget.join)
	losersDone chan struct{}
	// For a pace hedge (see PaceHedge), once decided: the registry, the
	// request, how attempts open, and the replicas it went to.
	reg   *Registry
	req   Request
	open  OpenFunc
	tried []*Replica

	mu   sync.Mutex
	lost []Lost
}

// Finish gives back the winner's in-flight slot, cancels its context and
// takes the request out of its group. Safe to call more than once and on a
// failed result.
func (res *Result) Finish() {
	if res.finish != nil {
		res.finish()
		res.finish = nil
	}
	if res.leave != nil {
		res.leave()
		res.leave = nil
	}
}

// Losers waits until every losing attempt has ended and returns them.
func (res *Result) Losers() []Lost {
	if res.losersDone != nil {
		<-res.losersDone
	}
	res.mu.Lock()
	defer res.mu.Unlock()
	return res.lost
}

type outcome struct {
	n       int
	rep     *Replica
	reason  AttemptReason
	att     Attempt
	err     error
	release func()
	started time.Time
}

// Do serves one request: it opens an attempt on a replica chosen by the
// selection policy; retries at once elsewhere when the attempt never reached
// its replica or was declined; retries within the budget when it reached the
// replica but produced no token; and, when hedging is on for the model and
// no token came within the hedge delay, opens a second attempt on another
// replica — the first to produce a token wins and the other is cancelled.
func (r *Registry) Do(ctx context.Context, req Request, open OpenFunc) (*Result, error) {
	r.budget.Deposit()
	hs := r.hedges.settings(req.Model)
	hb := r.hedges.budget(req.Model)
	res := &Result{losersDone: make(chan struct{})}
	// A request stays in its group until its answer is relayed (Finish),
	// so the group's pot and size hold for pace hedges too.
	leave := hb.join(req.Group, hs.budget, hs.burst)
	defer func() {
		if res.leave == nil {
			leave()
		}
	}()
	defer func() { r.m.routed(res.Attempts) }()
	outcomes := make(chan outcome, r.cfg.MaxAttempts)
	cancels := map[int]context.CancelFunc{}
	// Clipped: appending to tried never writes into the caller's array.
	tried := slices.Clip(req.Exclude)
	live := 0

	// inline runs attempts on the caller's goroutine when no hedge can
	// start for this request: nothing needs to run beside them.
	inline := false
	// deferRun, when set, receives the next attempt's run instead of
	// running it: the first attempt of a hedged request (see below).
	var deferRun *func()
	var firstStarted time.Time
	launch := func(rep *Replica, reason AttemptReason) {
		tried = append(tried, rep)
		res.Attempts++
		n := res.Attempts
		actx, cancel := context.WithCancel(ctx)
		cancels[n] = cancel
		release := rep.acquire(req.Class)
		live++
		r.m.attempt(req.Model, reason)
		started := r.cfg.Now()
		if n == 1 {
			firstStarted = started
		}
		run := func() {
			var (
				att Attempt
				err error
			)
			func() {
				defer func() {
					if p := recover(); p != nil {
						err = fmt.Errorf("attempt panicked: %v", p)
					}
				}()
				att, err = open(actx, rep, n, reason)
			}()
			// Never blocks: the channel holds one outcome per possible attempt.
			outcomes <- outcome{n: n, rep: rep, reason: reason, att: att, err: err, release: release, started: started}
		}
		switch {
		case deferRun != nil:
			*deferRun, deferRun = run, nil
		case inline:
			run()
		default:
			go run()
		}
	}
	start := func(reason AttemptReason) error {
		// An interactive request goes to the best-scored replica of all.
		rep, err := r.pick(req.Hint, tried, ClassInteractive, req.Class == ClassInteractive)
		if err == ErrNoReplica {
			return r.noReplica(req.Hint.Model, tried) // why, for the client
		}
		if err != nil {
			return err
		}
		launch(rep, reason)
		return nil
	}
	// drain collects the attempts still running after the request is decided.
	drain := func(pending int) {
		for n, c := range cancels {
			if n != res.N || res.Attempt == nil {
				c()
			}
		}
		if pending == 0 {
			close(res.losersDone)
			return
		}
		go func() {
			defer close(res.losersDone)
			for range pending {
				o := <-outcomes
				if o.att != nil {
					o.att.Abort()
				}
				o.release()
				res.mu.Lock()
				res.lost = append(res.lost, Lost{Replica: o.rep, N: o.n, Reason: o.reason, Attempt: o.att, Err: o.err})
				res.mu.Unlock()
			}
		}()
	}

	// A part of a group is armed for the earliest any part may be due: its
	// group's size is not known yet (parts sent at once reach the router
	// one by one). When the delay passes, the part waits on if its group
	// turned out smaller (see partPercentile).
	size := 1
	if req.Group != "" {
		size = math.MaxInt
	}
	delay, learnt := r.hedges.delayFor(req.Model, req.Stream, size)
	armed := learnt && hs.enabled && !req.NoHedge
	// after re-arms the hedge delay, for a group part whose group turned
	// out smaller (the first arming is below: it may take over deciding).
	var timer *time.Timer
	after := func(d time.Duration) <-chan time.Time {
		if r.cfg.After != nil {
			return r.cfg.After(d)
		}
		if timer == nil {
			timer = time.NewTimer(d)
		} else {
			timer.Reset(d)
		}
		return timer.C
	}
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()

	// decide waits for the attempts' outcomes — and, on hedgeC, for the
	// hedge delay — until the request is served or has failed.
	decide := func(hedgeC <-chan time.Time) (*Result, error) {
		// What follows is declared in decide, not beside it, so it stays on
		// the stack: decide may run on the timer's goroutine, and what it
		// captures lives on the heap.
		//
		// win makes o the request's answer and cancels the attempts still running.
		win := func(o outcome) (*Result, error) {
			res.Replica, res.Attempt, res.N, res.Reason = o.rep, o.att, o.n, o.reason
			res.reg, res.req, res.open, res.tried = r, req, open, tried
			cancel := cancels[o.n]
			release := o.release
			res.finish = func() { release(); cancel() }
			res.leave = leave
			if res.Hedged {
				r.m.hedged(req.Model, o.reason == ReasonHedge)
			}
			drain(live)
			return res, nil
		}
		// held is a late original whose first token came while its hedge had
		// none yet, held back for the grace (see hedger.grace) while holding;
		// graceC ends it.
		var (
			held    outcome
			holding bool
			graceC  <-chan time.Time
		)
		// unhold makes the held original a loser: it had its first token, so it
		// is aborted and counted like any loser of a close race.
		unhold := func() {
			h := held
			holding = false
			h.att.Abort()
			h.release()
			cancels[h.n]()
			res.mu.Lock()
			res.lost = append(res.lost, Lost{Replica: h.rep, N: h.n, Reason: h.reason, Attempt: h.att})
			res.mu.Unlock()
		}
		var last error
		for {
			select {
			case o := <-outcomes:
				live--
				if o.err == nil {
					now := r.cfg.Now()
					o.rep.markOK(now)
					o.rep.ObserveTTFT(now.Sub(o.started))
					if holding {
						// The hedge's first token came within the grace: it
						// wins, and the late original is the loser.
						r.m.graced(req.Model, "hedge")
						unhold()
						return win(o)
					}
					// The delay learns the request's time to first token as the
					// first attempt saw it: when a hedge won, the time the
					// original had waited by then, a lower bound of its own
					// (censored, but still above the delay, so the percentile
					// holds instead of drifting down to the hedges' times).
					waited := now.Sub(firstStarted)
					r.hedges.observe(req.Model, req.Stream, waited)
					if !armed && (req.NoHedge || !hs.enabled) {
						// A hedge would have started, but for the request or
						// the model's setting.
						if d, ok := r.hedges.delayFor(req.Model, req.Stream, hb.size(req.Group)); ok && waited > d {
							if req.NoHedge {
								r.m.skipped(req.Model, skipOptOut)
							} else {
								r.m.skipped(req.Model, skipDisabled)
							}
						}
					}
					if res.Hedged && o.reason != ReasonHedge && live > 0 {
						if g := r.hedges.grace(req.Model, req.Stream, delay); g > 0 {
							held, holding, graceC = o, true, after(g)
							continue
						}
					}
					return win(o)
				}
				o.release()
				cancels[o.n]()
				res.Replica = o.rep
				res.mu.Lock()
				res.lost = append(res.lost, Lost{Replica: o.rep, N: o.n, Reason: o.reason, Err: o.err})
				res.mu.Unlock()
				last = o.err
				if holding {
					if ctx.Err() != nil {
						unhold()
						drain(live)
						return res, last
					}
					// The hedge failed within the grace: the original stands.
					r.m.graced(req.Model, "original")
					holding = false
					return win(held)
				}
				if ctx.Err() != nil {
					drain(live)
					return res, last
				}
				class := ""
				r.blame(o.rep, o.err)
				switch {
				case IsNotSent(o.err):
					class = "not_sent"
				case IsDeclined(o.err):
					class = "declined"
				case IsNoToken(o.err):
					if live == 0 && r.budget.TakeRetry() {
						class = "no_token"
					}
				default: // final: the replica's answer stands
					drain(live)
					return res, o.err
				}
				if class != "" && live == 0 && res.Attempts < r.cfg.MaxAttempts {
					if err := start(ReasonRetry); err == nil {
						r.m.retry(req.Model, class)
						continue
					} else if class == "no_token" {
						r.budget.Refund()
					}
				}
				if live == 0 {
					drain(0)
					return res, last
				}
			case <-graceC:
				// No first token from the hedge within the grace: the
				// original wins after all.
				graceC = nil
				r.m.graced(req.Model, "original")
				holding = false
				return win(held)
			case <-hedgeC:
				hedgeC = nil
				if req.Group != "" {
					if d, _ := r.hedges.delayFor(req.Model, req.Stream, hb.size(req.Group)); d > delay {
						hedgeC = after(d - r.cfg.Now().Sub(firstStarted))
						delay = d
						continue
					}
				}
				if live != 1 || res.Attempts >= r.cfg.MaxAttempts {
					continue
				}
				rep, why := r.hedgeTarget(req, tried)
				if why == "" {
					_, why = hb.take(req.Group, hs.burst)
				}
				if why != "" {
					r.m.skipped(req.Model, why)
					continue
				}
				launch(rep, ReasonHedge)
				res.Hedged = true
			}
		}
	}

	inline = !armed
	if !armed {
		if err := start(ReasonFirst); err != nil {
			close(res.losersDone)
			return res, err
		}
		return decide(nil)
	}
	// A hedged request's first attempt also runs on the caller's
	// goroutine: most first tokens come before the hedge delay, and then
	// nothing else ever ran. Should the delay pass first, the timer's
	// goroutine takes over deciding the request — it starts the hedge and
	// cancels the loser — while this one waits for its attempt to end.
	var run func()
	deferRun = &run
	if err := start(ReasonFirst); err != nil {
		close(res.losersDone)
		return res, err
	}
	const (
		running   = iota // the first attempt runs on the caller's goroutine
		takenOver        // the delay passed first: the timer decides
		ended            // the attempt ended first: the caller decides
	)
	var state atomic.Int32
	tick := make(chan time.Time, 1) // the delay, for a caller that decides
	type decided struct {
		res     *Result
		err     error
		panicky any // a panic while deciding, raised again on the caller's goroutine
	}
	taken := make(chan decided, 1)
	fire := func() {
		if !state.CompareAndSwap(running, takenOver) {
			tick <- time.Time{}
			return
		}
		defer func() {
			if p := recover(); p != nil {
				taken <- decided{panicky: p}
			}
		}()
		fired := make(chan time.Time, 1)
		fired <- time.Time{}
		res, err := decide(fired)
		taken <- decided{res: res, err: err}
	}
	if r.cfg.After != nil {
		c, stop := r.cfg.After(delay), make(chan struct{})
		defer close(stop)
		go func() {
			select {
			case <-c:
				fire()
			case <-stop:
			}
		}()
	} else {
		t := time.AfterFunc(delay, fire)
		defer t.Stop()
	}
	run()
	if !state.CompareAndSwap(running, ended) {
		d := <-taken
		if d.panicky != nil {
			panic(d.panicky)
		}
		return d.res, d.err
	}
	return decide(tick)
}

// blame takes an attempt's failure out on its replica: one it never reached
// is ejected at once, one that reached it but produced no token counts as
// a failure (or ejects it, for a deadline that says it hung).
func (r *Registry) blame(rep *Replica, err error) {
	switch {
	case IsNotSent(err):
		r.Eject(rep, "connect")
	case IsDeclined(err):
	case IsNoToken(err):
		if why := noTokenEject(err); why != "" {
			r.Eject(rep, why)
		} else {
			rep.markFailure(r.cfg.Now())
		}
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
func (r *Registry) hedgeTarget(req Request, tried []*Replica) (*Replica, string) {
	rep, err := r.pick(req.Hint, tried, req.Class, req.Class == ClassInteractive)
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
