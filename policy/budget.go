package policy

import (
	"fmt"
	"math"
	"math/bits"
	"sync"
	"time"

	"github.com/tailgate-dev/tailgate/data"
)

// QuotaError rejects a request that could take its tenant past its budget
// (OpenAI's insufficient_quota). The amounts are in the budget's unit:
// tokens, or micro-units of currency for the cost budget.
type QuotaError struct {
	Tenant string
	// Budget is the budget that would be exceeded: "tokens" or "cost".
	Budget string
	// Limit is the budget, Spent what settled requests used of it, Reserved
	// what admitted requests still in flight hold of it, and Requested this
	// request's worst case (its prompt bound plus its completion cap), which
	// admission must reserve in full.
	Limit, Spent, Reserved, Requested int64
	// Period is the budget's period ("" for a lifetime budget: Spent is
	// then everything the tenant ever spent) and ResetsAt when it ends and
	// the budget is whole again (zero: never).
	Period   string
	ResetsAt time.Time
}

// Left is what the budget has left for new requests, never negative.
func (e *QuotaError) Left() int64 { return max(e.Limit-e.Spent-e.Reserved, 0) }

// UsedUp reports whether nothing is left, as opposed to a request larger
// than what is left.
func (e *QuotaError) UsedUp() bool { return e.Left() == 0 }

func (e *QuotaError) Error() string {
	if e.UsedUp() {
		return fmt.Sprintf("insufficient quota: the %s%s budget of tenant %s is used up (%d of %d spent, %d reserved)%s",
			e.periodWord(), e.Budget, e.Tenant, e.Spent, e.Limit, e.Reserved, e.ResetNote())
	}
	return fmt.Sprintf("insufficient quota: request needs up to %d of the %s%s budget of tenant %s, %d left (%d of %d spent, %d reserved)%s",
		e.Requested, e.periodWord(), e.Budget, e.Tenant, e.Left(), e.Spent, e.Limit, e.Reserved, e.ResetNote())
}

func (e *QuotaError) periodWord() string {
	if e.Period == "" {
		return ""
	}
	return e.Period + " "
}

// ResetNote is "; it resets at <time>" for a periodic budget, "" for a
// lifetime one.
func (e *QuotaError) ResetNote() string {
	if e.ResetsAt.IsZero() {
		return ""
	}
	return "; it resets at " + e.ResetsAt.UTC().Format(time.RFC3339)
}

// Price is what a model costs, in micro-units of currency per million
// tokens.
type Price struct {
	InputMicrosPerM, OutputMicrosPerM int64
}

// Micros converts an amount in currency units (a price, a budget) to the
// micro-units prices and budgets are kept in, rounded.
func Micros(units float64) int64 { return int64(math.Round(units * 1e6)) }

func (p Price) valid() bool { return p.InputMicrosPerM >= 0 && p.OutputMicrosPerM >= 0 }

// price returns the price of a model.
func (g *Gate) price(model string) Price {
	if p, ok := g.prices[model]; ok {
		return p
	}
	return g.defPr
}

// Cost is what usage of model costs, in whole micro-units of currency:
//
//	(prompt·input + completion·output + 500_000) / 1_000_000
//
// that is, the exact cost rounded to the nearest micro-unit, halves up.
// Rounding is per request and monotonic, so a request never costs more than
// the reservation made for a larger usage. Negative token counts count as
// zero; a cost beyond the int64 range saturates.
func (g *Gate) Cost(model string, u Usage) int64 {
	return cost(g.price(model), u.PromptTokens, u.CompletionTokens)
}

func cost(p Price, prompt, completion int64) int64 {
	// 128-bit arithmetic: token counts times prices can exceed an int64.
	h1, l1 := bits.Mul64(uint64(max(prompt, 0)), uint64(max(p.InputMicrosPerM, 0)))
	h2, l2 := bits.Mul64(uint64(max(completion, 0)), uint64(max(p.OutputMicrosPerM, 0)))
	lo, c := bits.Add64(l1, l2, 0)
	hi := h1 + h2 + c
	lo, c = bits.Add64(lo, 500_000, 0)
	hi += c
	if hi >= 1_000_000 {
		return math.MaxInt64
	}
	q, _ := bits.Div64(hi, lo, 1_000_000)
	if q > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(q)
}

