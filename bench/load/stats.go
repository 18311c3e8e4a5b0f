package load

import (
	"math"
	"slices"
)

// Summary describes a sample of latencies, in milliseconds. Percentiles use
// the nearest-rank method: P99 of 100 samples is the 99th smallest, so every
// figure is a latency some request really had.
type Summary struct {
	N    int     `json:"n"`
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	P95  float64 `json:"p95"`
	P99  float64 `json:"p99"`
	Max  float64 `json:"max"`
	Mean float64 `json:"mean"`
}

// Summarize computes the summary of values. It sorts values in place.
func Summarize(values []float64) Summary {
	if len(values) == 0 {
		return Summary{}
	}
	slices.Sort(values)
	var sum float64
	for _, v := range values {
		sum += v
	}
	return Summary{
		N: len(values), P50: rank(values, 50), P90: rank(values, 90), P95: rank(values, 95), P99: rank(values, 99),
		Max: values[len(values)-1], Mean: sum / float64(len(values)),
	}
}

// Percentile returns the nearest-rank p-th percentile (0 < p <= 100) of
// values, which must be sorted; NaN for no values.
func Percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return math.NaN()
	}
	return rank(sorted, p)
}

func rank(sorted []float64, p float64) float64 {
	k := int(math.Ceil(p/100*float64(len(sorted)))) - 1
	return sorted[min(max(k, 0), len(sorted)-1)]
}

// Get returns the named figure: "p50", "p90", "p95", "p99", "max", "mean";
// NaN for an empty sample.
func (s Summary) Get(name string) float64 {
	if s.N == 0 {
		return math.NaN()
	}
	switch name {
	case "p50":
		return s.P50
	case "p90":
		return s.P90
	case "p95":
		return s.P95
	case "p99":
		return s.P99
	case "max":
		return s.Max
	case "mean":
		return s.Mean
	}
	return math.NaN()
}

// Show renders the named figure in milliseconds, "-" for an empty sample.
func (s Summary) Show(name string) string { return fmtMS(s.Get(name)) }
