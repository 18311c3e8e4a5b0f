package slo

import "github.com/prometheus/client_golang/prometheus"

// Collector exports the evaluation as gauges, computed when scraped (the
// request path pays nothing for them). Labels are bounded: model (the
// registry's), kind, stage, objective (the configured percentiles) and
// window; sources are summed (the admin API has them per source).
func (e *Evaluator) Collector() prometheus.Collector { return collector{e} }

type collector struct{ e *Evaluator }

var (
	objLabels  = []string{"model", "kind", "stage", "objective"}
	winLabels  = append(append([]string{}, objLabels...), "window")
	withinDesc = prometheus.NewDesc("tailgate_slo_within_budget_ratio",
		"Share of requests whose stage finished within its budget, per window (absent when the window had no request).", winLabels, nil)
	burnDesc = prometheus.NewDesc("tailgate_slo_burn_rate",
		"Error budget burn rate per window: share over budget / (1 - target); 1 spends the budget exactly. Page when 1h and 5m exceed 14.4, ticket when 6h and 30m exceed 6.", winLabels, nil)
	budgetDesc = prometheus.NewDesc("tailgate_slo_budget_seconds", "The stage's latency budget.", objLabels, nil)
	targetDesc = prometheus.NewDesc("tailgate_slo_target_ratio", "Share of requests that must finish the stage within its budget.", objLabels, nil)
	okDesc     = prometheus.NewDesc("tailgate_slo_ok", "1 while the objective holds over the shortest window and no burn-rate alert fires, else 0.", objLabels, nil)
)

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{withinDesc, burnDesc, budgetDesc, targetDesc, okDesc} {
		ch <- d
	}
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	for _, r := range c.e.Evaluate(false) {
		lv := []string{r.Model, string(r.Kind), r.Stage, r.Objective}
		ch <- prometheus.MustNewConstMetric(budgetDesc, prometheus.GaugeValue, r.BudgetMS/1000, lv...)
		ch <- prometheus.MustNewConstMetric(targetDesc, prometheus.GaugeValue, r.Target, lv...)
		ok := 0.0
		if r.OK {
			ok = 1
		}
		ch <- prometheus.MustNewConstMetric(okDesc, prometheus.GaugeValue, ok, lv...)
		for _, w := range Windows {
			wl := append(lv[:len(lv):len(lv)], w.Name)
			ch <- prometheus.MustNewConstMetric(burnDesc, prometheus.GaugeValue, r.Burn[w.Name], wl...)
			if v := r.within[w.Name]; v != nil {
				ch <- prometheus.MustNewConstMetric(withinDesc, prometheus.GaugeValue, *v, wl...)
			}
		}
	}
}
