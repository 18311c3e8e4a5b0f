package policy

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/tailgate-dev/tailgate/data"
)

// UnpricedBudget is a tenant's money budget that does not limit everything
// the tenant may use: a model without a price costs nothing, so its
// requests never count against a money budget.
type UnpricedBudget struct {
	Tenant       string
	BudgetMicros int64
	// Models are the models the tenant's keys name that have no price;
	// empty when the problem is that no model at all has one.
	Models []string
	// Never is set when no model the tenant may use has a price: the
	// budget can never be reached, which is a configuration error rather
	// than a free model beside priced ones.
	Never bool
}

func (u *UnpricedBudget) Error() string {
	budget := strconv.FormatFloat(float64(u.BudgetMicros)/1e6, 'f', -1, 64)
	switch {
	case u.Never && len(u.Models) == 0:
		return fmt.Sprintf("tenant %q has a money budget (%s) but no model has a price, so it is never reached: "+
			"give its models a price (--price MODEL=IN,OUT or models.MODEL.price in --config) or give the tenant a token budget instead",
			u.Tenant, budget)
	case u.Never:
		return fmt.Sprintf("tenant %q has a money budget (%s) but none of the models its keys may use has a price (%s), so it is never reached: "+
			"give them a price (--price MODEL=IN,OUT or models.MODEL.price in --config) or give the tenant a token budget instead",
			u.Tenant, budget, strings.Join(u.Models, ", "))
	}
	return fmt.Sprintf("tenant %q has a money budget (%s) that does not limit %s: no price, so its requests are free "+
		"(--price MODEL=IN,OUT or models.MODEL.price in --config)", u.Tenant, budget, strings.Join(u.Models, ", "))
}

// costs reports whether a request for model can cost anything.
func (g *Gate) costs(model string) bool {
	p := g.price(model)
	return p.InputMicrosPerM > 0 || p.OutputMicrosPerM > 0
}

// anyCosts reports whether some model has a price.
func (g *Gate) anyCosts() bool {
	if g.defPr.InputMicrosPerM > 0 || g.defPr.OutputMicrosPerM > 0 {
		return true
	}
	for m := range g.prices {
		if g.costs(m) {
			return true
		}
	}
	return false
}

// unpriced checks one tenant's money budget against the models its keys
// allow (each key's list; an empty list allows every model). It returns nil
// when there is no money budget, no key, or every model named has a price.
// A key that allows every model counts as priced when some model has a
// price: the others are free by configuration.
func (g *Gate) unpriced(tenant string, budgetMicros int64, keyModels [][]string) *UnpricedBudget {
	if budgetMicros <= 0 || len(keyModels) == 0 {
		return nil
	}
	u := &UnpricedBudget{Tenant: tenant, BudgetMicros: budgetMicros}
	priced := false
	for _, models := range keyModels {
		if len(models) == 0 {
			priced = priced || g.anyCosts()
			continue
		}
		for _, m := range models {
			if g.costs(m) {
				priced = true
			} else if !slices.Contains(u.Models, m) {
				u.Models = append(u.Models, m)
			}
		}
	}
	slices.Sort(u.Models)
	u.Never = !priced
	if !u.Never && len(u.Models) == 0 {
		return nil
	}
	return u
}

// UnpricedBudgets checks every tenant's money budget against the prices
// (see [UnpricedBudget]); revoked keys do not count. A gateway runs it when
// it starts: an entry with Never set is a budget that would silently never
// be enforced.
func (g *Gate) UnpricedBudgets(ctx context.Context) ([]*UnpricedBudget, error) {
	tenants, err := g.st.Tenants(ctx)
	if err != nil {
		return nil, fmt.Errorf("check budgets: %w", err)
	}
	keys, err := g.st.Keys(ctx, "")
	if err != nil {
		return nil, fmt.Errorf("check budgets: %w", err)
	}
	byTenant := map[int64][][]string{}
	for _, k := range keys {
		if !k.Revoked() {
			byTenant[k.Tenant.ID] = append(byTenant[k.Tenant.ID], k.Models)
		}
	}
	var out []*UnpricedBudget
	for _, t := range tenants {
		if u := g.unpriced(t.Name, t.BudgetMicros, byTenant[t.ID]); u != nil {
			out = append(out, u)
		}
	}
	return out, nil
}

// CheckNewKey reports, as an [*UnpricedBudget] with Never set, whether
// creating the key o describes would leave its tenant with a money budget
// that can never be reached; nil if not.
func (g *Gate) CheckNewKey(ctx context.Context, o KeyOptions) error {
	return g.checkBudget(ctx, o.Tenant, o.BudgetMicros, [][]string{o.Models})
}

// CheckBudget reports, as an [*UnpricedBudget] with Never set, whether
// giving the tenant the money budget micros would make a budget that can
// never be reached; nil if not.
func (g *Gate) CheckBudget(ctx context.Context, tenant string, micros int64) error {
	return g.checkBudget(ctx, tenant, &micros, nil)
}

// checkBudget checks the tenant's money budget (micros, or the stored one
// if nil) against the models of its active keys and of the keys in extra.
func (g *Gate) checkBudget(ctx context.Context, tenant string, micros *int64, extra [][]string) error {
	var budget int64
	var keyModels [][]string
	t, err := g.st.TenantByName(ctx, tenant)
	switch {
	case errors.Is(err, data.ErrNotFound):
	case err != nil:
		return fmt.Errorf("check budget: %w", err)
	default:
		budget = t.BudgetMicros
		keys, err := g.st.Keys(ctx, t.Name)
		if err != nil {
			return fmt.Errorf("check budget: %w", err)
		}
		for _, k := range keys {
			if !k.Revoked() {
				keyModels = append(keyModels, k.Models)
			}
		}
	}
	if micros != nil {
		budget = *micros
	}
	if u := g.unpriced(tenant, budget, append(keyModels, extra...)); u != nil && u.Never {
		return u
	}
	return nil
}

// reportUnpriced logs the money budgets that do not limit everything their
// tenant may use, each once while it lasts: at start the gateway reports
// them itself, and Run calls this after a budget or key changed.
func (g *Gate) reportUnpriced(ctx context.Context, log bool) error {
	found, err := g.UnpricedBudgets(ctx)
	if err != nil {
		return err
	}
	now := make(map[string]bool, len(found))
	for _, u := range found {
		msg := u.Error()
		now[msg] = true
		if log && !g.reported[msg] {
			g.log.Warn("money budget not enforced on every model: " + msg)
		}
	}
	g.reported = now
	return nil
}

// maxUnpricedNotes bounds the (tenant, model) pairs noteUnpriced remembers.
const maxUnpricedNotes = 1024

// noteUnpriced warns, once per tenant and model, that a request of a
// tenant with a money budget was admitted for a model without a price: a
// key that allows every model reaches models the configuration may not
// have priced.
func (g *Gate) noteUnpriced(tenant, model string, budgetMicros int64) {
	key := tenant + "\x00" + model
	if _, seen := g.unpricedNotes.Load(key); seen || g.unpricedCount.Load() >= maxUnpricedNotes {
		return
	}
	if _, seen := g.unpricedNotes.LoadOrStore(key, struct{}{}); seen {
		return
	}
	g.unpricedCount.Add(1)
	u := &UnpricedBudget{Tenant: tenant, BudgetMicros: budgetMicros, Models: []string{model}}
	g.log.Warn("money budget not enforced on every model: " + u.Error())
}
