package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/e2e/testkit"
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
	g.approve("w1", filepath.Join(g.dir, "w1"))
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

// TestWorkerEngineListensOnNoTCPPort: `tailgate worker --engine sim` serves
// chat end to end through the gateway while its engine process (`tailgate
// sim --uds`) listens on no TCP port: vLLM's API key guards only /v1, so a
// port would let anyone on the box call /invocations, /tokenize, /rerank …
// unmetered. Its one listening socket is a Unix socket of mode 0600 in a
// directory of mode 0700, both the worker's user's.
func TestWorkerEngineListensOnNoTCPPort(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the tailgate binary")
	}
	g := startGateway(t)
	w := g.startWorker("w1")
	g.waitReady("w1")
	for _, stream := range []bool{false, true} {
		if status, _, body, err := g.chat(context.Background(), stream, 4); err != nil || status != http.StatusOK {
			t.Fatalf("chat (stream %v) through the gateway: %d %s %v", stream, status, body, err)
		}
	}

	engine := enginePID(t, w.PID()) // its child running `tailgate sim --uds`
	tcp, unix := testkit.Listening(t, engine)
	if len(tcp) != 0 {
		t.Errorf("engine (pid %d) listens on %d TCP sockets, want none", engine, len(tcp))
	}
	if len(unix) != 1 {
		t.Fatalf("engine listens on Unix sockets %q, want one", unix)
	}
	for _, c := range []struct {
		path string
		mode os.FileMode
	}{{unix[0], os.ModeSocket | 0o600}, {filepath.Dir(unix[0]), os.ModeDir | 0o700}} {
		fi, err := os.Lstat(c.path)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode() != c.mode || int(fi.Sys().(*syscall.Stat_t).Uid) != os.Getuid() {
			t.Errorf("%s: mode %v, want %v owned by the worker's user", c.path, fi.Mode(), c.mode)
		}
	}
	// The same check sees a TCP listener where there is one: the worker's
	// sidecar.
	if tcp, _ := testkit.Listening(t, w.PID()); len(tcp) == 0 {
		t.Error("the check finds no TCP listener in the worker, whose sidecar listens on one")
	}
}

// TestUpWithVLLMEngine runs `tailgate up --engine vllm` against the fake
// `vllm` executable (the simulated engine behind vLLM's command line): the
// workers launch it with the expected arguments, wait for it, warm it up,
// register, and serve requests for the model.
func TestUpWithVLLMEngine(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the tailgate binary")
	}
	bin := t.TempDir()
	build := exec.Command("go", "build", "-o", filepath.Join(bin, "vllm"), "../serving/launcher/testdata/fakevllm")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build fake vllm: %v\n%s", err, out)
	}
	record := filepath.Join(t.TempDir(), "vllm.jsonl")
	t.Setenv("PATH", bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	t.Setenv("FAKE_VLLM_RECORD", record)

	p := startUp(t, "--replicas", "2", "--engine", "vllm", "--model", "org/fake-model",
		"--vllm-arg=--enable-prefix-caching", "--warmup", "2")
	g := &gatewayProcess{t: t, admin: p.admin, api: p.api, key: p.demoKey, token: readToken(t, filepath.Join(p.dir, "admin.token"))}
	g.waitReady("worker-1", "worker-2")

	body := `{"model":"org/fake-model","max_tokens":3,"messages":[{"role":"user","content":"hi"}]}`
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	code, _, raw, err := g.chatBody(ctx, body)
	if err != nil || code != 200 || !strings.Contains(raw, `"completion_tokens":3`) {
		t.Fatalf("request through vLLM workers: %d %v %s", code, err, raw)
	}

	// Each worker started vllm serve with its GPU, on a Unix socket of its own
	// (no TCP port), with the extra argument.
	f, err := os.Open(record)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	gpus, keys, socks := map[string]bool{}, map[string]bool{}, map[string]bool{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var ev struct {
			Event string            `json:"event"`
			Argv  []string          `json:"argv"`
			Env   map[string]string `json:"env"`
		}
		if json.Unmarshal(sc.Bytes(), &ev) != nil || ev.Event != "start" {
			continue
		}
		args := strings.Join(ev.Argv[1:], " ")
		if len(ev.Argv) != 6 || ev.Argv[3] != "--uds" || socks[ev.Argv[4]] ||
			strings.Join([]string{ev.Argv[1], ev.Argv[2], ev.Argv[5]}, " ") != "serve org/fake-model --enable-prefix-caching" {
			t.Errorf("vllm argv: %q, want serve org/fake-model --uds <a socket of its own> --enable-prefix-caching", args)
		} else {
			socks[ev.Argv[4]] = true
		}
		// Each engine got its own API key, in its environment, not its argv.
		key := ev.Env["VLLM_API_KEY"]
		if key == "" || keys[key] || strings.Contains(args, key) {
			t.Errorf("vllm API key %q: want a fresh one per engine, only in its environment (argv %q)", key, args)
		}
		keys[key] = true
		if ev.Env["VLLM_NO_USAGE_STATS"] != "1" {
			t.Errorf("VLLM_NO_USAGE_STATS = %q", ev.Env["VLLM_NO_USAGE_STATS"])
		}
		gpus[ev.Env["CUDA_VISIBLE_DEVICES"]] = true
	}
	if !gpus["0"] || !gpus["1"] {
		t.Fatalf("CUDA_VISIBLE_DEVICES per worker: %v, want 0 and 1", gpus)
	}
}

