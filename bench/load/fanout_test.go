package load

import (
	"math"
	"strconv"
	"strings"
	"testing"
)

// TestSweepRecommendsTheCheapestNearTheBestCut: the threshold procedure
// picks the setting with the fewest extra tokens among those within 90 % of
// the best P95 cut, not the best cut at any price.
func TestSweepRecommendsTheCheapestNearTheBestCut(t *testing.T) {
	arm := func(p95, extra float64) fanoutArm {
		return fanoutArm{Docs: Summary{N: 100, P95: p95, P99: p95}, ExtraTokens: extra, ExtraRequests: extra}
	}
	base := arm(3000, math.NaN())
	rows := []sweepRow{
		{Percentile: 0.8, Budget: 0.15, Arm: arm(600, 0.14)},   // best cut ÷5, dearest
		{Percentile: 0.9, Budget: 0.10, Arm: arm(650, 0.06)},   // ÷4.6, within 90 %
		{Percentile: 0.99, Budget: 0.05, Arm: arm(1500, 0.01)}, // cheap, but ÷2
	}
	if got := recommend(base, rows); got != 1 {
		t.Fatalf("recommended row %d, want 1 (p90, 10%%)", got)
	}
	var b strings.Builder
	writeSweep(&b, base, rows)
	if !strings.Contains(b.String(), "recommended: --hedge-percentile 0.9 --hedge-budget 0.1 ") {
		t.Errorf("sweep output:\n%s", b.String())
	}
	if got := recommend(base, []sweepRow{{Percentile: 0.9, Budget: 0.1, Arm: arm(3100, 0.02)}}); got != -1 {
		t.Errorf("a setting that cut nothing was recommended")
	}
}

// TestFanoutDocsAreSeeded: the same seed gives the same documents (so arms
// and runs compare document for document), parts within bounds, and a
// monolithic request asks for the parts' whole output.
func TestFanoutDocsAreSeeded(t *testing.T) {
	a, b := fanoutDocs(3, 20, 4, 8), fanoutDocs(3, 20, 4, 8)
	for i := range a {
		if strings.Join(a[i].prompt, "|") != strings.Join(b[i].prompt, "|") {
			t.Fatalf("document %d differs between two draws of the same seed", i)
		}
		if k := len(a[i].prompt); k < 4 || k > 8 {
			t.Errorf("document %d has %d parts, want 4 to 8", i, k)
		}
	}
	if strings.Join(fanoutDocs(4, 1, 4, 8)[0].prompt, "") == strings.Join(a[0].prompt, "") {
		t.Errorf("another seed drew the same document")
	}
	d := a[0]
	total := 0
	for _, o := range d.out {
		total += o
	}
	mono := d.requests("m", true, false)
	if len(mono) != 1 || !strings.Contains(string(mono[0]), `"max_tokens":`+strconv.Itoa(total)) {
		t.Errorf("monolithic body %s, want max_tokens %d", mono[0], total)
	}
	if parts := d.requests("m", false, true); len(parts) != len(d.prompt) || !strings.Contains(string(parts[0]), `"stream":true`) {
		t.Errorf("decomposed bodies: %d, want %d streamed", len(parts), len(d.prompt))
	}
}

// TestFanoutTableSaysWhyHedgesDidNotStart: under the table, each hedged
// arm's hedges not started, by reason, as the gateway counted them.
func TestFanoutTableSaysWhyHedgesDidNotStart(t *testing.T) {
	arm := func(design string, skipped map[string]float64) fanoutArm {
		return fanoutArm{Mode: "stream", Design: design, Docs: Summary{N: 10, P95: 100, P99: 100}, Skipped: skipped}
	}
	var out strings.Builder
	writeFanoutTable(&out, 3, []fanoutArm{arm(armMonolithic, nil), arm(armDecomposed, nil),
		arm(armHedged, map[string]float64{"saturation": 4, "budget": 2})})
	if !strings.Contains(out.String(), "stream decomposed+hedge: hedges not started: budget 2, saturation 4\n") {
		t.Fatalf("no skip reasons:\n%s", out.String())
	}
}

// TestFanoutTableSaysTheHedgesOnDecodePace: under the table, each hedged
// arm's hedges started on decode pace, won and lost, as the gateway counted
// them; an arm with none says nothing.
func TestFanoutTableSaysTheHedgesOnDecodePace(t *testing.T) {
	arm := func(mode, design string, paced map[string]float64) fanoutArm {
		return fanoutArm{Mode: mode, Design: design, Docs: Summary{N: 10, P95: 100, P99: 100}, Paced: paced}
	}
	var out strings.Builder
	writeFanoutTable(&out, 3, []fanoutArm{arm("json", armMonolithic, nil), arm("json", armDecomposed, nil),
		arm("json", armHedged, map[string]float64{"won": 7, "lost": 2}), arm("stream", armHedged, nil)})
	if !strings.Contains(out.String(), "json decomposed+hedge: hedges on decode pace: won 7, lost 2\n") || strings.Contains(out.String(), "stream decomposed+hedge: hedges on") {
		t.Fatalf("pace hedges not reported as counted:\n%s", out.String())
	}
}

// TestFanoutTableSaysTheGraces: under the table, each hedged arm's late
// originals held for a grace, by winner, as the gateway counted them.
func TestFanoutTableSaysTheGraces(t *testing.T) {
	arm := func(mode, design string, graced map[string]float64) fanoutArm {
		return fanoutArm{Mode: mode, Design: design, Docs: Summary{N: 10, P95: 100, P99: 100}, Graced: graced}
	}
	var out strings.Builder
	writeFanoutTable(&out, 3, []fanoutArm{arm("stream", armDecomposed, nil),
		arm("stream", armHedged, map[string]float64{"hedge": 9, "original": 4}), arm("json", armHedged, nil)})
	if !strings.Contains(out.String(), "stream decomposed+hedge: originals whose first token came first, held for a grace: the hedge won 9, the original 4\n") ||
		strings.Contains(out.String(), "json decomposed+hedge: originals") {
		t.Fatalf("graces not reported as counted:\n%s", out.String())
	}
}
