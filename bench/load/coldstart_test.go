package load

import (
	"slices"
	"strings"
	"testing"
	"time"
)

// coldRun is a run from zero replicas: requests held until a replica is
// ready at 6s, the replica asleep from 13s, woken for a request at 16s and
// ready again at 17s, asleep again, then stopped after the idle period.
func coldRun(firstAfterRelease, firstAfterWake time.Duration, errClass string) *Report {
	s := time.Second
	rec := func(at, ttft, hold time.Duration, stream bool) Record {
		return Record{Intended: at, Sent: at, Stream: stream, TTFT: ttft, Total: ttft + 100*time.Millisecond, LastToken: -1,
			StageMS: map[string]float64{"hold": ms(hold)}}
	}
	recs := []Record{
		rec(2*s, 4*s, 3900*time.Millisecond, false), // sent after the first, held too
		rec(s/2, 5*s+s/2+firstAfterRelease, 5*s+s/2, true),
		rec(7*s, 50*time.Millisecond, 0, true),
		rec(16*s+s/2, 750*time.Millisecond, 700*time.Millisecond, true), // sent after the first from sleep
		rec(16*s, 1200*time.Millisecond+firstAfterWake, 1200*time.Millisecond, false),
	}
	if errClass != "" {
		recs[4].ErrClass, recs[4].TTFT, recs[4].Total = errClass, -1, time.Second
	}
	sample := func(at time.Duration, state string) ReplicaSample {
		return ReplicaSample{At: at, Replicas: []ReplicaState{{ID: "m-1", State: state, Ready: state == "ready"}}}
	}
	return &Report{Requests: recs, Samples: []ReplicaSample{
		{At: 0, Replicas: []ReplicaState{}}, sample(2*s, "starting"), sample(5*s+s/2, "warming"), sample(6*s, "ready"),
		sample(10*s, "ready"), sample(13*s, "sleeping"), sample(16*s, "sleeping"), sample(16*s+s/2, "warming"), sample(17*s, "ready"),
		sample(20*s, "ready"), sample(24*s, "sleeping"), sample(37*s, "draining"), sample(40*s, "lost"),
	}}
}

func TestColdStartReport(t *testing.T) {
	fleet := coldStartFleet{StartDelay: "20s", WakeDelay: "1s", Idle: 20 * time.Second, SleepAfter: 4 * time.Second}
	c := coldStart(coldRun(80*time.Millisecond, 100*time.Millisecond, ""), fleet)
	if c.Verdict != "PASS" || c.FirstSentS != 0.5 || !c.FirstStream || c.FirstAfterReadyMS == nil || *c.FirstAfterReadyMS != 80 {
		t.Errorf("first request: %+v, want PASS, sent at 0.5s, first token 80 ms after the hold", c)
	}
	if c.Held != 4 || c.Requests != 5 || c.Errors != 0 {
		t.Errorf("held %d of %d, errors %d; want 4 of 5, 0", c.Held, c.Requests, c.Errors)
	}
	if c.ReplicaStartingS == nil || *c.ReplicaStartingS != 2 || c.EngineUpS == nil || *c.EngineUpS != 5.5 || c.ReplicaReadyS == nil || *c.ReplicaReadyS != 6 {
		t.Errorf("starting %v, engine up %v, ready %v; want 2 s, 5.5 s and 6 s", c.ReplicaStartingS, c.EngineUpS, c.ReplicaReadyS)
	}
	w := c.Wake
	switch {
	case w == nil:
		t.Fatal("no wake report with --fleet-sleep-after 4s")
	case w.Verdict != "PASS" || w.AsleepS == nil || *w.AsleepS != 13 || w.FirstSentS != 16 || w.FirstStream:
		t.Errorf("wake %+v: want PASS, asleep at 13 s, first request the JSON one at 16 s", w)
	case w.FirstHoldMS == nil || *w.FirstHoldMS != 1200 || w.FirstAfterReadyMS == nil || *w.FirstAfterReadyMS != 100:
		t.Errorf("wake's first request held %v ms, first token %v ms after; want 1200 and 100", w.FirstHoldMS, w.FirstAfterReadyMS)
	case w.WakeMS == nil || *w.WakeMS != 1000 || w.ColdLoadMS == nil || *w.ColdLoadMS != 4000 || w.ColdOverWake == nil || *w.ColdOverWake != 4:
		t.Errorf("wake %v ms vs cold start %v ms (%v×); want 1000 (last sleeping 16 s → ready 17 s) vs 4000 (starting 2 s → ready 6 s), 4×", w.WakeMS, w.ColdLoadMS, w.ColdOverWake)
	case w.Requests != 2 || w.Errors != 0:
		t.Errorf("from sleep: %d requests, %d errors; want 2, 0", w.Requests, w.Errors)
	}
	// A sleeping replica still holds its GPU: scale-down is the stop.
	if c.ZeroS == nil || *c.ZeroS != 37 || c.ScaleDownAfterS == nil || *c.ScaleDownAfterS != 37-17.4 {
		t.Errorf("scale-down at %v (after %v); want the draining sample at 37 s, 19.6 s after the last request ended", c.ZeroS, c.ScaleDownAfterS)
	}
	text := strings.Join(c.Lines(), "\n")
	for _, want := range []string{"80 ms after its replica was ready", "100 ms after its replica woke", "woken in 1000 ms", "4.0× faster", "wake from sleep: PASS", "cold start: PASS"} {
		if !strings.Contains(text, want) {
			t.Errorf("text lacks %q:\n%s", want, text)
		}
	}

	if c := coldStart(coldRun(80*time.Millisecond, 100*time.Millisecond, ""), coldStartFleet{StartDelay: "20s", Idle: 20 * time.Second}); c.Wake != nil || c.Verdict != "PASS" {
		t.Errorf("without --fleet-sleep-after: wake %+v, verdict %s; want no wake report, PASS", c.Wake, c.Verdict)
	}
	if c := coldStart(coldRun(1500*time.Millisecond, 100*time.Millisecond, ""), fleet); c.Verdict != "FAIL" {
		t.Errorf("first token 1.5 s after ready: %s, want FAIL", c.Verdict)
	}
	if c := coldStart(coldRun(80*time.Millisecond, 1500*time.Millisecond, ""), fleet); c.Verdict != "FAIL" || c.Wake.Verdict != "FAIL" {
		t.Errorf("first token 1.5 s after the wake: %s (wake %s), want FAIL", c.Verdict, c.Wake.Verdict)
	}
	if c := coldStart(coldRun(80*time.Millisecond, 100*time.Millisecond, ErrTimeout), fleet); c.Verdict != "FAIL" || c.Errors != 1 || c.Wake.Errors != 1 {
		t.Errorf("an error within the queue bound: %s with %d errors, want FAIL", c.Verdict, c.Errors)
	}
	awake := coldRun(80*time.Millisecond, 100*time.Millisecond, "")
	awake.Samples = slices.DeleteFunc(awake.Samples, func(s ReplicaSample) bool { return slices.ContainsFunc(s.Replicas, sleeping) })
	if c := coldStart(awake, fleet); c.Verdict != "FAIL" || c.Wake.AsleepS != nil || !strings.Contains(strings.Join(c.Lines(), "\n"), "no replica slept") {
		t.Errorf("no replica slept: %s, %+v; want FAIL saying so", c.Verdict, c.Wake)
	}
}

