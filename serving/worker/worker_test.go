package worker

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/e2e/testkit"
	"github.com/tailgate-dev/tailgate/serving"
	"github.com/tailgate-dev/tailgate/serving/sim"
)

// engineEnv, when set, makes the test binary the engine: the simulated
// engine on the Unix socket it names, as `tailgate sim --uds` serves. The
// launcher starts it like vLLM.
const engineEnv = "WORKER_TEST_ENGINE_SOCKET"

func TestMain(m *testing.M) {
	if sock := os.Getenv(engineEnv); sock != "" {
		runEngine(sock)
		return
	}
	os.Exit(m.Run())
}

// runEngine serves model "m" with 20ms per output token on the socket
// until SIGTERM, requiring the API key in $VLLM_API_KEY as vLLM does.
func runEngine(sock string) {
	eng, err := sim.New(sim.Config{Model: "m", TTFT: time.Millisecond, TPOT: 20 * time.Millisecond,
		APIKey: os.Getenv("VLLM_API_KEY")}, nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	ln, err := sim.ListenUnix(sock)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	srv := &http.Server{Handler: eng.Handler()}
	go func() { _ = srv.Serve(ln) }()
	<-ctx.Done()
	_ = srv.Close()
}

// engineCommand starts the test binary as the engine.
func engineCommand(sock string) ([]string, []string, error) {
	return []string{os.Args[0]}, []string{engineEnv + "=" + sock}, nil
}

// gateway is a fake gateway admin listener that records heartbeats.
type gateway struct {
	*httptest.Server
	mu    sync.Mutex
	beats []serving.Heartbeat
}

func startGateway(t *testing.T) *gateway {
	g := &gateway{}
	g.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != serving.HeartbeatPath || r.Header.Get("Authorization") != "Bearer tok" {
			http.Error(w, "no", http.StatusUnauthorized)
			return
		}
		var hb serving.Heartbeat
		if err := json.NewDecoder(r.Body).Decode(&hb); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		g.mu.Lock()
		g.beats = append(g.beats, hb)
		g.mu.Unlock()
		_ = json.NewEncoder(w).Encode(serving.HeartbeatReply{LeaseSeconds: 3})
	}))
	t.Cleanup(g.Close)
	return g
}

// states returns the states the gateway was told, repeats folded.
func (g *gateway) states() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []string
	for _, hb := range g.beats {
		if len(out) == 0 || out[len(out)-1] != hb.State {
			out = append(out, hb.State)
		}
	}
	return out
}

func (g *gateway) last() serving.Heartbeat {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.beats) == 0 {
		return serving.Heartbeat{}
	}
	return g.beats[len(g.beats)-1]
}

func listen(t *testing.T, addr string) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	return ln
}

func TestNewRejectsBadConfig(t *testing.T) {
	t.Parallel()
	ln := listen(t, "127.0.0.1:0")
	wild := listen(t, "0.0.0.0:0")
	good := Config{Gateways: []string{"http://gw:8081"}, ClusterToken: "tok", Listener: ln, Model: "m", Command: engineCommand}
	tests := []struct {
		name   string
		change func(*Config)
		want   string
	}{
		{"no gateway", func(c *Config) { c.Gateways = nil }, "a gateway URL is required"},
		{"gateway not a URL", func(c *Config) { c.Gateways = []string{"gw:8081"} }, `gateway URL "gw:8081" is not an http(s) URL`},
		{"gateway twice", func(c *Config) { c.Gateways = []string{"http://gw:8081", "http://gw:8081/"} }, "gateway gw:8081 is named twice"},
		{"no token", func(c *Config) { c.ClusterToken = "" }, "ClusterToken is required"},
		{"no listener", func(c *Config) { c.Listener = nil }, "Listener is required"},
		{"no model", func(c *Config) { c.Model = "" }, "Model is required"},
		{"no command", func(c *Config) { c.Command = nil }, "Command is required"},
		{"negative warm-up", func(c *Config) { c.Warmup = -1 }, "NoWarmup turns it off"},
		{"negative drain grace", func(c *Config) { c.DrainGrace = -time.Second }, "must not be negative"},
		{"wildcard listener without Advertise", func(c *Config) { c.Listener = wild }, "binds every interface: Advertise is required"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := good
			tt.change(&cfg)
			if _, err := New(cfg); err == nil || !strings.HasPrefix(err.Error(), "worker: ") || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("New = %v, want a worker: error containing %q", err, tt.want)
			}
		})
	}
	if _, err := New(good); err != nil {
		t.Fatalf("New(good) = %v", err)
	}
	cfg := good
	cfg.Listener, cfg.Advertise = wild, "http://10.0.0.5:9000"
	if _, err := New(cfg); err != nil {
		t.Fatalf("wildcard listener with Advertise: %v", err)
	}
}

