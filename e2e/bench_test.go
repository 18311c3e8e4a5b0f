package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/bench/load"
	"github.com/tailgate-dev/tailgate/data/pglocal"
	"github.com/tailgate-dev/tailgate/data/pgtest"
)

// TestBenchScenarioFailoverEndToEnd runs the real binary's failover scenario
// with short phases: a gateway and three sim workers start, one is SIGKILLed
// and replaced, and the report has the figures of it. Nothing is left
// running afterwards.
func TestBenchScenarioFailoverEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the tailgate binary")
	}
	dir := t.TempDir()
	jsonPath, htmlPath := filepath.Join(dir, "r.json"), filepath.Join(dir, "r.html")
	const phases, rate, seed = "steady:2s,kill:1,steady:4s", 15, 3
	cmd := exec.Command(binPath, "bench", "--scenario", "failover", "--phases", phases, "--rate", "15", "--seed", "3",
		"--window", "3s", "--json", jsonPath, "--html", htmlPath, "--keep")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	done := make(chan error, 1)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("bench: %v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
		}
	case <-time.After(90 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatalf("bench did not finish in 90s\nstderr:\n%s", stderr.String())
	}
	out := stdout.String()
	t.Logf("stdout:\n%s", out)
	for _, want := range []string{"== phase 1 steady", "== summary ==", "== failover: kill at", "(sim-1)",
		"left the gateway's ready set", "client-visible errors", "replacement sim-4", "peak queue on survivors"} {
		if !strings.Contains(out, want) {
			t.Errorf("stdout lacks %q", want)
		}
	}

	var rep load.Report
	raw, err := os.ReadFile(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &rep); err != nil {
		t.Fatal(err)
	}
	ps, _ := load.ParsePhases(phases)
	plan, _ := load.NewPlan(ps)
	if want := len(load.OpenLoop(plan, rate, seed)); len(rep.Requests) != want {
		t.Errorf("%d requests in the report, the seeded schedule has %d", len(rep.Requests), want)
	}
	if len(rep.Failovers) != 1 || len(rep.Events) != 1 || !slices.Equal(rep.Events[0].Replicas, []string{"sim-1"}) {
		t.Fatalf("events %+v failovers %+v", rep.Events, rep.Failovers)
	}
	f := rep.Failovers[0]
	if len(f.Replacements) != 1 || f.Replacements[0].ID != "sim-4" || f.Replacements[0].ReadyMS == nil {
		t.Errorf("replacement %+v: not seen ready within 4s", f.Replacements)
	}
	if f.LeftReadyMS == nil {
		t.Error("the killed worker never left the ready set in the samples")
	}
	if f.BeforeFirstToken+f.Midstream != f.Errors {
		t.Errorf("errors %d != %d before the first token + %d mid-stream", f.Errors, f.BeforeFirstToken, f.Midstream)
	}
	served := map[string]int{}
	for _, r := range rep.Requests {
		if r.OK() {
			served[r.Replica]++
		}
	}
	if served["sim-2"] == 0 || served["sim-3"] == 0 {
		t.Errorf("requests served per replica: %v", served)
	}
	if len(rep.Samples) == 0 || rep.All.Stages["gateway"].N == 0 {
		t.Errorf("%d replica samples; gateway stage n=%d", len(rep.Samples), rep.All.Stages["gateway"].N)
	}
	// The HTML report draws its plots in a real browser.
	dom := renderBenchHTML(t, htmlPath)
	if !strings.Contains(dom, `data-status="rendered"`) || !regexp.MustCompile(`<svg [^>]*data-plot="timeline"[^>]*data-points="[1-9]`).MatchString(dom) ||
		!regexp.MustCompile(`<svg [^>]*data-plot="cdf"[^>]*data-curves="2"`).MatchString(dom) {
		t.Errorf("the HTML report's plots did not render:\n%s", dom)
	}

	// The fleet is gone: no process runs from its directory.
	m := regexp.MustCompile(`bench: kept (\S+)`).FindStringSubmatch(stderr.String())
	if m == nil {
		t.Fatalf("no kept directory in stderr:\n%s", stderr.String())
	}
	fleetDir := m[1]
	defer os.RemoveAll(fleetDir)
	if pids := processesMentioning(fleetDir); len(pids) > 0 {
		t.Errorf("processes still running from %s: %v", fleetDir, pids)
	}
}

// renderBenchHTML opens a file in headless Chromium (flags as in the
// dashboard test), lets its script run and returns the DOM.
func renderBenchHTML(t *testing.T, path string) string {
	t.Helper()
	bin, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatal("chromium not found: scripts/test.sh installs Debian's chromium package")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
		"--user-data-dir="+t.TempDir(), "--virtual-time-budget=5000", "--dump-dom", "file://"+path).Output()
	if err != nil {
		t.Fatalf("chromium: %v", err)
	}
	return string(out)
}

// processesMentioning lists processes whose command line contains s.
func processesMentioning(s string) []string {
	var out []string
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && bytes.Contains(cmdline, []byte(s)) {
			out = append(out, e.Name()+": "+strings.ReplaceAll(string(cmdline), "\x00", " "))
		}
	}
	return out
}

