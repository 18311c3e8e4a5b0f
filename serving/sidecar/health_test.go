package sidecar

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/e2e/testkit"
	"github.com/tailgate-dev/tailgate/serving"
	"github.com/tailgate-dev/tailgate/serving/sim"
)

// sickEngine is a simulated engine whose /health the test can break: it
// hangs (a frozen process: the kernel still accepts connections) or answers
// 503 (vLLM's dead engine loop).
type sickEngine struct {
	srv  *httptest.Server
	mode atomic.Value // "", "hang" or "503"
}

func startSickEngine(t *testing.T) *sickEngine {
	t.Helper()
	eng, err := sim.New(sim.Config{Model: "m"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	e := &sickEngine{}
	e.mode.Store("")
	e.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" {
			switch e.mode.Load() {
			case "hang":
				<-r.Context().Done()
				return
			case "503":
				w.WriteHeader(http.StatusServiceUnavailable)
				return
			}
		}
		eng.Handler().ServeHTTP(w, r)
	}))
	t.Cleanup(e.srv.Close)
	return e
}

// stateLog records what OnStateChange was told.
type stateLog struct {
	mu      sync.Mutex
	changes []string // "state: reason"
}

func (l *stateLog) record(state, reason string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.changes = append(l.changes, state+": "+reason)
}

func (l *stateLog) get() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.changes...)
}

// TestAnEngineThatStopsAnsweringTakesTheReplicaOut: behind a ready state,
// an engine whose /health hangs, answers 503 or refuses connections makes
// the replica failed — no request reaches it, /health says why, the caller
// is told — until it answers again.
func TestAnEngineThatStopsAnsweringTakesTheReplicaOut(t *testing.T) {
	tests := []struct {
		name  string
		sick  func(e *sickEngine, url *atomic.Value)
		heal  func(e *sickEngine, url *atomic.Value)
		cause string
	}{
		{
			name:  "frozen",
			sick:  func(e *sickEngine, _ *atomic.Value) { e.mode.Store("hang") },
			heal:  func(e *sickEngine, _ *atomic.Value) { e.mode.Store("") },
			cause: "(timed out)",
		},
		{
			name:  "engine loop dead",
			sick:  func(e *sickEngine, _ *atomic.Value) { e.mode.Store("503") },
			heal:  func(e *sickEngine, _ *atomic.Value) { e.mode.Store("") },
			cause: "(answered 503 Service Unavailable)",
		},
		{
			name: "not listening",
			sick: func(_ *sickEngine, url *atomic.Value) {
				// Port 1 (tcpmux), where nothing listens: a port freed by a
				// closed test server could be taken at once by a parallel
				// test's engine, which answers /health 200.
				url.Store("http://127.0.0.1:1")
			},
			heal:  func(e *sickEngine, url *atomic.Value) { url.Store(e.srv.URL) },
			cause: "(connection refused)",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e := startSickEngine(t)
			var url atomic.Value
			url.Store(e.srv.URL)
			var told stateLog
			var logs logBuffer
			s, sc := startSidecar(t, "", func(c *Config) {
				c.EngineURL = func() string { return url.Load().(string) }
				// Probes get 50 ms at least: at 10 ms, under -race on a
				// busy 2-core machine, every probe in the window could time
				// out before the sick engine's answer came back.
				c.HealthInterval = 50 * time.Millisecond
				c.UnhealthyAfter = 300 * time.Millisecond
				c.OnStateChange = told.record
				c.Log = newLogger(&logs)
			})
			runSidecar(t, s)
			chat := func() (int, string) {
				status, _, body := send(t, context.Background(), http.MethodPost, sc.URL+"/v1/chat/completions",
					`{"model":"m","messages":[{"role":"user","content":"a"}],"max_tokens":1}`)
				var er struct {
					Error struct{ Code, Message string }
				}
				_ = json.Unmarshal(body, &er)
				return status, er.Error.Code + ": " + er.Error.Message
			}
			if status, msg := chat(); status != http.StatusOK {
				t.Fatalf("healthy engine: %d %s", status, msg)
			}

			tt.sick(e, &url)
			testkit.WaitFor(t, "the replica out of service", func() bool { st, _ := s.State(); return st == serving.StateFailed })
			_, reason := s.State()
			if !strings.HasPrefix(reason, "engine not answering /health for ") || !strings.Contains(reason, tt.cause) {
				t.Errorf("reason %q, want engine not answering /health for … %s", reason, tt.cause)
			}
			if status, msg := chat(); status != http.StatusServiceUnavailable || !strings.HasPrefix(msg, "replica_not_ready: ") ||
				!strings.Contains(msg, "engine not answering /health") {
				t.Errorf("request to the sick engine: %d %s, want 503 replica_not_ready saying why", status, msg)
			}
			hstatus, _, health := send(t, context.Background(), http.MethodGet, sc.URL+"/health", "")
			if hstatus != http.StatusServiceUnavailable || !strings.Contains(string(health), `"state":"failed","reason":"engine not answering /health for `) {
				t.Errorf("/health: %d %s", hstatus, health)
			}

			tt.heal(e, &url)
			testkit.WaitFor(t, "the replica back in service", func() bool { st, _ := s.State(); return st == serving.StateReady })
			if status, msg := chat(); status != http.StatusOK {
				t.Errorf("after recovery: %d %s", status, msg)
			}
			got := told.get()
			if len(got) != 2 || !strings.HasPrefix(got[0], "failed: engine not answering /health for ") || got[1] != "ready: " {
				t.Errorf("OnStateChange told %q, want failed (why), then ready", got)
			}
			if logs.count("engine not answering: replica out of service") != 1 || logs.count("engine answers again: replica back in service") != 1 {
				t.Errorf("want one line each for out and back:\n%s", logs.String())
			}
		})
	}
}

// TestEngineHealthIsTheLaunchersUntilReady: the sidecar judges only an
// engine the launcher calls ready; a new ready (a restarted engine) starts
// from a clean slate.
func TestEngineHealthIsTheLaunchersUntilReady(t *testing.T) {
	t.Parallel()
	e := startSickEngine(t)
	e.mode.Store("503")
	var told stateLog
	s, _ := startSidecar(t, e.srv.URL, func(c *Config) {
		c.HealthInterval = 10 * time.Millisecond
		c.UnhealthyAfter = 50 * time.Millisecond
		c.OnStateChange = told.record
	})
	s.SetState(serving.StateStarting, "loading weights")
	runSidecar(t, s)
	time.Sleep(200 * time.Millisecond) // several intervals past UnhealthyAfter
	if st, reason := s.State(); st != serving.StateStarting || reason != "loading weights" {
		t.Errorf("State while starting = %q, %q; want the launcher's", st, reason)
	}

	s.SetState(serving.StateReady, "")
	testkit.WaitFor(t, "the sick engine judged", func() bool { st, _ := s.State(); return st == serving.StateFailed })
	e.mode.Store("")
	s.SetState(serving.StateReady, "") // the launcher restarted it
	if st, reason := s.State(); st != serving.StateReady || reason != "" {
		t.Errorf("State after a new ready = %q, %q", st, reason)
	}
	s.SetState(serving.StateDraining, "worker shutting down")
	if st, _ := s.State(); st != serving.StateDraining {
		t.Errorf("State = %q, want draining", st)
	}
	if got := told.get(); len(got) != 1 || !strings.HasPrefix(got[0], "failed: ") {
		t.Errorf("OnStateChange told %q, want only the failure the sidecar found", got)
	}
}