func TestNewNamesTheReplicaAfterHostAndPort(t *testing.T) {
	t.Parallel()
	ln := listen(t, "127.0.0.1:0")
	w, err := New(Config{Gateways: []string{"http://gw:8081"}, ClusterToken: "tok", Listener: ln, Model: "m", Command: engineCommand})
	if err != nil {
		t.Fatal(err)
	}
	host, _ := os.Hostname()
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	if w.ReplicaID() != host+"-"+port || w.Address() != "http://"+ln.Addr().String() {
		t.Fatalf("ReplicaID %q Address %q", w.ReplicaID(), w.Address())
	}
}

// TestRunDrainsBeforeStoppingTheEngine: when Run's context ends, the gateway
// hears "draining" at once, a request in flight finishes (within the drain
// grace), and only then does the engine stop.
func TestRunDrainsBeforeStoppingTheEngine(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name         string
		noDrain      bool
		wantFinished bool
	}{
		{"in-flight request finishes", false, true},
		{"NoDrain cuts it", true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			g := startGateway(t)
			ln := listen(t, "127.0.0.1:0")
			w, err := New(Config{Gateways: []string{g.URL}, ClusterToken: "tok", Listener: ln, ReplicaID: "r1", Model: "m",
				Engine: "sim", Command: engineCommand, Warmup: 1, NoDrain: tt.noDrain})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			runErr := make(chan error, 1)
			go func() { runErr <- w.Run(ctx) }()
			testkit.WaitFor(t, "replica ready at the gateway", func() bool { return g.last().State == serving.StateReady })
			if hb := g.last(); hb.ReplicaID != "r1" || hb.Address != "http://"+ln.Addr().String() ||
				!slices.Equal(hb.Models, []string{"m"}) || hb.Engine != "sim" {
				t.Fatalf("heartbeat %+v", hb)
			}

			// 40 tokens at 20ms: the stream runs for most of a second.
			req, _ := http.NewRequest(http.MethodPost, w.Address()+"/v1/chat/completions", strings.NewReader(
				`{"model":"m","stream":true,"max_tokens":40,"messages":[{"role":"user","content":"hi"}]}`))
			req.Header.Set("Authorization", "Bearer tok")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d", resp.StatusCode)
			}
			body := bufio.NewReader(resp.Body)
			if _, err := body.ReadString('\n'); err != nil {
				t.Fatal(err)
			}
			cancel()

			var rest strings.Builder
			_, copyErr := body.WriteTo(&rest)
			finished := copyErr == nil && strings.HasSuffix(rest.String(), "data: [DONE]\n\n")
			if finished != tt.wantFinished {
				t.Errorf("request finished = %v (err %v), want %v", finished, copyErr, tt.wantFinished)
			}
			select {
			case err := <-runErr:
				if err != nil {
					t.Fatalf("Run = %v, want nil", err)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("Run did not return after cancel")
			}
			states := g.states()
			if states[len(states)-1] != serving.StateDraining {
				t.Errorf("states told the gateway %q, want draining last (the engine's stop is not reported)", states)
			}
		})
	}
}

