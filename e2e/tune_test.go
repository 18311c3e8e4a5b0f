package e2e

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// runTune runs the binary's tune with args, bounded, and returns its exit
// status and its stdout and stderr together.
func runTune(t *testing.T, args ...string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, binPath, append([]string{"tune"}, args...)...)
	cmd.WaitDelay = 5 * time.Second
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("tune %v still running after 2 minutes; output:\n%s", args, out.String())
	}
	if ee, ok := errors.AsType[*exec.ExitError](err); ok {
		return ee.ExitCode(), out.String()
	} else if err != nil {
		t.Fatal(err)
	}
	return 0, out.String()
}

// TestTuneFindsTheConfigurationThatHoldsTheTarget: on the simulated engine,
// a worker that runs one sequence at a time queues 6 requests a second of
// ~0.2 s each far past a 250 ms TTFT p99, one that runs eight does not.
// tune tries both, writes the second as the worker config, and --check
// passes on that file and fails on the first.
func TestTuneFindsTheConfigurationThatHoldsTheTarget(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the tailgate binary")
	}
	dir := t.TempDir()
	engine := []string{"--engine=sim", "--sim-ttft=10ms", "--sim-ttft-sigma=-1", "--sim-tpot=5ms", "--warmup=1"}
	target := []string{"--ttft-p99", "250ms", "--rate", "6", "--duration", "3s", "--prompt-tokens", "64", "--output-tokens", "40"}
	tuned := filepath.Join(dir, "tuned-worker.conf")

	code, out := runTune(t, append(append(append([]string{}, engine...), target...),
		"--sim-max-seqs=1", "--space", "max-num-seqs=8", "--out", tuned)...)
	if code != 0 {
		t.Fatalf("tune: exit status %d, output:\n%s", code, out)
	}
	for _, want := range []string{
		"ENGINE SIMULATED",
		"host CPU: ",
		"=> 1. max-num-seqs=8 — 1 GPU(s)",
		"2. as given (engine defaults for the knobs not set) — 1 GPU(s)",
		"FAIL at 6 req/s: stream ttft p99 ",
		"chosen: max-num-seqs=8",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the report lacks %q; output:\n%s", want, out)
		}
	}
	raw, err := os.ReadFile(tuned)
	if err != nil {
		t.Fatal(err)
	}
	conf := string(raw)
	if !strings.Contains(conf, "\n--sim-max-seqs=8\n") || strings.Contains(conf, "--sim-max-seqs=1") || !strings.Contains(conf, "\n--engine=sim\n") {
		t.Fatalf("written config:\n%s\nwant the sim with --sim-max-seqs=8 (and not =1)", conf)
	}

	// The file records the target and workload it was tuned for, so a
	// cron job's --check needs nothing else.
	code, out = runTune(t, "--check", tuned)
	if code != 0 || !strings.Contains(out, "\nPASS: ") || !strings.Contains(out, "stream ttft p99 ≤ 250ms") {
		t.Errorf("tune --check on the tuned config: exit status %d, output:\n%s\nwant 0 and PASS against the 250ms TTFT p99", code, out)
	}

	def := filepath.Join(dir, "default.conf")
	if err := os.WriteFile(def, []byte("# the configuration before tuning\n"+strings.Join(append(engine, "--sim-max-seqs=1"), "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out = runTune(t, append([]string{"--check", def}, target...)...)
	// The engine's own figures say why: its queue, not its prefill.
	if code != 1 || !strings.Contains(out, "\nFAIL: ") || !strings.Contains(out, "misses the target at 6 req/s: FAIL at 6 req/s: stream ttft p99") ||
		!strings.Contains(out, "engine (its /metrics, means): queue ") {
		t.Errorf("tune --check on the default config: exit status %d, output:\n%s\nwant 1 and FAIL naming the TTFT p99", code, out)
	}
}
