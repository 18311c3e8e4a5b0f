package router

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// sortingWindow is the window as it was kept before its samples were held
// in order: a ring sorted whole, copied, on every refresh. The window kept
// in order must read the same delay and percentiles after every sample.
type sortingWindow struct {
	samples        []time.Duration
	next, seen     int
	full           bool
	delay          time.Duration
	sorted         []time.Duration
	lo, hi         time.Duration
	minSamples, pp int
}

func (w *sortingWindow) add(d time.Duration, p float64, lo, hi time.Duration) {
	w.samples[w.next] = d
	w.next = (w.next + 1) % len(w.samples)
	if w.next == 0 {
		w.full = true
	}
	w.seen++
	n := w.next
	if w.full {
		n = len(w.samples)
	}
	every := max(8, n/32)
	if n < w.minSamples || (w.seen%every != 0 && w.delay != 0) {
		return
	}
	w.sorted = slices.Clone(w.samples[:n])
	slices.Sort(w.sorted)
	w.lo, w.hi = lo, hi
	w.delay = w.at(p)
}

func (w *sortingWindow) at(p float64) time.Duration {
	n := len(w.sorted)
	if n == 0 {
		return 0
	}
	return min(max(w.sorted[max(0, min(n-1, int(math.Ceil(p*float64(n)))-1))], w.lo), w.hi)
}

// The delay, the grace's median and a group part's percentile are what
// sorting the whole window gave, after every sample of sequences that
// fill, wrap and repeat values, in windows of several sizes.
func TestHedgeWindowInOrderReadsWhatSortingRead(t *testing.T) {
	rng := rand.New(rand.NewPCG(53, 1))
	draws := map[string]func() time.Duration{
		"spread":  func() time.Duration { return time.Duration(1+rng.IntN(200)) * time.Millisecond },
		"repeats": func() time.Duration { return time.Duration(1+rng.IntN(4)) * time.Millisecond },
		"tail":    func() time.Duration { return time.Duration(rng.ExpFloat64() * float64(30*time.Millisecond)) },
		"rising": func() func() time.Duration {
			var i time.Duration
			return func() time.Duration { i++; return i * time.Microsecond }
		}(),
		"falling": func() func() time.Duration {
			i := time.Duration(1 << 20)
			return func() time.Duration { i--; return i * time.Microsecond }
		}(),
	}
	for name, draw := range draws {
		for _, size := range []int{1, 7, 50, 256, 1000} {
			cfg := HedgeConfig{Enabled: true, Percentile: 0.95, Window: size, MinSamples: min(size, 10), Min: time.Millisecond, Max: time.Second}
			h := newHedger(cfg, time.Now)
			hm := h.model("m")
			ref := &sortingWindow{samples: make([]time.Duration, size), minSamples: cfg.MinSamples}
			for i := range 3*size + 100 {
				d := draw()
				h.observeIn(hm, false, d)
				ref.add(d, 0.95, time.Millisecond, time.Second)
				w := hm.windowOf(false)
				if got := time.Duration(w.delay.Load()); got != ref.delay {
					t.Fatalf("%s, window %d, sample %d: delay %v, sorting gave %v", name, size, i, got, ref.delay)
				}
				for _, p := range []float64{0.5, 0.8, 0.9, 0.99} {
					got, _ := h.at(w, p)
					if want := ref.at(p); got != want {
						t.Fatalf("%s, window %d, sample %d: p%v %v, sorting gave %v", name, size, i, p*100, got, want)
					}
				}
				if !slices.IsSorted(w.order) || len(w.order) != min(i+1, size) {
					t.Fatalf("%s, window %d, sample %d: the window's order %v is not its samples sorted", name, size, i, w.order)
				}
			}
		}
	}
}

// BenchmarkHedgeObserve is one request's sample into a full window of the
// default size (1000) and the refreshes it makes due.
func BenchmarkHedgeObserve(b *testing.B) {
	h := newHedger(HedgeConfig{Enabled: true}, time.Now)
	rng := rand.New(rand.NewPCG(53, 2))
	ds := make([]time.Duration, 4096)
	for i := range ds {
		ds[i] = time.Duration(rng.ExpFloat64() * float64(30*time.Millisecond))
	}
	for i := range 1000 {
		h.observe("m", false, ds[i%len(ds)])
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		h.observe("m", false, ds[i%len(ds)])
	}
}
