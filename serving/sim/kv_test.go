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

// TestKVCacheKeepsRequestsWaitingWithSlotsFree: with a KV cache of limited
// size, a request whose tokens do not fit waits although slots are free,
// as on a vLLM short of KV blocks; the metrics say so the way vLLM's do.
func TestKVCacheKeepsRequestsWaitingWithSlotsFree(t *testing.T) {
	e, srv := start(t, Config{Model: "m", MaxSeqs: 8, MaxModelLen: 1000, KVCacheTokens: 1000, TPOT: 50 * time.Millisecond})
	chat := srv.URL + "/v1/chat/completions"

	// A stream of 9 + 700 tokens holds most of the cache until the test
	// lets it go.
	blockCtx, unblock := context.WithCancel(context.Background())
	defer unblock()
	openStream(t, blockCtx, chat, `{"messages":[{"role":"user","content":"block"}],"max_tokens":700,"ignore_eos":true,"stream":true}`)
	testkit.WaitFor(t, "the blocker to run", func() bool { return e.Stats().Running == 1 })

	// A prompt of 407 tokens and 1 more do not fit beside it; 9 + 2 would,
	// but wait behind the head (first come, first served).
	var wg sync.WaitGroup
	for i, body := range []string{
		`{"messages":[{"role":"user","content":"` + strings.Repeat("long", 400) + `"}],"max_tokens":1}`,
		`{"messages":[{"role":"user","content":"small"}],"max_tokens":2,"ignore_eos":true}`,
	} {
		wg.Go(func() {
			if status, _, b := post(t, chat, body); status != http.StatusOK {
				t.Errorf("request %d: status %d: %s", i, status, b)
			}
		})
		testkit.WaitFor(t, "the request to queue", func() bool { return e.Stats().Waiting == i+1 })
	}
	_, metrics := get(t, srv.URL+"/metrics")
	for name, want := range map[string]float64{
		`vllm:num_requests_running{engine="0",model_name="m"}`:                             1,
		`vllm:num_requests_waiting{engine="0",model_name="m"}`:                             2,
		`vllm:num_requests_waiting_by_reason{engine="0",model_name="m",reason="capacity"}`: 2,
		`vllm:num_requests_waiting_by_reason{engine="0",model_name="m",reason="deferred"}`: 0,
		`vllm:kv_cache_usage_perc{engine="0",model_name="m"}`:                              0.709,
	} {
		if got := metricValue(t, metrics, name); got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	unblock()
	wg.Wait()
	testkit.WaitFor(t, "the engine to drain", func() bool { s := e.Stats(); return s.Running == 0 && s.Waiting == 0 })
}

func TestKVCacheMustHoldOneSequence(t *testing.T) {
	_, err := New(Config{MaxModelLen: 4096, KVCacheTokens: 2048}, nil)
	if err == nil || !strings.Contains(err.Error(), "cannot hold one sequence") {
		t.Errorf("New = %v, want the cache refused", err)
	}
}

// TestPrefixCacheCountsRepeatedPrompts: a prompt whose leading blocks of
// 16 templated tokens were seen recently counts them as prefix-cache hits,
// in vLLM's series.
func TestPrefixCacheCountsRepeatedPrompts(t *testing.T) {
	_, srv := start(t, Config{Model: "m"})
	system := strings.Repeat("You are a careful assistant. ", 10) // 290 bytes: 4 whole blocks
	ask := func(question string) {
		t.Helper()
		body := `{"messages":[{"role":"system","content":"` + system + `"},{"role":"user","content":"` + question + `"}],"max_tokens":1}`
		if status, _, b := post(t, srv.URL+"/v1/chat/completions", body); status != http.StatusOK {
			t.Fatalf("status %d: %s", status, b)
		}
	}
	ask("What is the weather in Paris?")
	ask("And in Rome?")
	_, metrics := get(t, srv.URL+"/metrics")
	queries := float64(ChatPromptTokens(system, "What is the weather in Paris?") + ChatPromptTokens(system, "And in Rome?"))
	for name, want := range map[string]float64{
		`vllm:prefix_cache_queries_total{engine="0",model_name="m"}`: queries,
		// The system message (3 + 73 + 1 tokens) and the user turn's
		// opening (3) are 80 shared tokens: 5 whole blocks.
		`vllm:prefix_cache_hits_total{engine="0",model_name="m"}`: 5 * 16,
	} {
		if got := metricValue(t, metrics, name); got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
}
