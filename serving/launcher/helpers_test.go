package launcher

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/e2e/testkit"
)

// fakeVLLM is the path of the fake `vllm` executable that TestMain builds
// from testdata/fakevllm and puts first on PATH.
var fakeVLLM string

func TestMain(m *testing.M) {
	os.Exit(runTests(m))
}

func runTests(m *testing.M) int {
	dir, err := os.MkdirTemp("", "launcher-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	bin := filepath.Join(dir, "bin")
	fakeVLLM = filepath.Join(bin, "vllm")
	build := exec.Command("go", "build", "-o", fakeVLLM, "./testdata/fakevllm")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build fake vllm:", err)
		return 1
	}
	os.Setenv("PATH", bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	return m.Run()
}

// event is one line the fake vllm recorded.
type event struct {
	Event    string            `json:"event"`
	PID      int               `json:"pid"`
	Time     int64             `json:"time_unix_nano"`
	Argv     []string          `json:"argv"`
	Env      map[string]string `json:"env"`
	ChildPID int               `json:"child_pid"`
}

type stateChange struct {
	state, reason string
	chats         int // warm-up requests the engines had received at the change
}

// harness runs one Launcher over the fake vllm.
type harness struct {
	t      *testing.T
	record string
	l      *Launcher
	logs   *syncBuffer

	mu     sync.Mutex
	states []stateChange

	cancel context.CancelFunc
	done   chan error
}

// testConfig is a Config with the short timings the tests use; fields set
// in cfg win.
func testConfig(cfg Config) Config {
	set := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	set(&cfg.StartupTimeout, 5*time.Second)
	set(&cfg.Progress, 100*time.Millisecond)
	set(&cfg.PollInterval, 20*time.Millisecond)
	set(&cfg.WarmupTimeout, 5*time.Second)
	set(&cfg.BackoffMin, 50*time.Millisecond)
	set(&cfg.BackoffMax, 400*time.Millisecond)
	set(&cfg.StopGrace, 5*time.Second)
	if cfg.Model == "" {
		cfg.Model = "m"
	}
	return cfg
}

// start runs a launcher of opts (Model "m" unless set) with the fake's
// knobs added to the engine environment; it is stopped at the test's end.
func start(t *testing.T, opts VLLMOptions, knobs []string, cfg Config) *harness {
	t.Helper()
	if opts.Model == "" {
		opts.Model = "m"
	}
	h := &harness{t: t, record: filepath.Join(t.TempDir(), "record.jsonl"), logs: &syncBuffer{}, done: make(chan error, 1)}
	cfg = testConfig(cfg)
	cfg.Command = func(sock string) ([]string, []string, error) {
		argv, env, err := VLLMCommand(opts, sock)
		return argv, append(append(env, "FAKE_VLLM_RECORD="+h.record), knobs...), err
	}
	cfg.Log = slog.New(slog.NewTextHandler(h.logs, nil))
	cfg.OnState = func(state, reason string) {
		chats := h.count("chat")
		h.mu.Lock()
		h.states = append(h.states, stateChange{state, reason, chats})
		h.mu.Unlock()
	}
	l, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	h.l = l
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	go func() { h.done <- l.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-h.done:
		case <-time.After(30 * time.Second):
			t.Error("Run did not return after cancel")
		}
	})
	return h
}

// stop cancels Run and returns its error.
func (h *harness) stop() error {
	h.t.Helper()
	h.cancel()
	select {
	case err := <-h.done:
		h.done <- err // for Cleanup
		return err
	case <-time.After(30 * time.Second):
		h.t.Fatal("Run did not return after cancel")
		return nil
	}
}

func (h *harness) changes() []stateChange {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]stateChange(nil), h.states...)
}

// stateNames returns the reported states, in order.
func (h *harness) stateNames() []string {
	var names []string
	for _, c := range h.changes() {
		names = append(names, c.state)
	}
	return names
}

// events returns what the fake engines recorded, optionally of one kind.
func (h *harness) events(kind string) []event {
	raw, err := os.ReadFile(h.record)
	if err != nil && !os.IsNotExist(err) {
		h.t.Fatal(err)
	}
	var evs []event
	sc := bufio.NewScanner(bytes.NewReader(raw))
	for sc.Scan() {
		var ev event
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			continue // a line being written
		}
		if kind == "" || ev.Event == kind {
			evs = append(evs, ev)
		}
	}
	return evs
}

func (h *harness) count(kind string) int { return len(h.events(kind)) }

// waitState waits until the n-th report (counting from 1) of state arrived
// and returns all changes so far.
func (h *harness) waitState(state string, n int) []stateChange {
	h.t.Helper()
	var got []stateChange
	testkit.WaitFor(h.t, fmt.Sprintf("state %s reported %d times", state, n), func() bool {
		got = h.changes()
		seen := 0
		for _, c := range got {
			if c.state == state {
				seen++
			}
		}
		return seen >= n
	})
	return got
}

// processGone reports whether pid no longer runs: no such process, or a
// zombie nobody reaped yet (PID 1 in some containers never does).
func processGone(pid int) bool {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	s := string(raw)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && strings.HasPrefix(s[i+1:], " Z")
}

func waitGone(t *testing.T, what string, pid int) {
	t.Helper()
	if pid == 0 {
		t.Fatalf("%s: no pid", what)
	}
	testkit.WaitFor(t, what+" to be gone", func() bool { return processGone(pid) })
}

// syncBuffer is the launcher's log output, read while it is written.
type syncBuffer struct{ testkit.Buffer }

// logLines returns the log lines that contain every one of parts.
func (b *syncBuffer) logLines(parts ...string) []string {
	var out []string
	for line := range strings.Lines(b.String()) {
		ok := true
		for _, p := range parts {
			ok = ok && strings.Contains(line, p)
		}
		if ok {
			out = append(out, line)
		}
	}
	return out
}

// socketClient returns a client whose every connection goes to the Unix
// socket at sock.
func socketClient(sock string) *http.Client {
	return &http.Client{Transport: &http.Transport{DisableKeepAlives: true,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", sock)
		}}}
}

// checkPrivateSocket fails t unless sock is a socket of mode 0600 in a
// directory of mode 0700, both owned by this process's user.
func checkPrivateSocket(t *testing.T, sock string) {
	t.Helper()
	for _, c := range []struct {
		path string
		mode os.FileMode
	}{{sock, os.ModeSocket | 0o600}, {filepath.Dir(sock), os.ModeDir | 0o700}} {
		fi, err := os.Lstat(c.path)
		if err != nil {
			t.Errorf("engine socket: %v", err)
			continue
		}
		if fi.Mode() != c.mode || int(fi.Sys().(*syscall.Stat_t).Uid) != os.Getuid() {
			t.Errorf("%s: mode %v, owner %d; want %v owned by %d", c.path, fi.Mode(), fi.Sys().(*syscall.Stat_t).Uid, c.mode, os.Getuid())
		}
	}
}