// TestEngineAnswersOnlyTheSidecar: the worker serves requests end to end
// while its engine process listens on no TCP port at all, only on a Unix
// socket of mode 0600 in a directory of mode 0700 (vLLM's API key guards
// only /v1, so a port would let anyone on the box call the rest unmetered);
// and even on the socket the engine wants the key only the sidecar sends.
func TestEngineAnswersOnlyTheSidecar(t *testing.T) {
	t.Parallel()
	g := startGateway(t)
	ln := listen(t, "127.0.0.1:0")
	w, err := New(Config{Gateways: []string{g.URL}, ClusterToken: "tok", Listener: ln, ReplicaID: "r1", Model: "m",
		Engine: "sim", Warmup: 1, NoDrain: true, Command: engineCommand})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	runErr := make(chan error, 1)
	go func() { runErr <- w.Run(ctx) }()
	defer func() { cancel(); <-runErr }()
	testkit.WaitFor(t, "replica ready at the gateway", func() bool { return g.last().State == serving.StateReady })

	sock := w.launch.EngineSocket()
	chat := `{"model":"m","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`
	call := func(client *http.Client, base, auth string) (int, string) {
		req, _ := http.NewRequest(http.MethodPost, base+"/v1/chat/completions", strings.NewReader(chat))
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for range 3 {
		if status, body := call(http.DefaultClient, w.Address(), "Bearer tok"); status != http.StatusOK {
			t.Errorf("through the worker: %d %s, want 200", status, body)
		}
	}

	// The engine process listens on its socket and on no TCP port. The
	// same check finds this test's own TCP listener, so it can fail.
	pid := w.launch.PID()
	if tcp, unix := testkit.Listening(t, pid); len(tcp) != 0 || !slices.Equal(unix, []string{sock}) {
		t.Errorf("engine (pid %d) listens on TCP sockets %q and Unix %q; want only its socket %s", pid, tcp, unix, sock)
	}
	if tcp, _ := testkit.Listening(t, os.Getpid()); len(tcp) == 0 {
		t.Fatal("the check finds no TCP listener in this process, which has the sidecar's")
	}
	for _, c := range []struct {
		path string
		mode os.FileMode
	}{{sock, os.ModeSocket | 0o600}, {filepath.Dir(sock), os.ModeDir | 0o700}} {
		fi, err := os.Lstat(c.path)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode() != c.mode || int(fi.Sys().(*syscall.Stat_t).Uid) != os.Getuid() {
			t.Errorf("%s: mode %v owner %d, want %v owned by the worker's user %d", c.path, fi.Mode(),
				fi.Sys().(*syscall.Stat_t).Uid, c.mode, os.Getuid())
		}
	}

	// This test runs as the worker's user, so it may open the socket: the
	// engine still refuses it without the launcher's key.
	direct := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}}
	defer direct.CloseIdleConnections()
	for _, auth := range []string{"", "Bearer tok"} {
		if status, body := call(direct, "http://localhost", auth); status != http.StatusUnauthorized || body != `{"error":"Unauthorized"}` {
			t.Errorf("straight to the engine with Authorization %q: %d %s, want 401 Unauthorized", auth, status, body)
		}
	}
}

func TestRunFailsWhenTheEngineCannotStart(t *testing.T) {
	t.Parallel()
	g := startGateway(t)
	ln := listen(t, "127.0.0.1:0")
	w, err := New(Config{Gateways: []string{g.URL}, ClusterToken: "tok", Listener: ln, Model: "m",
		Command: func(string) ([]string, []string, error) { return []string{"/nonexistent/vllm"}, nil, nil }})
	if err != nil {
		t.Fatal(err)
	}
	err = w.Run(context.Background())
	if err == nil || !strings.Contains(err.Error(), "fork/exec /nonexistent/vllm") {
		t.Fatalf("Run = %v, want the engine's start error", err)
	}
	// The gateway heard why before the worker gave up.
	if hb := g.last(); hb.State != serving.StateDraining || !strings.Contains(hb.Reason, "the engine cannot start") ||
		!strings.Contains(hb.Reason, "fork/exec /nonexistent/vllm") {
		t.Errorf("last heartbeat: %s %q, want draining naming the start error", hb.State, hb.Reason)
	}
	if err := w.Run(context.Background()); err == nil || !strings.Contains(err.Error(), "Run called twice") {
		t.Errorf("second Run = %v", err)
	}
	// Ask the listener itself: a dial to its port could reach another
	// parallel test's server that was given the freed port.
	_ = ln.(*net.TCPListener).SetDeadline(time.Now().Add(100 * time.Millisecond))
	if c, err := ln.Accept(); err == nil {
		c.Close()
		t.Error("the sidecar's listener still accepts after Run returned")
	} else if !errors.Is(err, net.ErrClosed) {
		t.Errorf("the sidecar's listener is still open after Run returned (Accept: %v)", err)
	}
}

