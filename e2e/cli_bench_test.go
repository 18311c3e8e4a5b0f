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
	"strings"
	"testing"
	"time"

	"tailgate/bench/load"
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
