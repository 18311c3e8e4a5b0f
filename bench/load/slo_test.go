package load

import "testing"

// TestSLOCountsFailuresBeforeTheAnswerOverBudget: bench --slo counts a
// request that failed before its answer began (a 503, a 502) over budget
// on the end-to-end stage however fast the error came, and keeps it out
// of the stage's percentile; the bench's own overload and a stream that
// broke after its first token are not counted; the gateway's inner
// stages count answers only.
func TestSLOCountsFailuresBeforeTheAnswerOverBudget(t *testing.T) {
	answer := func(stream bool, ms float64) Record {
		r := rec(1, "a", ms, ms)
		r.Stream = stream
		r.StageMS = map[string]float64{"gateway": 1}
		return r
	}
	fail := func(stream bool, class, stage string) Record {
		r := failed(rec(1, "a", -1, 1), class, stage) // the error came in 1 ms
		r.Stream = stream
		if stage == Midstream {
			r.TTFT = msd(100)
		}
		return r
	}
	rep := &Report{
		Phases: []PhaseReport{{Name: "outage"}},
		Requests: []Record{
			answer(false, 100), answer(false, 100),
			fail(false, "http_503", BeforeFirstToken), fail(false, "http_502", BeforeFirstToken),
			fail(false, ErrOverload, BeforeFirstToken),
			answer(true, 100),
			fail(true, "http_503", BeforeFirstToken),
			fail(true, ErrStreamCut, Midstream),
		},
	}
	objs := []Objective{
		{Kind: "json", Stage: "total", Name: "p95", Target: 0.95, BudgetMS: 500},
		{Kind: "stream", Stage: "ttft", Name: "p95", Target: 0.95, BudgetMS: 500},
		{Kind: "json", Stage: "gateway", Name: "p95", Target: 0.95, BudgetMS: 50},
	}
	got := map[string]SLOCheck{}
	for _, c := range checkSLO(rep, objs) {
		if c.Phase == "outage" {
			got[c.Kind+" "+c.Stage] = c
		}
	}
	for _, want := range []struct {
		check            string
		requests, within int
		result           string
		valueMS          float64
	}{
		// Two answers, two fast failures; the bench's overload is not counted.
		{"json total", 4, 2, Fail, 100},
		// One answer, one failure before the first token; the cut stream had its TTFT but is not counted.
		{"stream ttft", 2, 1, Fail, 100},
		// The gateway's own stage: answers only.
		{"json gateway", 2, 2, Pass, 1},
	} {
		c, ok := got[want.check]
		if !ok {
			t.Errorf("%s: no check", want.check)
			continue
		}
		if c.Requests != want.requests || c.Within != want.within || c.Result != want.result {
			t.Errorf("%s: %d requests, %d within, %s; want %d, %d, %s", want.check, c.Requests, c.Within, c.Result, want.requests, want.within, want.result)
		}
		if c.ValueMS == nil || *c.ValueMS != want.valueMS {
			t.Errorf("%s: value %v ms, want %v (the answers' own; a failure has no value)", want.check, c.ValueMS, want.valueMS)
		}
	}
}
