package slo

import (
	"math/bits"
	"sync/atomic"
)

// A ring holds counts per time slot (a second, a minute) for the recent
// past. Writers add with atomics only. A slot is reused when its epoch comes
// round again: the first writer of the new epoch zeroes it, and an add that
// races with that reset may be lost — one observation at a slot boundary,
// which an evaluation over hundreds of requests does not notice.

// counts is one slot of a countRing.
type counts struct {
	epoch  atomic.Int64
	total  atomic.Uint64
	within atomic.Uint64
}

// countRing counts requests and those within budget per slot of width
// seconds.
type countRing struct {
	width int64
	slots []counts
}

func newCountRing(width int64, n int) countRing {
	return countRing{width: width, slots: make([]counts, n)}
}

func (r *countRing) add(sec int64, within bool) {
	epoch := sec / r.width
	c := &r.slots[epoch%int64(len(r.slots))]
	if e := c.epoch.Load(); e != epoch && e < epoch && c.epoch.CompareAndSwap(e, epoch) {
		c.total.Store(0)
		c.within.Store(0)
	}
	c.total.Add(1)
	if within {
		c.within.Add(1)
	}
}

// sum adds the slots of the last span seconds up to sec (the current slot,
// partly filled, included).
func (r *countRing) sum(sec, span int64) (total, within uint64) {
	now := sec / r.width
	n := min(max(span/r.width, 1), int64(len(r.slots)))
	for epoch := now - n + 1; epoch <= now; epoch++ {
		c := &r.slots[((epoch%int64(len(r.slots)))+int64(len(r.slots)))%int64(len(r.slots))]
		if c.epoch.Load() == epoch {
			total += c.total.Load()
			within += c.within.Load()
		}
	}
	return total, within
}

// Histogram bins are log-linear in microseconds: values below 8 µs have a
// bin each, then 8 bins per doubling (at most 12.5 % wide) up to 2^28 µs
// (about 4.5 minutes); longer values land in the last bin.
const (
	histSub  = 8
	histTop  = 28
	histBins = histSub + (histTop-3)*histSub
)

func histBin(us int64) int {
	if us < histSub {
		return int(max(us, 0))
	}
	e := bits.Len64(uint64(us)) - 1 // ≥ 3
	if e >= histTop {
		return histBins - 1
	}
	m := int(us>>(e-3)) & (histSub - 1)
	return histSub + (e-3)*histSub + m
}

// histValue is the middle of bin b, in microseconds.
func histValue(b int) float64 {
	if b < histSub {
		return float64(b)
	}
	e := (b-histSub)/histSub + 3
	m := (b - histSub) % histSub
	lo := float64(int64(histSub+m) << (e - 3))
	return lo + float64(int64(1)<<(e-3))/2
}

// hist is one slot of a histRing.
type hist struct {
	epoch atomic.Int64
	bins  [histBins]atomic.Uint64
}

// histRing holds a latency histogram per slot of width seconds, for
// percentiles over the recent past.
type histRing struct {
	width int64
	slots []hist
}

func newHistRing(width int64, n int) histRing {
	return histRing{width: width, slots: make([]hist, n)}
}

func (r *histRing) add(sec, us int64) {
	epoch := sec / r.width
	h := &r.slots[epoch%int64(len(r.slots))]
	if e := h.epoch.Load(); e != epoch && e < epoch && h.epoch.CompareAndSwap(e, epoch) {
		for i := range h.bins {
			h.bins[i].Store(0)
		}
	}
	h.bins[histBin(us)].Add(1)
}

// addTo adds the bins of the slots of the last span seconds up to sec to
// into.
func (r *histRing) addTo(into *[histBins]uint64, sec, span int64) {
	now := sec / r.width
	n := min(max(span/r.width, 1), int64(len(r.slots)))
	for epoch := now - n + 1; epoch <= now; epoch++ {
		h := &r.slots[((epoch%int64(len(r.slots)))+int64(len(r.slots)))%int64(len(r.slots))]
		if h.epoch.Load() != epoch {
			continue
		}
		for i := range h.bins {
			into[i] += h.bins[i].Load()
		}
	}
}

// quantile returns the q-quantile of bins in microseconds; false when empty.
func quantile(bins *[histBins]uint64, q float64) (float64, bool) {
	var n uint64
	for _, c := range bins {
		n += c
	}
	if n == 0 {
		return 0, false
	}
	rank := uint64(q*float64(n-1)) + 1
	var seen uint64
	for b, c := range bins {
		seen += c
		if seen >= rank {
			return histValue(b), true
		}
	}
	return histValue(histBins - 1), true
}
