package launcher

import (
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/e2e/testkit"
)

func TestNewRejectsBadConfig(t *testing.T) {
	t.Parallel()
	cmd := func(string) ([]string, []string, error) { return []string{"true"}, nil, nil }
	tests := []struct {
		name string
		cfg  Config
		want string
	}{
		{"no command", Config{Model: "m"}, "Command is required"},
		{"no model", Config{Command: cmd}, "Model is required"},
		{"negative duration", Config{Command: cmd, Model: "m", StopGrace: -time.Second}, "must not be negative"},
		{"negative warm-up", Config{Command: cmd, Model: "m", Warmup: -1}, "NoWarmup turns it off"},
		{"backoff bounds reversed", Config{Command: cmd, Model: "m", BackoffMin: time.Minute, BackoffMax: time.Second}, "exceeds BackoffMax"},
		{"min above default max", Config{Command: cmd, Model: "m", BackoffMin: 2 * time.Minute}, "exceeds BackoffMax"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := New(tt.cfg); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("New = %v, want an error containing %q", err, tt.want)
			}
		})
	}
}

func TestRunFailsAtOnceWhenEngineCannotStart(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		command func(sock string) ([]string, []string, error)
		want    string
	}{
		{
			name: "explicit vllm binary missing",
			command: func(sock string) ([]string, []string, error) {
				return VLLMCommand(VLLMOptions{Binary: "/nonexistent/bin/vllm", Model: "m"}, sock)
			},
			want: "/nonexistent/bin/vllm",
		},
		{
			name:    "executable vanished after lookup",
			command: func(string) ([]string, []string, error) { return []string{"/nonexistent/engine", "serve"}, nil, nil },
			want:    "start engine: fork/exec /nonexistent/engine: no such file or directory",
		},
		{
			name:    "command error",
			command: func(string) ([]string, []string, error) { return nil, nil, errors.New("bad flags") },
			want:    "bad flags",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var states []string
			l, err := New(Config{Model: "m", Command: tt.command, OnState: func(s, _ string) { states = append(states, s) }})
			if err != nil {
				t.Fatal(err)
			}
			err = l.Run(t.Context())
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Run = %v, want an error containing %q", err, tt.want)
			}
			if state, reason := l.State(); state != "failed" || !strings.Contains(reason, tt.want) {
				t.Errorf("State = %q, %q; want failed naming the problem", state, reason)
			}
			if !slices.Equal(states, []string{"failed"}) || l.Restarts() != 0 {
				t.Errorf("states %q, restarts %d; want one failure, no retry", states, l.Restarts())
			}
		})
	}
}

