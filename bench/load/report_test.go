package load

import (
	"encoding/json"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"
)

func msd(v float64) time.Duration { return time.Duration(v * float64(time.Millisecond)) }

// rec builds a scripted record: sent at at seconds, answered by replica.
func rec(at float64, replica string, ttft, total float64) Record {
	t := msd(at * 1000)
	r := Record{Intended: t, Sent: t, Replica: replica, TTFT: msd(ttft), Total: msd(total), Attempts: 1, Status: 200}
	if ttft < 0 {
		r.TTFT = -1
	}
	return r
}

func failed(r Record, class, stage string) Record {
	r.ErrClass, r.ErrStage, r.TTFT = class, stage, -1
	if stage == Midstream {
		r.Chunks = 2
	}
	return r
}

func sample(at float64, reps ...ReplicaState) ReplicaSample {
	return ReplicaSample{At: msd(at * 1000), Replicas: reps}
}

func ready(id string, inflight int, waiting float64) ReplicaState {
	return ReplicaState{ID: id, State: "ready", Ready: true, Inflight: inflight, EngineWaiting: waiting}
}

func down(id, state string) ReplicaState { return ReplicaState{ID: id, State: state} }

// scriptedResult is a run of 30s: steady, kill of "a" at 10s (replacement
// "c" started at 10.5s), steady, scale-out of "d" at 20s, steady.
func scriptedResult(t *testing.T) *Result {
	plan := mustPlan(t, "steady:10s,kill:1,steady:10s,scaleout:1,steady:10s")
	recs := []Record{
		rec(0.5, "a", -1, 10), // 429 before anything happened
		rec(1, "a", 100, 200),
		rec(2, "b", 120, 220),
		rec(7, "a", 90, 190),
		rec(8, "b", 80, 180),
		rec(9.9, "a", 50, 300),  // cut mid-stream by the kill, at 10.2s
		rec(9.95, "a", -1, 100), // connection lost before a token, at 10.05s
		rec(10.1, "a", -1, 5),   // routed to the dead replica: 502
		rec(10.3, "b", 400, 500),
		rec(11, "b", 150, 250),
		rec(12, "c", 300, 350), // the replacement's first answer, first token at 12.3s
		rec(13, "b", 110, 210),
		rec(21, "d", 90, 190), // the new replica's first answer, at 21.09s
		rec(22, "b", 100, 200),
	}
	recs[0] = failed(recs[0], "http_429", BeforeFirstToken)
	recs[5] = failed(recs[5], ErrStreamCut, Midstream)
	recs[6] = failed(recs[6], ErrTransport, BeforeFirstToken)
	recs[7] = failed(recs[7], "http_502", BeforeFirstToken)
	recs[8].Attempts = 2
	for i := range recs {
		recs[i].Index = i
		recs[i].Span = plan.SpanAt(recs[i].Intended)
	}
	return &Result{
		Label: "scripted", BaseURL: "http://gw/v1", Rate: 1, Seed: 1, Plan: plan, Elapsed: 30 * time.Second,
		Records: recs, SampleInterval: 250 * time.Millisecond, Admin: true,
		Samples: []ReplicaSample{
			sample(9.75, ready("a", 2, 0), ready("b", 1, 1)),
			sample(10, ready("a", 2, 0), ready("b", 1, 0)),
			sample(10.25, down("a", "ejected"), ready("b", 4, 3), down("c", "starting")),
			sample(11, down("a", "ejected"), ready("b", 2, 1), ready("c", 0, 0)),
			sample(19, ready("b", 1, 0), ready("c", 1, 0)),
			sample(20.5, ready("b", 1, 0), ready("c", 1, 0), ready("d", 1, 0)),
		},
		Events: []Event{
			{Kind: Kill, Count: 1, At: 10 * time.Second, Done: 10 * time.Second, Replicas: []string{"a"},
				Replacements: []EventReplacement{{ID: "c", At: 10500 * time.Millisecond}}},
			{Kind: ScaleOut, Count: 1, At: 20 * time.Second, Done: 20 * time.Second, Replicas: []string{"d"}},
		},
	}
}

func fp(v float64) *float64 { return &v }

