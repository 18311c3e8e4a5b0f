package policy

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"tailgate/data"
)

// SetBudget changes the budget of the existing tenant called name: tokens
// and micros, when not nil, replace that part of it (0 = unlimited). A
// running gateway applies the change within its poll interval, to the next
// request. An unknown tenant is data.ErrNotFound (wrapped): a typo must not
// create a tenant.
func SetBudget(ctx context.Context, st *data.Store, name string, tokens, micros *int64) (data.Tenant, error) {
	name = strings.TrimSpace(name)
	switch {
	case name == "":
		return data.Tenant{}, errors.New("set budget: tenant name required")
	case tokens != nil && *tokens < 0, micros != nil && *micros < 0:
		return data.Tenant{}, errors.New("set budget: negative budget")
	case tokens == nil && micros == nil:
		return data.Tenant{}, errors.New("set budget: nothing to change")
	}
	t, err := st.TenantByName(ctx, name)
	if err != nil {
		return data.Tenant{}, fmt.Errorf("set budget: %w", err)
	}
	if tokens != nil {
		t.BudgetTokens = *tokens
	}
	if micros != nil {
		t.BudgetMicros = *micros
	}
	if err := st.SetTenantBudget(ctx, t.ID, t.BudgetTokens, t.BudgetMicros); err != nil {
		return data.Tenant{}, fmt.Errorf("set budget: %w", err)
	}
	return t, nil
}

// TenantTotal is what a tenant has spent and what is reserved of its budget
// by requests admitted and not yet settled.
type TenantTotal struct {
	Spent, Reserved data.Spend
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
	g.tenantsMu.RLock()
	for id, ts := range g.tenants {
		ts.mu.Lock()
		t := TenantTotal{Spent: ts.spent, Reserved: ts.reserved}
		if g.shared != nil && (ts.budgetTokens > 0 || ts.budgetMicros > 0) {
			t.Reserved = data.Spend{} // held in the database, read below
		}
		ts.mu.Unlock()
		out[id] = t
	}
	g.tenantsMu.RUnlock()
	if g.shared == nil {
		return out, nil
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
		out[id] = t
	}
	return out, nil
}
