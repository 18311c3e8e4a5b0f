package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// writeRun writes a vegeta CSV file of n requests, every one answered 200
// in lat, except that the slowest 2 % take tail (so tail is the p99).
func writeRun(t *testing.T, name string, n int, lat, tail time.Duration) {
	t.Helper()
	var b strings.Builder
	for i := range n {
		l := lat
		if i >= n-n/50 {
			l = tail
		}
		fmt.Fprintf(&b, "%d,200,%d,120,300,,,ab,%d,POST,http://127.0.0.1/v1/chat/completions,\n", int64(i)*int64(time.Millisecond), l.Nanoseconds(), i)
	}
	if err := os.WriteFile(name, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestABTable: each round's added latency is taken against the direct run of
// the same round, and the medians are over rounds — a slow round (the
// machine busy for everyone) moves the direct run too and cancels out.
func TestABTable(t *testing.T) {
	dir := t.TempDir()
	ms := func(f float64) time.Duration { return time.Duration(f * float64(time.Millisecond)) }
	// direct, a, b per round: p50 and p99 (the slowest 1 %).
	rounds := [][3][2]float64{
		{{0.30, 1.0}, {0.70, 3.0}, {0.60, 2.0}},
		{{0.90, 3.0}, {1.30, 5.5}, {1.25, 4.0}}, // a busy round
		{{0.30, 1.0}, {0.75, 3.2}, {0.62, 2.5}},
	}
	for k, r := range rounds {
		for i, p := range []string{"direct", "a", "b"} {
			writeRun(t, filepath.Join(dir, fmt.Sprintf("%s-r%d.csv", p, k+1)), 1000, ms(r[i][0]), ms(r[i][1]))
		}
	}
	var out strings.Builder
	abTable(&out, dir, []string{"direct", "a", "b"}, 3)
	got := out.String()
	for _, want := range []string{
		"     1 | 0.400 / 2.000     | 0.300 / 1.000",
		"     2 | 0.400 / 2.500     | 0.350 / 1.000",
		"median | 0.400 / 2.200     | 0.320 / 1.000",
		// Not the difference of the medians (-0.080, -1.200): the median of
		// the differences in each round.
		"b            p50 -0.100 ms, p99 -1.000 ms",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("table lacks %q:\n%s", want, got)
		}
	}
}
