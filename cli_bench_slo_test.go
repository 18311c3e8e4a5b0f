package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"tailgate/bench/load"
)

// runBenchSLO runs the real binary's bench with args and a short bounded
// burst scenario, and returns its exit code, stdout and report.
func runBenchSLO(t *testing.T, args ...string) (int, string, load.Report) {
	t.Helper()
	jsonPath := filepath.Join(t.TempDir(), "r.json")
	args = append([]string{"bench", "--scenario", "burst", "--phases", "steady:3s", "--rate", "10", "--seed", "5",
		"--json", jsonPath, "--quiet"}, args...)
	cmd := exec.Command(binPath, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var err error
	select {
	case err = <-done:
	case <-time.After(90 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatalf("bench did not finish in 90s\nstderr:\n%s", stderr.String())
	}
	code := 0
	if ee, ok := errors.AsType[*exec.ExitError](err); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	var rep load.Report
	raw, rerr := os.ReadFile(jsonPath)
	if rerr == nil {
		rerr = json.Unmarshal(raw, &rep)
	}
	if rerr != nil {
		t.Fatalf("report: %v\nstdout:\n%s\nstderr:\n%s", rerr, stdout.String(), stderr.String())
	}
	t.Logf("exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout.String(), stderr.String())
	return code, stdout.String(), rep
}

func sloCheck(rep load.Report, phase, kind, stage, obj string) *load.SLOCheck {
	for i := range rep.SLO {
		c := &rep.SLO[i]
		if c.Phase == phase && c.Kind == kind && c.Stage == stage && c.Name == obj {
			return c
		}
	}
	return nil
}

// TestBenchSLOPassesOnAHealthyFleetAndFailsOverBudget: `bench --slo FILE`
// checks every phase and stage against the file's budgets and exits 0 on a
// healthy fleet; with the engine's TTFT pushed over its budget (the sim's
// knob) the engine_ttft row FAILs and the exit status is 1. The same holds
// with the budgets read from the gateway under test (--slo-from-gateway).
func TestBenchSLOPassesOnAHealthyFleetAndFailsOverBudget(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the tailgate binary")
	}
	// Budgets loose where a shared, noisy test machine could miss them;
	// engine_ttft is the one the test moves.
	file := filepath.Join(t.TempDir(), "gateway.yaml")
	if err := os.WriteFile(file, []byte(`
slo:
  stream:
    ttft: {p95: 2s}
    gateway: {p99: 1s}
    network: {p99: 1s}
    engine_queue: {p95: 1s}
    engine_ttft: {p95: 250ms}
  json:
    total: {p95: 10s}
    gateway: {p99: 1s}
`), 0o600); err != nil {
		t.Fatal(err)
	}

	t.Run("healthy fleet passes", func(t *testing.T) {
		code, out, rep := runBenchSLO(t, "--slo", file, "--sources", "eu,us")
		c := sloCheck(rep, "all", "stream", "engine_ttft", "p95")
		if code != 0 || c == nil || c.Result != load.Pass || c.Requests == 0 {
			t.Fatalf("exit %d, all/stream/engine_ttft %+v: want PASS and exit 0", code, c)
		}
		for _, src := range []string{"eu", "us"} {
			if s := rep.Phases[0].Sources[src]; s.Requests == 0 || s.TTFT.N == 0 || !strings.Contains(out, "source "+src+": ") {
				t.Errorf("source %s: %+v, want its own figures in the report", src, s)
			}
		}
		if sloCheck(rep, "1 steady", "json", "total", "p95") == nil || !strings.Contains(out, "== latency budgets ("+file+") ==") || !strings.Contains(out, "PASS: ") {
			t.Errorf("per-phase checks or the text table missing")
		}
	})
	t.Run("engine over its budget fails", func(t *testing.T) {
		code, out, rep := runBenchSLO(t, "--slo", file, "--worker-args", "--sim-ttft 400ms --sim-ttft-sigma -1")
		c := sloCheck(rep, "1 steady", "stream", "engine_ttft", "p95")
		if code != 1 || c == nil || c.Result != load.Fail || c.ValueMS == nil || *c.ValueMS < 300 {
			t.Fatalf("exit %d, steady/stream/engine_ttft %+v: want FAIL and exit 1", code, c)
		}
		if g := sloCheck(rep, "1 steady", "stream", "gateway", "p99"); g == nil || g.Result != load.Pass {
			t.Errorf("the gateway stage %+v: only the engine was slowed", g)
		}
		if !strings.Contains(out, "FAIL: ") {
			t.Errorf("the text report does not say FAIL")
		}
	})
	t.Run("budgets from the gateway", func(t *testing.T) {
		code, _, rep := runBenchSLO(t, "--slo-from-gateway", "--gateway-args", "--slo stream.engine_ttft=p95:100ms --slo stream.ttft=p95:5s,p99:5s --slo stream.gateway=p99:1s --slo json.gateway=p99:1s",
			"--worker-args", "--sim-ttft 300ms --sim-ttft-sigma -1")
		c := sloCheck(rep, "1 steady", "stream", "engine_ttft", "p95")
		if code != 1 || c == nil || c.Result != load.Fail || c.BudgetMS != 100 || !strings.HasPrefix(rep.SLOFrom, "from the gateway") {
			t.Fatalf("exit %d, engine_ttft %+v from %q: want the gateway's 100ms budget to FAIL", code, c, rep.SLOFrom)
		}
		if ttft := sloCheck(rep, "1 steady", "stream", "ttft", "p95"); ttft == nil || ttft.BudgetMS != 5000 || ttft.Result != load.Pass {
			t.Errorf("ttft %+v: want the gateway's 5s budget, passed", ttft)
		}
	})
}
