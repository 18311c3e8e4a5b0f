package router

import (
	"context"
	"fmt"
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

// Attempt is the caller's side of an attempt that got as far as its first
// output (or, for an answer that is not streamed, the whole answer). Abort
// cancels it by closing its connection.
type Attempt interface {
	Abort()
}

// OpenFunc starts attempt n on rep and returns once it has produced its
// first output. It must not write anything to the client: the router may
// run two at once and keeps only the winner. Failures are classified with
// [ErrNotSent], [ErrDeclined] or [ErrNoToken]; any other error is final
// (the replica's answer stands, e.g. a 400) and ends the request.
type OpenFunc func(ctx context.Context, rep *Replica, n int, reason AttemptReason) (Attempt, error)

// AssembleFunc reads the rest of att's answer — one the client sees only
// whole — to its end, and returns nil once it is whole, else why not: an
// [ErrBroke] error for an answer that broke or went quiet after its first
// output; any other error is final. It tells progress of each output after
// the first (k of them so far, the latest at at), which holds the answer to
// its model's decode pace. The router may run two at once (a pace hedge);
// cancelling an attempt's context ends its read.
type AssembleFunc func(ctx context.Context, att Attempt, progress func(k int64, at time.Time)) error

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
	// Hold, when set, lets the call wait for capacity with these options
	// ([Registry.Hold]) when its model has no ready replica but one is
	// coming — before its first pass, and once more when every replica of
	// that pass declined or none was left while capacity is on its way:
	// nothing ran, so it waits as a request that found no replica does.
	// nil: the call never waits. A wait that ends without capacity ends
	// the call with a [HoldError].
	Hold *HoldOptions
	// Exclude are replicas this request must not go to, for any attempt —
	// first, retry or hedge — however well they score; nil for none. The
	// call never changes the slice.
	Exclude []*Replica
}

// Lost is an attempt that did not produce the answer.
type Lost struct {
	Replica *Replica
	N       int
	Reason  AttemptReason
	// Attempt is non-nil when the attempt had produced a first output before
	// it was cancelled (it lost a race) or broke.
	Attempt Attempt
	// Err is why it produced no first output, or — with Attempt — how its
	// answer broke before it was whole (it was blamed for it); nil for one
	// that only lost.
	Err error
}

// attempt is the router's side of one attempt of a call: where it runs,
// its slot and context, and how far it got.
type attempt struct {
	n       int
	rep     *Replica
	reason  AttemptReason
	ctx     attemptCtx // ends when the attempt is cancelled
	cancel  context.CancelFunc
	stopped atomic.Bool     // the router cancelled it (stop)
	parent  context.Context // its call's context
	slot    inflightSlot    // its count in rep's in-flight figures
	out     chan<- *attempt // where it goes once open returned: its pass's outcomes
	started time.Time

	// Set by run once open returned.
	att   Attempt
	err   error
	first time.Time // when it produced its first output

	// After its first output, as its reader reports it (see progress).
	k    atomic.Int64 // outputs after the first
	last atomic.Int64 // unix nanos of the latest
	// end is how its assembly ended (see AssembleFunc); broke is set when
	// it was blamed for breaking before its answer was whole.
	end   error
	broke error
	watch *paceWatch // the pace watch holding it to its model's pace, if any
}

// withContext gives a its context, a child of ctx.
func (a *attempt) withContext(ctx context.Context) {
	a.ctx.a, a.parent = a, ctx
	a.ctx.Context, a.cancel = context.WithCancel(ctx)
}

// stop is the router's cancel of a: the race is over for it (it lost, or
// the call ended). Its opener may cancel it too ([AttemptCancel]); stopped
// tells the two apart.
func (a *attempt) stop() {
	a.stopped.Store(true)
	a.cancel()
}

// attemptCtx is an attempt's context: a cancelCtx that also carries its
// attempt, so that the opener cancels the attempt with the router's own
// cancel ([AttemptCancel]) instead of adding a context layer of its own
// (BenchmarkGatewayOverhead's pprof: context.WithCancel in
// server.(*Server).openAttempt, 5 allocations a request). It lives in the
// attempt: no allocation of its own.
type attemptCtx struct {
	context.Context
	a *attempt
}

type attemptKey struct{}

func (c *attemptCtx) Value(key any) any {
	if _, ok := key.(attemptKey); ok {
		return c.a
	}
	return c.Context.Value(key)
}

// AttemptCancel returns the cancel of the attempt whose context ctx is (or
// descends from), as given to an [OpenFunc]: the opener's way to end its
// attempt early (a deadline, an abort) without a context of its own. The
// router tells its own cancels apart from the opener's. nil when ctx is
// no attempt's.
func AttemptCancel(ctx context.Context) context.CancelFunc {
	if a, ok := ctx.Value(attemptKey{}).(*attempt); ok {
		return a.cancel
	}
	return nil
}

// AttemptCancelled reports whether the attempt whose context ctx is (or
// descends from) was cancelled by the router (it lost a race, its call
// ended) or its call's context, not by its opener's own cancel
// ([AttemptCancel]). For a ctx that is no attempt's, ctx.Err() != nil.
func AttemptCancelled(ctx context.Context) bool {
	if a, ok := ctx.Value(attemptKey{}).(*attempt); ok {
		return a.stopped.Load() || a.parent.Err() != nil
	}
	return ctx.Err() != nil
}

// release gives back the attempt's in-flight slot; only the first call
// counts.
func (a *attempt) release() { a.slot.release() }

// run opens the attempt and records how it ended; a panic in open is an
// error of the attempt.
func (a *attempt) run(open OpenFunc, now func() time.Time) {
	defer func() {
		if p := recover(); p != nil {
			a.att, a.err = nil, fmt.Errorf("attempt panicked: %v", p)
		}
	}()
	a.att, a.err = open(&a.ctx, a.rep, a.n, a.reason)
	if a.err == nil {
		a.first = now()
	}
}

// progress records that the attempt has produced k outputs after its
// first, the latest at at.
func (a *attempt) progress(k int64, at time.Time) {
	a.last.Store(at.UnixNano())
	a.k.Store(k)
}

// lost is the attempt as a loser.
func (a *attempt) lost() Lost {
	l := Lost{Replica: a.rep, N: a.n, Reason: a.reason, Attempt: a.att, Err: a.err}
	if a.broke != nil {
		l.Err = a.broke
	}
	return l
}
