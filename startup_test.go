package main

import (
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"tailgate/mesh/meshtest"
)

// TestStartupErrorsExitWithOneLine runs the binary into each start-up error
// a user can make and checks what they see: exit status 1 and one line
// "tailgate: ..." naming the cause, never a panic or a goroutine dump.
func TestStartupErrorsExitWithOneLine(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the tailgate binary")
	}
	t.Setenv("TS_AUTHKEY", "") // the children inherit it; a key would change the mesh rows
	t.Setenv("TS_AUTH_KEY", "")
	held := holdPort(t)
	regular := filepath.Join(t.TempDir(), "regular")
	if err := os.WriteFile(regular, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	tokenFile := filepath.Join(t.TempDir(), "cluster.token")
	if err := os.WriteFile(tokenFile, []byte("tgc-test\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	control := meshtest.StartControl(t, meshtest.RequireAuthKey("tskey-auth-good"))

	gateway := func(extra ...string) []string {
		return append([]string{"gateway", "--data", t.TempDir(), "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"}, extra...)
	}
	up := func(extra ...string) []string {
		return append([]string{"up", "--data", t.TempDir(), "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--replicas", "1"}, extra...)
	}
	worker := func(extra ...string) []string {
		return append([]string{"worker", "--data", t.TempDir(), "--engine", "sim", "--gateway", "http://127.0.0.1:9",
			"--cluster-token-file", tokenFile, "--listen", "127.0.0.1:0"}, extra...)
	}
	for _, tc := range []struct {
		name string
		args []string
		want []string // all in the error line
	}{
		{"gateway public port in use", gateway("--listen", held),
			[]string{"--listen " + held, "address already in use"}},
		{"gateway admin port in use", gateway("--admin-listen", held),
			[]string{"--admin-listen " + held, "address already in use"}},
		{"up public port in use", up("--listen", held),
			[]string{"--listen " + held, "address already in use"}},
		{"worker sidecar port in use", worker("--listen", held),
			[]string{"listen " + held, "address already in use"}},
		{"gateway data dir under a regular file", gateway("--data", filepath.Join(regular, "data")),
			[]string{"--data", regular, "not a directory"}},
		{"up data dir under a regular file", up("--data", filepath.Join(regular, "data")),
			[]string{"--data", regular, "not a directory"}},
		{"worker without --gateway", []string{"worker", "--engine", "sim", "--cluster-token", "x"},
			[]string{"--gateway is required"}},
		{"worker on every interface without --advertise", worker("--listen", "0.0.0.0:0"),
			[]string{"--listen 0.0.0.0:0 binds every interface", "--advertise"}},
		{"--mesh-allow-peers without --mesh", gateway("--mesh-allow-peers", "tg-w1"),
			[]string{"--mesh-allow-peers needs --mesh"}},
		{"gateway mesh key refused", gateway("--mesh", "--mesh-control-url", control, "--mesh-ephemeral", "--mesh-authkey", "tskey-auth-bad"),
			[]string{"refused", "invalid authkey", "--mesh-authkey"}},
		{"worker mesh key refused", worker("--mesh", "--mesh-control-url", control, "--mesh-ephemeral", "--mesh-authkey", "tskey-auth-bad"),
			[]string{"refused", "invalid authkey", "--mesh-authkey"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, stderr := runToExit(t, 90*time.Second, tc.args...)
			if code != 1 {
				t.Errorf("exit status %d, want 1", code)
			}
			if strings.Contains(stderr, "panic") || strings.Contains(stderr, "goroutine ") {
				t.Errorf("stderr has a panic or a goroutine dump")
			}
			line := errorLine(t, stderr)
			for _, w := range tc.want {
				if !strings.Contains(line, w) {
					t.Errorf("error line lacks %q", w)
				}
			}
			if t.Failed() {
				t.Logf("tailgate %s\nstderr:\n%s", strings.Join(tc.args, " "), stderr)
			}
		})
	}
}

// runToExit runs the binary with args until it exits, at most within, and
// returns its exit status and stderr.
func runToExit(t *testing.T, within time.Duration, args ...string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), within)
	defer cancel()
	cmd := exec.CommandContext(ctx, binPath, args...)
	cmd.WaitDelay = 5 * time.Second
	var stderr syncBuffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("still running after %v; stderr:\n%s", within, stderr.String())
	}
	if ee, ok := errors.AsType[*exec.ExitError](err); ok {
		return ee.ExitCode(), stderr.String()
	}
	if err != nil {
		t.Fatal(err)
	}
	return 0, stderr.String()
}

// errorLine returns the one line of stderr that reports the error: it
// starts with "tailgate: " and is the last line (log lines come before).
func errorLine(t *testing.T, stderr string) string {
	t.Helper()
	lines := strings.Split(strings.TrimRight(stderr, "\n"), "\n")
	var n int
	for _, l := range lines {
		if strings.HasPrefix(l, "tailgate: ") {
			n++
		}
	}
	last := lines[len(lines)-1]
	if n != 1 || !strings.HasPrefix(last, "tailgate: ") {
		t.Errorf("want exactly one error line, \"tailgate: ...\", last on stderr; got %d", n)
	}
	return last
}

// holdPort listens on a loopback port for the test's duration and returns
// its address.
func holdPort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln.Addr().String()
}
