package load

import (
	"strings"
	"testing"
	"time"
)

// coldRun is a run from zero replicas: requests held until a replica is
// ready at 6s, the replica stopped after the idle period.
func coldRun(firstAfterRelease time.Duration, errClass string) *Report {
	s := time.Second
	rec := func(at, ttft, hold time.Duration, stream bool) Record {
		r := Record{Intended: at, Sent: at, Stream: stream, TTFT: ttft, Total: ttft + 100*time.Millisecond, LastToken: -1,
			StageMS: map[string]float64{"hold": ms(hold)}}
		return r
	}
	recs := []Record{
		rec(2*s, 4*s, 0, false), // sent after the first, held too
		rec(s/2, 5*s+s/2+firstAfterRelease, 5*s+s/2, true),
		rec(7*s, 50*time.Millisecond, 0, true),
	}
	recs[0].StageMS["hold"] = 3900
	if errClass != "" {
		recs[2].ErrClass, recs[2].TTFT, recs[2].Total = errClass, -1, time.Second
	}
	sample := func(at time.Duration, state string) ReplicaSample {
		return ReplicaSample{At: at, Replicas: []ReplicaState{{ID: "m-1", State: state, Ready: state == "ready"}}}
	}
	return &Report{Requests: recs, Samples: []ReplicaSample{
		{At: 0, Replicas: []ReplicaState{}}, sample(2*s, "starting"), sample(5*s+s/2, "warming"), sample(6*s, "ready"),
		sample(10*s, "ready"), sample(19*s, "draining"), sample(25*s, "lost"),
	}}
}

func TestColdStartReport(t *testing.T) {
	c := coldStart(coldRun(80*time.Millisecond, ""), "20s", 10*time.Second)
	if c.Verdict != "PASS" || c.FirstSentS != 0.5 || !c.FirstStream || c.FirstAfterReadyMS == nil || *c.FirstAfterReadyMS != 80 {
		t.Errorf("first request: %+v, want PASS, sent at 0.5s, first token 80 ms after the hold", c)
	}
	if c.Held != 2 || c.Requests != 3 || c.Errors != 0 {
		t.Errorf("held %d of %d, errors %d; want 2 of 3, 0", c.Held, c.Requests, c.Errors)
	}
	if c.EngineUpS == nil || *c.EngineUpS != 5.5 || c.ReplicaReadyS == nil || *c.ReplicaReadyS != 6 {
		t.Errorf("engine up %v, ready %v; want 5.5 s and 6 s", c.EngineUpS, c.ReplicaReadyS)
	}
	if c.ZeroS == nil || *c.ZeroS != 19 || c.ScaleDownAfterS == nil || *c.ScaleDownAfterS != 19-7.15 {
		t.Errorf("scale-down at %v (after %v); want the draining sample at 19 s, 11.85 s after the last request ended", c.ZeroS, c.ScaleDownAfterS)
	}
	if text := strings.Join(c.Lines(), "\n"); !strings.Contains(text, "80 ms after its replica was ready") || !strings.Contains(text, "cold start: PASS") {
		t.Errorf("text:\n%s", text)
	}

	if c := coldStart(coldRun(1500*time.Millisecond, ""), "20s", 10*time.Second); c.Verdict != "FAIL" {
		t.Errorf("first token 1.5 s after ready: %s, want FAIL", c.Verdict)
	}
	if c := coldStart(coldRun(80*time.Millisecond, ErrTimeout), "20s", 10*time.Second); c.Verdict != "FAIL" || c.Errors != 1 {
		t.Errorf("an error within the queue bound: %s with %d errors, want FAIL", c.Verdict, c.Errors)
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
	if f := cold.fleetBounds(); f == nil || f.Min != 0 || f.Max != 2 || f.Idle != 10*time.Second {
		t.Errorf("coldstart fleet %+v, want min 0, max --replicas, idle 10s", f)
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
