package load

import (
	"math"
	"math/rand/v2"
	"testing"
)

func TestSummarizeNearestRankPercentiles(t *testing.T) {
	hundred := make([]float64, 100)
	for i := range hundred {
		hundred[i] = float64(i + 1)
	}
	rand.New(rand.NewPCG(1, 2)).Shuffle(len(hundred), func(i, j int) { hundred[i], hundred[j] = hundred[j], hundred[i] })
	tests := []struct {
		name   string
		values []float64
		want   Summary
	}{
		{"1..100 shuffled", hundred, Summary{N: 100, P50: 50, P90: 90, P95: 95, P99: 99, Max: 100, Mean: 50.5}},
		{"1..10: high percentiles are the max", []float64{10, 9, 8, 7, 6, 5, 4, 3, 2, 1}, Summary{N: 10, P50: 5, P90: 9, P95: 10, P99: 10, Max: 10, Mean: 5.5}},
		{"one sample", []float64{7}, Summary{N: 1, P50: 7, P90: 7, P95: 7, P99: 7, Max: 7, Mean: 7}},
		{"a tail of one in twenty", append(repeat(10, 19), 500), Summary{N: 20, P50: 10, P90: 10, P95: 10, P99: 500, Max: 500, Mean: 34.5}},
		{"none", nil, Summary{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Summarize(tt.values); got != tt.want {
				t.Fatalf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

func repeat(v float64, n int) []float64 {
	out := make([]float64, n)
	for i := range out {
		out[i] = v
	}
	return out
}

func TestPercentileIsAlwaysASample(t *testing.T) {
	sorted := []float64{1, 2, 3, 4}
	for p, want := range map[float64]float64{1: 1, 25: 1, 26: 2, 50: 2, 75: 3, 76: 4, 100: 4} {
		if got := Percentile(sorted, p); got != want {
			t.Errorf("p%v of %v = %v, want %v", p, sorted, got, want)
		}
	}
	if !math.IsNaN(Percentile(nil, 50)) {
		t.Error("percentile of nothing is not NaN")
	}
}
