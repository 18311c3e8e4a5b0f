package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/serving/sim"
)

// TestSimFlagsReachChildEngines: every sim knob `up` and `worker --engine
// sim` pass on (sim.Flags.args) parses back into the same engine config.
func TestSimFlagsReachChildEngines(t *testing.T) {
	var parent sim.Flags
	fs := flag.NewFlagSet("parent", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	parent.Register(fs)
	err := fs.Parse([]string{
		"--sim-ttft", "80ms", "--sim-ttft-sigma", "-1", "--sim-tpot", "3ms", "--sim-stall-prob", "0.01",
		"--sim-stall-factor", "4", "--sim-max-seqs", "9", "--sim-default-max-tokens", "77",
		"--sim-max-model-len", "36000",
		"--sim-reasoning-tokens", "12", "--sim-reasoning-field", "both", "--sim-embedding-dim", "32",
		"--sim-error-rate", "0.05", "--sim-429-rate", "0.1", "--sim-retry-after", "2500ms", "--sim-hang-rate", "0.02",
		"--sim-keep-alive", "3s", "--sim-stream-interval", "4", "--sim-kv-cache-tokens", "40000",
		"--sim-prefill-per-token", "25us", "--sim-prefix-cache-blocks", "128",
		"--sim-seeded-latency", "--sim-start-delay", "40s",
		"--sim-max-num-batched-tokens", "2048", "--sim-tensor-parallel-size", "2",
	})
	if err != nil {
		t.Fatal(err)
	}
	var child sim.Flags
	cfs := flag.NewFlagSet("child", flag.ContinueOnError)
	cfs.SetOutput(io.Discard)
	child.Register(cfs)
	if err := cfs.Parse(parent.Args()); err != nil {
		t.Fatalf("child flags %q: %v", parent.Args(), err)
	}
	want, got := parent.Config("m"), child.Config("m")
	if got != want {
		t.Errorf("child config %+v\nwant %+v", got, want)
	}
	if got.ReasoningTokens != 12 || got.ReasoningField != "both" || got.RetryAfter != 2500*time.Millisecond || got.HangRate != 0.02 || got.KeepAlive != 3*time.Second || got.StreamInterval != 4 || got.KVCacheTokens != 40000 || !got.LatencyFromContent ||
		got.PrefillPerToken != 25*time.Microsecond || got.PrefixCacheBlocks != 128 || got.MaxNumBatchedTokens != 2048 || got.TensorParallelSize != 2 || got.MaxModelLen != 36000 {
		t.Errorf("knobs lost on the way: %+v", got)
	}
	if err := got.Validate(); err != nil {
		t.Errorf("config: %v", err)
	}
	if child.StartDelay() != 40*time.Second {
		t.Errorf("--sim-start-delay lost on the way: %s", child.StartDelay())
	}
}

// TestREADMEDocumentsEverySimKnob: the sim's docs page (docs/sim.md, also
// `tailgate help sim`) names each --sim-* flag, and only flags that exist.
func TestREADMEDocumentsEverySimKnob(t *testing.T) {
	raw, err := os.ReadFile("docs/sim.md")
	if err != nil {
		t.Fatal(err)
	}
	section := string(raw)
	var sf sim.Flags
	fs := flag.NewFlagSet("sim", flag.ContinueOnError)
	sf.Register(fs)
	named := map[string]bool{}
	for _, m := range regexp.MustCompile("`--(sim-[a-z0-9-]+)").FindAllStringSubmatch(section, -1) {
		named[m[1]] = true
		if fs.Lookup(m[1]) == nil {
			t.Errorf("docs/sim.md names --%s, which the sim knobs do not have", m[1])
		}
	}
	fs.VisitAll(func(f *flag.Flag) {
		if !named[f.Name] {
			t.Errorf("--%s is not in docs/sim.md", f.Name)
		}
	})
}

// TestSimClosesIdleConnectionsLikeUvicorn: `tailgate sim` started with
// vLLM's VLLM_HTTP_TIMEOUT_KEEP_ALIVE in its environment closes a
// keep-alive connection idle that long, as vLLM does.
func TestSimClosesIdleConnectionsLikeUvicorn(t *testing.T) {
	t.Setenv(sim.KeepAliveEnv, "1")
	ctx, cancel := context.WithCancel(t.Context())
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- cmdSim(ctx, []string{"--listen", "127.0.0.1:0", "--announce"}, pw, io.Discard)
		pw.Close()
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("sim: %v", err)
		}
	})
	line, err := bufio.NewReader(pr).ReadString('\n')
	if err != nil {
		t.Fatalf("read the announced address: %v", err)
	}
	go func() { _, _ = io.Copy(io.Discard, pr) }()
	addr := strings.TrimSpace(strings.TrimPrefix(line, announcePrefix))

	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, "GET /health HTTP/1.1\r\nHost: sim\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(conn)
	if status, err := br.ReadString('\n'); err != nil || !strings.Contains(status, " 200 ") {
		t.Fatalf("status line %q, %v", status, err)
	}
	// Read the rest of the answer, then wait: the deadline only bounds a
	// hung test.
	_ = conn.SetReadDeadline(time.Now().Add(15 * time.Second))
	for {
		_, err := br.ReadByte()
		if errors.Is(err, io.EOF) {
			return // closed by the engine
		}
		if err != nil {
			t.Fatalf("idle connection: %v, want EOF once the 1s keep-alive passed", err)
		}
	}
}