// TestFleetControllerDropsScaleOut: under the fleet controller the
// scenario's scaleout phases are dropped, and one asked for is refused.
func TestFleetControllerDropsScaleOut(t *testing.T) {
	o := Options{Scenario: "failover", FleetController: true}
	b, err := o.resolve()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(b.opts.Phases, "scaleout") || !strings.Contains(b.opts.Phases, "kill:1") {
		t.Errorf("phases %q: want the kill without the scaleout", b.opts.Phases)
	}
	if f := b.fleetBounds(); f == nil || f.Min != 3 || f.Max != 3 {
		t.Errorf("fleet bounds %+v, want min = max = the scenario's 3 replicas", f)
	}
	o.Phases = "steady:5s,scaleout:1"
	if _, err := o.resolve(); err == nil || !strings.Contains(err.Error(), "drop scaleout") {
		t.Errorf("scaleout under the controller: %v", err)
	}
	o = Options{Scenario: "overhead", FleetController: true}
	if _, err := o.resolve(); err == nil || !strings.Contains(err.Error(), "--fleet-controller") {
		t.Errorf("--fleet-controller on overhead: %v", err)
	}
	cold, err := (&Options{Scenario: "coldstart", Replicas: 2}).resolve()
	if err != nil {
		t.Fatal(err)
	}
	if f := cold.fleetBounds(); f == nil || f.Min != 0 || f.Max != 2 || f.Idle != 20*time.Second || f.SleepAfter != 4*time.Second {
		t.Errorf("coldstart fleet %+v, want min 0, max --replicas, idle 20s, sleep after 4s", f)
	}
}

// TestRestartedReplicaIsItsOwnReplacement: a killed replica that comes
// back under its own id is the replacement, ready once it was back, and
// what it answered after coming back is not routing to the dead one.
func TestRestartedReplicaIsItsOwnReplacement(t *testing.T) {
	s := time.Second
	ready := func(at time.Duration, aReady bool) ReplicaSample {
		st := "ready"
		if !aReady {
			st = "starting"
		}
		return ReplicaSample{At: at, Replicas: []ReplicaState{{ID: "a", State: st, Ready: aReady}, {ID: "b", State: "ready", Ready: true}}}
	}
	ok := func(at time.Duration, rep string) Record {
		return Record{Intended: at, Sent: at, TTFT: 50 * time.Millisecond, Total: 100 * time.Millisecond, LastToken: -1, Replica: rep, Attempts: 1}
	}
	res := &Result{
		Plan:    Plan{Length: 20 * s},
		Elapsed: 20 * s,
		Samples: []ReplicaSample{ready(4*s, true), ready(5*s+s/10, true), ready(5*s+s/2, false), ready(8*s, true), ready(12*s, true)},
		Records: []Record{ok(4*s, "a"), ok(4*s, "b"), ok(6*s, "b"), ok(9*s, "a"), ok(10*s, "a")},
		Events:  []Event{{Kind: Kill, Count: 1, At: 5 * s, Replicas: []string{"a"}}},
	}
	rep := Analyze(res, 10*s)
	f := rep.Failovers[0]
	if f.RoutedAfter != 0 {
		t.Errorf("routed to the killed replica after the kill: %d, want 0 (its answers after coming back are the replacement's)", f.RoutedAfter)
	}
	if len(f.Replacements) != 1 || f.Replacements[0].ID != "a" || f.Replacements[0].ReadyMS == nil || *f.Replacements[0].ReadyMS != 3000 {
		t.Errorf("replacements %+v, want a, ready 3 s after the kill", f.Replacements)
	}
}
