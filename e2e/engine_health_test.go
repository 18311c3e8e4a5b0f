package e2e

import (
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"tailgate/e2e/testkit"
)

// enginePID finds the simulated engine a worker launched: its child running
// `tailgate sim --uds`.
func enginePID(t *testing.T, worker int) int {
	t.Helper()
	// A Go process forks from any of its threads: look at every thread's children.
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", worker))
	for _, task := range tasks {
		raw, _ := os.ReadFile(task)
		for _, f := range strings.Fields(string(raw)) {
			pid, _ := strconv.Atoi(f)
			cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
			if strings.Contains(string(cmdline), "\x00sim\x00--uds\x00") {
				return pid
			}
		}
	}
	t.Fatalf("worker %d has no engine child", worker)
	return 0
}

func (g *gatewayProcess) replica(id string) replicaView {
	for _, r := range g.replicas() {
		if r.ID == id {
			return r
		}
	}
	return replicaView{ID: id, State: "gone"}
}

// served returns how many requests l saw answered by replica id.
func (l *clientLoad) served(id string) int64 {
	if v, ok := l.byReplica.Load(id); ok {
		return v.(*atomic.Int64).Load()
	}
	return 0
}

// TestFrozenEngineLeavesRoutingAndComesBack: the ENGINE process behind a
// live sidecar is stopped (SIGSTOP) under load. The worker reports it failed
// and the gateway stops routing to it within 3s of the stop; no request
// fails; SIGCONT brings the replica back into routing.
func TestFrozenEngineLeavesRoutingAndComesBack(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the tailgate binary")
	}
	g := startGateway(t)
	ws := g.startFleet(3, "--sim-tpot", "2ms")
	engine := enginePID(t, ws[0].PID())
	l := startLoad(g, 6)
	defer l.stop()
	testkit.WaitWithin(t, 10*time.Second, "load reaching w1", func() bool { return l.served("w1") > 0 })
	// Stop at a random point of the sidecar's probe cycle (1s), so runs
	// cover the worst case: a stop just after a good answer.
	time.Sleep(rand.N(time.Second))

	if err := syscall.Kill(engine, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer syscall.Kill(engine, syscall.SIGCONT)
	// testkit.WaitWithin polls at most 20ms apart (plus an admin request), so the bound
	// checked is 3s plus one poll.
	var out replicaView
	took := testkit.WaitWithin(t, 3*time.Second, "the frozen engine's replica out of routing within 3s of SIGSTOP", func() bool {
		out = g.replica("w1")
		return out.State != "ready"
	})
	t.Logf("out of routing %v after SIGSTOP of the engine (pid %d): %s (%s)", took.Round(time.Millisecond), engine, out.State, out.Reason)
	if out.State != "failed" || !strings.HasPrefix(out.Reason, "engine not answering /health for ") {
		t.Errorf("w1 %s (%q), want failed: engine not answering /health", out.State, out.Reason)
	}
	if g.state("w2") != "ready" || g.state("w3") != "ready" {
		t.Fatalf("the healthy replicas are not ready: %+v", g.replicas())
	}

	// Requests go elsewhere while it is frozen.
	ok, onW1 := l.ok.Load(), l.served("w1")
	time.Sleep(1500 * time.Millisecond)
	if l.ok.Load() <= ok {
		t.Errorf("no request completed while w1 was frozen")
	}
	if n := l.served("w1"); n != onW1 {
		t.Errorf("%d requests answered by the frozen replica", n-onW1)
	}

	if err := syscall.Kill(engine, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	back := testkit.WaitWithin(t, 10*time.Second, "w1 ready after SIGCONT", func() bool { return g.state("w1") == "ready" })
	onW1 = l.served("w1")
	testkit.WaitWithin(t, 10*time.Second, "requests answered by w1 again", func() bool { return l.served("w1") > onW1 })
	l.stop()

	t.Logf("ready %v after SIGCONT; ok %d, failed before the first token %d, mid-stream %d, other %d",
		back.Round(time.Millisecond), l.ok.Load(), l.failedBeforeToken.Load(), l.failedMidStream.Load(), l.other.Load())
	if n := l.failedBeforeToken.Load() + l.failedMidStream.Load() + l.other.Load(); n != 0 {
		t.Fatalf("%d requests failed:\n%s", n, l.errors())
	}
	if g.metric("tailgate_ejections_total", `replica="w1"`, `reason="engine"`) < 1 {
		t.Error("the frozen engine's replica is not counted in tailgate_ejections_total{reason=\"engine\"}")
	}
	if !strings.Contains(ws[0].stderr.String(), "engine not answering: replica out of service") {
		t.Error("the worker did not log why its replica went out of service")
	}
}

// buildFakeVLLM builds the fake `vllm` executable into a temporary
// directory and returns its path.
func buildFakeVLLM(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "vllm")
	build := exec.Command("go", "build", "-o", bin, "../serving/launcher/testdata/fakevllm")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build fake vllm: %v\n%s", err, out)
	}
	return bin
}

