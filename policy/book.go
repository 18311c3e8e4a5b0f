package policy

import (
	"context"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tailgate-dev/tailgate/data"
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
	// tenant, for a request made at at, or books nothing and returns a
	// *QuotaError (without the tenant's name) or an error wrapping
	// data.ErrLedgerUnavailable. start is the start of the budget period
	// the request counts in (zero for a lifetime budget).
	reserve(ts *tenantState, tenantID, tokens, micros int64, at time.Time) (held bool, start time.Time, err error)
	// settle replaces a reservation made by reserve with what the request
	// used: tokens and cost.
	settle(ts *tenantState, tenantID int64, held bool, start time.Time, reserved [2]int64, tokens, cost int64)
}

// memoryBook keeps reservations in this process (one gateway per database).
type memoryBook struct{}

func (memoryBook) reserve(ts *tenantState, _, tokens, micros int64, at time.Time) (bool, time.Time, error) {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	ts.roll(at)
	if qe := ts.reserve(tokens, micros); qe != nil {
		return false, time.Time{}, qe
	}
	return false, ts.start, nil
}

func (memoryBook) settle(ts *tenantState, _ int64, _ bool, start time.Time, reserved [2]int64, tokens, cost int64) {
	ts.mu.Lock()
	ts.reserved.Tokens -= reserved[0]
	ts.reserved.Micros -= reserved[1]
	ts.addSpent(start, tokens, cost)
	ts.mu.Unlock()
}

// reserveTimeout bounds a reservation's database round trip: a database
// that does not answer fails the request closed (503) instead of hanging it.
const reserveTimeout = 2 * time.Second

// sharedBook reserves budgets in a database other gateways share. A tenant
// without a budget is not booked there (nothing to exceed; the request
// costs no round trip). A settled request's ledger row moves its cost from
// this gateway's hold into spend when it is written; what it reserved
// beyond its cost stays held as this gateway's spare for the tenant, so
// the next requests reserve from it without a round trip. A spare holds at
// most 1/spareShare of the tenant's budget (more is released), and a spare
// not drawn on since the previous lease tick is released: near a budget's
// end another gateway may be refused that much early, for about a second.
// Releases are written in the background, batched per tenant (late
// releases are safe: a hold only ever errs on the side of refusing).
type sharedBook struct {
	st    *data.Store
	mem   memoryBook // this gateway's view, for TenantState
	mu    sync.Mutex
	owed  map[int64]data.Spend // releases not yet written, per tenant
	spare map[int64]*spare     // held in the database beyond the requests in flight
	wake  chan struct{}
	// booked counts reservations that went to the database.
	booked atomic.Int64
}

// spare is budget this gateway holds in the database for a tenant beyond
// its requests in flight.
type spare struct {
	data.Spend
	used bool // drawn on or added to since the last lease tick
}

// spareShare: a gateway's spare for a tenant holds at most 1/spareShare of
// each of the tenant's budgets.
const spareShare = 16

// spareCap is the most a spare keeps of a budget: 1/spareShare of it, or
// all it gets when the budget is unlimited (0), where holds restrict
// nothing.
func spareCap(budget int64) int64 {
	if budget <= 0 {
		return math.MaxInt64 / 2
	}
	return budget / spareShare
}

// sliceOf is what a reservation that goes to the database takes beyond its
// need, for the spare: half the spare's cap; none of an unlimited budget.
func sliceOf(budget int64) int64 {
	if budget <= 0 {
		return 0
	}
	return budget / spareShare / 2
}

func newSharedBook(st *data.Store) *sharedBook {
	return &sharedBook{st: st, owed: make(map[int64]data.Spend), spare: make(map[int64]*spare), wake: make(chan struct{}, 1)}
}

func (b *sharedBook) reserve(ts *tenantState, tenantID, tokens, micros int64, at time.Time) (bool, time.Time, error) {
	ts.mu.Lock()
	limited := ts.budgetTokens > 0 || ts.budgetMicros > 0
	slice := data.Spend{Tokens: sliceOf(ts.budgetTokens), Micros: sliceOf(ts.budgetMicros)}
	ts.mu.Unlock()
	if !limited {
		return b.mem.reserve(ts, tenantID, tokens, micros, at)
	}
	// The spare is budget held in the database, counted against whichever
	// period is current when it is used (holds have no period), so it
	// stays good across a boundary.
	if !b.take(tenantID, tokens, micros) {
		if err := b.hold(tenantID, tokens, micros, slice, at); err != nil {
			return false, time.Time{}, err
		}
	}
	ts.mu.Lock()
	ts.roll(at)
	ts.reserved.Tokens += tokens
	ts.reserved.Micros += micros
	start := ts.start
	ts.mu.Unlock()
	return true, start, nil
}

