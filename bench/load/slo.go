package load

import (
	"context"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"text/tabwriter"
)

// Objective is a latency budget: Target (e.g. 0.95) of the requests of
// Kind ("stream" or "json") finish Stage within BudgetMS. Name is the
// percentile it was given as ("p95"). The JSON shape is the gateway's
// (GET /admin/v1/slo).
type Objective struct {
	Kind     string  `json:"kind"`
	Stage    string  `json:"stage"`
	Name     string  `json:"objective"`
	Target   float64 `json:"target"`
	BudgetMS float64 `json:"budget_ms"`
}

// SLO is the set of budgets a run is checked against: Default for every
// model, Models for the models named.
type SLO struct {
	Default []Objective            `json:"default_objectives"`
	Models  map[string][]Objective `json:"model_objectives"`
}

// For returns the objectives that hold for model.
func (s *SLO) For(model string) []Objective {
	if objs, ok := s.Models[model]; ok {
		return objs
	}
	return s.Default
}

// SLOCheck is one objective checked on one phase (or the whole run).
// Result is PASS, FAIL, or "no data" when the phase had no request of the
// kind with the stage measured.
type SLOCheck struct {
	Phase string `json:"phase"`
	// Source is the source label the check is limited to; "" for every
	// request. With more than one source in a run, each phase is checked
	// for every source too: one global percentile hides a slow geography.
	Source string `json:"source,omitempty"`
	Objective
	Requests    int     `json:"requests"`
	Within      int     `json:"within"`
	WithinRatio float64 `json:"within_ratio"`
	// ValueMS is the phase's value at the objective's percentile (nearest
	// rank over the requests that have one; a failed request counts over
	// budget in WithinRatio but has no value).
	ValueMS *float64 `json:"value_ms"`
	Result  string   `json:"result"`
}

// Results of an SLOCheck.
const (
	Pass   = "PASS"
	Fail   = "FAIL"
	NoData = "no data"
)

// sloValue is the value of stage for r as the check reads it: counted
// says whether r counts at all, and a counted request without a value
// (it failed before its answer began) is over budget. The end-to-end
// stages are the client's own measure (ttft for streams, total for JSON
// answers); the others are the gateway's stage timings.
func sloValue(r *Record, kind, stage string) (v float64, has, counted bool) {
	end := stage == "ttft" && kind == "stream" || stage == "total" && kind == "json"
	if !r.OK() {
		// The bench's own overload is not the target's doing, and a stream
		// that broke after its first token had its TTFT.
		return 0, false, end && r.ErrStage != Midstream && r.ErrClass != ErrOverload
	}
	switch {
	case !end:
		v, ok := r.StageMS[stage]
		return v, ok, ok
	case stage == "ttft" && r.TTFT >= 0:
		return ms(r.TTFT), true, true
	case stage == "total" && r.Total >= 0:
		return ms(r.Total), true, true
	}
	return 0, false, false
}

// checkSLO checks objs on every phase of rep and on the whole run, and,
// when the requests carry more than one source label, on each source of
// each phase and of the run as well.
func checkSLO(rep *Report, objs []Objective) []SLOCheck {
	byPhase := make([][]*Record, len(rep.Phases))
	all := make([]*Record, 0, len(rep.Requests))
	sources := map[string]bool{}
	for i := range rep.Requests {
		r := &rep.Requests[i]
		if r.Span >= 0 && r.Span < len(byPhase) {
			byPhase[r.Span] = append(byPhase[r.Span], r)
		}
		all = append(all, r)
		if r.Source != "" {
			sources[r.Source] = true
		}
	}
	perSource := []string{""}
	if len(sources) > 1 {
		perSource = append(perSource, slices.Sorted(maps.Keys(sources))...)
	}
	var out []SLOCheck
	check := func(phase string, recs []*Record) {
		for _, src := range perSource {
			out = append(out, checkObjectives(phase, src, recs, objs)...)
		}
	}
	for i, p := range rep.Phases {
		check(p.Name, byPhase[i])
	}
	check("all", all)
	return out
}