// TestBenchScenarioDatabases runs `bench --scenario databases` short: one
// gateway on SQLite and two gateways on a throwaway PostgreSQL serve the
// same seeded requests; the report sets them side by side with
// PostgreSQL/SQLite ratios, every request was answered on both sides, and
// each ledger billed exactly the answers and tokens the clients received.
func TestBenchScenarioDatabases(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the tailgate binary and PostgreSQL")
	}
	if _, err := pglocal.BinDir(); err != nil {
		if os.Getenv(pgtest.SkipEnv) == "skip" {
			t.Skipf("%v (skipped: %s=skip)", err, pgtest.SkipEnv)
		}
		t.Fatal(err)
	}
	jsonPath := filepath.Join(t.TempDir(), "r.json")
	cmd := exec.Command(binPath, "bench", "--scenario", "databases", "--rate", "30", "--phases", "steady:3s",
		"--json", jsonPath)
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
			t.Fatalf("bench: %v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
		}
	case <-time.After(3 * time.Minute):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("bench did not finish in 3 minutes\nstderr:\n%s", stderr.String())
	}
	out := stdout.String()
	t.Logf("stdout:\n%s", out)
	for _, want := range []string{"== compare: A = A: 1 gateway on SQLite, B = B: 2 gateways on one PostgreSQL",
		"matched: seed 1", "ttft p99", "total p99", "ledger: ", "match\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("stdout lacks %q", want)
		}
	}
	if !strings.Contains(stderr.String(), "starting 2 gateways") {
		t.Errorf("stderr does not say side B started two gateways:\n%s", stderr.String())
	}

	raw, err := os.ReadFile(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	var cmp load.Comparison
	if err := json.Unmarshal(raw, &cmp); err != nil {
		t.Fatal(err)
	}
	if !cmp.Matched {
		t.Errorf("the two sides were not sent the same requests")
	}
	for _, rep := range []*load.Report{cmp.A, cmp.B} {
		if rep == nil {
			t.Fatal("the JSON report lacks a side")
		}
		if len(rep.Requests) == 0 || rep.All.Errors != 0 {
			t.Errorf("%s: %d requests, %d errors (%v): want every request answered", rep.Label, len(rep.Requests), rep.All.Errors, rep.All.ErrorsByClass)
		}
		l := rep.Ledger
		if l == nil {
			t.Errorf("%s: no ledger check in the report", rep.Label)
			continue
		}
		if !l.Match || l.Requests != int64(len(rep.Requests)) || l.Answers != len(rep.Requests) || l.CompletionTokens == 0 {
			t.Errorf("%s: ledger %+v for %d requests sent: want every request billed once, token for token", rep.Label, *l, len(rep.Requests))
		}
		if rep.All.TTFT.N == 0 || rep.All.Total.N != len(rep.Requests) {
			t.Errorf("%s: ttft over %d, total over %d of %d requests", rep.Label, rep.All.TTFT.N, rep.All.Total.N, len(rep.Requests))
		}
	}
}

// TestBenchScenarioDatabasesWithoutPostgres: without PostgreSQL binaries
// the scenario stops before starting anything, exits non-zero and names
// the package to install.
func TestBenchScenarioDatabasesWithoutPostgres(t *testing.T) {
	cmd := exec.Command(binPath, "bench", "--scenario", "databases", "--phases", "steady:1s")
	cmd.Env = append(os.Environ(), pglocal.BinDirEnv+"="+t.TempDir())
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "apt-get install -y postgresql") {
		t.Fatalf("bench --scenario databases without PostgreSQL = %v:\n%s\nwant an error naming the postgresql package", err, out)
	}
	if strings.Contains(string(out), "simulated replica") {
		t.Errorf("a fleet was started before PostgreSQL was found:\n%s", out)
	}
}

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

// TestBenchPriorityScenarioRunsABatchBesideInteractiveTraffic: `bench
// --scenario priority` (scaled down) sends interactive requests alone and
// then beside a Batch API job on its own fleet: the batch completes, its
// lines waited in the admission queue while interactive requests were
// admitted ahead of them, and the report gives both p99s and their ratio
// (reported, not asserted: that is the full run's measure).
func TestBenchPriorityScenarioRunsABatchBesideInteractiveTraffic(t *testing.T) {
	t.Parallel() // mostly waiting on its own fleet
	out := runBench(t, 3*time.Minute, "--scenario", "priority", "--batch-lines", "200", "--priority-duration", "3s",
		"--rate", "10", "--max-ratio", "1000")
	for _, want := range []string{"priority: interactive requests (key class interactive) at 10/s for 3s, alone and beside a 200-line Batch API job",
		"interactive alone", "with a 200-line batch", "with a 200-line batch: batch completed in", "interactive p99 with the batch / alone:"} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	waits := func(class string) (admitted, waited, meanMS float64) {
		m := regexp.MustCompile(`with a 200-line batch: ` + class + `: (\d+) admitted, (\d+) at once, (\d+) waited in the admission queue \((\d+) ms on average\)`).FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("no %s admission line in the batch phase", class)
		}
		f := func(s string) float64 { v, _ := strconv.ParseFloat(s, 64); return v }
		return f(m[1]), f(m[3]), f(m[4])
	}
	bAdmitted, bWaited, bMean := waits("batch")
	iAdmitted, iWaited, iMean := waits("interactive")
	if bAdmitted != 200 || bWaited == 0 {
		t.Errorf("batch: %v lines admitted, %v waited; want all 200, some held back while the fleet was full", bAdmitted, bWaited)
	}
	if iAdmitted == 0 || iWaited >= bWaited || iMean >= bMean {
		t.Errorf("interactive: %v admitted, %v waited (%v ms on average) beside batch lines that waited %v ms on average: want them admitted ahead",
			iAdmitted, iWaited, iMean, bMean)
	}
}
