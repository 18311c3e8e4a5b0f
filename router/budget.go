package router

import (
	"sync"
	"time"
)

// BudgetConfig sizes the token bucket that bounds retries of attempts that
// reached a replica. Attempts that never reached a replica (or that it
// declined) are retried for free: nothing ran. Hedges have a budget of their
// own ([HedgeConfig.Budget] and [HedgeConfig.Burst]).
type BudgetConfig struct {
	// Ratio is the tokens every request earns; 0 means 0.05 (up to 5 % extra
	// attempts in the long run).
	Ratio float64
	// Burst caps the bucket; 0 means 50.
	Burst float64
	// MinPerSecond refills the bucket even without traffic, so a quiet gateway
	// can still retry; 0 means 5.
	MinPerSecond float64
}

// Budget is the token bucket that bounds retries.
type Budget struct {
	cfg BudgetConfig
	now func() time.Time

	mu     sync.Mutex
	tokens float64
	last   time.Time
}

// defaultBudgetRatio is the default retry budget: 5 % of requests.
const defaultBudgetRatio = 0.05

// withDefaults returns c with every zero field filled in.
func (c BudgetConfig) withDefaults() BudgetConfig {
	if c.Ratio == 0 {
		c.Ratio = defaultBudgetRatio
	}
	if c.Burst == 0 {
		c.Burst = 50
	}
	if c.MinPerSecond == 0 {
		c.MinPerSecond = 5
	}
	return c
}

// NewBudget returns a full bucket; a nil now means time.Now.
func NewBudget(cfg BudgetConfig, now func() time.Time) *Budget {
	cfg = cfg.withDefaults()
	if now == nil {
		now = time.Now
	}
	return &Budget{cfg: cfg, now: now, tokens: cfg.Burst, last: now()}
}

func (b *Budget) refillLocked() {
	now := b.now()
	if el := now.Sub(b.last); el > 0 {
		b.tokens = min(b.cfg.Burst, b.tokens+el.Seconds()*b.cfg.MinPerSecond)
	}
	b.last = now
}

// Deposit credits one request's share.
func (b *Budget) Deposit() {
	b.mu.Lock()
	b.refillLocked()
	b.tokens = min(b.cfg.Burst, b.tokens+b.cfg.Ratio)
	b.mu.Unlock()
}

// TakeRetry spends a token on a retry.
func (b *Budget) TakeRetry() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.refillLocked()
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// Refund gives a token back (an attempt that could not start).
func (b *Budget) Refund() {
	b.mu.Lock()
	b.tokens = min(b.cfg.Burst, b.tokens+1)
	b.mu.Unlock()
}

// Tokens returns the bucket's level (for metrics and tests).
func (b *Budget) Tokens() float64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.refillLocked()
	return b.tokens
}

// hedgeBudget bounds one model's hedges: a bucket every request credits with
// the model's budget ratio and every hedge debits by one, holding at most
// its burst. Tokens are earned by requests only, never by time, so however
// quiet or busy the gateway, hedges stay within the ratio of requests plus
// the burst.
//
// The parts of a fan-out (requests with the same group) decide their
// document together: its time is its slowest part's. They trip the hedge
// delay together too, so two rules keep the burst cap from cutting them:
//   - while any part of a group is in flight, the parts' shares go to the
//     group's pot instead of the bucket, so they are not lost to the cap
//     when a document arrives at once; parts spend the pot first, and what is
//     left goes back to the bucket when the group's last part leaves;
//   - a part whose pot and bucket hold less than a token may hedge on
//     credit: the bucket goes below zero, down to minus the burst, and later
//     requests' shares repay it. The long-run bound holds; at any moment
//     grouped requests may run at most one extra burst ahead.
type hedgeBudget struct {
	mu     sync.Mutex
	tokens float64 // the bucket; negative while grouped hedges are repaid
	deep   float64 // a bucket twice as deep serving every hedge asked for: tells "burst" from "budget" refusals
	groups map[string]*groupPot
}

// groupPot is what the parts of one group in flight have earned.
type groupPot struct {
	members int
	peak    int // the most members in flight at once: the group's size
	tokens  float64
}

// Reasons a hedge did not start, as tailgate_hedges_skipped_total labels them.
const (
	skipBudget     = "budget"     // the model's share of requests is spent
	skipBurst      = "burst"      // share earned, but a bigger burst would have kept it
	skipSaturation = "saturation" // the replica it would go to is full or queueing
	skipOptOut     = "opt_out"    // the request asked for no hedge
	skipDisabled   = "disabled"   // hedging is off for the model
	skipPriority   = "priority"   // every other replica serves a higher class now
)

func newHedgeBudget(burst float64) *hedgeBudget {
	return &hedgeBudget{tokens: burst, deep: burst, groups: map[string]*groupPot{}}
}

// join credits one request's share, to its group's pot if it has a group,
// and returns the function that takes it out of the group when it leaves.
func (b *hedgeBudget) join(group string, ratio, burst float64) (leave func()) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.deep = min(2*burst, b.deep+ratio)
	if group == "" {
		b.tokens = min(burst, b.tokens+ratio)
		return func() {}
	}
	p := b.groups[group]
	if p == nil {
		p = &groupPot{}
		b.groups[group] = p
	}
	p.members++
	p.peak = max(p.peak, p.members)
	p.tokens += ratio
	return func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		if p.members--; p.members == 0 {
			b.tokens = min(burst, b.tokens+p.tokens)
			delete(b.groups, group)
		}
	}
}

// take spends a token on a hedge of a request in group ("" for none), or
// says why not (skipBudget or skipBurst).
func (b *hedgeBudget) take(group string, burst float64) (ok bool, reason string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	p := b.groups[group]
	pot := 0.0
	if p != nil {
		pot = p.tokens
	}
	if pot+b.tokens < 1 && (p == nil || b.tokens-(1-pot) < -burst) {
		// deep serves the same demand from twice the depth: if it still
		// holds a token, the burst cut this hedge, not the share.
		if b.deep >= 1 {
			b.deep--
			return false, skipBurst
		}
		return false, skipBudget
	}
	if p != nil {
		from := min(pot, 1)
		p.tokens -= from
		b.tokens -= 1 - from
	} else {
		b.tokens--
	}
	b.deep--
	return true, ""
}

// size returns how many requests group has had in flight at once while
// it has been in flight; 1 for no group ("") or one not in flight.
func (b *hedgeBudget) size(group string) int {
	if group == "" {
		return 1
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if p := b.groups[group]; p != nil {
		return p.peak
	}
	return 1
}

// level returns the bucket's level (for metrics and tests).
func (b *hedgeBudget) level() float64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.tokens
}
