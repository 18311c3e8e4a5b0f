package policy

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/tailgate-dev/tailgate/data"
)

// SetBudget changes the budget of the existing tenant called name: tokens
// and micros, when not nil, replace that part of it (0 = unlimited). A
// running gateway applies the change within its poll interval, to the next
// request. An unknown tenant is data.ErrNotFound (wrapped): a typo must not
// create a tenant.
func SetBudget(ctx context.Context, st *data.Store, name string, tokens, micros *int64) (data.Tenant, error) {
	return ChangeBudget(ctx, st, name, BudgetChange{Tokens: tokens, Micros: micros})
}

// BudgetChange is an edit of a tenant's budget: nil fields stay as they
// are.
type BudgetChange struct {
	// Tokens and Micros are the budget's amounts (0 = unlimited).
	Tokens, Micros *int64
	// Period is when it resets: "daily", "weekly", "monthly" (calendar
	// periods in UTC), or "" / "none" for never (a lifetime total).
	Period *string
	// AlertPercent is the soft threshold, 1–100.
	AlertPercent *int64
}

func (c BudgetChange) empty() bool {
	return c.Tokens == nil && c.Micros == nil && c.Period == nil && c.AlertPercent == nil
}

// ChangeBudget applies c to the budget of the existing tenant called name,
// as SetBudget does.
func ChangeBudget(ctx context.Context, st *data.Store, name string, c BudgetChange) (data.Tenant, error) {
	name = strings.TrimSpace(name)
	switch {
	case name == "":
		return data.Tenant{}, errors.New("set budget: tenant name required")
	case c.Tokens != nil && *c.Tokens < 0, c.Micros != nil && *c.Micros < 0:
		return data.Tenant{}, errors.New("set budget: negative budget")
	case c.AlertPercent != nil && (*c.AlertPercent < 1 || *c.AlertPercent > 100):
		return data.Tenant{}, errors.New("set budget: the alert percent must be 1 to 100")
	case c.empty():
		return data.Tenant{}, errors.New("set budget: nothing to change")
	}
	if c.Period != nil {
		p := NormalizePeriod(*c.Period)
		if err := data.CheckBudgetPeriod(p); err != nil {
			return data.Tenant{}, fmt.Errorf("set budget: %w", err)
		}
		c.Period = &p
	}
	t, err := st.TenantByName(ctx, name)
	if err != nil {
		return data.Tenant{}, fmt.Errorf("set budget: %w", err)
	}
	return applyBudget(ctx, st, t, c)
}

// NormalizePeriod reads a budget period as a user gives it: "none" (or "")
// is a lifetime budget.
func NormalizePeriod(p string) string {
	p = strings.ToLower(strings.TrimSpace(p))
	if p == "none" || p == "lifetime" {
		return data.PeriodNone
	}
	return p
}

func applyBudget(ctx context.Context, st *data.Store, t data.Tenant, c BudgetChange) (data.Tenant, error) {
	if c.Tokens != nil || c.Micros != nil {
		if c.Tokens != nil {
			t.BudgetTokens = *c.Tokens
		}
		if c.Micros != nil {
			t.BudgetMicros = *c.Micros
		}
		if err := st.SetTenantBudget(ctx, t.ID, t.BudgetTokens, t.BudgetMicros); err != nil {
			return data.Tenant{}, fmt.Errorf("set budget: %w", err)
		}
	}
	if c.Period != nil || c.AlertPercent != nil {
		if c.Period != nil {
			t.BudgetPeriod = *c.Period
		}
		if c.AlertPercent != nil {
			t.BudgetAlertPercent = *c.AlertPercent
		}
		if err := st.SetBudgetPeriod(ctx, t.ID, t.BudgetPeriod, t.BudgetAlertPercent); err != nil {
			return data.Tenant{}, fmt.Errorf("set budget: %w", err)
		}
	}
	return t, nil
}

// TenantTotal is what a tenant has spent and what is reserved of its budget
// by requests admitted and not yet settled.
type TenantTotal struct {
	Spent, Reserved data.Spend
	// PeriodSpent is what the current period of a periodic budget has
	// spent (Spent for a lifetime one), ResetsAt when it ends (zero:
	// never), UsedRatio the share of the budget PeriodSpent is (0 without
	// a budget): measured now, as tailgate_budget_used_ratio is every
	// BudgetWatchInterval.
	PeriodSpent data.Spend
	ResetsAt    time.Time
	UsedRatio   float64
}

// TenantTotals returns each tenant's spend and reservations as the admin
// API shows them. On a database several gateways share (PostgreSQL) they
// are the database's: spend from its totals, reserved what every gateway
// holds of the tenant's budget (a tenant without a budget is not held in
// the database: there, what this gateway's requests in flight reserve). On
// SQLite the one gateway's own figures are the whole. Tenants with nothing
// spent or reserved may be missing.
func (g *Gate) TenantTotals(ctx context.Context) (map[int64]TenantTotal, error) {
	out := make(map[int64]TenantTotal)
	type budget struct{ tokens, micros int64 }
	budgets := make(map[int64]budget)
	g.tenantsMu.RLock()
	for id, ts := range g.tenants {
		ts.mu.Lock()
		ts.roll(g.now())
		t := TenantTotal{Spent: ts.spent, Reserved: ts.reserved, PeriodSpent: ts.counted(), ResetsAt: ts.resets()}
		budgets[id] = budget{ts.budgetTokens, ts.budgetMicros}
		if g.shared != nil && (ts.budgetTokens > 0 || ts.budgetMicros > 0) {
			t.Reserved = data.Spend{} // held in the database, read below
		}
		ts.mu.Unlock()
		out[id] = t
	}
	g.tenantsMu.RUnlock()
	// The share used, from the spend shown beside it: the watcher's figure
	// lags it by up to BudgetWatchInterval (the dashboard showed 0.0 % of
	// a budget beside the 24 tokens already spent of it).
	withRatios := func() map[int64]TenantTotal {
		for id, t := range out {
			if b := budgets[id]; b.tokens > 0 || b.micros > 0 {
				_, _, _, t.UsedRatio = budgetUsed(t.PeriodSpent, b.tokens, b.micros)
				out[id] = t
			}
		}
		return out
	}
	if g.shared == nil {
		return withRatios(), nil
	}
	spent, err := g.st.TenantSpend(ctx)
	if err != nil {
		return nil, fmt.Errorf("tenant totals: %w", err)
	}
	held, err := g.st.BudgetHeld(ctx)
	if err != nil {
		return nil, fmt.Errorf("tenant totals: %w", err)
	}
	for _, ids := range []map[int64]data.Spend{spent, held} {
		for id := range ids {
			if _, ok := out[id]; !ok {
				out[id] = TenantTotal{}
			}
		}
	}
	for id, t := range out {
		t.Spent = spent[id]
		t.Reserved.Tokens += held[id].Tokens
		t.Reserved.Micros += held[id].Micros
		t.PeriodSpent = t.Spent
		if !t.ResetsAt.IsZero() {
			g.tenantsMu.RLock()
			ts := g.tenants[id]
			g.tenantsMu.RUnlock()
			ts.mu.Lock()
			start := ts.start
			ts.mu.Unlock()
			if t.PeriodSpent, err = g.st.TenantPeriodSpend(ctx, id, start); err != nil {
				return nil, fmt.Errorf("tenant totals: %w", err)
			}
		}
		out[id] = t
	}
	return withRatios(), nil
}
