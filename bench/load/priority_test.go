package load

import (
	"strings"
	"testing"
	"time"
)

// TestPriorityVerdict: the report gives both p99s and their ratio, and the
// run fails over --max-ratio, on errors and on a batch that did not
// complete — and passes otherwise.
func TestPriorityVerdict(t *testing.T) {
	phase := func(name string, p99 float64) priorityPhase {
		return priorityPhase{Name: name, Latency: Summary{N: 100, P50: 50, P99: p99, Max: p99}, Errors: map[string]int{}}
	}
	p := PriorityOptions{}.withDefaults()
	for _, tc := range []struct {
		name  string
		with  priorityPhase
		fails string
	}{
		{"within the ratio", phase("with", 110), ""},
		{"over the ratio", phase("with", 130), "interactive p99 ×1.30 beside the batch, over --max-ratio 1.2"},
		{"batch failed", func() priorityPhase { ph := phase("with", 100); ph.Batch = "batch_failed"; return ph }(), "the batch: batch_failed"},
		{"errors", func() priorityPhase { ph := phase("with", 100); ph.Errors["http_429"] = 2; return ph }(), "with: 2 http_429"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out strings.Builder
			err := writePriority(&out, []priorityPhase{phase("alone", 100), tc.with}, p)
			if !strings.Contains(out.String(), "interactive p99 with the batch / alone:") {
				t.Fatalf("no ratio line:\n%s", out.String())
			}
			switch {
			case tc.fails == "" && err != nil:
				t.Fatalf("failed: %v\n%s", err, out.String())
			case tc.fails != "" && (err == nil || !strings.Contains(err.Error(), tc.fails)):
				t.Fatalf("error %v, want one saying %q", err, tc.fails)
			}
		})
	}
}

func TestPriorityOptionsValidate(t *testing.T) {
	for _, tc := range []struct {
		p    PriorityOptions
		rate float64
		want string
	}{
		{PriorityOptions{}, 20, ""},
		{PriorityOptions{Lines: 60000}, 20, "--batch-lines 60000"},
		{PriorityOptions{Duration: time.Millisecond}, 20, "--priority-duration 1ms"},
		{PriorityOptions{MaxRatio: 0.5}, 20, "--max-ratio 0.5"},
		{PriorityOptions{}, -1, "--rate -1"},
	} {
		err := tc.p.withDefaults().validate(tc.rate)
		if (tc.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%+v at rate %v: %v, want %q", tc.p, tc.rate, err, tc.want)
		}
	}
}
