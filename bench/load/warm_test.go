package load

import (
	"strings"
	"testing"
	"time"
)

// TestTimeToWarmPerformance: a replacement replica is warm — apart from
// ready and first answer — once the TTFT p95 of its recent answers comes
// within the tolerance of the fleet's steady p95 before the kill.
func TestTimeToWarmPerformance(t *testing.T) {
	plan := mustPlan(t, "steady:10s,kill:1,steady:20s")
	var recs []Record
	for at := 5.0; at < 10; at += 0.5 {
		recs = append(recs, rec(at, "b", 90, 150)) // the fleet's steady TTFT
	}
	// The replacement's first answers are slow (a cold cache), then fast.
	for i := range 15 {
		ttft := 100.0
		if i < 3 {
			ttft = []float64{400, 300, 200}[i]
		}
		recs = append(recs, rec(11+0.5*float64(i), "c", ttft, ttft+50))
	}
	for i := range recs {
		recs[i].Index, recs[i].Span = i, plan.SpanAt(recs[i].Intended)
	}
	res := &Result{Plan: plan, Elapsed: 30 * time.Second, Records: recs, Rate: 1,
		Events: []Event{{Kind: Kill, Count: 1, At: 10 * time.Second, Done: 10 * time.Second, Replicas: []string{"a"},
			Replacements: []EventReplacement{{ID: "c", At: 10500 * time.Millisecond}}}}}
	rep := Analyze(res, 5*time.Second)
	nr := rep.Failovers[0].Replacements[0]
	// Its last ten answers are all fast from the 13th on (sent at 17s,
	// first token at 17.1s): 7.1s after the kill, 6.1s after its first one.
	if nr.WarmBaselineMS != 90 || nr.WarmMS == nil || *nr.WarmMS != 7100 || *nr.ServingMS != 1400 {
		t.Fatalf("replacement %s: want warm at +7100 ms against a 90 ms baseline", show(nr))
	}
	var b strings.Builder
	rep.writeFailover(&b, &rep.Failovers[0])
	if !strings.Contains(b.String(), "warm (ttft p95 within 25% of the fleet's 90.0 ms) +7.10s") {
		t.Errorf("failover text lacks the warm figure:\n%s", b.String())
	}

	// A replica that never gets fast enough is never warm.
	for i := range res.Records {
		if res.Records[i].Replica == "c" {
			res.Records[i].TTFT = msd(300)
		}
	}
	if nr := Analyze(res, 5*time.Second).Failovers[0].Replacements[0]; nr.WarmMS != nil {
		t.Errorf("a replica at 3x the fleet's TTFT is warm at %v", *nr.WarmMS)
	}
}

// TestSourcesLabelRequestsAndSplitTheReport: with sources, requests are
// labelled in turn (the same seed, the same labels) and each phase reports
// each source's latencies apart.
func TestSourcesLabelRequestsAndSplitTheReport(t *testing.T) {
	w, err := NewWorkload(WorkloadConfig{Model: "m", Sources: []string{"eu", "us"}, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	if w.Request(0).Source != "eu" || w.Request(1).Source != "us" || w.Request(2).Source != "eu" {
		t.Fatalf("labels %q %q %q", w.Request(0).Source, w.Request(1).Source, w.Request(2).Source)
	}
	plan := mustPlan(t, "steady:10s")
	var recs []Record
	for i := range 10 {
		r := rec(float64(i), "a", 100, 200)
		if r.Source = "eu"; i%2 == 1 {
			r.Source, r.TTFT = "us", msd(900)
		}
		r.Index, r.Span = i, plan.SpanAt(r.Intended)
		recs = append(recs, r)
	}
	rep := Analyze(&Result{Plan: plan, Elapsed: 10 * time.Second, Records: recs, Rate: 1}, 0)
	eu, us := rep.Phases[0].Sources["eu"], rep.Phases[0].Sources["us"]
	if eu.Requests != 5 || eu.TTFT.P95 != 100 || us.Requests != 5 || us.TTFT.P95 != 900 {
		t.Errorf("eu %+v us %+v: the slow source must show apart", eu, us)
	}
}