// runGPUCheck runs scripts/gpu-check.sh against the fake vllm with env
// added, and returns its exit status and output.
func runGPUCheck(t *testing.T, env ...string) (int, string) {
	t.Helper()
	vllm := buildFakeVLLM(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "../scripts/gpu-check.sh")
	cmd.Env = append(os.Environ(), append([]string{"TAILGATE=" + binPath, "VLLM_BINARY=" + vllm, "OUT=" + t.TempDir(),
		"MODEL=org/fake-model", "TOOL_CALL_PARSER=hermes", "BENCH_SECONDS=3", "DRAIN_TOKENS=200", "FAKE_VLLM_TPOT=10ms",
		"TUNE_SECONDS=2", "TUNE_RATES=2", "TUNE_SEQS=4"}, env...)...)
	// The script's own trap stops `tailgate up`; a SIGTERM lets it run.
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 30 * time.Second
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	switch {
	case ctx.Err() != nil:
		t.Fatalf("gpu-check.sh still running after 2 minutes; output:\n%s", out)
	case errors.As(err, &exit):
		return exit.ExitCode(), string(out)
	case err != nil:
		t.Fatal(err)
	}
	return 0, string(out)
}

var checkLine = regexp.MustCompile(`(?m)^(PASS|FAIL|SKIP) (\S+)`)

// checks returns the verdict of each check the script printed.
func checks(out string) map[string]string {
	got := map[string]string{}
	for _, m := range checkLine.FindAllStringSubmatch(out, -1) {
		got[m[2]] = m[1]
	}
	return got
}

// TestGPUCheckScript runs the GPU acceptance script against the fake vLLM
// (the simulated engine behind vLLM's command line): every check passes on
// a working deployment, and a broken engine makes it print FAIL and exit 1.
func TestGPUCheckScript(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the tailgate binary")
	}
	t.Run("all checks pass", func(t *testing.T) {
		t.Parallel()
		code, out := runGPUCheck(t)
		if code != 0 || !strings.HasSuffix(out, "\n11 passed, 0 failed\n") {
			t.Fatalf("exit status %d, output:\n%s\nwant exit 0 and \"11 passed, 0 failed\" last", code, out)
		}
		want := []string{"ready", "warm-up", "stream-chat", "completion", "tool-call", "metrics", "abort", "drain", "sigkill", "bench", "tune"}
		got := checks(out)
		for _, name := range want {
			if got[name] != "PASS" {
				t.Errorf("check %s: %q, want PASS", name, got[name])
			}
		}
		if t.Failed() {
			t.Logf("output:\n%s", out)
		}
	})
	t.Run("an engine failing chat fails the run", func(t *testing.T) {
		t.Parallel()
		// Long enough for a loaded machine to start the fake engine; the
		// script reports the last telling reason, not the restart's wait.
		code, out := runGPUCheck(t, "FAKE_VLLM_CHAT_STATUS=500", "READY_TIMEOUT=20")
		if code != 1 || !strings.Contains(out, "\nFAIL ready (not ready within 20s: state ") ||
			!strings.Contains(out, "500 Internal Server Error") || !strings.HasSuffix(out, "\n0 passed, 1 failed\n") {
			t.Fatalf("exit status %d, output:\n%s\nwant exit 1, FAIL ready naming the 500, and \"0 passed, 1 failed\" last", code, out)
		}
	})
}