func TestAnalyzeScriptedRun(t *testing.T) {
	rep := Analyze(scriptedResult(t), 5*time.Second)

	if len(rep.Phases) != 3 {
		t.Fatalf("%d phases", len(rep.Phases))
	}
	p1, p2, p3 := rep.Phases[0], rep.Phases[1], rep.Phases[2]
	if p1.Requests != 7 || p1.Errors != 3 || p1.Midstream != 1 || p1.BeforeFirstToken != 2 ||
		!reflect.DeepEqual(p1.ErrorsByClass, map[string]int{"http_429": 1, ErrStreamCut: 1, ErrTransport: 1}) {
		t.Errorf("phase 1: %+v", p1)
	}
	if want := (Summary{N: 4, P50: 90, P90: 120, P95: 120, P99: 120, Max: 120, Mean: 97.5}); p1.TTFT != want {
		t.Errorf("phase 1 ttft %+v, want %+v", p1.TTFT, want)
	}
	if p2.Requests != 5 || p2.Errors != 1 || p3.Requests != 2 || p3.Errors != 0 || rep.All.Requests != 14 || rep.All.Errors != 4 {
		t.Errorf("phase 2 %d/%d, phase 3 %d/%d, all %d/%d", p2.Requests, p2.Errors, p3.Requests, p3.Errors, rep.All.Requests, rep.All.Errors)
	}
	if p2.Throughput != 0.4 {
		t.Errorf("phase 2 throughput %v ok/s, want 0.4", p2.Throughput)
	}

	if len(rep.Failovers) != 1 {
		t.Fatalf("%d failovers", len(rep.Failovers))
	}
	f := rep.Failovers[0]
	want := FailoverReport{
		AtS: 10, Killed: []string{"a"}, ScopeEndS: 20,
		LeftReadyMS: fp(250), LastRoutedMS: fp(100), RoutedAfter: 1, LastRetryMS: fp(300), Retried: 1,
		Errors: 3, BeforeFirstToken: 2, Midstream: 1,
		ErrorsByClass: map[string]int{ErrStreamCut: 1, ErrTransport: 1, "http_502": 1},
		After: WindowReport{FromS: 10, ToS: 15, Requests: 5, Errors: 1,
			TTFT:        Summary{N: 4, P50: 150, P90: 400, P95: 400, P99: 400, Max: 400, Mean: 240},
			Total:       Summary{N: 4, P50: 250, P90: 500, P95: 500, P99: 500, Max: 500, Mean: 327.5},
			PeakWaiting: 3, PeakWaitingReplica: "b", PeakInflight: 4, PeakInflightReplica: "b", Samples: 3},
		Before: WindowReport{FromS: 5, ToS: 10, Requests: 4, Errors: 2,
			TTFT:        Summary{N: 2, P50: 80, P90: 90, P95: 90, P99: 90, Max: 90, Mean: 85},
			Total:       Summary{N: 2, P50: 180, P90: 190, P95: 190, P99: 190, Max: 190, Mean: 185},
			PeakWaiting: 1, PeakWaitingReplica: "b", PeakInflight: 1, PeakInflightReplica: "b", Samples: 1},
		Replacements: []NewReplica{{ID: "c", StartMS: fp(500), ReadyMS: fp(1000), ServingMS: fp(2300), Share: 0.5, WarmBaselineMS: 90}},
	}
	if !reflect.DeepEqual(f, want) {
		t.Errorf("failover\n got %s\nwant %s", show(f), show(want))
	}

	if len(rep.ScaleOuts) != 1 {
		t.Fatalf("%d scale-outs", len(rep.ScaleOuts))
	}
	s := rep.ScaleOuts[0]
	if len(s.Started) != 1 || !reflect.DeepEqual(s.Started[0], NewReplica{ID: "d", StartMS: fp(0), ReadyMS: fp(500), ServingMS: fp(1090), Share: 0.5}) {
		t.Errorf("scale-out started %s", show(s.Started))
	}
	if s.ReadyReplicas != 3 || s.AtS != 20 || s.ScopeEndS != 30 {
		t.Errorf("scale-out %+v", s)
	}
}

// TestAnalyzeInfersReplicas: a fleet that could not say which replicas it
// killed or started (a hook that prints nothing) gets the same figures, the
// replicas worked out from the samples, or from the responses without them.
func TestAnalyzeInfersReplicas(t *testing.T) {
	res := scriptedResult(t)
	for i := range res.Events {
		res.Events[i].Replicas, res.Events[i].Replacements = nil, nil
	}
	rep := Analyze(res, 5*time.Second)
	f := rep.Failovers[0]
	if joinIDs(f.Killed) != "a" || !f.Inferred || *f.LeftReadyMS != 250 || f.Errors != 3 {
		t.Errorf("failover with inferred kill: %s", show(f))
	}
	if len(f.Replacements) != 1 || !reflect.DeepEqual(f.Replacements[0], NewReplica{ID: "c", Inferred: true, ReadyMS: fp(1000), ServingMS: fp(2300), Share: 0.5, WarmBaselineMS: 90}) {
		t.Errorf("inferred replacements %s", show(f.Replacements))
	}
	if s := rep.ScaleOuts[0]; len(s.Started) != 1 || s.Started[0].ID != "d" || !s.Started[0].Inferred || *s.Started[0].ReadyMS != 500 {
		t.Errorf("inferred scale-out %s", show(s.Started))
	}
	if !rep.Events[0].Inferred || joinIDs(rep.Events[1].Replicas) != "d" {
		t.Errorf("events %+v", rep.Events)
	}

	// Without samples: the replica that answered before the kill and not in
	// the window after it; new replicas are those answering for the first time.
	res = scriptedResult(t)
	res.Samples, res.Admin = nil, false
	for i := range res.Events {
		res.Events[i].Replicas, res.Events[i].Replacements = nil, nil
	}
	rep = Analyze(res, 5*time.Second)
	f = rep.Failovers[0]
	if joinIDs(f.Killed) != "a" || f.LeftReadyMS != nil {
		t.Errorf("failover from responses only: %s", show(f))
	}
	if len(f.Replacements) != 1 || f.Replacements[0].ID != "c" || f.Replacements[0].ReadyMS != nil || *f.Replacements[0].ServingMS != 2300 {
		t.Errorf("replacement from responses only: %s", show(f.Replacements))
	}
	if s := rep.ScaleOuts[0]; len(s.Started) != 1 || s.Started[0].ID != "d" {
		t.Errorf("scale-out from responses only: %s", show(s.Started))
	}
}

