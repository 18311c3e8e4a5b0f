package load

import (
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"strings"
	"text/tabwriter"
)

// fmtMS renders milliseconds with a precision that suits their size.
func fmtMS(v float64) string {
	switch {
	case math.IsNaN(v):
		return "-"
	case v < 10:
		return fmt.Sprintf("%.2f", v)
	case v < 100:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.0f", v)
}

func fmtOpt(v *float64) string {
	if v == nil {
		return "n/a"
	}
	return "+" + fmtDur(*v)
}

// fmtDur renders milliseconds as ms or s.
func fmtDur(v float64) string {
	if v >= 1000 {
		return fmt.Sprintf("%.2fs", v/1000)
	}
	return fmtMS(v) + "ms"
}

func (r *Report) load() string {
	if r.Rate > 0 {
		return fmt.Sprintf("open loop, Poisson %s req/s", trimFloat(r.Rate))
	}
	return fmt.Sprintf("closed loop, %d clients", r.Concurrency)
}

func (p *PhaseReport) loadCol() string {
	if p.Name == "all" {
		return ""
	}
	if p.TargetRate > 0 || p.Clients == 0 {
		return trimFloat(math.Round(p.TargetRate*10)/10) + "/s"
	}
	return fmt.Sprintf("%d cl", p.Clients)
}

// errorList renders errors by class, most frequent first.
func errorList(m map[string]int) string {
	keys := slices.Collect(maps.Keys(m))
	slices.SortFunc(keys, func(a, b string) int {
		if m[a] != m[b] {
			return m[b] - m[a]
		}
		return strings.Compare(a, b)
	})
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %d", k, m[k])
	}
	return strings.Join(parts, ", ")
}

// WriteText writes the report as readable tables: a block of stage figures
// per phase, a summary table, the failover and scale-out figures and notes.
func (r *Report) WriteText(w io.Writer) error { return r.writeText(w, true) }

// WriteBrief writes the report without the per-phase stage blocks.
func (r *Report) WriteBrief(w io.Writer) error { return r.writeText(w, false) }

