package policy

import (
	"cmp"
	"errors"
	"sync"
	"time"
)

// ErrModelNotAllowed rejects a request for a model its key may not use.
var ErrModelNotAllowed = errors.New("model not allowed for this key")

// Usage is the tokens a request actually consumed.
type Usage struct {
	PromptTokens, CompletionTokens int64
}

// Request is what admission needs to know about a request before it runs.
type Request struct {
	Model string
	// PromptEstimate is the likely prompt size in tokens, charged against
	// the key's TPM limit and corrected when the request settles.
	PromptEstimate int64
	// PromptBound is a guaranteed upper bound on the prompt's tokens,
	// reserved against the tenant's budget.
	PromptBound int64
	// MaxTokens bounds the completion. A request that may produce more than
	// it reserved can take its tenant past the budget, so callers should
	// always set it.
	MaxTokens int64
}

// Ticket is an admitted request's hold on its key's and tenant's capacity.
// It must be settled exactly once, with Settle or Release, whatever the
// request's outcome; later calls do nothing.
type Ticket struct {
	g      *Gate
	key    *keyState
	tenant *tenantState
	// tenantID is the tenant's, and held says the reservation is booked in
	// the database (see book).
	tenantID int64
	held     bool
	// start is the start of the budget period the request counts in.
	start time.Time
	price Price
	// tpm is the key's TPM limit at admission (0: not charged) and
	// estimate what was charged against it.
	tpm, estimate int64
	// reserved is the budget reservation.
	reserved [2]int64 // tokens, micros

	once sync.Once
	cost int64
}

// Admit checks a request against p's limits and its tenant's budget, in this
// order: the model (ErrModelNotAllowed), concurrency, requests per minute
// and tokens per minute (*LimitError), then the budget (*QuotaError). An
// admitted request holds a concurrency slot, one request and
// PromptEstimate+MaxTokens tokens of its rate limits and a reservation of
// PromptBound+MaxTokens tokens (and their price) of the budget until its
// Ticket is settled. A rejected request takes nothing. The RateState is the
// key's state after the decision, for rate-limit headers.
func (g *Gate) Admit(p *Principal, r Request) (*Ticket, RateState, error) {
	return g.admit(p, nil, r)
}

// Entry is a request's place in its key's concurrency and requests-per-
// minute limits, taken by [Gate.Enter] before its body is read: what the
// key may do is decided before the request takes any shared resource.
// Admit it with [Gate.AdmitEntered], or give it back with Leave.
type Entry struct {
	key  *keyState
	rpm  int64 // the RPM limit one request was taken from (0: none)
	done bool  // admitted (its Ticket holds the slot) or left
}

// Enter checks p's concurrency and requests-per-minute limits (in that
// order, *LimitError) and takes one of each: a request that waits for its
// body already counts against its key, so a key's slow uploads are bounded
// by its own limits. The RateState is the key's state after the decision.
func (g *Gate) Enter(p *Principal) (*Entry, RateState, error) {
	ks := p.key
	if ks == nil {
		ks = g.keyFor(p.KeyID)
	}
	rpm, tpm, conc := g.share(p.RPM), g.share(p.TPM), g.share(p.MaxConcurrency)
	now := g.now()
	ks.mu.Lock()
	defer ks.mu.Unlock()
	if rpm > 0 {
		ks.requests.refill(now, rpm)
	}
	if tpm > 0 {
		ks.tokens.refill(now, tpm)
	}
	if conc > 0 && ks.inflight >= conc {
		return nil, ks.state(rpm, tpm), &LimitError{Limit: "concurrency"}
	}
	if rpm > 0 {
		if ok, wait := ks.requests.check(1, rpm); !ok {
			return nil, ks.state(rpm, tpm), &LimitError{Limit: "requests", RetryAfter: wait}
		}
		ks.requests.take(1)
	}
	ks.inflight++
	return &Entry{key: ks, rpm: rpm}, ks.state(rpm, tpm), nil
}

// Leave gives back what Enter took, for a request that ends before it is
// admitted (its body could not be read, it was refused): it took nothing.
// It does nothing once the request was admitted, or on a nil Entry.
func (e *Entry) Leave() {
	if e == nil || e.done {
		return
	}
	e.done = true
	ks := e.key
	ks.mu.Lock()
	ks.inflight--
	if e.rpm > 0 {
		ks.requests.give(1, e.rpm)
	}
	ks.mu.Unlock()
}

// AdmitEntered admits a request that passed [Gate.Enter]: as Admit, but
// its concurrency slot and its request are the entry's, not checked or
// taken again. An admitted request's Ticket takes the entry over; a
// refused one keeps it, for the caller to Leave. A nil Entry admits as
// Admit does.
func (g *Gate) AdmitEntered(p *Principal, e *Entry, r Request) (*Ticket, RateState, error) {
	return g.admit(p, e, r)
}

