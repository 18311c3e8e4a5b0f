package sim

import (
	"fmt"
	"slices"
	"strings"
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

// seededLatencies parses each chat body on e, as a request to e would be,
// and returns the latency e gives it, drawing in the order given by order.
func seededLatencies(t *testing.T, e *Engine, bodies []string, order []int) []latency {
	t.Helper()
	out := make([]latency, len(bodies))
	for _, i := range order {
		j, aerr := e.parseChat([]byte(bodies[i]))
		if aerr != nil {
			t.Fatalf("parse %s: %+v", bodies[i], aerr)
		}
		out[i] = e.lat.drawFor(j.latencyKey())
	}
	return out
}

func TestSeededLatencyIsFixedByContentAndStallsPerReplica(t *testing.T) {
	cfg := Config{TTFT: 50 * time.Millisecond, TPOT: time.Millisecond, StallProb: 0.3, Seed: 1, LatencyFromContent: true}
	newEngine := func(seed int64) *Engine {
		c := cfg
		c.Seed = seed
		e, err := New(c, nil)
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	const n = 400
	bodies := make([]string, n)
	forward, backward := make([]int, n), make([]int, n)
	for i := range bodies {
		bodies[i] = fmt.Sprintf(`{"model":"tailgate-sim","messages":[{"role":"user","content":"part %d of document %d"}],"max_tokens":8}`, i%7, i/7)
		forward[i], backward[n-1-i] = i, i
	}

	// The same requests in another order, with unrelated draws between
	// them, get the same latencies: a rerun (or the B side of an A/B run)
	// sees the same stalls request for request.
	a := seededLatencies(t, newEngine(1), bodies, forward)
	again := newEngine(1)
	for range 17 {
		again.lat.draw()
	}
	if b := seededLatencies(t, again, bodies, backward); !slices.Equal(a, b) {
		t.Fatalf("the same requests in reverse order drew other latencies on an engine of the same seed")
	}
	stalled := 0
	for _, l := range a {
		if l.stalled {
			stalled++
		}
	}
	if frac := float64(stalled) / n; frac < 0.22 || frac > 0.38 {
		t.Errorf("%.2f of requests stalled, want about the stall probability 0.3", frac)
	}

	// Another replica (another seed) draws independently, so a hedge
	// rarely meets the original's stall.
	other := seededLatencies(t, newEngine(2), bodies, forward)
	both, sameTTFT := 0, 0
	for i := range a {
		if a[i].stalled && other[i].stalled {
			both++
		}
		if a[i].ttft == other[i].ttft {
			sameTTFT++
		}
	}
	// Independent stalls at 0.3 overlap on about 0.09 of requests; the same
	// stalls would overlap on 0.3.
	if frac := float64(both) / n; frac > 0.16 {
		t.Errorf("%.2f of requests stalled on both replicas: stalls do not depend on the replica's seed", frac)
	}
	if sameTTFT > n/10 {
		t.Errorf("%d of %d requests have the same TTFT on two replicas: the jitter does not depend on the replica's seed", sameTTFT, n)
	}

	// A request's own seed field makes it another draw.
	withSeed := make([]string, n)
	for i, b := range bodies {
		withSeed[i] = strings.Replace(b, `"max_tokens":8`, fmt.Sprintf(`"max_tokens":8,"seed":%d`, 1000+i), 1)
	}
	if seeded := seededLatencies(t, newEngine(1), withSeed, forward); slices.Equal(a, seeded) {
		t.Errorf("the seed field left every latency as it was")
	}
	// Jitter still spreads around the median.
	ttfts := make([]time.Duration, 0, n)
	for _, l := range a {
		if !l.stalled {
			ttfts = append(ttfts, l.ttft)
		}
	}
	slices.Sort(ttfts)
	if med := ttfts[len(ttfts)/2]; med < 45*time.Millisecond || med > 55*time.Millisecond || ttfts[0] == ttfts[len(ttfts)-1] {
		t.Errorf("content-fixed TTFTs: median %v, range %v..%v; want jitter around 50ms", med, ttfts[0], ttfts[len(ttfts)-1])
	}
}
