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

// latencyModel draws per-request latencies. By default they come from one
// seeded source, so a seed fixes the sequence of draws (not which request
// gets which draw: that follows arrival order). With fromContent a
// generation request's latency is a function of what it asks and of the
// replica's seed instead (see [Config.LatencyFromContent]): the same request
// meets the same latency on the same replica run after run, and a hedge to
// another replica draws its jitter and its stall independently.
type latencyModel struct {
	ttft        time.Duration
	tpot        time.Duration
	sigma       float64 // 0: no jitter
	stallProb   float64
	stallFactor float64
	fromContent bool
	seed        uint64 // the replica's, mixed into content-fixed stalls

	mu  sync.Mutex
	rng *rand.Rand
}

// newLatencyModel expects cfg with defaults applied.
func newLatencyModel(cfg Config) *latencyModel {
	seed := uint64(cfg.Seed)
	return &latencyModel{
		ttft:        cfg.TTFT,
		tpot:        time.Duration(float64(cfg.TPOT) / TPSpeedup(cfg.TensorParallelSize)),
		sigma:       cfg.TTFTSigma,
		stallProb:   cfg.StallProb,
		stallFactor: cfg.StallFactor,
		fromContent: cfg.LatencyFromContent,
		seed:        seed,
		rng:         rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
	}
}

// draw returns the next latency from the seeded stream. Every draw consumes
// the same amount of randomness whatever the configuration, so the stall
// decisions of a seed do not shift when only the medians change.
func (m *latencyModel) draw() latency {
	m.mu.Lock()
	z := m.rng.NormFloat64()
	u := m.rng.Float64()
	m.mu.Unlock()
	return m.shape(z, u)
}

// drawFor returns the latency of a request whose content hashes to key (see
// [job.latencyKey]): fixed by key when the model is fromContent, else the
// next draw of the stream.
func (m *latencyModel) drawFor(key uint64) latency {
	if !m.fromContent {
		return m.draw()
	}
	// The jitter's uniform is kept inside (0, 1), where the inverse normal
	// CDF is finite.
	v := (float64(splitmix(key^splitmix(m.seed^ttftSalt))>>11) + 0.5) / (1 << 53)
	z := math.Sqrt2 * math.Erfinv(2*v-1)
	u := float64(splitmix(key^splitmix(m.seed^stallSalt))>>11) / (1 << 53)
	return m.shape(z, u)
}

// Salts that keep a content key's jitter and stall draws apart.
const (
	ttftSalt  = 0x8a5cd789635d2dff
	stallSalt = 0x121fd2155c472f96
)

// splitmix is SplitMix64's finalizer: a bijective mix of x whose output
// bits each depend on every input bit.
func splitmix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// shape turns a standard normal z and a uniform u in [0, 1) into a latency.
func (m *latencyModel) shape(z, u float64) latency {
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