func (g *Gate) admit(p *Principal, e *Entry, r Request) (*Ticket, RateState, error) {
	if !p.Allows(r.Model) {
		return nil, RateState{}, ErrModelNotAllowed
	}
	entered := e != nil && !e.done
	ks, ts := p.key, p.tenant
	if entered {
		ks = e.key
	}
	if ks == nil {
		ks = g.keyFor(p.KeyID)
	}
	if ts == nil {
		ts = g.tenantFor(p.TenantID, p.Tenant, 0, 0)
	}
	rpm, tpm, conc := g.share(p.RPM), g.share(p.TPM), g.share(p.MaxConcurrency)
	maxTokens := clampLimit(r.MaxTokens)
	estimate := clampLimit(r.PromptEstimate) + maxTokens
	bound := clampLimit(r.PromptBound) + maxTokens
	price := g.price(r.Model)
	micros := cost(price, clampLimit(r.PromptBound), maxTokens)
	now := g.now()

	// Everything is checked before anything is taken, under the key's lock
	// and then the tenant's (always in that order), so a rejection leaves no
	// trace and concurrent admissions cannot overbook the budget. On a shared
	// database the budget is reserved there (see book), still under the
	// key's lock: one key's admissions to a limited tenant take turns for
	// the round trip.
	ks.mu.Lock()
	if rpm > 0 {
		ks.requests.refill(now, rpm)
	}
	if tpm > 0 {
		ks.tokens.refill(now, tpm)
	}
	if conc > 0 && ks.inflight >= conc && !entered {
		rs := ks.state(rpm, tpm)
		ks.mu.Unlock()
		return nil, rs, &LimitError{Limit: "concurrency"}
	}
	if rpm > 0 && !entered {
		if ok, wait := ks.requests.check(1, rpm); !ok {
			rs := ks.state(rpm, tpm)
			ks.mu.Unlock()
			return nil, rs, &LimitError{Limit: "requests", RetryAfter: wait}
		}
	}
	if tpm > 0 {
		if ok, wait := ks.tokens.check(estimate, tpm); !ok {
			rs := ks.state(rpm, tpm)
			ks.mu.Unlock()
			return nil, rs, &LimitError{Limit: "tokens", RetryAfter: wait}
		}
	}
	held, start, err := g.book.reserve(ts, p.TenantID, bound, micros, now)
	ts.mu.Lock()
	name, budgetMicros := ts.name, ts.budgetMicros
	var resets time.Time
	if ts.budgetTokens > 0 || ts.budgetMicros > 0 {
		resets = ts.resets()
	}
	ts.mu.Unlock()
	if err != nil {
		rs := ks.state(rpm, tpm)
		rs.BudgetResets = resets
		ks.mu.Unlock()
		var qe *QuotaError
		if errors.As(err, &qe) {
			qe.Tenant = cmp.Or(name, p.Tenant)
		}
		return nil, rs, err
	}
	if entered {
		e.done = true // the ticket holds its slot now
	} else {
		ks.inflight++
		if rpm > 0 {
			ks.requests.take(1)
		}
	}
	t := &Ticket{g: g, key: ks, tenant: ts, tenantID: p.TenantID, held: held, start: start, price: price, reserved: [2]int64{bound, micros}}
	if tpm > 0 {
		ks.tokens.take(estimate)
		t.tpm, t.estimate = tpm, estimate
	}
	rs := ks.state(rpm, tpm)
	rs.BudgetResets = resets
	ks.mu.Unlock()
	if budgetMicros > 0 && price == (Price{}) {
		g.noteUnpriced(cmp.Or(name, p.Tenant), r.Model, budgetMicros)
	}
	return t, rs, nil
}

// share is this gateway's share of a key's limit: limit/N, rounded up,
// with N the gateways whose lease is live on a shared database (1 on
// SQLite, or before the first count). 0 (no limit) stays 0.
func (g *Gate) share(limit int64) int64 {
	n := g.gateways.Load()
	if limit <= 0 || n <= 1 {
		return limit
	}
	return (limit + n - 1) / n
}

// state reports the key's rate-limit state under this gateway's limits.
// Callers hold ks.mu and have refilled the buckets.
func (ks *keyState) state(rpm, tpm int64) RateState {
	var rs RateState
	if rpm > 0 {
		rs.LimitRequests = rpm
		rs.RemainingRequests = ks.requests.remaining()
		rs.ResetRequests = ks.requests.reset(rpm)
	}
	if tpm > 0 {
		rs.LimitTokens = tpm
		rs.RemainingTokens = ks.tokens.remaining()
		rs.ResetTokens = ks.tokens.reset(tpm)
	}
	return rs
}

// Settle ends the request with its actual usage: it frees the concurrency
// slot, replaces the budget reservation with the usage and its cost, and
// corrects the TPM charge by the difference between usage and estimate
// (which may leave the key in debt). It returns the cost in micro-units.
// Only the first call counts; later calls return the same cost. A nil Ticket
// settles to 0.
func (t *Ticket) Settle(u Usage) (costMicros int64) {
	if t == nil {
		return 0
	}
	t.once.Do(func() { t.cost = t.settle(u) })
	return t.cost
}

// Release settles a request that consumed nothing.
func (t *Ticket) Release() { t.Settle(Usage{}) }

// Cost is what u would cost at the ticket's price, without settling
// anything (for a stream's provisional ledger row).
func (t *Ticket) Cost(u Usage) int64 {
	if t == nil {
		return 0
	}
	return cost(t.price, u.PromptTokens, u.CompletionTokens)
}

func (t *Ticket) settle(u Usage) int64 {
	prompt, completion := clampLimit(u.PromptTokens), clampLimit(u.CompletionTokens)
	c := cost(t.price, prompt, completion)

	ks := t.key
	ks.mu.Lock()
	ks.inflight--
	if t.tpm > 0 {
		// Returning tokens commutes with refilling, so only debt needs the
		// bucket brought up to now (and the clock read).
		d := t.estimate - (prompt + completion)
		if d < 0 {
			ks.tokens.refill(t.g.now(), t.tpm)
		}
		ks.tokens.give(d, t.tpm)
	}
	ks.mu.Unlock()

	t.g.book.settle(t.tenant, t.tenantID, t.held, t.start, t.reserved, prompt+completion, c)
	return c
}
