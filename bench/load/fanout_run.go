package load

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"maps"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"text/tabwriter"
	"time"
)

// fanoutSimArgs is the fan-out scenario's fleet, scaled 1:15 from the seed
// paper's replay: a heavy tail of stalls (3 % of requests ×4), 12 ms a
// token, latency fixed by each request's content so the fleet without
// hedging and the fleet with it see the same stalls on each replica.
//
// Its gateway lets every batch line run at once (--batch-concurrency), so
// the Batch API arms measure the executor, not a queue behind its caps.
var fanoutGatewayArgs = "--batch-concurrency 1024 --batch-tenant-concurrency 1024"

var fanoutSimArgs = []string{"--sim-ttft", "60ms", "--sim-tpot", "12ms", "--sim-stall-prob", "0.03",
	"--sim-stall-factor", "4", "--sim-max-seqs", "64", "--sim-seeded-latency"}

// Arm names, in report order.
const (
	armMonolithic = "monolithic"
	armDecomposed = "decomposed"
	armHedged     = "decomposed+hedge"
)

// fanoutArm is one measured design in one mode.
type fanoutArm struct {
	Mode, Design string
	Docs         Summary
	Errors       map[string]int
	// Hedge figures from the gateway's metrics over the arm: extra tokens
	// (hedge overhead) as a share of prompt+completion tokens, hedges as a
	// share of first attempts; NaN when not measured.
	ExtraTokens, ExtraRequests float64
	// Skipped are the hedges not started over the arm, by reason
	// (tailgate_hedges_skipped_total): why stalled parts went unhedged.
	Skipped map[string]float64
	// Paced are the hedges started on decode pace over the arm, by outcome
	// (tailgate_pace_hedges_total: won, lost): JSON and batch parts whose
	// first token came in time and whose tokens then crawled.
	Paced map[string]float64
	// Graced are the hedged parts whose original's first token came first
	// and was held for a grace, by winner (tailgate_hedge_graces_total:
	// hedge, original).
	Graced map[string]float64
}

// gatewayCounts are the gateway counters the fan-out report reads.
type gatewayCounts struct {
	prompt, completion, overhead float64
	first, hedges                float64
	skipped                      map[string]float64 // by reason
	paced                        map[string]float64 // pace hedges by outcome
	graced                       map[string]float64 // graces by winner
}

// scrapeCounts reads the gateway's Prometheus metrics.
func scrapeCounts(ctx context.Context, adminURL, token string) (gatewayCounts, error) {
	c := gatewayCounts{skipped: map[string]float64{}, paced: map[string]float64{}, graced: map[string]float64{}}
	err := eachSample(ctx, adminURL, token, func(name, labels string, v float64) {
		switch {
		case name == "tailgate_tokens_total" && strings.Contains(labels, `kind="prompt"`):
			c.prompt += v
		case name == "tailgate_tokens_total" && strings.Contains(labels, `kind="completion"`):
			c.completion += v
		case name == "tailgate_tokens_total" && strings.Contains(labels, `kind="hedge_overhead"`):
			c.overhead += v
		case name == "tailgate_upstream_attempts_total" && strings.Contains(labels, `reason="first"`):
			c.first += v
		case name == "tailgate_upstream_attempts_total" && strings.Contains(labels, `reason="hedge"`):
			c.hedges += v
		case name == "tailgate_hedges_skipped_total":
			c.skipped[labelValue(labels, "reason")] += v
		case name == "tailgate_pace_hedges_total" && !strings.Contains(labels, `outcome="skipped"`):
			c.paced[labelValue(labels, "outcome")] += v
		case name == "tailgate_hedge_graces_total":
			c.graced[labelValue(labels, "winner")] += v
		}
	})
	return c, err
}

// eachSample calls fn with every labelled sample of the gateway's
// Prometheus metrics, in the order it lists them.
func eachSample(ctx context.Context, adminURL, token string, fn func(name, labels string, v float64)) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(adminURL, "/")+"/metrics", nil)
	if err != nil {
		return err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Do(req)
	if err != nil {
		return fmt.Errorf("gateway metrics: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("gateway metrics: status %d", resp.StatusCode)
	}
	sc := bufio.NewScanner(io.LimitReader(resp.Body, 64<<20))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		name, rest, ok := strings.Cut(sc.Text(), "{")
		if !ok {
			continue
		}
		labels, val, ok := strings.Cut(rest, "} ")
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(strings.Fields(val)[0], 64)
		if err != nil {
			continue
		}
		fn(name, labels, v)
	}
	return sc.Err()
}

