package load

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"text/tabwriter"
)

// Comparison is two reports of the same seeded workload, for --json.
type Comparison struct {
	A *Report `json:"a"`
	B *Report `json:"b"`
	// Matched says both runs sent the same request sequence on the same
	// schedule (open loop, same seed, plan and number of requests).
	Matched bool `json:"matched"`
}

// Compare pairs two reports.
func Compare(a, b *Report) *Comparison {
	return &Comparison{A: a, B: b, Matched: matched(a, b)}
}

func matched(a, b *Report) bool {
	if a.Seed != b.Seed || a.Plan != b.Plan || a.Rate != b.Rate || a.Rate == 0 || a.Workload != b.Workload ||
		len(a.Requests) != len(b.Requests) {
		return false
	}
	for i := range a.Requests {
		ra, rb := &a.Requests[i], &b.Requests[i]
		if ra.Index != rb.Index || ra.Intended != rb.Intended || ra.Stream != rb.Stream || ra.PromptTokens != rb.PromptTokens || ra.MaxTokens != rb.MaxTokens {
			return false
		}
	}
	return true
}

func ratio(a, b float64) string {
	if a <= 0 || b < 0 || math.IsNaN(a) || math.IsNaN(b) {
		return "-"
	}
	return fmt.Sprintf("×%.2f", b/a)
}

func optVal(v *float64) float64 {
	if v == nil {
		return math.NaN()
	}
	return *v
}

func fmtOptMS(v float64) string {
	if math.IsNaN(v) {
		return "n/a"
	}
	return fmtMS(v)
}

// WriteText writes the two reports side by side with B/A ratios.
func (c *Comparison) WriteText(w io.Writer) error {
	a, b := c.A, c.B
	var sb strings.Builder
	fmt.Fprintf(&sb, "== compare: A = %s, B = %s ==\n", a.Label, b.Label)
	fmt.Fprintf(&sb, "  A  %s\n  B  %s\n", a.Target, b.Target)
	if c.Matched {
		fmt.Fprintf(&sb, "  matched: seed %d, %s, the same %d requests on the same schedule\n", a.Seed, a.Plan, len(a.Requests))
	} else {
		fmt.Fprintf(&sb, "  NOT matched: %d vs %d requests (closed loop, a stopped run, or different settings): compare with care\n", len(a.Requests), len(b.Requests))
	}
	sb.WriteString("  latencies in ms; B/A below 1 means B is faster\n\n")
	tw := tabwriter.NewWriter(&sb, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "phase\tmetric\tA\tB\tB/A\t")
	row := func(phase, metric string, va, vb float64, isRatio bool) {
		r := ""
		if isRatio {
			r = ratio(va, vb)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t\n", phase, metric, fmtOptMS(va), fmtOptMS(vb), r)
	}
	count := func(phase, metric string, va, vb int) {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t\t\n", phase, metric, va, vb)
	}
	phases := append(slices.Clone(a.Phases), a.All)
	bPhases := append(slices.Clone(b.Phases), b.All)
	for i := range min(len(phases), len(bPhases)) {
		pa, pb := &phases[i], &bPhases[i]
		count(pa.Name, "requests", pa.Requests, pb.Requests)
		fmt.Fprintf(tw, "\terror rate\t%.2f%%\t%.2f%%\t\t\n", 100*pa.ErrorRate, 100*pb.ErrorRate)
		for _, q := range []string{"p50", "p95", "p99", "max"} {
			row("", "ttft "+q, pa.TTFT.Get(q), pb.TTFT.Get(q), true)
		}
		for _, q := range []string{"p50", "p95", "p99"} {
			row("", "total "+q, pa.Total.Get(q), pb.Total.Get(q), true)
		}
		fmt.Fprintf(tw, "\toutput tok/s\t%.1f\t%.1f\t%s\t\n", pa.OutputTokensPerS, pb.OutputTokensPerS, ratio(pa.OutputTokensPerS, pb.OutputTokensPerS))
		if pa.TPOT.N > 0 && pb.TPOT.N > 0 {
			row("", "tpot p50", pa.TPOT.Get("p50"), pb.TPOT.Get("p50"), true)
			row("", "tpot p95", pa.TPOT.Get("p95"), pb.TPOT.Get("p95"), true)
		}
		if pa.ITL.N > 0 && pb.ITL.N > 0 {
			row("", "itl p99", pa.ITL.Get("p99"), pb.ITL.Get("p99"), true)
		}
		// The gateway's ttft and total repeat the client's; connect is
		// about nothing but keep-alive.
		for _, st := range []string{"gateway", "upstream_ttft", "engine_queue", "engine_ttft", "network"} {
			sa, okA := pa.Stages[st]
			sb, okB := pb.Stages[st]
			if okA && okB {
				row("", "gw "+st+" p99", sa.Get("p99"), sb.Get("p99"), true)
			}
		}
	}
	for i := range min(len(a.Failovers), len(b.Failovers)) {
		fa, fb := &a.Failovers[i], &b.Failovers[i]
		name := fmt.Sprintf("kill %d", i+1)
		row(name, "left ready set", optVal(fa.LeftReadyMS), optVal(fb.LeftReadyMS), false)
		row("", "last routed to it", optVal(fa.LastRoutedMS), optVal(fb.LastRoutedMS), false)
		count("", "errors before 1st token", fa.BeforeFirstToken, fb.BeforeFirstToken)
		count("", "errors mid-stream", fa.Midstream, fb.Midstream)
		row("", "ttft p95 after", fa.After.TTFT.Get("p95"), fb.After.TTFT.Get("p95"), true)
		row("", "ttft p99 after", fa.After.TTFT.Get("p99"), fb.After.TTFT.Get("p99"), true)
		row("", "total p99 after", fa.After.Total.Get("p99"), fb.After.Total.Get("p99"), true)
		fmt.Fprintf(tw, "\tpeak waiting on survivors\t%g\t%g\t\t\n", fa.After.PeakWaiting, fb.After.PeakWaiting)
		if len(fa.Replacements) > 0 && len(fb.Replacements) > 0 {
			row("", "replacement ready", optVal(fa.Replacements[0].ReadyMS), optVal(fb.Replacements[0].ReadyMS), false)
			row("", "replacement serving", optVal(fa.Replacements[0].ServingMS), optVal(fb.Replacements[0].ServingMS), false)
		}
	}
	for i := range min(len(a.ScaleOuts), len(b.ScaleOuts)) {
		sa, sb := &a.ScaleOuts[i], &b.ScaleOuts[i]
		name := fmt.Sprintf("scaleout %d", i+1)
		if len(sa.Started) > 0 && len(sb.Started) > 0 {
			row(name, "new replica ready", optVal(sa.Started[0].ReadyMS), optVal(sb.Started[0].ReadyMS), false)
			row("", "new replica serving", optVal(sa.Started[0].ServingMS), optVal(sb.Started[0].ServingMS), false)
			name = ""
		}
		row(name, "ttft p99 after", sa.After.TTFT.Get("p99"), sb.After.TTFT.Get("p99"), true)
	}
	tw.Flush()
	_, err := io.WriteString(w, sb.String())
	return err
}
