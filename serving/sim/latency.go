package sim

import (
	"math"
	"math/rand/v2"
	"sync"
	"time"
)

// latency is one request's drawn delays.
type latency struct {
	ttft    time.Duration // slot taken → first token
	tpot    time.Duration // between later tokens
	stalled bool
}

// latencyModel draws per-request latencies from one seeded source, so a seed
// fixes the sequence of draws (not which request gets which draw: that
// follows arrival order).
type latencyModel struct {
	ttft        time.Duration
	tpot        time.Duration
	sigma       float64 // 0: no jitter
	stallProb   float64
	stallFactor float64

	mu  sync.Mutex
	rng *rand.Rand
}

// newLatencyModel expects cfg with defaults applied.
func newLatencyModel(cfg Config) *latencyModel {
	seed := uint64(cfg.Seed)
	return &latencyModel{
		ttft:        cfg.TTFT,
		tpot:        cfg.TPOT,
		sigma:       cfg.TTFTSigma,
		stallProb:   cfg.StallProb,
		stallFactor: cfg.StallFactor,
		rng:         rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
	}
}

// draw returns the next latency. Every draw consumes the same amount of
// randomness whatever the configuration, so the stall decisions of a seed do
// not shift when only the medians change.
func (m *latencyModel) draw() latency {
	m.mu.Lock()
	z := m.rng.NormFloat64()
	u := m.rng.Float64()
	m.mu.Unlock()

	ttft := float64(m.ttft)
	if m.sigma > 0 {
		ttft *= math.Exp(m.sigma * z)
	}
	tpot := float64(m.tpot)
	stalled := u < m.stallProb
	if stalled {
		ttft *= m.stallFactor
		tpot *= m.stallFactor
	}
	return latency{ttft: duration(ttft), tpot: duration(tpot), stalled: stalled}
}

// duration converts nanoseconds to a Duration, saturating instead of
// overflowing.
func duration(ns float64) time.Duration {
	if ns >= math.MaxInt64 {
		return math.MaxInt64
	}
	return time.Duration(ns)
}