// hold reserves tokens and micros for the tenant in the database, and slice
// more for its spare; near the budget's end, where that does not fit, just
// what was asked. It returns a *QuotaError when not even that fits.
func (b *sharedBook) hold(tenantID, tokens, micros int64, slice data.Spend, at time.Time) error {
	ctx, cancel := context.WithTimeout(context.Background(), reserveTimeout)
	defer cancel()
	b.booked.Add(1)
	c, err := b.st.ReserveBudgetAt(ctx, tenantID, tokens+slice.Tokens, micros+slice.Micros, at)
	if err == nil && c.OK {
		b.mu.Lock()
		b.addSpareLocked(tenantID, slice)
		b.mu.Unlock()
	} else if err == nil && slice != (data.Spend{}) {
		b.booked.Add(1)
		c, err = b.st.ReserveBudgetAt(ctx, tenantID, tokens, micros, at)
	}
	if err != nil {
		return fmt.Errorf("%w: %v", data.ErrLedgerUnavailable, err)
	}
	if !c.OK {
		qe := &QuotaError{Budget: "tokens", Limit: c.Budget.Tokens, Spent: c.Spent.Tokens, Reserved: c.Held.Tokens, Requested: tokens}
		if within := c.Budget.Tokens <= 0 || fits(c.Budget.Tokens, c.Spent.Tokens, c.Held.Tokens, tokens); within {
			qe = &QuotaError{Budget: "cost", Limit: c.Budget.Micros, Spent: c.Spent.Micros, Reserved: c.Held.Micros, Requested: micros}
		}
		qe.Period, qe.ResetsAt = c.Period, c.Resets
		return qe
	}
	return nil
}

// addSpareLocked adds s to the tenant's spare and returns it.
func (b *sharedBook) addSpareLocked(tenantID int64, s data.Spend) *spare {
	sp := b.spare[tenantID]
	if sp == nil {
		sp = &spare{}
		b.spare[tenantID] = sp
	}
	sp.Tokens += s.Tokens
	sp.Micros += s.Micros
	sp.used = true
	return sp
}

// take reserves tokens and micros from the tenant's spare, if it holds
// them.
func (b *sharedBook) take(tenantID, tokens, micros int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	sp := b.spare[tenantID]
	if sp == nil || sp.Tokens < tokens || sp.Micros < micros {
		return false
	}
	sp.Tokens -= tokens
	sp.Micros -= micros
	sp.used = true
	return true
}

func (b *sharedBook) settle(ts *tenantState, tenantID int64, held bool, start time.Time, reserved [2]int64, tokens, cost int64) {
	b.mem.settle(ts, tenantID, held, start, reserved, tokens, cost)
	if !held {
		return
	}
	// The ledger row takes tokens and cost out of the hold; the rest of the
	// reservation stays held as spare, up to the cap; beyond it, it goes
	// back.
	extra := data.Spend{Tokens: max(reserved[0]-tokens, 0), Micros: max(reserved[1]-cost, 0)}
	if extra == (data.Spend{}) {
		return
	}
	ts.mu.Lock()
	capT, capM := spareCap(ts.budgetTokens), spareCap(ts.budgetMicros)
	ts.mu.Unlock()
	b.mu.Lock()
	sp := b.addSpareLocked(tenantID, extra)
	over := data.Spend{Tokens: max(sp.Tokens-capT, 0), Micros: max(sp.Micros-capM, 0)}
	sp.Tokens -= over.Tokens
	sp.Micros -= over.Micros
	owe := over != (data.Spend{})
	if owe {
		o := b.owed[tenantID]
		o.Tokens += over.Tokens
		o.Micros += over.Micros
		b.owed[tenantID] = o
	}
	b.mu.Unlock()
	if owe {
		select {
		case b.wake <- struct{}{}:
		default:
		}
	}
}

// releaseIdle releases the spares not drawn on since the last call (all of
// them with all set, before the gateway stops); flush writes them.
func (b *sharedBook) releaseIdle(all bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for id, sp := range b.spare {
		if sp.used && !all {
			sp.used = false
			continue
		}
		if sp.Spend != (data.Spend{}) {
			o := b.owed[id]
			o.Tokens += sp.Tokens
			o.Micros += sp.Micros
			b.owed[id] = o
		}
		delete(b.spare, id)
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
