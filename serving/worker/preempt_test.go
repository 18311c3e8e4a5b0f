package worker

import (
	"bufio"
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/e2e/testkit"
	"github.com/tailgate-dev/tailgate/serving"
)

// TestPreemptionNoticeDrains: a preemption notice — the file appearing, the
// metadata URL saying TRUE, a signal — makes the worker tell the gateway at
// once that the replica drains because it is preempted, lets the request
// in flight finish, and ends Run without its context ending.
func TestPreemptionNoticeDrains(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		setup func(t *testing.T, cfg *Config) (notify func())
		want  string // in the draining reason
	}{
		{"file appears", func(t *testing.T, cfg *Config) func() {
			cfg.PreemptFile = filepath.Join(t.TempDir(), "preempt")
			return func() {
				if err := os.WriteFile(cfg.PreemptFile, nil, 0o600); err != nil {
					t.Fatal(err)
				}
			}
		}, "notice file"},
		{"metadata URL says TRUE", func(t *testing.T, cfg *Config) func() {
			var preempted atomic.Bool
			md := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Header.Get("Metadata-Flavor") != "Google" {
					http.Error(w, "missing Metadata-Flavor", http.StatusForbidden)
					return
				}
				if preempted.Load() {
					_, _ = w.Write([]byte("TRUE"))
					return
				}
				_, _ = w.Write([]byte("FALSE"))
			}))
			t.Cleanup(md.Close)
			cfg.PreemptURL = md.URL + "/computeMetadata/v1/instance/preempted"
			return func() { preempted.Store(true) }
		}, "says TRUE"},
		{"signal", func(t *testing.T, cfg *Config) func() {
			sig := make(chan os.Signal, 1)
			cfg.Preempt = sig
			return func() { sig <- syscall.SIGUSR1 }
		}, "signal"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			g := startGateway(t)
			ln := listen(t, "127.0.0.1:0")
			cfg := Config{Gateways: []string{g.URL}, ClusterToken: "tok", Listener: ln, ReplicaID: "r1", Model: "m",
				Engine: "sim", Command: engineCommand, Warmup: 1, PreemptPoll: 20 * time.Millisecond}
			notify := tt.setup(t, &cfg)
			w, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			runErr := make(chan error, 1)
			go func() { runErr <- w.Run(ctx) }()
			testkit.WaitFor(t, "replica ready at the gateway", func() bool { return g.last().State == serving.StateReady })

			// 40 tokens at 20ms: in flight for most of a second.
			req, _ := http.NewRequest(http.MethodPost, w.Address()+"/v1/chat/completions", strings.NewReader(
				`{"model":"m","stream":true,"max_tokens":40,"messages":[{"role":"user","content":"hi"}]}`))
			req.Header.Set("Authorization", "Bearer tok")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body := bufio.NewReader(resp.Body)
			if _, err := body.ReadString('\n'); err != nil {
				t.Fatal(err)
			}
			notify()
			testkit.WaitFor(t, "the gateway told the replica drains", func() bool { return g.last().State == serving.StateDraining })
			if r := g.last().Reason; !strings.HasPrefix(r, serving.ReasonPreempted+": ") || !strings.Contains(r, tt.want) {
				t.Errorf("draining reason %q, want %q… naming %q", r, serving.ReasonPreempted+": ", tt.want)
			}
			var rest strings.Builder
			if _, err := body.WriteTo(&rest); err != nil || !strings.HasSuffix(rest.String(), "data: [DONE]\n\n") {
				t.Errorf("the request in flight did not finish: err %v, tail %q", err, rest.String())
			}
			select {
			case err := <-runErr:
				if err != nil {
					t.Fatalf("Run = %v after a preemption, want nil", err)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("Run did not return after the preemption notice")
			}
		})
	}
}