func (r *Report) writeText(w io.Writer, detail bool) error {
	var b strings.Builder
	label := ""
	if r.Label != "" {
		label = " — " + r.Label
	}
	fmt.Fprintf(&b, "tailgate bench%s\n", label)
	fmt.Fprintf(&b, "  target    %s\n", r.Target)
	ka := "on"
	if !r.KeepAlive {
		ka = "off"
	}
	fmt.Fprintf(&b, "  load      %s, seed %d, keep-alive %s\n", r.load(), r.Seed, ka)
	fmt.Fprintf(&b, "  workload  %s\n", r.Workload)
	fmt.Fprintf(&b, "  phases    %s (ran %.1fs)\n", r.Plan, r.ElapsedS)
	b.WriteString("  latencies in ms from the intended send time; percentiles over successful requests (nearest rank)\n")
	if r.TTFTStreamsOnly {
		b.WriteString("  ttft (and the gateway's *_ttft and network stages) over streams: a non-streaming answer arrives whole, it counts in total\n")
	}

	for i := range r.Phases {
		if detail {
			b.WriteByte('\n')
			r.writePhase(&b, &r.Phases[i])
		}
	}

	b.WriteString("\n== summary ==\n")
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "phase\ttime\tload\treqs\terrors\terr%\tttft p50\tp95\tp99\tmax\ttotal p50\tp95\tp99\tmax\tout tok/s\ttpot p50\tp95\titl p99\t")
	rows := append(slices.Clone(r.Phases), r.All)
	for _, p := range rows {
		fmt.Fprintf(tw, "%s\t%s–%ss\t%s\t%d\t%d\t%.2f%%\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%.1f\t%s\t%s\t%s\t\n",
			p.Name, trimFloat(p.StartS), trimFloat(p.EndS), p.loadCol(), p.Requests, p.Errors, 100*p.ErrorRate,
			p.TTFT.Show("p50"), p.TTFT.Show("p95"), p.TTFT.Show("p99"), p.TTFT.Show("max"),
			p.Total.Show("p50"), p.Total.Show("p95"), p.Total.Show("p99"), p.Total.Show("max"),
			p.OutputTokensPerS, p.TPOT.Show("p50"), p.TPOT.Show("p95"), p.ITL.Show("p99"))
	}
	tw.Flush()
	for _, ev := range r.Events {
		fmt.Fprintf(&b, "  %s %d at %.1fs: %s\n", ev.Kind, ev.Count, secs(ev.At), eventWho(ev))
	}
	r.writeSLO(&b)

	for i := range r.Failovers {
		b.WriteByte('\n')
		r.writeFailover(&b, &r.Failovers[i])
	}
	for i := range r.ScaleOuts {
		b.WriteByte('\n')
		r.writeScaleOut(&b, &r.ScaleOuts[i])
	}
	if r.ColdStart != nil {
		b.WriteString("\ncold start from zero replicas:\n")
		for _, l := range r.ColdStart.Lines() {
			fmt.Fprintf(&b, "  %s\n", l)
		}
	}
	if r.Geo != nil {
		_ = r.Geo.WriteText(&b)
	}
	if len(r.Notes) > 0 {
		b.WriteString("\nnotes:\n")
		for _, n := range r.Notes {
			fmt.Fprintf(&b, "  - %s\n", n)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func eventWho(ev Event) string {
	who := "replicas unknown"
	if len(ev.Replicas) > 0 {
		who = strings.Join(ev.Replicas, ", ")
		if ev.Inferred {
			who += " (inferred)"
		}
	}
	if ev.Err != "" {
		who += " — error: " + ev.Err
	}
	return who
}

// stageRows are the rows of a phase block: label and summary.
func (p *PhaseReport) stageRows() [][2]any {
	rows := [][2]any{{"ttft", p.TTFT}, {"total", p.Total}}
	if p.TPOT.N > 0 {
		rows = append(rows, [2]any{"tpot", p.TPOT})
	}
	if p.ITL.N > 0 {
		rows = append(rows, [2]any{"itl (chunk gap)", p.ITL})
	}
	if s, ok := p.Stages[ClientConnect]; ok {
		rows = append(rows, [2]any{"client connect", s})
	}
	for _, st := range Stages {
		if s, ok := p.Stages[st]; ok {
			name := "gw " + st
			rows = append(rows, [2]any{name, s})
		}
	}
	rows = append(rows, [2]any{"send lag", p.SendLag})
	return rows
}

func (r *Report) writePhase(b *strings.Builder, p *PhaseReport) {
	fmt.Fprintf(b, "== phase %s  %s–%ss  %s  %d requests (%d streams), %d ok, %d errors (%.2f%%), %.1f ok/s, %.1f output tok/s ==\n",
		p.Name, trimFloat(p.StartS), trimFloat(p.EndS), p.loadCol(), p.Requests, p.Streams, p.OK, p.Errors, 100*p.ErrorRate, p.Throughput, p.OutputTokensPerS)
	tw := tabwriter.NewWriter(b, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "  ms\tn\tp50\tp90\tp95\tp99\tmax\t")
	for _, row := range p.stageRows() {
		s := row[1].(Summary)
		if s.N == 0 {
			fmt.Fprintf(tw, "%s\t0\t-\t-\t-\t-\t-\t\n", row[0])
			continue
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t\n", row[0], s.N, fmtMS(s.P50), fmtMS(s.P90), fmtMS(s.P95), fmtMS(s.P99), fmtMS(s.Max))
	}
	tw.Flush()
	if p.Errors > 0 {
		fmt.Fprintf(b, "  errors: %s (%d before the first token, %d mid-stream)\n", errorList(p.ErrorsByClass), p.BeforeFirstToken, p.Midstream)
	}
	for _, src := range slices.Sorted(maps.Keys(p.Sources)) {
		s := p.Sources[src]
		fmt.Fprintf(b, "  source %s: %d requests, %d errors, ttft p50 %s p95 %s p99 %s, total p95 %s\n", src, s.Requests, s.Errors,
			s.TTFT.Show("p50"), s.TTFT.Show("p95"), s.TTFT.Show("p99"), s.Total.Show("p95"))
	}
}

func pct(a, b float64) string {
	if a == 0 || b == 0 {
		return ""
	}
	return fmt.Sprintf("; p99 after/before ×%.2f", a/b)
}

func (r *Report) writeFailover(b *strings.Builder, f *FailoverReport) {
	who := strings.Join(f.Killed, ", ")
	if who == "" {
		who = "replica unknown"
	} else if f.Inferred {
		who += ", inferred"
	}
	fmt.Fprintf(b, "== failover: kill at %.1fs (%s) ==\n", f.AtS, who)
	if f.Err != "" {
		fmt.Fprintf(b, "  the kill failed: %s\n", f.Err)
	}
	tw := tabwriter.NewWriter(b, 0, 4, 2, ' ', 0)
	res := fmt.Sprintf("(admin samples every %s)", fmtDur(r.SampleIntervalMS))
	if len(r.Samples) == 0 {
		res = "(needs --admin)"
	}
	fmt.Fprintf(tw, "  left the gateway's ready set\t%s  %s\n", fmtOpt(f.LeftReadyMS), res)
	fmt.Fprintf(tw, "  last request routed to it\t%s  (%s sent after the kill answered or failed by it)\n", fmtOpt(f.LastRoutedMS), plural(f.RoutedAfter, "request"))
	fmt.Fprintf(tw, "  last request needing a retry\t%s  (%s sent after the kill took more than one attempt)\n", fmtOpt(f.LastRetryMS), plural(f.Retried, "request"))
	errs := fmt.Sprintf("%d: %d before the first token, %d mid-stream", f.Errors, f.BeforeFirstToken, f.Midstream)
	if f.Errors > 0 {
		errs += " (" + errorList(f.ErrorsByClass) + ")"
	}
	fmt.Fprintf(tw, "  client-visible errors\t%s, until %.1fs\n", errs, f.ScopeEndS)
	writeWindows(tw, f.After, f.Before)
	if f.After.Samples > 0 {
		fmt.Fprintf(tw, "  peak queue on survivors\t%s  (before: %s)\n", peakQueue(f.After), peakQueue(f.Before))
	}
	for _, rp := range f.Replacements {
		fmt.Fprintf(tw, "  replacement %s\t%s\n", rp.ID, newReplicaLine(rp))
	}
	if len(f.Replacements) == 0 {
		fmt.Fprintf(tw, "  replacement\tnone seen\n")
	}
	tw.Flush()
}

// writeWindows writes the p95/p99 of the windows after and before an action.
func writeWindows(tw io.Writer, after, before WindowReport) {
	for _, m := range []struct {
		name string
		a, b Summary
	}{{"ttft", after.TTFT, before.TTFT}, {"total", after.Total, before.Total}} {
		fmt.Fprintf(tw, "  %s p95 / p99 after\t%s / %s ms  (requests sent %.1f–%.1fs; before, %.1f–%.1fs: %s / %s ms%s)\n", m.name,
			m.a.Show("p95"), m.a.Show("p99"), after.FromS, after.ToS, before.FromS, before.ToS, m.b.Show("p95"), m.b.Show("p99"),
			pct(m.a.P99, m.b.P99))
	}
}

func peakQueue(w WindowReport) string {
	s := fmt.Sprintf("engine waiting %g", w.PeakWaiting)
	if w.PeakWaitingReplica != "" {
		s += " on " + w.PeakWaitingReplica
	}
	s += fmt.Sprintf(", gateway in flight %d", w.PeakInflight)
	if w.PeakInflightReplica != "" {
		s += " on " + w.PeakInflightReplica
	}
	return s
}

func newReplicaLine(rp NewReplica) string {
	var parts []string
	if rp.StartMS != nil {
		parts = append(parts, "started "+fmtOpt(rp.StartMS))
	}
	parts = append(parts, "ready "+fmtOpt(rp.ReadyMS), "first answer "+fmtOpt(rp.ServingMS))
	if rp.ServingMS != nil {
		parts = append(parts, fmt.Sprintf("then %.0f%% of requests", 100*rp.Share))
	}
	if rp.WarmBaselineMS > 0 {
		parts = append(parts, fmt.Sprintf("warm (ttft p95 within %.0f%% of the fleet's %s ms) %s", 100*WarmTolerance, fmtMS(rp.WarmBaselineMS), fmtOpt(rp.WarmMS)))
	}
	s := strings.Join(parts, ", ")
	if rp.Inferred {
		s += " (inferred)"
	}
	return s
}

func (r *Report) writeScaleOut(b *strings.Builder, s *ScaleOutReport) {
	fmt.Fprintf(b, "== scale-out at %.1fs ==\n", s.AtS)
	if s.Err != "" {
		fmt.Fprintf(b, "  the scale-out failed: %s\n", s.Err)
	}
	tw := tabwriter.NewWriter(b, 0, 4, 2, ' ', 0)
	for _, rp := range s.Started {
		fmt.Fprintf(tw, "  new replica %s\t%s\n", rp.ID, newReplicaLine(rp))
	}
	if len(s.Started) == 0 {
		fmt.Fprintf(tw, "  new replica\tnone seen\n")
	}
	if s.ReadyReplicas > 0 {
		fmt.Fprintf(tw, "  ready replicas after\t%d\n", s.ReadyReplicas)
	}
	writeWindows(tw, s.After, s.Before)
	if s.After.Samples > 0 {
		fmt.Fprintf(tw, "  peak queue after\t%s  (before: %s)\n", peakQueue(s.After), peakQueue(s.Before))
	}
	tw.Flush()
}

func plural(n int, word string) string {
	if n == 1 {
		return "1 " + word
	}
	return fmt.Sprintf("%d %ss", n, word)
}