func TestReadyOnlyAfterHealthModelAndWarmup(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		warmup     int
		noWarmup   bool
		wantChats  int
		wantStates []string
	}{
		{"default warm-up", 0, false, 3, []string{"starting", "warming", "ready"}},
		{"one warm-up request", 1, false, 1, []string{"starting", "warming", "ready"}},
		{"warm-up off", 0, true, 0, []string{"starting", "ready"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := start(t, VLLMOptions{ServedModelName: "served", GPUs: "1"},
				[]string{"FAKE_VLLM_STARTUP_DELAY=400ms"}, Config{Model: "served", Warmup: tt.warmup, NoWarmup: tt.noWarmup})
			changes := h.waitState("ready", 1)

			if got := h.stateNames(); !slices.Equal(got, tt.wantStates) {
				t.Errorf("states = %q, want %q", got, tt.wantStates)
			}
			for _, c := range changes {
				want := 0
				if c.state == "ready" {
					want = tt.wantChats
				}
				if c.chats != want {
					t.Errorf("engine had %d warm-up requests when %s was reported, want %d", c.chats, c.state, want)
				}
			}
			if state, reason := h.l.State(); state != "ready" || reason != "" {
				t.Errorf("State = %q, %q; want ready", state, reason)
			}

			// The engine waited for is the one started, as configured.
			starts := h.events("start")
			if len(starts) != 1 {
				t.Fatalf("%d engine starts, want 1", len(starts))
			}
			// It listens on a Unix socket, never on a TCP port: no --host,
			// no --port. The socket is the worker's alone: mode 0600 in a
			// directory of mode 0700 owned by the worker's user.
			sock := h.l.EngineSocket()
			wantArgs := []string{fakeVLLM, "serve", "m", "--uds", sock, "--served-model-name", "served"}
			if sock == "" || !slices.Equal(starts[0].Argv, wantArgs) {
				t.Errorf("engine argv = %q, want %q", starts[0].Argv, wantArgs)
			}
			checkPrivateSocket(t, sock)
			// The engine keeps idle connections for serving.EngineKeepAlive,
			// which the sidecar's idle timeout stays below.
			if env := starts[0].Env; env["VLLM_NO_USAGE_STATS"] != "1" || env["CUDA_VISIBLE_DEVICES"] != "1" ||
				env["VLLM_HTTP_TIMEOUT_KEEP_ALIVE"] != "5" {
				t.Errorf("engine env = %v, want usage stats off, GPU 1 and a keep-alive of 5s", env)
			}
			if starts[0].PID != h.l.PID() {
				t.Errorf("PID = %d, engine reports %d", h.l.PID(), starts[0].PID)
			}

			// The engine got a fresh API key in its environment, not on its
			// command line, and answers /v1 only with it: the launcher's
			// probes and warm-up carried it, anyone else is refused.
			key := h.l.EngineKey()
			if len(key) < 20 || starts[0].Env["VLLM_API_KEY"] != key {
				t.Errorf("engine env VLLM_API_KEY = %q, EngineKey = %q; want the same random key", starts[0].Env["VLLM_API_KEY"], key)
			}
			for _, arg := range starts[0].Argv {
				if key != "" && strings.Contains(arg, key) {
					t.Errorf("engine argv %q shows the API key", starts[0].Argv)
				}
			}
			for _, tt := range []struct {
				auth string
				want int
			}{{"", http.StatusUnauthorized}, {"Bearer wrong", http.StatusUnauthorized}, {"Bearer " + key, http.StatusOK}} {
				req, _ := http.NewRequest(http.MethodGet, h.l.EngineURL()+"/v1/models", nil)
				if tt.auth != "" {
					req.Header.Set("Authorization", tt.auth)
				}
				resp, err := socketClient(sock).Do(req)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				if resp.StatusCode != tt.want {
					t.Errorf("GET /v1/models with Authorization %q = %d, want %d", tt.auth, resp.StatusCode, tt.want)
				}
			}

			// Waiting was reported, and the engine's output reached the log,
			// one record per line, tagged with the engine.
			if lines := h.logs.logLines("engine starting: waited", "of 5s; last /health: no socket yet"); len(lines) == 0 {
				t.Errorf("no progress line while the engine loaded; log:\n%s", h.logs)
			}
			for _, want := range []string{"fakevllm: loading model m", "fakevllm: progress 1/2", "fakevllm: progress 2/2"} {
				if lines := h.logs.logLines(`msg="`+want+`"`, "engine=vllm", fmt.Sprintf("pid=%d", h.l.PID())); len(lines) != 1 {
					t.Errorf("engine output %q forwarded %d times, want once; log:\n%s", want, len(lines), h.logs)
				}
			}
		})
	}
}

func TestEngineThatNeverBecomesReadyIsKilledAndRestarted(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		opts       VLLMOptions
		knobs      []string
		wantReason string
	}{
		{
			name:       "health never 200",
			knobs:      []string{"FAKE_VLLM_NEVER_READY=1"},
			wantReason: "model never became ready within 1s (last /health: 503 Service Unavailable); last engine output: fakevllm: progress 2/2; restarting in 50ms",
		},
		{
			name:       "model never listed",
			opts:       VLLMOptions{ServedModelName: "other"},
			wantReason: `model never became ready within 1s (last /v1/models: model "m" not listed (listed: other)); last engine output: fakevllm: progress 2/2; restarting in 50ms`,
		},
		{
			name:       "never listens",
			knobs:      []string{"FAKE_VLLM_STARTUP_DELAY=1h"},
			wantReason: "model never became ready within 1s (last /health: no socket yet); last engine output: fakevllm: progress 2/2; restarting in 50ms",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := start(t, tt.opts, tt.knobs, Config{StartupTimeout: time.Second})
			changes := h.waitState("starting", 2)

			want := []stateChange{
				{state: "starting", reason: `waiting for the engine to serve "m"`},
				{state: "failed", reason: tt.wantReason},
				{state: "starting", reason: `waiting for the engine to serve "m"`},
			}
			if !slices.Equal(changes[:3], want) {
				t.Errorf("state changes:\n got %+v\nwant %+v", changes[:3], want)
			}
			if h.l.Restarts() < 1 {
				t.Errorf("Restarts = %d, want at least 1", h.l.Restarts())
			}
			first := h.events("start")[0]
			waitGone(t, "first engine", first.PID)
			waitGone(t, "first engine's child", first.ChildPID)
			if !slices.ContainsFunc(h.events("sigterm"), func(e event) bool { return e.PID == first.PID }) {
				t.Error("the engine past its deadline was not sent SIGTERM first")
			}
			if err := h.stop(); err != nil {
				t.Errorf("Run = %v, want nil", err)
			}
		})
	}
}

