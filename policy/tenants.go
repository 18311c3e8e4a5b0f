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