// TestSimServesOnAUnixSocket: `tailgate sim --uds PATH` serves on a socket
// of mode 0600 (as the worker starts it) and removes it when it stops;
// --uds with --listen is one clear error.
func TestSimServesOnAUnixSocket(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "engine.sock")
	if err := cmdSim(t.Context(), []string{"--listen", "127.0.0.1:0", "--uds", sock}, io.Discard, io.Discard); err == nil ||
		err.Error() != "sim: give --listen or --uds, not both" {
		t.Errorf("--listen with --uds: %v", err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- cmdSim(ctx, []string{"--uds", sock, "--model", "m"}, io.Discard, io.Discard) }()
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", sock)
		}}}
	var resp *http.Response
	var err error
	for range 500 { // until it listens; bounded at about 10s
		if resp, err = client.Get("http://engine/health"); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("GET /health over the socket: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("GET /health over the socket: %s", resp.Status)
	}
	if fi, err := os.Lstat(sock); err != nil || fi.Mode() != os.ModeSocket|0o600 {
		t.Errorf("socket: %v, %v; want a socket of mode 0600", fi, err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("sim: %v", err)
	}
	if _, err := os.Lstat(sock); !os.IsNotExist(err) {
		t.Errorf("socket left after sim stopped: %v", err)
	}
}

// TestSimListensOnlyOnceLoaded: with --sim-start-delay the engine refuses
// connections while it "loads" (as vLLM does until its engine is built),
// stops cleanly if told to while loading, and serves once the delay passed;
// a negative delay is one clear error.
func TestSimListensOnlyOnceLoaded(t *testing.T) {
	if err := cmdSim(t.Context(), []string{"--sim-start-delay", "-1s"}, io.Discard, io.Discard); err == nil ||
		!strings.Contains(err.Error(), "--sim-start-delay -1s") {
		t.Errorf("negative delay: %v", err)
	}
	dir := t.TempDir()
	get := func(sock string) (*http.Response, error) {
		client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableKeepAlives: true,
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				return (&net.Dialer{}).DialContext(ctx, "unix", sock)
			}}}
		return client.Get("http://engine/health")
	}

	// Loading for an hour: nothing answers, and a stop ends it at once.
	loading := filepath.Join(dir, "loading.sock")
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		done <- cmdSim(ctx, []string{"--uds", loading, "--sim-start-delay", "1h"}, io.Discard, io.Discard)
	}()
	time.Sleep(200 * time.Millisecond)
	if resp, err := get(loading); err == nil {
		resp.Body.Close()
		t.Fatalf("GET /health while loading answered %s; want no answer, as vLLM before its engine is loaded", resp.Status)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("sim stopped while loading: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("sim did not stop while loading")
	}

	// Loaded after 300ms: it serves.
	sock := filepath.Join(dir, "engine.sock")
	ctx, cancel = context.WithCancel(t.Context())
	go func() {
		done <- cmdSim(ctx, []string{"--uds", sock, "--sim-start-delay", "300ms"}, io.Discard, io.Discard)
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("sim: %v", err)
		}
	}()
	var resp *http.Response
	var err error
	for range 500 { // bounded at about 10s
		if resp, err = get(sock); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("GET /health once loaded: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("GET /health once loaded: %s", resp.Status)
	}
}