// TestTTFTCoversStreams: a non-streaming answer arrives whole, so when a
// run has streams its TTFT (and the gateway's TTFT-like stages) summarize
// streams only; total and the other stages cover every request.
func TestTTFTCoversStreams(t *testing.T) {
	stream, whole := rec(1, "a", 50, 200), rec(2, "a", 300, 300)
	stream.Stream = true
	stream.StageMS = map[string]float64{"gateway": 1, "upstream_ttft": 49}
	whole.StageMS = map[string]float64{"gateway": 3, "upstream_ttft": 299}
	res := &Result{Plan: mustPlan(t, "steady:10s"), Rate: 1, Elapsed: 10 * time.Second, Records: []Record{stream, whole}}
	rep := Analyze(res, 0)
	p := rep.Phases[0]
	if !rep.TTFTStreamsOnly || p.TTFT.N != 1 || p.TTFT.Max != 50 || p.Total.N != 2 ||
		p.Stages["upstream_ttft"].N != 1 || p.Stages["gateway"].N != 2 {
		t.Fatalf("ttft %+v total %+v stages %+v", p.TTFT, p.Total, p.Stages)
	}
	res.Records = []Record{whole}
	if rep := Analyze(res, 0); rep.TTFTStreamsOnly || rep.Phases[0].TTFT.Max != 300 {
		t.Fatalf("without streams, ttft is the time to the answer: %+v", rep.Phases[0].TTFT)
	}
}

func TestNotes(t *testing.T) {
	res := scriptedResult(t)
	res.Records[1].Stream = true // an ok stream without gateway stages
	res.Records[2].Sent += 40 * time.Millisecond
	res.AdminErrors = 2
	rep := Analyze(res, 5*time.Second)
	want := []string{
		"the client sent late (send lag p99 40.0 ms, max 40.0 ms): the machine running the bench is busy; latencies include the lag",
		"gateway stage timings found for 0 of 1 streams (the admin API keeps the most recent requests)",
		"2 admin API polls failed",
	}
	if !reflect.DeepEqual(rep.Notes, want) {
		t.Errorf("notes %q", rep.Notes)
	}
}

func show(v any) string {
	b, _ := json.MarshalIndent(v, "", " ")
	return string(b)
}

// TestOutputTokensAndTPOTPerPhase: ten streams of 11 tokens each, their
// last token 100 ms after the first, in a 10 s phase: 110 output tokens,
// 11 tokens/s, a TPOT of 10 ms each — in the report, its JSON and its text.
func TestOutputTokensAndTPOTPerPhase(t *testing.T) {
	rep := Analyze(decodeResult(t, "decode"), 5*time.Second)
	p := rep.Phases[0]
	if p.OutputTokens != 110 || p.OutputTokensPerS != 11 {
		t.Errorf("output tokens %d, %v/s; want 110, 11/s", p.OutputTokens, p.OutputTokensPerS)
	}
	if p.TPOT.N != 10 || p.TPOT.P50 != 10 || p.TPOT.Max != 10 {
		t.Errorf("tpot %+v, want 10 values of 10 ms", p.TPOT)
	}
	raw, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	var back struct {
		Phases []struct {
			TPS  float64  `json:"output_tokens_per_s"`
			TPOT Summary  `json:"tpot_ms"`
			ITL  *Summary `json:"itl_ms"`
		} `json:"phases"`
		Requests []Record `json:"requests"`
	}
	if err := json.Unmarshal(raw, &back); err != nil {
		t.Fatal(err)
	}
	if ph := back.Phases[0]; ph.TPS != 11 || ph.TPOT.P95 != 10 || ph.ITL == nil {
		t.Errorf("JSON phase: %+v", ph)
	}
	// A saved report's requests keep what TPOT is computed from.
	if d, ok := back.Requests[3].TPOT(); !ok || d != 10*time.Millisecond {
		t.Errorf("request read back from JSON: TPOT %v %v", d, ok)
	}
	var text strings.Builder
	if err := rep.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"11.0 output tok/s", "out tok/s", "tpot p50"} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("text report lacks %q:\n%s", want, text.String())
		}
	}
	if !regexp.MustCompile(`(?m)^\s*tpot\s+10\s+10\.0`).MatchString(text.String()) {
		t.Errorf("text report has no tpot row of 10 ms:\n%s", text.String())
	}
}