// TestFrozenEngineIsReportedAndRecovers: an engine process stopped behind
// the live sidecar (SIGSTOP) makes the replica failed at the gateway with
// the reason; SIGCONT makes it ready again.
func TestFrozenEngineIsReportedAndRecovers(t *testing.T) {
	t.Parallel()
	g := startGateway(t)
	ln := listen(t, "127.0.0.1:0")
	w, err := New(Config{Gateways: []string{g.URL}, ClusterToken: "tok", Listener: ln, ReplicaID: "r1", Model: "m",
		Engine: "sim", Command: engineCommand, NoWarmup: true, NoDrain: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	runErr := make(chan error, 1)
	go func() { runErr <- w.Run(ctx) }()
	defer func() {
		cancel()
		<-runErr
	}()
	testkit.WaitFor(t, "replica ready at the gateway", func() bool { return g.last().State == serving.StateReady })

	pid := w.launch.PID()
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer syscall.Kill(pid, syscall.SIGCONT)
	testkit.WaitFor(t, "the frozen engine reported", func() bool { return g.last().State == serving.StateFailed })
	if hb := g.last(); !strings.HasPrefix(hb.Reason, "engine not answering /health for ") {
		t.Errorf("reason %q", hb.Reason)
	}
	if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, "the engine back", func() bool { return g.last().State == serving.StateReady })
	if hb := g.last(); hb.Reason != "" || hb.EngineLog != nil {
		t.Errorf("ready heartbeat carries %q / %q", hb.Reason, hb.EngineLog)
	}
	if w.launch.PID() != pid || w.launch.Restarts() != 0 {
		t.Errorf("engine pid %d → %d, restarts %d: a frozen engine is not restarted", pid, w.launch.PID(), w.launch.Restarts())
	}
}

// TestFailingEngineSendsItsErrorLines: while the engine fails, heartbeats
// carry its last error lines and the reason names the last one.
func TestFailingEngineSendsItsErrorLines(t *testing.T) {
	t.Parallel()
	g := startGateway(t)
	ln := listen(t, "127.0.0.1:0")
	w, err := New(Config{Gateways: []string{g.URL}, ClusterToken: "tok", Listener: ln, ReplicaID: "r1", Model: "m", NoDrain: true,
		Command: func(string) ([]string, []string, error) {
			return []string{"sh", "-c", "echo loading; echo 'Traceback (most recent call last):' >&2; echo 'OSError: no such model: m' >&2; exit 1"}, nil, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	runErr := make(chan error, 1)
	go func() { runErr <- w.Run(ctx) }()
	defer func() {
		cancel()
		<-runErr
	}()
	testkit.WaitFor(t, "the failure reported", func() bool { return g.last().State == serving.StateFailed })
	hb := g.last()
	if want := []string{"Traceback (most recent call last):", "OSError: no such model: m"}; !slices.Equal(hb.EngineLog, want) {
		t.Errorf("engine_log %q, want %q", hb.EngineLog, want)
	}
	if !strings.Contains(hb.Reason, "exit status 1; last engine output: OSError: no such model: m; restarting in ") {
		t.Errorf("reason %q", hb.Reason)
	}
}
