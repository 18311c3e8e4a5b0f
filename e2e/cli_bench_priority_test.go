package e2e

import (
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestBenchPriorityScenarioRunsABatchBesideInteractiveTraffic: `bench
// --scenario priority` (scaled down) sends interactive requests alone and
// then beside a Batch API job on its own fleet: the batch completes, its
// lines waited in the admission queue while interactive requests were
// admitted ahead of them, and the report gives both p99s and their ratio
// (reported, not asserted: that is the full run's measure).
func TestBenchPriorityScenarioRunsABatchBesideInteractiveTraffic(t *testing.T) {
	t.Parallel() // mostly waiting on its own fleet
	out := runBench(t, 3*time.Minute, "--scenario", "priority", "--batch-lines", "200", "--priority-duration", "3s",
		"--rate", "10", "--max-ratio", "1000")
	for _, want := range []string{"priority: interactive requests (key class interactive) at 10/s for 3s, alone and beside a 200-line Batch API job",
		"interactive alone", "with a 200-line batch", "with a 200-line batch: batch completed in", "interactive p99 with the batch / alone:"} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	waits := func(class string) (admitted, waited, meanMS float64) {
		m := regexp.MustCompile(`with a 200-line batch: ` + class + `: (\d+) admitted, (\d+) at once, (\d+) waited in the admission queue \((\d+) ms on average\)`).FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("no %s admission line in the batch phase", class)
		}
		f := func(s string) float64 { v, _ := strconv.ParseFloat(s, 64); return v }
		return f(m[1]), f(m[3]), f(m[4])
	}
	bAdmitted, bWaited, bMean := waits("batch")
	iAdmitted, iWaited, iMean := waits("interactive")
	if bAdmitted != 200 || bWaited == 0 {
		t.Errorf("batch: %v lines admitted, %v waited; want all 200, some held back while the fleet was full", bAdmitted, bWaited)
	}
	if iAdmitted == 0 || iWaited >= bWaited || iMean >= bMean {
		t.Errorf("interactive: %v admitted, %v waited (%v ms on average) beside batch lines that waited %v ms on average: want them admitted ahead",
			iAdmitted, iWaited, iMean, bMean)
	}
}
