package policy

import (
	"context"
	"fmt"
	"sync"
	"time"

	"tailgate/data"
)

// Where budget reservations are booked. On SQLite one gateway serves the
// database, and a reservation is an entry in this process's memory
// (tenantState.reserve). On PostgreSQL several gateways may spend the same
// budgets, so a tenant with a budget is reserved in the database, as one
// atomic operation that fits spend plus every gateway's holds under the
// budget ([data.Store.ReserveBudget]); the in-memory figures are then only
// this gateway's view, for TenantState. Both are behind book.

// book books reservations of tenants' budgets.
type book interface {
	// reserve books a worst-case reservation of tokens and micros for the
	// tenant, or books nothing and returns a *QuotaError (without the
	// tenant's name) or an error wrapping data.ErrLedgerUnavailable.
	reserve(ts *tenantState, tenantID, tokens, micros int64) (held bool, err error)
	// settle replaces a reservation made by reserve with what the request
	// used: tokens and cost.
	settle(ts *tenantState, tenantID int64, held bool, reserved [2]int64, tokens, cost int64)
}

// memoryBook keeps reservations in this process (one gateway per database).
type memoryBook struct{}

func (memoryBook) reserve(ts *tenantState, _, tokens, micros int64) (bool, error) {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if qe := ts.reserve(tokens, micros); qe != nil {
		return false, qe
	}
	return false, nil
}

func (memoryBook) settle(ts *tenantState, _ int64, _ bool, reserved [2]int64, tokens, cost int64) {
	ts.mu.Lock()
	ts.reserved.Tokens -= reserved[0]
	ts.reserved.Micros -= reserved[1]
	ts.spent.Tokens += tokens
	ts.spent.Micros += cost
	ts.mu.Unlock()
}

// reserveTimeout bounds a reservation's database round trip: a database
// that does not answer fails the request closed (503) instead of hanging it.
const reserveTimeout = 2 * time.Second

// sharedBook reserves budgets in a database other gateways share. A tenant
// without a budget is not booked there (nothing to exceed; the request
// costs no round trip). A settled request's ledger row moves its cost from
// this gateway's hold into spend when it is written; what it reserved
// beyond its cost is released here, in the background and batched per
// tenant (late releases are safe: a hold only ever errs on the side of
// refusing).
type sharedBook struct {
	st   *data.Store
	mem  memoryBook // this gateway's view, for TenantState
	mu   sync.Mutex
	owed map[int64]data.Spend // releases not yet written, per tenant
	wake chan struct{}
}

func newSharedBook(st *data.Store) *sharedBook {
	return &sharedBook{st: st, owed: make(map[int64]data.Spend), wake: make(chan struct{}, 1)}
}

func (b *sharedBook) reserve(ts *tenantState, tenantID, tokens, micros int64) (bool, error) {
	ts.mu.Lock()
	limited := ts.budgetTokens > 0 || ts.budgetMicros > 0
	ts.mu.Unlock()
	if !limited {
		return b.mem.reserve(ts, tenantID, tokens, micros)
	}
	ctx, cancel := context.WithTimeout(context.Background(), reserveTimeout)
	defer cancel()
	c, err := b.st.ReserveBudget(ctx, tenantID, tokens, micros)
	if err != nil {
		return false, fmt.Errorf("%w: %v", data.ErrLedgerUnavailable, err)
	}
	if !c.OK {
		qe := &QuotaError{Budget: "tokens", Limit: c.Budget.Tokens, Spent: c.Spent.Tokens, Reserved: c.Held.Tokens, Requested: tokens}
		if within := c.Budget.Tokens <= 0 || fits(c.Budget.Tokens, c.Spent.Tokens, c.Held.Tokens, tokens); within {
			qe = &QuotaError{Budget: "cost", Limit: c.Budget.Micros, Spent: c.Spent.Micros, Reserved: c.Held.Micros, Requested: micros}
		}
		return false, qe
	}
	ts.mu.Lock()
	ts.reserved.Tokens += tokens
	ts.reserved.Micros += micros
	ts.mu.Unlock()
	return true, nil
}

func (b *sharedBook) settle(ts *tenantState, tenantID int64, held bool, reserved [2]int64, tokens, cost int64) {
	b.mem.settle(ts, tenantID, held, reserved, tokens, cost)
	if !held {
		return
	}
	// The ledger row takes tokens and cost out of the hold; the rest of the
	// reservation goes back now.
	extra := data.Spend{Tokens: max(reserved[0]-tokens, 0), Micros: max(reserved[1]-cost, 0)}
	if extra == (data.Spend{}) {
		return
	}
	b.mu.Lock()
	o := b.owed[tenantID]
	o.Tokens += extra.Tokens
	o.Micros += extra.Micros
	b.owed[tenantID] = o
	b.mu.Unlock()
	select {
	case b.wake <- struct{}{}:
	default:
	}
}

// flush writes the releases owed; those that fail stay owed for the next
// flush.
func (b *sharedBook) flush(ctx context.Context) error {
	b.mu.Lock()
	owed := b.owed
	b.owed = make(map[int64]data.Spend, len(owed))
	b.mu.Unlock()
	var first error
	for id, sp := range owed {
		if err := b.st.ReleaseBudget(ctx, id, sp.Tokens, sp.Micros); err != nil {
			if first == nil {
				first = err
			}
			b.mu.Lock()
			o := b.owed[id]
			o.Tokens += sp.Tokens
			o.Micros += sp.Micros
			b.owed[id] = o
			b.mu.Unlock()
		}
	}
	return first
}