func TestWarmupFailureIsNotReady(t *testing.T) {
	t.Parallel()
	h := start(t, VLLMOptions{}, []string{"FAKE_VLLM_CHAT_STATUS=500"}, Config{})
	changes := h.waitState("starting", 2)
	want := []string{"starting", "warming", "failed", "starting"}
	if got := h.stateNames()[:4]; !slices.Equal(got, want) {
		t.Fatalf("states = %q, want %q", got, want)
	}
	if reason := changes[2].reason; !strings.HasPrefix(reason, "warm-up 1 of 3 (/v1/chat/completions): 500 Internal Server Error: ") ||
		!strings.Contains(reason, "fake failure") {
		t.Errorf("failure reason = %q", reason)
	}
	if slices.Contains(h.stateNames(), "ready") {
		t.Error("reported ready although warm-up failed")
	}
}

// TestBaseModelWarmsUpWithCompletions: a model without a chat template,
// whose chat completions vLLM refuses with 400, is warmed up with plain
// completions and becomes ready, the log saying which warm-up ran.
func TestBaseModelWarmsUpWithCompletions(t *testing.T) {
	t.Parallel()
	h := start(t, VLLMOptions{}, []string{"FAKE_VLLM_NO_CHAT_TEMPLATE=1"}, Config{})
	h.waitState("ready", 1)
	if got := h.stateNames(); !slices.Equal(got, []string{"starting", "warming", "ready"}) {
		t.Errorf("states = %q, want starting, warming, ready", got)
	}
	if chats, completions := h.count("chat"), h.count("completion"); chats != 1 || completions != 3 {
		t.Errorf("warm-up sent %d chat and %d plain completions, want 1 refused chat and 3 completions", chats, completions)
	}
	if got := h.logs.logLines("chat warm-up refused; warming up with /v1/completions instead", "level=WARN",
		"default chat template is no longer allowed"); len(got) != 1 {
		t.Errorf("log lines saying the chat warm-up was refused: %q\nlog:\n%s", got, h.logs)
	}
	if got := h.logs.logLines("engine warmed up", "endpoint=/v1/completions", "requests=3"); len(got) != 1 {
		t.Errorf("log lines saying how the engine warmed up: %q", got)
	}
}

// TestWorkerAPIKeyIsNotTheEngines: a VLLM_API_KEY in the worker's
// environment does not reach the engine, which would then refuse the
// launcher's probes: the engine requires the launcher's key, it becomes
// ready, and the log says why the inherited key is not used.
func TestWorkerAPIKeyIsNotTheEngines(t *testing.T) {
	t.Parallel()
	h := start(t, VLLMOptions{}, []string{"VLLM_API_KEY=mine"}, Config{})
	h.waitState("ready", 1)
	key := h.l.EngineKey()
	if got := h.events("start")[0].Env["VLLM_API_KEY"]; got != key || key == "mine" {
		t.Errorf("engine VLLM_API_KEY = %q, launcher's key %q; want the launcher's", got, key)
	}
	if got := h.logs.logLines("VLLM_API_KEY in the worker's environment is not the engine's key", "level=WARN"); len(got) != 1 {
		t.Errorf("warnings about the inherited key: %q", got)
	}
}

func TestCrashedEngineIsRestarted(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name        string
		stableAfter time.Duration
		readyFor    time.Duration // before each crash
		wantBackoff []string
	}{
		{"backoff grows", 0, 0, []string{"50ms", "100ms"}},
		{"backoff starts over after a stable run", 100 * time.Millisecond, 300 * time.Millisecond, []string{"50ms", "50ms"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := start(t, VLLMOptions{}, nil, Config{StableAfter: tt.stableAfter})
			for i := range 2 {
				h.waitState("ready", i+1)
				time.Sleep(tt.readyFor)
				pid, key := h.l.PID(), h.l.EngineKey()
				child := h.events("start")[i].ChildPID
				if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
					t.Fatal(err)
				}
				changes := h.waitState("ready", i+2)
				waitGone(t, "crashed engine's orphaned child", child)
				if h.l.PID() == pid || h.l.PID() == 0 {
					t.Errorf("PID = %d after restart, crashed engine was %d", h.l.PID(), pid)
				}
				if got := h.l.EngineKey(); got == key || h.events("start")[i+1].Env["VLLM_API_KEY"] != got {
					t.Errorf("restarted engine's API key %q (in its env %q), crashed engine's %q; want a new one",
						got, h.events("start")[i+1].Env["VLLM_API_KEY"], key)
				}
				// After the crash: failed (with the cause and the pause),
				// then a full new start up to ready.
				tail := changes[len(changes)-4:]
				wantReason := "engine exited: signal: killed; restarting in " + tt.wantBackoff[i]
				if tail[0].state != "failed" || tail[0].reason != wantReason {
					t.Errorf("after crash %d: %+v, want failed %q", i+1, tail[0], wantReason)
				}
				if got := []string{tail[1].state, tail[2].state, tail[3].state}; !slices.Equal(got, []string{"starting", "warming", "ready"}) {
					t.Errorf("after crash %d: states %q", i+1, got)
				}
			}
			if h.l.Restarts() != 2 {
				t.Errorf("Restarts = %d, want 2", h.l.Restarts())
			}
			// Each killed engine left its socket behind; each new one bound
			// the same path again, and the directory goes with the launcher.
			sock := h.l.EngineSocket()
			for _, ev := range h.events("start") {
				if !slices.Equal(ev.Argv[3:5], []string{"--uds", sock}) {
					t.Errorf("engine argv %q, want --uds %s", ev.Argv, sock)
				}
			}
			checkPrivateSocket(t, sock)
			if err := h.stop(); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Lstat(filepath.Dir(sock)); !os.IsNotExist(err) {
				t.Errorf("the socket's directory is still there after Run returned: %v", err)
			}
		})
	}
}

