package policy

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Collector returns the tenants' spend and budgets as metrics, read from
// the Gate's own state when scraped (no query to the store). The tenant
// label is the tenant's name, which an operator chose; never a key.
//
// Spent counts only ever grow (the ledger's total at start plus what
// settled since), so they are counters: rate() of the cost one is a
// tenant's spend per second. A budget of 0 (none) has no series.
func (g *Gate) Collector() prometheus.Collector { return tenantCollector{g} }

var (
	spentMicrosDesc = prometheus.NewDesc("tailgate_tenant_spent_micros_total",
		"Cost settled for the tenant, in millionths of the price currency (prices are per million tokens).", []string{"tenant"}, nil)
	spentTokensDesc = prometheus.NewDesc("tailgate_tenant_spent_tokens_total",
		"Tokens (prompt and completion) settled for the tenant.", []string{"tenant"}, nil)
	budgetMicrosDesc = prometheus.NewDesc("tailgate_tenant_budget_micros",
		"The tenant's cost budget in millionths of the price currency (absent: none).", []string{"tenant"}, nil)
	budgetTokensDesc = prometheus.NewDesc("tailgate_tenant_budget_tokens",
		"The tenant's token budget (absent: none).", []string{"tenant"}, nil)
	budgetUsedDesc = prometheus.NewDesc("tailgate_budget_used_ratio",
		"Share of the tenant's budget used in its current period (the larger of its token and cost budgets' shares; 1: used up), as measured every few seconds (absent: no budget).", []string{"tenant"}, nil)
	budgetAlertDesc = prometheus.NewDesc("tailgate_budget_alert_ratio",
		"The tenant's soft threshold as a share of its budget (compare with tailgate_budget_used_ratio; absent: no budget).", []string{"tenant"}, nil)
)

type tenantCollector struct{ g *Gate }

// Describe implements prometheus.Collector.
func (c tenantCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{spentMicrosDesc, spentTokensDesc, budgetMicrosDesc, budgetTokensDesc, budgetUsedDesc, budgetAlertDesc} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c tenantCollector) Collect(ch chan<- prometheus.Metric) {
	c.g.tenantsMu.RLock()
	states := make([]*tenantState, 0, len(c.g.tenants))
	for _, ts := range c.g.tenants {
		states = append(states, ts)
	}
	c.g.tenantsMu.RUnlock()
	for _, ts := range states {
		ts.mu.Lock()
		name, spent, bTokens, bMicros := ts.name, ts.spent, ts.budgetTokens, ts.budgetMicros
		used, alert := ts.usedRatio, ts.alertPercent
		ts.mu.Unlock()
		if bTokens > 0 || bMicros > 0 {
			ch <- prometheus.MustNewConstMetric(budgetUsedDesc, prometheus.GaugeValue, used, name)
			ch <- prometheus.MustNewConstMetric(budgetAlertDesc, prometheus.GaugeValue, float64(alert)/100, name)
		}
		ch <- prometheus.MustNewConstMetric(spentMicrosDesc, prometheus.CounterValue, float64(spent.Micros), name)
		ch <- prometheus.MustNewConstMetric(spentTokensDesc, prometheus.CounterValue, float64(spent.Tokens), name)
		if bMicros > 0 {
			ch <- prometheus.MustNewConstMetric(budgetMicrosDesc, prometheus.GaugeValue, float64(bMicros), name)
		}
		if bTokens > 0 {
			ch <- prometheus.MustNewConstMetric(budgetTokensDesc, prometheus.GaugeValue, float64(bTokens), name)
		}
	}
}
