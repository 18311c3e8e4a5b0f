package policy

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/tailgate-dev/tailgate/data"
)

// BudgetAlert says that a tenant's budget use crossed a threshold in a
// period: its soft threshold (the tenant's alert percent) or 100 (used
// up).
type BudgetAlert struct {
	Tenant   string
	TenantID int64
	// Threshold is the percent crossed; UsedPercent the use measured, of
	// the budget named by Budget ("tokens" or "cost"), Used and Limit the
	// amounts in its unit.
	Threshold   int64
	UsedPercent float64
	Budget      string
	Used, Limit int64
	// Period is the budget's period ("" for a lifetime budget), which
	// started at PeriodStart and resets at ResetsAt (both zero for a
	// lifetime budget).
	Period                string
	PeriodStart, ResetsAt time.Time
	// At is when the watch measured it.
	At time.Time
}

// budgetUse is a tenant's budget as the watch saw it.
type budgetUse struct {
	id                         int64
	ts                         *tenantState
	name, period               string
	start, end                 time.Time
	budgetTokens, budgetMicros int64
	alertPercent               int64
	spent                      data.Spend
}

// WatchBudgets measures each tenant's budget use in its current period —
// what tailgate_budget_used_ratio reports — and reports the thresholds
// crossed to Config.OnBudgetAlert, once per tenant, period and threshold.
// Run calls it every BudgetWatchInterval; tests call it with their clock.
// On SQLite the Gate's own figures are the whole (no query); on a database
// gateways share, the spend is the database's.
func (g *Gate) WatchBudgets(ctx context.Context) error {
	now := g.now()
	var uses []budgetUse
	g.tenantsMu.RLock()
	for id, ts := range g.tenants {
		ts.mu.Lock()
		if ts.budgetTokens > 0 || ts.budgetMicros > 0 {
			ts.roll(now)
			uses = append(uses, budgetUse{id: id, ts: ts, name: ts.name, period: ts.period, start: ts.start, end: ts.resets(),
				budgetTokens: ts.budgetTokens, budgetMicros: ts.budgetMicros, alertPercent: ts.alertPercent, spent: ts.counted()})
		} else {
			ts.usedRatio = 0
		}
		ts.mu.Unlock()
	}
	g.tenantsMu.RUnlock()
	var errs []error
	for _, u := range uses {
		if g.shared != nil {
			sp, err := g.st.TenantPeriodSpend(ctx, u.id, u.start)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			u.spent = sp
		}
		budget, used, limit, ratio := budgetUsed(u.spent, u.budgetTokens, u.budgetMicros)
		u.ts.mu.Lock()
		u.ts.usedRatio = ratio
		if !u.ts.alertedStart.Equal(u.start) || u.ts.alerted == nil {
			u.ts.alertedStart, u.ts.alerted = u.start, make(map[int64]bool)
		}
		var due []int64
		for _, th := range []int64{u.alertPercent, 100} {
			if th > 0 && ratio*100 >= float64(th) && !u.ts.alerted[th] {
				due = append(due, th)
			}
		}
		u.ts.mu.Unlock()
		if g.onAlert == nil {
			continue
		}
		for _, th := range due {
			claimed, err := g.st.ClaimBudgetAlert(ctx, u.id, u.start, th)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			u.ts.mu.Lock()
			if u.ts.alertedStart.Equal(u.start) {
				u.ts.alerted[th] = true
			}
			u.ts.mu.Unlock()
			if claimed {
				g.onAlert(BudgetAlert{Tenant: u.name, TenantID: u.id, Threshold: th, UsedPercent: 100 * ratio, Budget: budget,
					Used: used, Limit: limit, Period: u.period, PeriodStart: u.start, ResetsAt: u.end, At: now})
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("watch budgets: %w", err)
	}
	return nil
}

// budgetUsed is which budget (tokens or cost) spent has used the larger
// share of, what it used of it, its limit and that share.
func budgetUsed(spent data.Spend, budgetTokens, budgetMicros int64) (budget string, used, limit int64, ratio float64) {
	budget, used, limit = "tokens", spent.Tokens, budgetTokens
	ratio = ratioOf(spent.Tokens, budgetTokens)
	if r := ratioOf(spent.Micros, budgetMicros); r > ratio || budgetTokens <= 0 {
		budget, used, limit, ratio = "cost", spent.Micros, budgetMicros, r
	}
	return budget, used, limit, ratio
}

func ratioOf(used, budget int64) float64 {
	if budget <= 0 {
		return 0
	}
	return float64(used) / float64(budget)
}
