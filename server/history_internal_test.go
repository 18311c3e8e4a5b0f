package server

import (
	"math"
	"testing"
)

// TestBucketQuantileInterpolatesAsHistogramQuantile pins the dashboard's
// percentiles to Prometheus' histogram_quantile on known buckets: inside
// the bucket the rank falls in, linearly between its bounds — not the
// bucket's upper bound (a p50 of 175 ms is not shown as 250 ms).
func TestBucketQuantileInterpolatesAsHistogramQuantile(t *testing.T) {
	// Cumulative: 10 at or below 100 ms, 30 at or below 250 ms, 40 at or
	// below 500 ms, none above.
	bs := []bucket{{.1, 10}, {.25, 30}, {.5, 40}, {math.Inf(1), 40}}
	for _, c := range []struct {
		q, want float64 // seconds
	}{
		{.5, .175}, // rank 20: 10 of 20 into (0.1, 0.25]
		{.95, .45}, // rank 38: 8 of 10 into (0.25, 0.5]
		{.99, .49}, // rank 39.6
		{.25, .1},  // rank 10: the top of the first bucket
		{.1, .04},  // rank 4: 4 of 10 into (0, 0.1]
	} {
		if got := bucketQuantile(c.q, bs); math.Abs(got-c.want) > 1e-9 {
			t.Errorf("q=%v: %v s, want %v s", c.q, got, c.want)
		}
	}
	// A rank in the +Inf bucket answers the highest finite bound.
	over := []bucket{{.1, 1}, {.25, 2}, {math.Inf(1), 10}}
	if got := bucketQuantile(.99, over); got != .25 {
		t.Errorf("rank past the last bound: %v, want 0.25", got)
	}
	if got := bucketQuantile(.5, []bucket{{.1, 0}, {math.Inf(1), 0}}); !math.IsNaN(got) {
		t.Errorf("no observations: %v, want NaN", got)
	}

	// The interval's percentiles in ms, of the difference of two samples.
	prev := []bucket{{.1, 5}, {.25, 5}, {.5, 5}, {math.Inf(1), 5}}
	cur := []bucket{{.1, 15}, {.25, 35}, {.5, 45}, {math.Inf(1), 45}}
	p := percentiles(delta(cur, prev))
	if p.N != 40 || math.Abs(*p.P50-175) > 1e-6 || math.Abs(*p.P95-450) > 1e-6 || math.Abs(*p.P99-490) > 1e-6 {
		t.Errorf("percentiles %v: p50 %v p95 %v p99 %v, want 40: 175, 450, 490 ms", p.N, *p.P50, *p.P95, *p.P99)
	}
	if e := percentiles(delta(prev, prev)); e.N != 0 || e.P50 != nil {
		t.Errorf("an interval without requests: %+v", e)
	}
}
