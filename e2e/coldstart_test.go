package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/bench/load"
)

// TestBenchColdStartFromZeroReplicas: `bench --scenario coldstart` starts
// `tailgate up` with the fleet controller at min 0 and an engine that loads
// for 3 s; every request is answered (held through the start, the hold
// stage at least the engine's load), the first token comes within 1 s of
// the replica being ready; idle, the replica is put to sleep, and the next
// requests are held while it wakes (at least the engine's 1 s wake) with
// the first token within 1 s of the wake, a wake faster than the start;
// and the idle replica is stopped again.
func TestBenchColdStartFromZeroReplicas(t *testing.T) {
	path := filepath.Join(t.TempDir(), "coldstart.json")
	out := runBench(t, 3*time.Minute, "--scenario", "coldstart", "--worker-args", "--sim-start-delay 3s",
		"--gateway-args", "--fleet-idle 8s --fleet-sleep-after 2s", "--phases", "steady:6s,idle:6s,steady:4s,idle:12s", "--json", path)
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var rep load.Report
	if err := json.Unmarshal(raw, &rep); err != nil {
		t.Fatal(err)
	}
	c := rep.ColdStart
	switch {
	case c == nil:
		t.Fatalf("no cold-start section in the report:\n%s", out)
	case c.Verdict != "PASS" || c.Errors != 0 || !c.FirstOK:
		t.Errorf("verdict %s, %d errors, first ok %v; want PASS with every request answered", c.Verdict, c.Errors, c.FirstOK)
	case c.FirstHoldMS == nil || *c.FirstHoldMS < 3000 || c.Held == 0:
		t.Errorf("first request held %v ms (%d held); want at least the engine's 3 s load", c.FirstHoldMS, c.Held)
	case c.StartDelay != "3s":
		t.Errorf("start delay %q, want the 3s asked for", c.StartDelay)
	case c.ZeroS == nil:
		t.Errorf("the replica was not stopped within the last idle phase (fleet idle 8s)")
	}
	w := c.Wake
	switch {
	case w == nil || w.AsleepS == nil:
		t.Fatalf("the replica was not seen asleep (--fleet-sleep-after 2s, 6 s idle): %+v\n%s", w, out)
	case w.Verdict != "PASS" || w.Errors != 0 || !w.FirstOK || w.Requests == 0:
		t.Errorf("from sleep: verdict %s, %d errors of %d, first ok %v; want PASS with every request answered", w.Verdict, w.Errors, w.Requests, w.FirstOK)
	case w.FirstHoldMS == nil || *w.FirstHoldMS < 1000:
		t.Errorf("first request from sleep held %v ms; want at least the engine's 1 s wake", w.FirstHoldMS)
	case w.WakeDelay != "1s" || w.SleepAfterS != 2:
		t.Errorf("wake delay %q, sleep after %v s; want 1s (the scenario's) and 2", w.WakeDelay, w.SleepAfterS)
	case w.ColdOverWake == nil || *w.ColdOverWake <= 1:
		t.Errorf("wake %v ms vs cold start %v ms: want the wake faster", w.WakeMS, w.ColdLoadMS)
	}
}

// TestBenchFailoverUnderTheFleetController: with --fleet-controller the
// bench kills a worker of `up`'s fleet and the controller brings it back:
// no client error but a stream cut mid-way on the killed worker, and the
// replacement is ready and serving again.
func TestBenchFailoverUnderTheFleetController(t *testing.T) {
	path := filepath.Join(t.TempDir(), "failover.json")
	runBench(t, 3*time.Minute, "--scenario", "failover", "--fleet-controller", "--replicas", "2", "--rate", "10",
		"--phases", "steady:4s,kill:1,steady:10s", "--json", path)
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var rep load.Report
	if err := json.Unmarshal(raw, &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Failovers) != 1 {
		t.Fatalf("failovers: %d, want 1", len(rep.Failovers))
	}
	f := rep.Failovers[0]
	// A stream that had its first token on the killed worker ends with the
	// in-band error the failover rules promise (no silent retry after the
	// first token); every other request is answered.
	if f.Errors != f.Midstream || len(f.Killed) != 1 {
		t.Errorf("kill of %v: %d client errors (%d mid-stream, by class %v), want one worker killed and none but streams cut mid-way", f.Killed, f.Errors, f.Midstream, f.ErrorsByClass)
	}
	if len(f.Replacements) != 1 || f.Replacements[0].ID != f.Killed[0] || f.Replacements[0].ReadyMS == nil || f.Replacements[0].ServingMS == nil {
		t.Errorf("replacements %+v: want the killed worker back, ready and serving", f.Replacements)
	}
}