// checkObjectives checks objs on recs, limited to the requests of source
// unless it is "".
func checkObjectives(phase, source string, recs []*Record, objs []Objective) []SLOCheck {
	var out []SLOCheck
	for _, o := range objs {
		c := SLOCheck{Phase: phase, Source: source, Objective: o, Result: NoData}
		var vals []float64
		for _, r := range recs {
			if r.Stream != (o.Kind == "stream") || source != "" && r.Source != source {
				continue
			}
			v, has, counted := sloValue(r, o.Kind, o.Stage)
			if !counted {
				continue
			}
			c.Requests++
			if !has {
				continue
			}
			vals = append(vals, v)
			if v <= o.BudgetMS {
				c.Within++
			}
		}
		if c.Requests > 0 {
			c.WithinRatio = float64(c.Within) / float64(c.Requests)
			c.Result = Pass
			if c.WithinRatio < o.Target {
				c.Result = Fail
			}
		}
		if len(vals) > 0 {
			slices.Sort(vals)
			v := Percentile(vals, o.Target*100)
			c.ValueMS = &v
		}
		out = append(out, c)
	}
	return out
}

// sloFailures counts the FAIL checks of the reports.
func sloFailures(reports []*Report) (fails, checks int) {
	for _, r := range reports {
		for _, c := range r.SLO {
			checks++
			if c.Result == Fail {
				fails++
			}
		}
	}
	return fails, checks
}

// writeSLO writes the checks as a table, FAIL rows marked.
func (r *Report) writeSLO(b *strings.Builder) {
	if len(r.SLO) == 0 {
		return
	}
	fmt.Fprintf(b, "\n== latency budgets (%s) ==\n", r.SLOFrom)
	tw := tabwriter.NewWriter(b, 0, 4, 2, ' ', 0)
	bySource := slices.ContainsFunc(r.SLO, func(c SLOCheck) bool { return c.Source != "" })
	if bySource {
		fmt.Fprint(tw, "source\t")
	}
	fmt.Fprintln(tw, "phase\tkind\tstage\tobjective\tbudget\tvalue\twithin\treqs\tresult")
	for _, c := range r.SLO {
		val := "–"
		if c.ValueMS != nil {
			val = fmtMS(*c.ValueMS)
		}
		within := "–"
		if c.Requests > 0 {
			within = fmt.Sprintf("%.1f%% (≥ %s%%)", 100*c.WithinRatio, trimFloat(math.Round(c.Target*1000)/10))
		}
		if bySource {
			src := c.Source
			if src == "" {
				src = "(all)"
			}
			fmt.Fprintf(tw, "%s\t", src)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s ms\t%s\t%s\t%d\t%s\n", c.Phase, c.Kind, c.Stage, c.Name, trimFloat(c.BudgetMS), val, within, c.Requests, c.Result)
	}
	tw.Flush()
	fails := 0
	var failed []string // sources with a FAIL
	for _, c := range r.SLO {
		if c.Result == Fail {
			fails++
			if c.Source != "" && !slices.Contains(failed, c.Source) {
				failed = append(failed, c.Source)
			}
		}
	}
	if fails > 0 {
		fmt.Fprintf(b, "  FAIL: %d of %d checks over budget\n", fails, len(r.SLO))
		if len(failed) > 0 {
			fmt.Fprintf(b, "  FAIL: source %s over budget\n", strings.Join(failed, ", "))
		}
	} else {
		fmt.Fprintf(b, "  PASS: %d checks within budget\n", len(r.SLO))
	}
	b.WriteString("  ttft (streams) and total (JSON answers) are the client's own times, failures before the answer count over budget; the other stages are the gateway's\n")
}

// gatewaySLO reads the budgets in force from a tailgate gateway's admin API.
func gatewaySLO(ctx context.Context, t Target) (*SLO, error) {
	a := newAdmin(t.AdminURL, t.AdminToken, "")
	if a == nil {
		return nil, fmt.Errorf("--slo-from-gateway: %s has no admin URL (--admin and --admin-token-file)", t.Label)
	}
	var s SLO
	if err := a.get(ctx, "/admin/v1/slo", &s); err != nil {
		return nil, fmt.Errorf("--slo-from-gateway: %w", err)
	}
	if len(s.Default) == 0 && len(s.Models) == 0 {
		return nil, fmt.Errorf("--slo-from-gateway: %s/admin/v1/slo lists no objectives (not a tailgate gateway with latency budgets?)", t.AdminURL)
	}
	return &s, nil
}