// fanoutSide is a gateway the fan-out arms run against.
type fanoutSide struct {
	client             *fanoutClient
	adminURL, adminTok string
	// optOut: this gateway hedges, so its unhedged arms send
	// x-tailgate-hedge: off (a deployment, whose flags the bench cannot
	// change).
	optOut bool
}

// measure runs one arm and reads the gateway's counters around it.
func (s *fanoutSide) measure(ctx context.Context, b *fanoutBench, docs []doc, seed int64, mode, design string) fanoutArm {
	arm := fanoutArm{Mode: mode, Design: design, Errors: map[string]int{}, ExtraTokens: math.NaN(), ExtraRequests: math.NaN()}
	var before gatewayCounts
	var countsErr error
	if s.adminURL != "" {
		before, countsErr = scrapeCounts(ctx, s.adminURL, s.adminTok)
	}
	var done atomic.Int64
	progress := func() {
		if b.progress != nil {
			fmt.Fprintf(b.progress, "\rbench: %s %s: %d/%d documents ", mode, design, done.Add(1), len(docs))
		}
	}
	noHedge := design != armHedged && s.optOut
	res := s.client.runArm(ctx, docs, seed, b.f.DocRate, mode, design == armMonolithic, noHedge, progress)
	if b.progress != nil {
		fmt.Fprintln(b.progress)
	}
	var lat []float64
	for _, r := range res {
		if r.err != "" {
			arm.Errors[errClass(r.err)]++
			continue
		}
		lat = append(lat, r.ms)
	}
	arm.Docs = Summarize(lat)
	if s.adminURL != "" && countsErr == nil {
		if after, err := scrapeCounts(ctx, s.adminURL, s.adminTok); err == nil {
			if tok := (after.prompt - before.prompt) + (after.completion - before.completion); tok > 0 {
				arm.ExtraTokens = (after.overhead - before.overhead) / tok
			}
			if first := after.first - before.first; first > 0 {
				arm.ExtraRequests = (after.hedges - before.hedges) / first
			}
			for why, n := range after.skipped {
				if d := n - before.skipped[why]; d > 0 {
					if arm.Skipped == nil {
						arm.Skipped = map[string]float64{}
					}
					arm.Skipped[why] = d
				}
			}
			for outcome, n := range after.paced {
				if d := n - before.paced[outcome]; d > 0 {
					if arm.Paced == nil {
						arm.Paced = map[string]float64{}
					}
					arm.Paced[outcome] = d
				}
			}
			for winner, n := range after.graced {
				if d := n - before.graced[winner]; d > 0 {
					if arm.Graced == nil {
						arm.Graced = map[string]float64{}
					}
					arm.Graced[winner] = d
				}
			}
		}
	}
	return arm
}

// errClass keeps an error's class, not its details.
func errClass(s string) string {
	c, _, _ := strings.Cut(s, ":")
	c, _, _ = strings.Cut(c, "\n")
	return c
}

// fanoutBench is one fan-out invocation.
type fanoutBench struct {
	o        Options
	f        FanoutOptions
	progress io.Writer
}

// runFanout runs `bench --scenario fanout` (or --target with the fan-out
// workload): per seed, every mode's monolithic and decomposed arms without
// hedging, then the decomposed arms with it, and prints the tables.
func runFanout(ctx context.Context, o Options) error {
	b := &fanoutBench{o: o, f: o.Fanout.withDefaults(o.Seed), progress: o.Progress}
	if err := b.f.validate(); err != nil {
		return err
	}
	w := orWriter(o.Stdout)
	fmt.Fprintf(w, "fan-out: %d documents of %d–%d parts per arm at %g documents/s; a document takes its slowest part's time\n",
		b.f.Docs, b.f.MinParts, b.f.MaxParts, b.f.DocRate)
	var missed []string
	for _, seed := range b.f.Seeds {
		arms, err := b.runSeed(ctx, seed)
		if len(arms) > 0 {
			writeFanoutTable(w, seed, arms)
		}
		if err != nil {
			return err
		}
		if !fanoutDone(arms) {
			missed = append(missed, strconv.FormatInt(seed, 10))
		}
	}
	if len(missed) > 0 {
		fmt.Fprintf(w, "note: seed %s: the fan-out target (P95 ÷4.6 vs monolithic, ÷2.5 vs decomposed, ≤ 10%% extra tokens) is not met in every mode\n",
			strings.Join(missed, ", "))
	}
	return nil
}

