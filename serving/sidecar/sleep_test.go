package sidecar

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/e2e/testkit"
	"github.com/tailgate-dev/tailgate/serving"
	"github.com/tailgate-dev/tailgate/serving/sim"
)

// TestSidecarPutsTheEngineToSleepAndWakesIt: through the sidecar's POST
// /sleep the engine (the simulator with sleep mode) goes to sleep, the
// replica reports sleeping and refuses generation; POST /wake_up wakes the
// engine and the replica serves again. The worker hears of every change.
func TestSidecarPutsTheEngineToSleepAndWakesIt(t *testing.T) {
	eng := startEngine(t, sim.Config{Model: "m", SleepMode: true, WakeDelay: time.Millisecond, WakeDelayLevel2: time.Millisecond})
	changes := make(chan string, 16)
	s, sc := startSidecar(t, eng.srv.URL, func(c *Config) {
		c.SleepMode = true
		c.ScrapeInterval = 5 * time.Millisecond
		c.OnStateChange = func(state, _ string) { changes <- state }
	})
	runSidecar(t, s)

	status, _, body := send(t, context.Background(), http.MethodPost, sc.URL+"/sleep?level=1", "")
	if status != http.StatusOK || !strings.Contains(string(body), `"state":"sleeping"`) {
		t.Fatalf("POST /sleep: %d %s", status, body)
	}
	select {
	case got := <-changes:
		if got != serving.StateSleeping {
			t.Fatalf("state change %q, want sleeping", got)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no state change reported after the sleep")
	}
	if state, reason := s.State(); state != serving.StateSleeping || !strings.Contains(reason, "level 1") {
		t.Fatalf("State() = %q %q, want sleeping at level 1", state, reason)
	}
	_, isSleeping := getEngine(t, eng.srv.URL+"/is_sleeping")
	if isSleeping != `{"is_sleeping":true}` {
		t.Fatalf("the engine says %s: the sidecar did not put it to sleep", isSleeping)
	}
	status, _, body = send(t, context.Background(), http.MethodPost, sc.URL+"/v1/chat/completions", chatBody)
	if status != http.StatusServiceUnavailable || !strings.Contains(string(body), "replica_not_ready") {
		t.Fatalf("generation while asleep: %d %s, want 503 replica_not_ready", status, body)
	}
	if n := generations(eng); n != 0 {
		t.Fatalf("the sidecar sent %d generation requests to a sleeping engine", n)
	}

	status, _, body = send(t, context.Background(), http.MethodPost, sc.URL+"/wake_up", "")
	if status != http.StatusOK || !strings.Contains(string(body), `"state":"ready"`) {
		t.Fatalf("POST /wake_up: %d %s", status, body)
	}
	testkit.WaitFor(t, "the ready state reported", func() bool {
		for {
			select {
			case got := <-changes:
				if got == serving.StateReady {
					return true
				}
			default:
				return false
			}
		}
	})
	if status, _, body := send(t, context.Background(), http.MethodPost, sc.URL+"/v1/chat/completions", chatBody); status != http.StatusOK {
		t.Fatalf("generation after the wake: %d %s", status, body)
	}
}

func TestSidecarSleepRefusals(t *testing.T) {
	eng := startEngine(t, sim.Config{SleepMode: true, WakeDelay: time.Millisecond})
	_, off := startSidecar(t, eng.srv.URL, nil)
	status, _, body := send(t, context.Background(), http.MethodPost, off.URL+"/sleep", "")
	if status != http.StatusConflict || !strings.Contains(string(body), "--sleep-mode") {
		t.Errorf("sleep without sleep mode: %d %s, want 409 naming --sleep-mode", status, body)
	}

	s, sc := startSidecar(t, eng.srv.URL, func(c *Config) { c.SleepMode = true })
	status, _, body = send(t, context.Background(), http.MethodPost, sc.URL+"/sleep?level=3", "")
	if status != http.StatusBadRequest {
		t.Errorf("level 3: %d %s, want 400", status, body)
	}
	// A request in flight keeps the engine awake.
	s.mu.Lock()
	s.inflight++
	s.mu.Unlock()
	status, _, body = send(t, context.Background(), http.MethodPost, sc.URL+"/sleep", "")
	if status != http.StatusConflict || !strings.Contains(string(body), "replica_busy") {
		t.Errorf("sleep with a request in flight: %d %s, want 409 replica_busy", status, body)
	}
	s.done()
	if _, isSleeping := getEngine(t, eng.srv.URL+"/is_sleeping"); isSleeping != `{"is_sleeping":false}` {
		t.Errorf("the engine sleeps after refusals: %s", isSleeping)
	}
	status, _, _ = send(t, context.Background(), http.MethodPost, sc.URL+"/sleep", "", "Authorization", "Bearer wrong")
	if status != http.StatusUnauthorized {
		t.Errorf("sleep without the cluster token: %d, want 401", status)
	}
}

func getEngine(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b strings.Builder
	_, _ = io.Copy(&b, resp.Body)
	return resp.StatusCode, b.String()
}

// generations counts the chat completions the engine was sent.
func generations(e *engine) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for _, a := range e.answers {
		if a.path == "/v1/chat/completions" {
			n++
		}
	}
	return n
}

// An engine whose /wake_up answered is awake: the sidecar says ready even
// when its reading of the engine's metrics right after does not come in
// time (vLLM's /metrics can be slow; a scrape has most of an interval),
// instead of repeating the reading it took while the engine slept.
func TestWakeUpSaysReadyWhenTheScrapeAfterItIsLate(t *testing.T) {
	eng := startEngine(t, sim.Config{Model: "m", SleepMode: true, WakeDelay: time.Millisecond, WakeDelayLevel2: time.Millisecond})
	target, _ := url.Parse(eng.srv.URL)
	proxy := httputil.NewSingleHostReverseProxy(target)
	var slowMetrics atomic.Bool
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/metrics" && slowMetrics.Load() {
			select { // far past the scrape's 16 ms; bounded
			case <-r.Context().Done():
				return
			case <-time.After(2 * time.Second):
			}
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(front.Close)
	s, sc := startSidecar(t, front.URL, func(c *Config) {
		c.SleepMode = true
		c.ScrapeInterval = 20 * time.Millisecond
	})
	runSidecar(t, s)

	status, _, body := send(t, context.Background(), http.MethodPost, sc.URL+"/sleep?level=1", "")
	if status != http.StatusOK {
		t.Fatalf("POST /sleep: %d %s", status, body)
	}
	testkit.WaitFor(t, "the engine's sleep read from its metrics", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.sleepReason() != ""
	})
	slowMetrics.Store(true)
	status, _, body = send(t, context.Background(), http.MethodPost, sc.URL+"/wake_up", "")
	if status != http.StatusOK || !strings.Contains(string(body), `"state":"ready"`) {
		t.Fatalf("POST /wake_up with the engine's metrics late: %d %s, want 200 ready", status, body)
	}
	if state, reason := s.State(); state != serving.StateReady {
		t.Fatalf("State() = %q %q after the wake, want ready", state, reason)
	}
}
