package sim

import (
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// With a step budget, prompts are prefilled one after another in chunks of
// at most the budget less the running decodes, each step at least TPOT;
// without one, each prompt takes its own tokens' time, whatever else runs.
func TestPrefillLaneChunksPromptsFirstComeFirstServed(t *testing.T) {
	now := time.Unix(0, 0)
	cfg := Config{PrefillPerToken: 40 * time.Microsecond, TPOT: 15 * time.Millisecond}

	free := newPrefillLane(cfg)
	if got := free.take(2048, 3, now); got != 2048*40*time.Microsecond {
		t.Errorf("no budget: prefill %v, want %v", got, 2048*40*time.Microsecond)
	}
	if got := free.take(2048, 3, now); got != 2048*40*time.Microsecond {
		t.Errorf("no budget: a second prompt at once waits: prefill %v", got)
	}

	cfg.MaxNumBatchedTokens = 512
	l := newPrefillLane(cfg)
	// 2048 tokens beside 12 decodes: 500 a step, 4 full steps of
	// max(15ms, 20ms) and a 48-token step of 15ms.
	first := l.take(2048, 12, now)
	if want := 4*20*time.Millisecond + 15*time.Millisecond; first != want {
		t.Errorf("budget 512: prefill %v, want %v", first, want)
	}
	// A short prompt arriving at the same moment waits for the long one.
	if got, want := l.take(10, 12, now), first+15*time.Millisecond; got != want {
		t.Errorf("budget 512: second prompt ready after %v, want %v (behind the first)", got, want)
	}
	// Once the lane is idle a prompt starts at once.
	later := now.Add(time.Second)
	if got := l.take(10, 0, later); got != 15*time.Millisecond {
		t.Errorf("idle lane: prefill %v, want one step of 15ms", got)
	}

	cfg.TensorParallelSize = 2
	tp := newPrefillLane(cfg)
	if got, want := tp.take(10, 0, now), 8333333*time.Nanosecond; got != want {
		t.Errorf("tp 2: step %v, want %v", got, want)
	}
}

// Two long prompts sent at once: without a step budget each prefills on its
// own, in parallel; with one (--sim-max-num-batched-tokens) they share the
// engine's steps first come first served, so the later one's answer comes
// about one prefill later — the queueing a tune sees when it turns the
// budget.
func TestBatchedTokensBudgetSerializesPrefills(t *testing.T) {
	body := `{"messages":[{"role":"user","content":"` + strings.Repeat("abcd", 2000) + `"}],"max_tokens":1}`
	slowest := func(budget int) time.Duration {
		_, srv := start(t, Config{Model: "m", TTFT: time.Millisecond, TTFTSigma: -1, TPOT: time.Millisecond,
			PrefillPerToken: 250 * time.Microsecond, PrefixCacheBlocks: -1, MaxNumBatchedTokens: budget})
		var (
			wg   sync.WaitGroup
			mu   sync.Mutex
			tail time.Duration
		)
		for range 2 {
			wg.Go(func() {
				began := time.Now()
				if status, _, b := post(t, srv.URL+"/v1/chat/completions", body); status != http.StatusOK {
					t.Errorf("status %d: %s", status, b)
				}
				mu.Lock()
				tail = max(tail, time.Since(began))
				mu.Unlock()
			})
		}
		wg.Wait()
		return tail
	}
	// About 2,000 prompt tokens: 0.5 s of prefill each.
	if got := slowest(0); got >= 900*time.Millisecond {
		t.Errorf("no budget: the slower of two prompts took %v, want them prefilled side by side (~0.5s)", got)
	}
	if got := slowest(8192); got < 900*time.Millisecond {
		t.Errorf("budget 8192: the slower of two prompts took %v, want it behind the other (~1s)", got)
	}
}
