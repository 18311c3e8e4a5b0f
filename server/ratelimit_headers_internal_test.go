package server

import (
	"net/http"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/policy"
)

// TestRateHeadersCostOneAllocation: the x-ratelimit-* headers of an answer
// say what the key has left, as OpenAI words them, and cost the answer one
// allocation (their values share one string).
func TestRateHeadersCostOneAllocation(t *testing.T) {
	rs := policy.RateState{
		LimitRequests: 1 << 40, RemainingRequests: 1<<40 - 7, ResetRequests: 250 * time.Millisecond,
		LimitTokens: 90_000, RemainingTokens: -3, ResetTokens: 6 * time.Minute,
	}
	o := &httpSink{h: make(http.Header, 16)}
	setRateHeaders(o, rs)
	want := map[string]string{
		"X-Ratelimit-Limit-Requests":     "1099511627776",
		"X-Ratelimit-Remaining-Requests": "1099511627769",
		"X-Ratelimit-Reset-Requests":     "251ms",
		"X-Ratelimit-Limit-Tokens":       "90000",
		"X-Ratelimit-Remaining-Tokens":   "0",
		"X-Ratelimit-Reset-Tokens":       "6m0s",
	}
	for k, v := range want {
		if got := o.h.Get(k); got != v {
			t.Errorf("%s: %q, want %q", k, got, v)
		}
	}
	if len(o.h) != len(want) {
		t.Errorf("headers %v, want only %v", o.h, want)
	}
	if n := testing.AllocsPerRun(100, func() { o.n = 0; setRateHeaders(o, rs) }); n > 1 {
		t.Errorf("the rate headers cost %.0f allocations, want 1", n)
	}
}
