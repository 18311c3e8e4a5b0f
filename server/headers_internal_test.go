package server

import (
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/data"
	"github.com/tailgate-dev/tailgate/serving"
)

// TestHeaderKeysReadDirectlyAreCanonical: every key headerValue is asked
// for is in the form net/http stores it, so a direct look-up finds what
// Header.Get finds — a client's x-tailgate-priority as its X-Tailgate-Priority.
func TestHeaderKeysReadDirectlyAreCanonical(t *testing.T) {
	keys := append(agentSessionHeaders[:], priorityHeader, idemHeader, "Retry-After", "X-Tailgate-Hedge",
		"X-Tailgate-Group", "Content-Type", "Authorization",
		serving.HeaderEngineTTFT, serving.HeaderEngineQueue, serving.HeaderSimQueue)
	for _, k := range keys {
		if c := http.CanonicalHeaderKey(k); c != k {
			t.Errorf("%q is read directly but its canonical form is %q", k, c)
		}
		h := http.Header{}
		h.Set(k, "v")
		if got := headerValue(h, k); got != "v" {
			t.Errorf("headerValue(%q) = %q after Set, want v", k, got)
		}
	}
}

// TestServerTimingIsMillisecondsToTheMicrosecond: each stage's value is its
// duration in milliseconds with three decimals, as strconv formats the
// float (a duration half a microsecond off a whole one rounds up).
func TestServerTimingIsMillisecondsToTheMicrosecond(t *testing.T) {
	for _, d := range []time.Duration{0, 1, 499, 501, 999, 1000, 1499, 1501, 12_345_678, 999_999_499,
		3_600_000_000_001, 1500, 2500} {
		cl := &call{stages: data.UnknownStages()}
		cl.stages.Total = d
		want := "total;dur=" + strconv.FormatFloat(float64(d)/float64(time.Millisecond), 'f', 3, 64)
		if d%1000 == 500 {
			want = "total;dur=" + strconv.FormatFloat(float64(d+1)/float64(time.Millisecond), 'f', 3, 64)
		}
		if got := serverTiming(cl); got != want {
			t.Errorf("%d ns: %q, want %q", d, got, want)
		}
	}
	cl := &call{stages: data.UnknownStages()}
	cl.stages.Connect, cl.stages.Total = 2*time.Millisecond, 1500*time.Microsecond
	if got, want := serverTiming(cl), "connect;dur=2.000, total;dur=1.500"; got != want {
		t.Errorf("%q, want %q", got, want)
	}
}