func orWriter(w io.Writer) io.Writer {
	if w == nil {
		return io.Discard
	}
	return w
}

// runSeed measures every arm of one seed.
func (b *fanoutBench) runSeed(ctx context.Context, seed int64) ([]fanoutArm, error) {
	docs := fanoutDocs(seed, b.f.Docs, b.f.MinParts, b.f.MaxParts)
	var arms []fanoutArm
	if b.o.Scenario == "" {
		side, err := b.targetSide(ctx)
		if err != nil {
			return nil, err
		}
		side.client.warm(ctx, seed, b.f.WarmParts)
		for _, mode := range b.f.Modes {
			for _, design := range []string{armMonolithic, armDecomposed, armHedged} {
				if mode == "batch" && design != armHedged {
					continue // a batch line carries no headers: no opt-out
				}
				arms = append(arms, side.measure(ctx, b, docs, seed, mode, design))
			}
		}
		return arms, ctx.Err()
	}
	// Two fleets of the same seeds: without hedging, and as configured.
	for _, hedged := range []bool{false, true} {
		extra := ""
		if !hedged {
			extra = "--hedge=false"
		}
		side, closeFleet, err := b.fleetSide(ctx, extra)
		if err != nil {
			return arms, err
		}
		side.client.warm(ctx, seed, b.f.WarmParts)
		for _, mode := range b.f.Modes {
			designs := []string{armMonolithic, armDecomposed}
			if hedged {
				designs = []string{armHedged}
			}
			for _, design := range designs {
				arms = append(arms, side.measure(ctx, b, docs, seed, mode, design))
			}
		}
		closeFleet()
		if ctx.Err() != nil {
			return arms, ctx.Err()
		}
	}
	return arms, nil
}

// fleetSide starts the scenario's fleet with extra gateway flags.
func (b *fanoutBench) fleetSide(ctx context.Context, extraGateway string) (*fanoutSide, func(), error) {
	o := b.o
	bin := o.Binary
	if bin == "" {
		bb := &bench{opts: o}
		var err error
		if bin, err = bb.binary(); err != nil {
			return nil, nil, err
		}
	}
	fleet, err := StartLocal(ctx, LocalConfig{
		Binary: bin, Keep: o.Keep, Replicas: orDefault(o.Replicas, 4), Model: orDefault(o.A.Model, "tailgate-sim"),
		GatewayArgs:    strings.Fields(fanoutGatewayArgs + " " + o.A.GatewayArgs + " " + extraGateway),
		WorkerArgs:     append(append([]string{}, fanoutSimArgs...), strings.Fields(o.A.WorkerArgs)...),
		StartupTimeout: orDefault(o.StartupTimeout, time.Minute), Log: o.Stderr,
	})
	if err != nil {
		return nil, nil, err
	}
	t := fleet.Target()
	side := &fanoutSide{client: b.client(t.BaseURL, t.Key, orDefault(o.A.Model, "tailgate-sim")), adminURL: t.AdminURL, adminTok: t.AdminToken}
	return side, func() { fleet.Close() }, nil
}

// targetSide is the deployment named by --target.
func (b *fanoutBench) targetSide(ctx context.Context) (*fanoutSide, error) {
	o := b.o
	if err := o.A.check(0); err != nil {
		return nil, err
	}
	bb := &bench{opts: o.withDefaults(nil)}
	t, err := bb.target(o.A, 0)
	if err != nil {
		return nil, err
	}
	model := o.A.Model
	if model == "" {
		if model, err = firstModel(ctx, t); err != nil {
			return nil, err
		}
	}
	return &fanoutSide{client: b.client(t.BaseURL, t.Key, model), adminURL: t.AdminURL, adminTok: t.AdminToken, optOut: true}, nil
}

