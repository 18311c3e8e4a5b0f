package load

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"text/tabwriter"
)

// mainFanout runs the fan-out workload: the scenario's arms, or with
// Fanout.Sweep the hedge threshold procedure; in a scenario on fleets it
// starts, else against --target.
func mainFanout(ctx context.Context, o Options) error {
	switch {
	case o.Scenario != "" && o.A.Target != "":
		return errors.New("give --scenario or --target, not both")
	case o.Scenario != "" && o.Scenario != "fanout":
		return fmt.Errorf("--sweep-hedge runs the fanout workload: give --scenario fanout (or none), not %q", o.Scenario)
	case o.Compare:
		return errors.New("--compare does not apply to the fanout workload: it compares its designs by itself")
	}
	if o.Scenario == "" && o.A.Target == "" {
		o.Scenario = "fanout"
	}
	if o.Fanout.Sweep {
		return runSweep(ctx, o)
	}
	return runFanout(ctx, o)
}

// sweepRow is one hedge setting's outcome.
type sweepRow struct {
	Percentile, Budget float64 // 0: the deployment's own setting
	Arm                fanoutArm
}

// runSweep runs the threshold procedure of the seed paper: the same seeded
// fan-out (decomposed, streamed) without hedging and at each percentile ×
// budget, then prints the trade-off and the setting it recommends. Against
// a deployment it cannot set the gateway's flags: it measures the
// no-hedge baseline (x-tailgate-hedge: off) against the deployment's own
// setting and says so.
func runSweep(ctx context.Context, o Options) error {
	b := &fanoutBench{o: o, f: o.Fanout.withDefaults(o.Seed), progress: o.Progress}
	b.f.Modes = []string{"stream"}
	if err := b.f.validate(); err != nil {
		return err
	}
	w := orWriter(o.Stdout)
	seed := b.f.Seeds[0]
	docs := fanoutDocs(seed, b.f.Docs, b.f.MinParts, b.f.MaxParts)
	fmt.Fprintf(w, "hedge sweep: %d documents of %d–%d parts (seed %d) at %g documents/s, decomposed and streamed\n",
		b.f.Docs, b.f.MinParts, b.f.MaxParts, seed, b.f.DocRate)
	var base fanoutArm
	var rows []sweepRow
	if o.Scenario == "" {
		side, err := b.targetSide(ctx)
		if err != nil {
			return err
		}
		side.client.warm(ctx, seed, b.f.WarmParts)
		base = side.measure(ctx, b, docs, seed, "stream", armDecomposed)
		rows = append(rows, sweepRow{Arm: side.measure(ctx, b, docs, seed, "stream", armHedged)})
		fmt.Fprintln(w, "against a deployment the bench cannot change the gateway's --hedge-percentile and --hedge-budget:")
		fmt.Fprintln(w, "the baseline sends x-tailgate-hedge: off, the other row is the deployment's own setting. To sweep,")
		fmt.Fprintln(w, "restart the gateway at each setting and run this again, or run the sweep with --scenario fanout.")
	} else {
		side, closeFleet, err := b.fleetSide(ctx, "--hedge=false")
		if err != nil {
			return err
		}
		side.client.warm(ctx, seed, b.f.WarmParts)
		base = side.measure(ctx, b, docs, seed, "stream", armDecomposed)
		closeFleet()
		for _, p := range b.f.Percentiles {
			for _, budget := range b.f.Budgets {
				if ctx.Err() != nil {
					break
				}
				side, closeFleet, err := b.fleetSide(ctx, fmt.Sprintf("--hedge-percentile %g --hedge-budget %g", p, budget))
				if err != nil {
					return err
				}
				side.client.warm(ctx, seed, b.f.WarmParts)
				rows = append(rows, sweepRow{Percentile: p, Budget: budget, Arm: side.measure(ctx, b, docs, seed, "stream", armHedged)})
				closeFleet()
			}
		}
	}
	writeSweep(w, base, rows)
	return ctx.Err()
}

// recommend returns the cheapest row (fewest extra tokens, then requests)
// whose P95 cut reaches 90 % of the best cut, or -1 when no row cut P95.
func recommend(base fanoutArm, rows []sweepRow) int {
	best := 0.0
	for _, r := range rows {
		best = max(best, base.Docs.P95/r.Arm.Docs.P95)
	}
	pick := -1
	for i, r := range rows {
		cut := base.Docs.P95 / r.Arm.Docs.P95
		if !(cut > 1) || cut < 0.9*best {
			continue
		}
		if pick < 0 || cost(r.Arm) < cost(rows[pick].Arm) {
			pick = i
		}
	}
	return pick
}

// cost orders settings by extra tokens, then extra requests; unmeasured
// costs come last.
func cost(a fanoutArm) float64 {
	if math.IsNaN(a.ExtraTokens) {
		return math.Inf(1)
	}
	return a.ExtraTokens + a.ExtraRequests/1000
}

// writeSweep prints the trade-off table and the recommendation.
func writeSweep(w io.Writer, base fanoutArm, rows []sweepRow) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "hedge percentile\tbudget\tdocs\terrors\tp95 ms\tp99 ms\tp95 cut\tp99 cut\textra tokens\textra requests\t")
	errs := func(a fanoutArm) int {
		n := 0
		for _, v := range a.Errors {
			n += v
		}
		return n
	}
	fmt.Fprintf(tw, "no hedge\t-\t%d\t%d\t%s\t%s\t-\t-\t-\t-\t\n", base.Docs.N, errs(base), fmtMS(base.Docs.P95), fmtMS(base.Docs.P99))
	setting := func(r sweepRow) (string, string) {
		if r.Percentile == 0 {
			return "deployed", "deployed"
		}
		return fmt.Sprintf("p%g", 100*r.Percentile), fmt.Sprintf("%g%%", 100*r.Budget)
	}
	for _, r := range rows {
		p, bud := setting(r)
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%s\t÷%.2f\t÷%.2f\t%s\t%s\t\n", p, bud, r.Arm.Docs.N, errs(r.Arm),
			fmtMS(r.Arm.Docs.P95), fmtMS(r.Arm.Docs.P99), base.Docs.P95/r.Arm.Docs.P95, base.Docs.P99/r.Arm.Docs.P99,
			sharePct(r.Arm.ExtraTokens), sharePct(r.Arm.ExtraRequests))
	}
	_ = tw.Flush()
	i := recommend(base, rows)
	if i < 0 {
		fmt.Fprintln(w, "recommended: none — no setting cut document P95; hedging does not pay on this workload")
		return
	}
	r := rows[i]
	flags := "the deployment's own --hedge-percentile and --hedge-budget"
	if r.Percentile != 0 {
		flags = fmt.Sprintf("--hedge-percentile %g --hedge-budget %g", r.Percentile, r.Budget)
	}
	fmt.Fprintf(w, "recommended: %s (the cheapest setting within 90%% of the best P95 cut: ÷%.2f at %s extra tokens)\n",
		flags, base.Docs.P95/r.Arm.Docs.P95, sharePct(r.Arm.ExtraTokens))
}