func TestBackoffDoublesWhileEngineKeepsCrashing(t *testing.T) {
	t.Parallel()
	h := start(t, VLLMOptions{}, []string{"FAKE_VLLM_EXIT_AFTER=0s"}, Config{BackoffMin: 50 * time.Millisecond, BackoffMax: 200 * time.Millisecond,
		StartFailures: 100})
	backoffs := []time.Duration{50, 100, 200, 200, 200}
	testkit.WaitFor(t, "six engine starts", func() bool { return h.count("start") >= len(backoffs)+1 })
	if err := h.stop(); err != nil {
		t.Fatal(err)
	}

	starts := h.events("start")
	for i, b := range backoffs {
		b *= time.Millisecond
		if gap := time.Duration(starts[i+1].Time - starts[i].Time); gap < b {
			t.Errorf("restart %d came %s after the previous start, want at least the backoff %s", i+1, gap, b)
		}
	}
	var reasons []string
	for _, c := range h.changes() {
		if c.state == "failed" && len(reasons) < len(backoffs) {
			reasons = append(reasons, c.reason)
		}
		if c.state == "ready" || c.state == "warming" {
			t.Errorf("state %s reported for an engine that never served", c.state)
		}
	}
	for i, b := range backoffs {
		// The crash races the fake's progress lines to be the last output.
		prefix := "engine exited while starting: exit status 1; last engine output: fakevllm: "
		suffix := fmt.Sprintf("; restarting in %s", b*time.Millisecond)
		if i >= len(reasons) || !strings.HasPrefix(reasons[i], prefix) || !strings.HasSuffix(reasons[i], suffix) {
			t.Errorf("failure %d reason = %q, want %q…%q", i+1, reasons[i:], prefix, suffix)
		}
	}
	if h.l.Restarts() < len(backoffs) {
		t.Errorf("Restarts = %d, want at least %d", h.l.Restarts(), len(backoffs))
	}
	for _, s := range starts {
		waitGone(t, "engine", s.PID)
		waitGone(t, "engine's child", s.ChildPID)
	}
}

func TestStopEndsTheWholeProcessGroup(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		knobs     []string
		untilFrom string // state to reach before stopping
		stopGrace time.Duration
		minStop   time.Duration // Run must wait at least this long after cancel
	}{
		{name: "ready engine", untilFrom: "ready"},
		{name: "engine still loading", knobs: []string{"FAKE_VLLM_STARTUP_DELAY=1h"}, untilFrom: "starting"},
		{name: "engine ignoring SIGTERM", knobs: []string{"FAKE_VLLM_IGNORE_SIGTERM=1"}, untilFrom: "ready",
			stopGrace: 300 * time.Millisecond, minStop: 300 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := start(t, VLLMOptions{}, tt.knobs, Config{StopGrace: tt.stopGrace})
			h.waitState(tt.untilFrom, 1)
			testkit.WaitFor(t, "the engine to record its start", func() bool { return h.count("start") == 1 })
			eng := h.events("start")[0]

			began := time.Now()
			if err := h.stop(); err != nil {
				t.Fatalf("Run = %v, want nil", err)
			}
			if took := time.Since(began); took < tt.minStop {
				t.Errorf("Run returned %s after cancel, before the grace of %s", took, tt.minStop)
			}
			if !slices.ContainsFunc(h.events("sigterm"), func(e event) bool { return e.PID == eng.PID }) {
				t.Error("engine was not sent SIGTERM")
			}
			waitGone(t, "engine", eng.PID)
			waitGone(t, "engine's child in its process group", eng.ChildPID)
			if state, reason := h.l.State(); state != "failed" || reason != "engine stopped" {
				t.Errorf("State = %q, %q after stop", state, reason)
			}
			if h.l.PID() != 0 {
				t.Errorf("PID = %d after stop, want 0", h.l.PID())
			}
		})
	}
}