func (b *fanoutBench) client(base, key, model string) *fanoutClient {
	return &fanoutClient{hc: newHTTPClient(false, 0), base: strings.TrimSuffix(base, "/"), key: key, model: model,
		timeout: orDefault(b.o.Timeout, 60*time.Second)}
}

// find returns the arm of mode and design, nil if none ran.
func find(arms []fanoutArm, mode, design string) *fanoutArm {
	for i := range arms {
		if arms[i].Mode == mode && arms[i].Design == design {
			return &arms[i]
		}
	}
	return nil
}

// fanoutDone tells whether every mode that has all three arms reaches the
// issue's target.
func fanoutDone(arms []fanoutArm) bool {
	for _, a := range arms {
		if a.Design != armHedged {
			continue
		}
		mono, dec := find(arms, a.Mode, armMonolithic), find(arms, a.Mode, armDecomposed)
		if mono == nil || dec == nil {
			continue
		}
		if mono.Docs.P95/a.Docs.P95 < 4.6 || dec.Docs.P95/a.Docs.P95 < 2.5 || !(a.ExtraTokens <= 0.10) {
			return false
		}
	}
	return true
}

// writeFanoutTable prints one seed's arms: document latency per design and
// mode, the hedged arm's cuts against the others, and what hedging cost.
func writeFanoutTable(w io.Writer, seed int64, arms []fanoutArm) {
	fmt.Fprintf(w, "\nseed %d — document latency (ms), from its start to its slowest part's answer\n", seed)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "mode\tdesign\tdocs\terrors\tp50\tp95\tp99\tmono/this p95\tdecomp/this p95\tmono/this p99\textra tokens\textra requests\t")
	modes := []string{}
	for _, a := range arms {
		if !slices.Contains(modes, a.Mode) {
			modes = append(modes, a.Mode)
		}
	}
	for _, mode := range modes {
		mono, dec := find(arms, mode, armMonolithic), find(arms, mode, armDecomposed)
		for _, design := range []string{armMonolithic, armDecomposed, armHedged} {
			a := find(arms, mode, design)
			if a == nil {
				continue
			}
			errs := 0
			for _, n := range a.Errors {
				errs += n
			}
			ratio := func(base *fanoutArm, p95 bool) string {
				if base == nil || base == a {
					return "-"
				}
				if p95 {
					return fmt.Sprintf("÷%.2f", base.Docs.P95/a.Docs.P95)
				}
				return fmt.Sprintf("÷%.2f", base.Docs.P99/a.Docs.P99)
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", mode, design, a.Docs.N, errs,
				fmtMS(a.Docs.P50), fmtMS(a.Docs.P95), fmtMS(a.Docs.P99),
				ratio(mono, true), ratio(dec, true), ratio(mono, false), sharePct(a.ExtraTokens), sharePct(a.ExtraRequests))
		}
	}
	_ = tw.Flush()
	for _, a := range arms {
		if a.Design != armHedged || len(a.Skipped) == 0 {
			continue
		}
		var why []string
		for _, r := range slices.Sorted(maps.Keys(a.Skipped)) {
			why = append(why, fmt.Sprintf("%s %.0f", r, a.Skipped[r]))
		}
		fmt.Fprintf(w, "%s %s: hedges not started: %s\n", a.Mode, a.Design, strings.Join(why, ", "))
	}
	for _, a := range arms {
		if a.Design != armHedged || len(a.Paced) == 0 {
			continue
		}
		fmt.Fprintf(w, "%s %s: hedges on decode pace: won %.0f, lost %.0f\n", a.Mode, a.Design, a.Paced["won"], a.Paced["lost"])
	}
	for _, a := range arms {
		if a.Design != armHedged || len(a.Graced) == 0 {
			continue
		}
		fmt.Fprintf(w, "%s %s: originals whose first token came first, held for a grace: the hedge won %.0f, the original %.0f\n",
			a.Mode, a.Design, a.Graced["hedge"], a.Graced["original"])
	}
}

func sharePct(v float64) string {
	if math.IsNaN(v) {
		return "-"
	}
	return fmt.Sprintf("%.1f%%", 100*v)
}
