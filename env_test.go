package main

import (
	"bytes"
	"flag"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"tailgate/server/gateway"
)

// TestSecretFlagsComeFromTheEnvironment: each secret-bearing flag takes its
// TAILGATE_* variable when the command line does not give it; a flag on
// the command line (or the file flag holding the same secret) wins, and a
// secret from the environment draws no "visible on the command line"
// warning.
func TestSecretFlagsComeFromTheEnvironment(t *testing.T) {
	env := map[string]string{
		"TAILGATE_CLUSTER_TOKEN": "tgc-env", "TAILGATE_MESH_AUTHKEY": "tskey-env",
		"TAILGATE_API_KEY": "sk-env", "TAILGATE_API_KEY_B": "sk-env-b", "TAILGATE_JOIN_TOKEN": "tgj-env",
	}
	type result struct{ clusterToken, meshKey, benchKey, benchKeyB, joinToken string }
	parse := func(t *testing.T, cmd string, args ...string) (result, string) {
		t.Helper()
		fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		var (
			wf workerFlags
			gc gateway.Config
			bf benchFlags
		)
		switch cmd {
		case "worker":
			wf.register(fs)
		case "gateway":
			gc.RegisterFlags(fs)
			gc.RegisterMeshFlags(fs)
		case "bench":
			bf.register(fs)
		}
		if err := parseFlags(fs, args); err != nil {
			t.Fatal(err)
		}
		if err := secretsFromEnv(fs, func(k string) string { return env[k] }); err != nil {
			t.Fatal(err)
		}
		var logs bytes.Buffer
		warnSecretFlags(slog.New(slog.NewTextHandler(&logs, nil)), fs, "cluster-token", "join-token", "mesh-authkey")
		return result{wf.clusterToken, wf.mesh.AuthKey + gc.Mesh.AuthKey, bf.opts.A.Key, bf.opts.B.Key, wf.joinToken}, logs.String()
	}
	for _, tc := range []struct {
		name string
		cmd  string
		args []string
		want result
		warn bool
	}{
		{"worker: all from the environment", "worker", nil, result{clusterToken: "tgc-env", meshKey: "tskey-env", joinToken: "tgj-env"}, false},
		{"worker: the flag wins", "worker", []string{"--cluster-token", "tgc-flag", "--mesh-authkey", "tskey-flag", "--join-token", "tgj-flag"},
			result{clusterToken: "tgc-flag", meshKey: "tskey-flag", joinToken: "tgj-flag"}, true},
		{"worker: the token files win", "worker", []string{"--cluster-token-file", "/etc/tailgate/cluster.token", "--join-token-file", "/etc/tailgate/join.token"},
			result{meshKey: "tskey-env"}, false},
		{"gateway: mesh key from the environment", "gateway", nil, result{meshKey: "tskey-env"}, false},
		{"bench: keys from the environment", "bench", nil, result{benchKey: "sk-env", benchKeyB: "sk-env-b"}, false},
		{"bench: key files win", "bench", []string{"--key-file", "k", "--key-file-b", "kb"}, result{}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, logs := parse(t, tc.cmd, tc.args...)
			if got != tc.want {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
			if warned := strings.Contains(logs, "visible to every user"); warned != tc.warn {
				t.Errorf("warned about a secret on the command line: %v, want %v; log:\n%s", warned, tc.warn, logs)
			}
			if strings.Contains(logs, "-env") || strings.Contains(logs, "-flag") {
				t.Errorf("a log line holds the secret:\n%s", logs)
			}
		})
	}
}

// TestWorkerSendsTheClusterTokenFromTheEnvironment: the real binary's
// worker, given no token flag, heartbeats with $TAILGATE_CLUSTER_TOKEN;
// given --cluster-token-file as well, with the file's token.
func TestWorkerSendsTheClusterTokenFromTheEnvironment(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the tailgate binary")
	}
	// Tokens long enough to be accepted (policy.CheckToken).
	fromEnv, fromFile := "tgc-from-env-"+strings.Repeat("e", 43), "tgc-from-file-"+strings.Repeat("f", 43)
	file := filepath.Join(t.TempDir(), "cluster.token")
	if err := os.WriteFile(file, []byte(fromFile+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		extra []string
		want  string
	}{
		{"environment", nil, "Bearer " + fromEnv},
		{"file wins", []string{"--cluster-token-file", file}, "Bearer " + fromFile},
	} {
		t.Run(tc.name, func(t *testing.T) {
			auth := make(chan string, 16)
			gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				select {
				case auth <- r.Header.Get("Authorization"):
				default:
				}
				http.Error(w, `{"error":{"message":"test gateway","type":"invalid_request_error"}}`, http.StatusUnauthorized)
			}))
			defer gw.Close()
			args := append([]string{"worker", "--data", t.TempDir(), "--gateway", gw.URL, "--engine", "sim",
				"--listen", "127.0.0.1:0", "--warmup", "0"}, tc.extra...)
			cmd := exec.Command(binPath, args...)
			cmd.Env = append(os.Environ(), "TAILGATE_CLUSTER_TOKEN="+fromEnv)
			var stderr syncBuffer
			cmd.Stderr = &stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			exited := make(chan error, 1)
			go func() { exited <- cmd.Wait() }()
			// SIGTERM, so the worker stops its engine (a child in its own
			// process group) instead of leaving it behind.
			defer func() {
				_ = cmd.Process.Signal(syscall.SIGTERM)
				select {
				case <-exited:
				case <-time.After(30 * time.Second):
					_ = cmd.Process.Kill()
					<-exited
				}
			}()
			select {
			case err := <-exited:
				exited <- err
				t.Fatalf("the worker exited (%v) before its first heartbeat; stderr:\n%s", err, stderr.String())
			case got := <-auth:
				if got != tc.want {
					t.Errorf("heartbeat Authorization %q, want %q", got, tc.want)
				}
			case <-time.After(30 * time.Second):
				t.Fatalf("no heartbeat within 30s; stderr:\n%s", stderr.String())
			}
			if strings.Contains(stderr.String(), "tgc-from") {
				t.Errorf("the worker logged the cluster token:\n%s", stderr.String())
			}
		})
	}
}
