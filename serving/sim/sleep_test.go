package sim

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/e2e/testkit"
)

// recordPauses makes e's sleep and wake latencies computed, not waited: each
// is recorded and returns at once.
func recordPauses(e *Engine) func() []time.Duration {
	var mu sync.Mutex
	var got []time.Duration
	e.sleep.pause = func(ctx context.Context, d time.Duration) error {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, d)
		return ctx.Err()
	}
	return func() []time.Duration {
		mu.Lock()
		defer mu.Unlock()
		return append([]time.Duration(nil), got...)
	}
}

func TestSleepEndpointsOnlyWithSleepMode(t *testing.T) {
	_, srv := start(t, Config{})
	for _, path := range []string{"/sleep", "/wake_up"} {
		if code, _, _ := post(t, srv.URL+path, ""); code != http.StatusNotFound {
			t.Errorf("POST %s without sleep mode: %d, want 404 as from vLLM without VLLM_SERVER_DEV_MODE", path, code)
		}
	}
	if code, _ := get(t, srv.URL+"/is_sleeping"); code != http.StatusNotFound {
		t.Errorf("GET /is_sleeping without sleep mode: %d, want 404", code)
	}
}

func TestSleepAndWakeLatenciesFollowTheLevel(t *testing.T) {
	e, srv := start(t, Config{SleepMode: true})
	pauses := recordPauses(e)
	steps := []struct {
		path string
		want time.Duration
	}{
		{"/sleep?level=1", DefaultWakeDelay},            // weights copied out over the same bus
		{"/wake_up", DefaultWakeDelay},                  // and back
		{"/sleep?level=2", DefaultWakeDelayLevel2 / 10}, // only freed
		{"/wake_up?tags=kv_cache", 0},                   // the KV cache: nothing to restore
		{"/wake_up?tags=weights", DefaultWakeDelayLevel2},
		{"/wake_up", -1}, // awake already: no pause at all
	}
	for _, s := range steps {
		before := len(pauses())
		if code, _, body := post(t, srv.URL+s.path, ""); code != http.StatusOK {
			t.Fatalf("POST %s: %d %s", s.path, code, body)
		}
		got := pauses()[before:]
		switch {
		case s.want < 0 && len(got) != 0:
			t.Errorf("POST %s paused %v, want nothing", s.path, got)
		case s.want >= 0 && (len(got) != 1 || got[0] != s.want):
			t.Errorf("POST %s paused %v, want [%v]", s.path, got, s.want)
		}
	}
	if DefaultWakeDelayLevel2 <= DefaultWakeDelay {
		t.Errorf("level 2 wakes in %v, level 1 in %v: level 2 reloads the weights and must be slower", DefaultWakeDelayLevel2, DefaultWakeDelay)
	}
}

func TestSleepingEngineHoldsGenerationUntilWoken(t *testing.T) {
	e, srv := start(t, Config{SleepMode: true})
	recordPauses(e)
	if code, _, _ := post(t, srv.URL+"/sleep?level=1", ""); code != http.StatusOK {
		t.Fatalf("sleep: %d", code)
	}
	if _, body := get(t, srv.URL+"/is_sleeping"); string(body) != `{"is_sleeping":true}` {
		t.Fatalf("/is_sleeping = %s", body)
	}
	_, metrics := get(t, srv.URL+"/metrics")
	for _, want := range []string{`sleep_state="weights_offloaded"} 1`, `sleep_state="awake"} 0`} {
		if !strings.Contains(string(metrics), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	// What needs no weights still works while asleep, as on vLLM.
	if code, _ := get(t, srv.URL+"/health"); code != http.StatusOK {
		t.Errorf("/health while asleep: %d, want 200", code)
	}
	if code, _, _ := post(t, srv.URL+"/tokenize", `{"model":"tailgate-sim","prompt":"hi"}`); code != http.StatusOK {
		t.Errorf("/tokenize while asleep: %d, want 200", code)
	}

	type answer struct {
		code int
		body []byte
	}
	done := make(chan answer, 1)
	go func() {
		code, _, body := post(t, srv.URL+"/v1/chat/completions", `{"model":"tailgate-sim","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`)
		done <- answer{code, body}
	}()
	testkit.WaitFor(t, "the request held by the sleeping engine", func() bool {
		e.sleep.mu.Lock()
		defer e.sleep.mu.Unlock()
		return e.sleep.held == 1
	})
	if n := e.Stats().Completed; n != 0 {
		t.Fatalf("%d requests completed on a sleeping engine", n)
	}
	if code, _, _ := post(t, srv.URL+"/wake_up", ""); code != http.StatusOK {
		t.Fatalf("wake_up: %d", code)
	}
	select {
	case a := <-done:
		if a.code != http.StatusOK {
			t.Fatalf("request held through the sleep: %d %s", a.code, a.body)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the request held while asleep was not answered after the wake")
	}
	if _, body := get(t, srv.URL+"/is_sleeping"); string(body) != `{"is_sleeping":false}` {
		t.Fatalf("/is_sleeping after wake = %s", body)
	}
}

func TestSleepRefusesBadLevelsAndTags(t *testing.T) {
	_, srv := start(t, Config{SleepMode: true, WakeDelay: time.Millisecond, WakeDelayLevel2: time.Millisecond})
	for _, path := range []string{"/sleep?level=3", "/sleep?level=x", "/wake_up?tags=gpu"} {
		if code, _, body := post(t, srv.URL+path, ""); code != http.StatusBadRequest {
			t.Errorf("POST %s: %d %s, want 400", path, code, body)
		}
	}
}