// TestVLLMThatCannotStartSaysWhy: a vLLM that rejects its command line
// (here a removed flag: argparse's exit status 2) is started once, not
// restarted forever; the worker stays up and registered, and the gateway's
// admin API shows the replica failed with vLLM's own error in the reason
// and in its engine lines.
func TestVLLMThatCannotStartSaysWhy(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the tailgate binary")
	}
	vllm := buildFakeVLLM(t)
	record := filepath.Join(t.TempDir(), "vllm.jsonl")
	t.Setenv("FAKE_VLLM_RECORD", record)
	g := startGateway(t)
	tailgate(t, "workers", "approve", "--data", g.dir, "w1")
	w := startProc(t, "worker w1", false, "worker", "--gateway", g.admin,
		"--cluster-token-file", filepath.Join(g.dir, "cluster.token"), "--listen", "127.0.0.1:0", "--replica-id", "w1",
		"--data", filepath.Join(g.dir, "w1"), "--engine", "vllm", "--vllm-binary", vllm, "--model", "org/fake-model",
		"--vllm-arg=--disable-log-requests")

	var r replicaView
	testkit.WaitWithin(t, 30*time.Second, "w1 reported as failed", func() bool {
		r = g.replica("w1")
		return r.State == "failed"
	})
	const said = "vllm: error: unrecognized arguments: --disable-log-requests"
	if want := "engine rejected its command line (exit status 2): " + said + "; not restarting: "; !strings.HasPrefix(r.Reason, want) {
		t.Errorf("w1 reason %q, want it to start with %q", r.Reason, want)
	}
	if !slices.Contains(r.EngineLog, said) || !slices.Contains(r.EngineLog, "usage: vllm serve [model_tag] [options]") {
		t.Errorf("engine_log %q lacks vLLM's error", r.EngineLog)
	}
	// Still so a while later: no restart (the first would come after 1s).
	time.Sleep(1500 * time.Millisecond)
	if r := g.replica("w1"); r.State != "failed" || !strings.Contains(r.Reason, said) {
		t.Errorf("w1 later: %s, %q", r.State, r.Reason)
	}
	raw, err := os.ReadFile(record)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(raw), `"event":"start"`); n != 1 {
		t.Errorf("vllm started %d times, want once", n)
	}
	select {
	case <-w.Done():
		t.Fatalf("the worker exited: %v", w.Err())
	default:
	}
	if !strings.Contains(w.stderr.String(), "engine rejected its command line; not restarting") {
		t.Errorf("the worker did not log that the engine rejected its command line:\n%s", w.stderr.String())
	}
}

// TestUpWithoutVLLMSaysSoAtOnce: `up --engine vllm` with no vLLM fails
// before starting anything, naming the fix, instead of restarting its
// workers forever.
func TestUpWithoutVLLMSaysSoAtOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the tailgate binary")
	}
	tests := []struct {
		name  string
		flags []string
		want  string
	}{
		{"none on PATH", nil, "vllm not found on PATH: install vLLM or pass --vllm-binary"},
		{"--vllm-binary missing", []string{"--vllm-binary", "/nonexistent/vllm"}, "vllm binary: exec: \"/nonexistent/vllm\""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cmd := exec.Command(binPath, append([]string{"up", "--data", t.TempDir(), "--listen", "127.0.0.1:0",
				"--admin-listen", "127.0.0.1:0", "--engine", "vllm", "--model", "org/m"}, tt.flags...)...)
			cmd.Env = append(os.Environ(), "PATH="+t.TempDir())
			out, err := cmd.CombinedOutput()
			if err == nil || !strings.Contains(string(out), tt.want) {
				t.Fatalf("up: %v, output:\n%s\nwant an error containing %q", err, out, tt.want)
			}
		})
	}
}