// tenantState is one tenant's budget and what is spent and reserved
// against it. 0 budgets mean unlimited.
type tenantState struct {
	mu                         sync.Mutex
	name                       string
	budgetTokens, budgetMicros int64
	// spent is everything the tenant spent (it only grows: the metrics'
	// counters), reserved what admitted requests hold.
	spent, reserved data.Spend
	// A periodic budget (period not "") counts periodSpent: what requests
	// admitted in the period [start, end) spent. It starts again from zero
	// at end, on the first admission after it (roll).
	period       string
	start, end   time.Time
	periodSpent  data.Spend
	alertPercent int64
	// usedRatio is the share of the budget used in the current period, as
	// the budget watch last measured it (see watchBudgets), and alerted the
	// thresholds already reported for the period that starts at
	// alertedStart.
	usedRatio    float64
	alertedStart time.Time
	alerted      map[int64]bool
}

// roll moves a periodic budget into the period at falls in, if it is past
// the one periodSpent counts. Callers hold ts.mu.
func (ts *tenantState) roll(at time.Time) {
	if ts.period == "" || at.Before(ts.end) {
		return
	}
	ts.start, ts.end = data.PeriodStart(ts.period, at), data.PeriodEnd(ts.period, at)
	ts.periodSpent = data.Spend{}
}

// counted is the spend the budget is checked against: the period's, or
// the lifetime's. Callers hold ts.mu.
func (ts *tenantState) counted() data.Spend {
	if ts.period != "" {
		return ts.periodSpent
	}
	return ts.spent
}

// resets is when the budget is whole again: the end of its period (zero
// for a lifetime budget). Callers hold ts.mu.
func (ts *tenantState) resets() time.Time {
	if ts.period == "" {
		return time.Time{}
	}
	return ts.end
}

// reserve books a worst-case reservation if it fits the budget; otherwise
// it books nothing and says which budget it would exceed and by how much
// (without the tenant's name). Callers hold ts.mu and have rolled it.
func (ts *tenantState) reserve(tokens, micros int64) *QuotaError {
	c := ts.counted()
	if b := ts.budgetTokens; b > 0 && !fits(b, c.Tokens, ts.reserved.Tokens, tokens) {
		return &QuotaError{Budget: "tokens", Limit: b, Spent: c.Tokens, Reserved: ts.reserved.Tokens, Requested: tokens,
			Period: ts.period, ResetsAt: ts.resets()}
	}
	if b := ts.budgetMicros; b > 0 && !fits(b, c.Micros, ts.reserved.Micros, micros) {
		return &QuotaError{Budget: "cost", Limit: b, Spent: c.Micros, Reserved: ts.reserved.Micros, Requested: micros,
			Period: ts.period, ResetsAt: ts.resets()}
	}
	ts.reserved.Tokens += tokens
	ts.reserved.Micros += micros
	return nil
}

// addSpent adds a settled request's usage: to the lifetime total, and to
// the period's when the request was admitted in the current period (one
// admitted before a boundary counts in the period its ledger row's time
// says, the one before). Callers hold ts.mu.
func (ts *tenantState) addSpent(start time.Time, tokens, cost int64) {
	ts.spent.Tokens += tokens
	ts.spent.Micros += cost
	if ts.period != "" && start.Equal(ts.start) {
		ts.periodSpent.Tokens += tokens
		ts.periodSpent.Micros += cost
	}
}

// fits reports whether spent+reserved+need ≤ budget without overflowing.
func fits(budget, spent, reserved, need int64) bool {
	left := budget - spent - reserved
	return left >= 0 && need <= left
}
