package sim

import (
	"slices"
	"testing"
	"time"
)

func TestStallFractionFollowsStallProb(t *testing.T) {
	m := newLatencyModel(Config{TTFT: 100 * time.Millisecond, TPOT: 10 * time.Millisecond, TTFTSigma: -1, StallProb: 0.5, Seed: 42}.withDefaults())
	const draws = 2000
	stalled := 0
	for range draws {
		l := m.draw()
		want := latency{ttft: 100 * time.Millisecond, tpot: 10 * time.Millisecond}
		if l.stalled {
			stalled++
			want = latency{ttft: time.Second, tpot: 100 * time.Millisecond, stalled: true} // default factor 10
		}
		if l != want {
			t.Fatalf("draw = %+v, want %+v", l, want)
		}
	}
	// Binomial(2000, 0.5) has a standard deviation of about 0.011.
	if frac := float64(stalled) / draws; frac < 0.45 || frac > 0.55 {
		t.Errorf("stalled fraction = %.3f, want about 0.5", frac)
	}
}

func TestStallProbExtremes(t *testing.T) {
	for _, p := range []float64{0, 1} {
		m := newLatencyModel(Config{TTFT: time.Millisecond, StallProb: p, StallFactor: 3, Seed: 1}.withDefaults())
		for range 500 {
			if l := m.draw(); l.stalled != (p == 1) {
				t.Fatalf("StallProb %v drew stalled=%v", p, l.stalled)
			}
		}
	}
}

func TestSameSeedSameDraws(t *testing.T) {
	cfg := Config{TTFT: 20 * time.Millisecond, TPOT: time.Millisecond, StallProb: 0.3, Seed: 7}.withDefaults()
	seq := func(cfg Config) []latency {
		m := newLatencyModel(cfg)
		out := make([]latency, 200)
		for i := range out {
			out[i] = m.draw()
		}
		return out
	}
	a, b := seq(cfg), seq(cfg)
	if !slices.Equal(a, b) {
		t.Errorf("same seed drew different sequences")
	}
	cfg.Seed = 8
	if slices.Equal(a, seq(cfg)) {
		t.Errorf("different seeds drew the same sequence")
	}
}

func TestTTFTIsLognormalAroundTheMedian(t *testing.T) {
	const median = 100 * time.Millisecond
	m := newLatencyModel(Config{TTFT: median, Seed: 3}.withDefaults()) // sigma 0.25
	ttfts := make([]time.Duration, 2001)
	for i := range ttfts {
		ttfts[i] = m.draw().ttft
	}
	slices.Sort(ttfts)
	if got := ttfts[len(ttfts)/2]; got < 90*time.Millisecond || got > 110*time.Millisecond {
		t.Errorf("median TTFT = %v, want about %v", got, median)
	}
	// About 68% of draws lie within one sigma: [median/e^0.25, median·e^0.25].
	within := 0
	for _, d := range ttfts {
		if d >= 77880*time.Microsecond && d <= 128403*time.Microsecond {
			within++
		}
	}
	if frac := float64(within) / float64(len(ttfts)); frac < 0.62 || frac > 0.74 {
		t.Errorf("%.2f of draws within one sigma, want about 0.68", frac)
	}
	if ttfts[0] == ttfts[len(ttfts)-1] {
		t.Errorf("no jitter with the default sigma")
	}

	fixed := newLatencyModel(Config{TTFT: median, TTFTSigma: -1}.withDefaults())
	for range 100 {
		if d := fixed.draw().ttft; d != median {
			t.Fatalf("negative sigma drew %v, want exactly %v", d, median)
		}
	}
}
