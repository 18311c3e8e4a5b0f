package main

import (
	"context"
	"errors"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"

	"tailgate/mesh/meshtest"
)

// TestWorkerStartupErrorsAreOneLine runs `tailgate worker` with each kind of
// bad start: it must exit with status 1 and print one line naming the
// cause — never a panic.
func TestWorkerStartupErrorsAreOneLine(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the binary")
	}
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { busy.Close() }) // after the parallel subtests
	gw := []string{"--gateway", "http://127.0.0.1:1", "--cluster-token", "t", "--engine", "sim"}
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"no --gateway", nil, "tailgate: --gateway is required"},
		{"--gateway not a URL", []string{"--gateway", "gw:8081"}, `tailgate: --gateway "gw:8081": want a URL`},
		{"no cluster token", []string{"--gateway", "http://127.0.0.1:1"}, "tailgate: a cluster token is required"},
		{"unreadable token file", []string{"--gateway", "http://127.0.0.1:1", "--cluster-token-file", "/nonexistent/cluster.token"},
			"tailgate: --cluster-token-file: open /nonexistent/cluster.token: no such file or directory"},
		{"unknown engine", append(gw, "--engine", "tgi"), `tailgate: --engine "tgi": want vllm or sim`},
		{"vllm without --model", append(gw, "--engine", "vllm"), "tailgate: --model is required with --engine vllm"},
		{"negative --warmup", append(gw, "--warmup", "-1"), "tailgate: --warmup -1: want 0 (none) or more"},
		{"port in use", append(gw, "--listen", busy.Addr().String()), "tailgate: sidecar listen " + busy.Addr().String() + ": "},
		{"0.0.0.0 without --advertise", append(gw, "--listen", "0.0.0.0:0"), "tailgate: --listen 0.0.0.0:0 binds every interface: also pass --advertise"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			assertStartupError(t, append([]string{"worker", "--data", t.TempDir()}, tt.args...), tt.want)
		})
	}
}

// TestWorkerMeshStartupErrorIsNotAPanic: an error after the worker joined
// the tailnet (a sidecar port it cannot listen on there) ends it with that
// error, the node closed.
func TestWorkerMeshStartupErrorIsNotAPanic(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the binary and a control server")
	}
	control := meshtest.StartControl(t)
	assertStartupError(t, []string{"worker", "--data", t.TempDir(), "--gateway", "http://tg-gateway:8081",
		"--cluster-token", "t", "--engine", "sim", "--mesh", "--mesh-control-url", control, "--mesh-ephemeral",
		"--listen", "127.0.0.1:99999"}, "tailgate: sidecar listen on the tailnet :99999: ")
}

// assertStartupError runs the binary with args and checks it exits with
// status 1 and its last stderr line starts with want, with no panic.
func assertStartupError(t *testing.T, args []string, want string) {
	t.Helper()
	var stderr strings.Builder
	// A worker that did start would serve until killed.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, binPath, args...)
	cmd.Stderr = &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("exit: %v, want status 1; stderr:\n%s", err, stderr.String())
	}
	out := stderr.String()
	if strings.Contains(out, "panic") || strings.Contains(out, "goroutine ") {
		t.Fatalf("stderr shows a panic:\n%s", out)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if last := lines[len(lines)-1]; !strings.HasPrefix(last, want) {
		t.Fatalf("last stderr line %q, want it to start with %q; stderr:\n%s", last, want, out)
	}
}
