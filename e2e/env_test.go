package e2e

import (
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"tailgate/e2e/testkit"
)

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
			var stderr testkit.Buffer
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
