package e2e

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/bench/load"
)

// runBenchSLO runs the real binary's bench with args and a short bounded
// burst scenario, and returns its exit code, stdout and report.
func runBenchSLO(t *testing.T, args ...string) (int, string, load.Report) {
	t.Helper()
	return runBenchReport(t, append([]string{"--scenario", "burst"}, args...)...)
}

// runBenchReport runs the real binary's bench with args and a short bounded
// steady phase, and returns its exit code, stdout and report.
func runBenchReport(t *testing.T, args ...string) (int, string, load.Report) {
	t.Helper()
	jsonPath := filepath.Join(t.TempDir(), "r.json")
	args = append([]string{"bench", "--phases", "steady:3s", "--rate", "10", "--seed", "5",
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

// sloCheck finds a check of every source (the global one).
func sloCheck(rep load.Report, phase, kind, stage, obj string) *load.SLOCheck {
	return sourceCheck(rep, "", phase, kind, stage, obj)
}

func sourceCheck(rep load.Report, source, phase, kind, stage, obj string) *load.SLOCheck {
	for i := range rep.SLO {
		c := &rep.SLO[i]
		if c.Source == source && c.Phase == phase && c.Kind == kind && c.Stage == stage && c.Name == obj {
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

// TestBenchSLOFailsASlowSourceThatTheGlobalPercentileHides: one source of
// three reaches the gateway 400 ms late (a slow geography, played by a
// loopback proxy that holds only its requests). Its own checks FAIL and the
// bench exits 1, while the global check of the same phase PASSes: two
// thirds of the requests are fast, and the budget is a p50.
func TestBenchSLOFailsASlowSourceThatTheGlobalPercentileHides(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the tailgate binary")
	}
	up := startUp(t, "--replicas", "1", "--sim-ttft", "5ms", "--sim-tpot", "1ms")
	gw, err := url.Parse(up.admin)
	if err != nil {
		t.Fatal(err)
	}
	api, _ := url.Parse(up.api)
	gw.Host = api.Host
	proxy := httputil.NewSingleHostReverseProxy(gw)
	proxy.FlushInterval = -1
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Tailgate-Source") == "ap" {
			select {
			case <-time.After(400 * time.Millisecond):
			case <-r.Context().Done():
				return
			}
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(slow.Close)
	file := filepath.Join(t.TempDir(), "gateway.yaml")
	if err := os.WriteFile(file, []byte(`
slo:
  stream:
    ttft: {p50: 250ms}
  json:
    total: {p50: 250ms}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, rep := runBenchReport(t, "--target", slow.URL+"/v1", "--key-file", filepath.Join(up.dir, "demo.key"),
		"--slo", file, "--sources", "eu,us,ap")
	if code != 1 {
		t.Errorf("exit %d, want 1: a source over its budget fails the run", code)
	}
	for _, kind := range []string{"stream", "json"} {
		stage := map[string]string{"stream": "ttft", "json": "total"}[kind]
		if c := sloCheck(rep, "1 steady", kind, stage, "p50"); c == nil || c.Result != load.Pass {
			t.Errorf("global %s %s: %+v, want PASS (two thirds are fast)", kind, stage, c)
		}
		if c := sourceCheck(rep, "ap", "1 steady", kind, stage, "p50"); c == nil || c.Result != load.Fail || c.Requests == 0 {
			t.Errorf("source ap %s %s: %+v, want FAIL", kind, stage, c)
		}
		for _, src := range []string{"eu", "us"} {
			if c := sourceCheck(rep, src, "all", kind, stage, "p50"); c == nil || c.Result != load.Pass {
				t.Errorf("source %s %s %s: %+v, want PASS", src, kind, stage, c)
			}
		}
	}
	if !strings.Contains(out, "FAIL: source ap over budget") {
		t.Errorf("the text report does not name the failing source")
	}
}
