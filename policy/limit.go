package policy

import (
	"sync"
	"time"
)

// LimitError rejects a request that would exceed one of its key's limits.
type LimitError struct {
	// Limit is "requests" (RPM), "tokens" (TPM) or "concurrency".
	Limit string
	// RetryAfter is how long until the request would fit; zero when it
	// cannot be known (concurrency: it depends on when a request ends).
	RetryAfter time.Duration
}

func (e *LimitError) Error() string {
	return "rate limit exceeded: " + e.Limit
}

// RateState is a key's rate-limit state after an admission decision, for
// OpenAI-style x-ratelimit-* headers. A zero limit means the key has none
// and no header should be sent.
type RateState struct {
	LimitRequests, RemainingRequests int64
	ResetRequests                    time.Duration // until the request bucket is full again
	LimitTokens, RemainingTokens     int64
	ResetTokens                      time.Duration // until the token bucket is full again
	// BudgetResets is when the tenant's periodic budget is whole again
	// (x-ratelimit-reset-budget); zero without one.
	BudgetResets time.Time
}

// keyState is one key's limiter state, shared by every Principal of the key.
type keyState struct {
	mu       sync.Mutex
	inflight int64
	requests bucket
	tokens   bucket
}

// Bucket levels are kept in token·µs per minute: a bucket with a limit of L
// per minute refills L units per microsecond and holds L·perMinute units
// when full. Integer units keep "N allowed, then refill after exactly 60/N
// seconds" exact, and the scale does not depend on the limit, so a changed
// limit simply applies from the next refill.
const perMinute = int64(time.Minute / time.Microsecond)

// maxLimit bounds limits and token counts in bucket arithmetic, and
// minLevel bounds debt, so that no sum of levels overflows an int64; larger
// limits are effectively unlimited anyway.
const (
	maxLimit = 10_000_000_000
	minLevel = -maxLimit * perMinute
)

func clampLimit(n int64) int64 { return max(0, min(n, maxLimit)) }

// bucket is a token bucket with capacity limit, refilling limit per minute.
// Its level may go negative: settled usage beyond the estimate is debt.
type bucket struct {
	level   int64
	last    time.Time
	started bool
}

// refill brings the bucket up to now. A new bucket starts full.
func (b *bucket) refill(now time.Time, limit int64) {
	limit = clampLimit(limit)
	if limit == 0 {
		return
	}
	full := limit * perMinute
	if !b.started {
		b.level, b.last, b.started = full, now, true
		return
	}
	el := now.Sub(b.last).Microseconds()
	if el <= 0 {
		return // a clock step backwards refills nothing
	}
	b.last = now
	if b.level >= full {
		b.level = full // the limit may have been lowered
		return
	}
	// Compare before multiplying so that el·limit cannot overflow.
	if need := full - b.level; el >= (need+limit-1)/limit {
		b.level = full
	} else {
		b.level += el * limit
	}
}

// check reports whether n tokens may be taken now and, if not, how long
// until they may. A request larger than the whole bucket is let through
// when the bucket is full (and leaves it in debt) rather than never.
func (b *bucket) check(n, limit int64) (bool, time.Duration) {
	limit = clampLimit(limit)
	need := min(clampLimit(n), limit) * perMinute
	if b.level >= need {
		return true, 0
	}
	return false, ceilMicros(need-b.level, limit)
}

// take removes n tokens; the level may go negative.
func (b *bucket) take(n int64) { b.level = max(minLevel, b.level-clampLimit(n)*perMinute) }

// give returns n tokens (or, for negative n, takes more), never filling the
// bucket past its capacity.
func (b *bucket) give(n, limit int64) {
	n = max(-maxLimit, min(n, maxLimit))
	b.level = max(minLevel, min(b.level+n*perMinute, clampLimit(limit)*perMinute))
}

// remaining is the number of whole tokens in the bucket.
func (b *bucket) remaining() int64 { return max(0, b.level) / perMinute }

// reset is how long until the bucket is full.
func (b *bucket) reset(limit int64) time.Duration {
	limit = clampLimit(limit)
	return ceilMicros(limit*perMinute-b.level, limit)
}

// ceilMicros is the time for units to refill at limit per microsecond.
func ceilMicros(units, limit int64) time.Duration {
	if units <= 0 || limit <= 0 {
		return 0
	}
	return time.Duration((units+limit-1)/limit) * time.Microsecond
}
