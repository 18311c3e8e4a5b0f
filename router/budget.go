package router

import (
	"sync"
	"time"
)

// BudgetConfig sizes the token bucket that bounds extra upstream work:
// retries of attempts that reached a replica, and hedges. Attempts that never
// reached a replica (or that it declined) are retried for free: nothing ran.
type BudgetConfig struct {
	// Ratio is the tokens every request earns; 0 means 0.05 (up to 5 % extra
	// attempts in the long run, DESIGN's default hedge budget).
	Ratio float64
	// Burst caps the bucket; 0 means 50.
	Burst float64
	// MinPerSecond refills the bucket even without traffic, so a quiet gateway
	// can still retry; 0 means 5.
	MinPerSecond float64
	// HedgeReserve is the part of Burst kept for retries: hedges only spend
	// while the bucket holds more than this. 0 (or more than Burst) means
	// half of Burst.
	HedgeReserve float64
	// HedgeBurst caps the hedges that may run ahead of their Ratio share
	// (their own bucket, earned by requests only); 0 means 5.
	HedgeBurst float64
}

// Budget is a token bucket shared by retries and hedges. Hedges also need a
// token of their own, earned only by requests (Ratio each), so that however
// quiet the gateway, hedges never exceed Ratio of the requests; the time
// refill (MinPerSecond) is for retries only.
type Budget struct {
	cfg BudgetConfig
	now func() time.Time

	mu     sync.Mutex
	tokens float64
	hedge  float64 // earned by requests only
	last   time.Time
}

// defaultBudgetRatio is DESIGN's default hedge budget: 5 % of requests.
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
	if c.HedgeReserve == 0 || c.HedgeReserve > c.Burst {
		c.HedgeReserve = c.Burst / 2
	}
	if c.HedgeBurst == 0 {
		c.HedgeBurst = 5
	}
	return c
}

// NewBudget returns a full bucket; a nil now means time.Now.
func NewBudget(cfg BudgetConfig, now func() time.Time) *Budget {
	cfg = cfg.withDefaults()
	if now == nil {
		now = time.Now
	}
	return &Budget{cfg: cfg, now: now, tokens: cfg.Burst, hedge: cfg.HedgeBurst, last: now()}
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
	b.hedge = min(b.cfg.HedgeBurst, b.hedge+b.cfg.Ratio)
	b.mu.Unlock()
}

// withdraw takes one token if at least reserve+1 are there.
func (b *Budget) withdraw(reserve float64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.refillLocked()
	if b.tokens-1 < reserve {
		return false
	}
	b.tokens--
	return true
}

// TakeRetry spends a token on a retry.
func (b *Budget) TakeRetry() bool { return b.withdraw(0) }

// TakeHedge spends a token on a hedge, leaving the reserve for retries.
func (b *Budget) TakeHedge() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.refillLocked()
	if b.hedge < 1 || b.tokens-1 < b.cfg.HedgeReserve {
		return false
	}
	b.hedge--
	b.tokens--
	return true
}

// RefundHedge gives back a hedge that could not start.
func (b *Budget) RefundHedge() {
	b.mu.Lock()
	b.hedge = min(b.cfg.HedgeBurst, b.hedge+1)
	b.tokens = min(b.cfg.Burst, b.tokens+1)
	b.mu.Unlock()
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
