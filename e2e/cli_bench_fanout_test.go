package e2e

import (
	"bytes"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// runBench runs the real binary's bench with args, bounded in time.
func runBench(t *testing.T, bound time.Duration, args ...string) string {
	t.Helper()
	if testing.Short() {
		t.Skip("starts the tailgate binary")
	}
	cmd := exec.Command(binPath, append([]string{"bench", "--quiet"}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("bench %v: %v\nstdout:\n%s\nstderr:\n%s", args, err, stdout.String(), stderr.String())
		}
	case <-time.After(bound):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("bench %v did not finish in %v\nstderr:\n%s", args, bound, stderr.String())
	}
	t.Logf("stdout:\n%s", stdout.String())
	return stdout.String()
}

// TestBenchFanoutScenarioReportsEveryArm: `bench --scenario fanout` runs
// monolithic, decomposed and decomposed+hedge documents streamed, as JSON
// and through the Batch API on its own fleets, and reports each arm's
// document percentiles, the cuts against the baselines and what hedging
// cost in tokens and requests (read from the gateway's metrics).
func TestBenchFanoutScenarioReportsEveryArm(t *testing.T) {
	t.Parallel() // mostly waiting on its own fleets: overlaps the other bench runs
	out := runBench(t, 3*time.Minute, "--scenario", "fanout", "--docs", "6", "--parts", "2-3", "--doc-rate", "20", "--seed", "5", "--warm-parts", "60")
	for _, want := range []string{"fan-out: 6 documents of 2–3 parts per arm", "seed 5 — document latency (ms)",
		"mono/this p95", "decomp/this p95", "extra tokens", "extra requests"} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	for _, mode := range []string{"stream", "json", "batch"} {
		for _, design := range []string{"monolithic", "decomposed", "decomposed+hedge"} {
			var row []string
			for line := range strings.SplitSeq(out, "\n") {
				if f := strings.Fields(line); len(f) > 3 && f[0] == mode && f[1] == design {
					row = f
				}
			}
			switch {
			case row == nil:
				t.Errorf("no %s %s row", mode, design)
			case row[2] != "6" || row[3] != "0":
				t.Errorf("%s %s: %s documents, %s errors; want 6 and 0", mode, design, row[2], row[3])
			case design == "decomposed+hedge" && (!strings.HasPrefix(row[7], "÷") || !strings.HasSuffix(row[10], "%")):
				t.Errorf("%s hedged row %v: want its cut against monolithic and its extra tokens", mode, row)
			}
		}
	}
}

// TestBenchSweepHedgePrintsTheTradeOff: `bench --sweep-hedge` runs the
// no-hedge baseline and each percentile × budget on the same seeded
// documents and prints one row per setting and the setting it recommends.
func TestBenchSweepHedgePrintsTheTradeOff(t *testing.T) {
	t.Parallel() // mostly waiting on its own fleets: overlaps the other bench runs
	out := runBench(t, 3*time.Minute, "--sweep-hedge", "--docs", "6", "--parts", "2-3", "--doc-rate", "20", "--warm-parts", "60",
		"--sweep-percentiles", "0.9", "--sweep-budgets", "0.1,0.2")
	for _, want := range []string{"hedge sweep: 6 documents", "hedge percentile", "no hedge", "p95 cut", "extra tokens"} {
		if !strings.Contains(out, want) {
			t.Errorf("sweep lacks %q", want)
		}
	}
	rows := 0
	for line := range strings.SplitSeq(out, "\n") {
		if f := strings.Fields(line); len(f) > 2 && f[0] == "p90" && (f[1] == "10%" || f[1] == "20%") {
			rows++
		}
	}
	if rows != 2 {
		t.Errorf("%d rows for p90 × {10%%, 20%%}, want 2", rows)
	}
	if !strings.Contains(out, "recommended: --hedge-percentile 0.9 --hedge-budget") && !strings.Contains(out, "recommended: none") {
		t.Errorf("no recommendation")
	}
}
