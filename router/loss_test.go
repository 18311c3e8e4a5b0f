package router

import (
	"strings"
	"testing"
	"time"
)

// TestLossIsSaidKeptAndRestored pins what a lost replica tells: why (its
// last probe's error with the lease), no load left from its last
// heartbeat, its ejection counted; the loss goes to OnLoss so a restarted
// registry can list it again with RestoreLost, lost with the same reason,
// until its worker is heard again (OnLoss says so) or it is forgotten.
func TestLossIsSaidKeptAndRestored(t *testing.T) {
	now := time.Unix(1000, 0)
	clock := func() time.Time { return now }
	reg := newRegistry(t, Config{Now: clock})
	var events []LossEvent
	reg.OnLoss(func(ev LossEvent) { events = append(events, ev) })
	rep := reg.Heartbeat(Update{ID: "w1", URL: "http://w1", Models: []string{"m"}, State: StateReady, Lease: 3 * time.Second,
		Worker: "wkr_a", Load: Load{Running: 4, Waiting: 2, Inflight: 4}})
	perr := "dial tcp 127.0.0.1:9: connect: connection refused"
	rep.probeErr.Store(&perr)
	now = now.Add(4 * time.Second)
	reg.ExpireLeases(now)
	if rep.State() != StateLost || !strings.HasPrefix(rep.Reason(), "worker unreachable: connection refused") {
		t.Fatalf("lost replica: %s %q", rep.State(), rep.Reason())
	}
	if l := rep.Load(); l != (Load{}) {
		t.Errorf("lost replica keeps its last load %+v", l)
	}
	if n := reg.Ejections("w1"); n != 1 {
		t.Errorf("Ejections(w1) = %d, want 1 (lost while ready)", n)
	}
	if len(events) != 1 || events[0].Loss == nil || events[0].Loss.Reason != rep.Reason() || events[0].Worker != "wkr_a" {
		t.Fatalf("OnLoss events %+v", events)
	}

	// A new registry (a restarted gateway) restores it from the event.
	reg2 := newRegistry(t, Config{Now: clock})
	if !reg2.RestoreLost(events[0]) {
		t.Fatal("RestoreLost added nothing")
	}
	back := reg2.Get("w1")
	if back == nil || back.State() != StateLost || back.Reason() != rep.Reason() || back.Worker != "wkr_a" || !back.Serves("m") {
		t.Fatalf("restored: %+v", back)
	}
	if _, err := reg2.Pick(Hint{Model: "m"}, nil); err == nil {
		t.Error("a restored lost replica was picked")
	}
	var events2 []LossEvent
	reg2.OnLoss(func(ev LossEvent) { events2 = append(events2, ev) })
	reg2.Heartbeat(Update{ID: "w1", URL: "http://w1", Models: []string{"m"}, State: StateReady, Lease: 3 * time.Second, Worker: "wkr_a"})
	if reg2.Get("w1").State() != StateReady || len(events2) != 1 || events2[0].Loss != nil {
		t.Fatalf("worker heard again: %s, events %+v", reg2.Get("w1").State(), events2)
	}
	if l := reg2.Get("w1").LastLoss(); l == nil || l.Reason != rep.Reason() {
		t.Errorf("a replica that came back forgot why it went away: %+v", l)
	}

	// A worker that comes back at another address while ready: the old
	// replica's going is counted and said.
	reg2.Heartbeat(Update{ID: "w1", URL: "http://w1b", Models: []string{"m"}, State: StateStarting, Lease: 3 * time.Second, Worker: "wkr_a"})
	if l := reg2.Get("w1").LastLoss(); l == nil || !strings.HasPrefix(l.Reason, "worker restarted: its sidecar moved from http://w1 to http://w1b") {
		t.Errorf("restarted worker's replica: last loss %+v", l)
	}
	if n := reg2.Ejections("w1"); n != 1 {
		t.Errorf("Ejections(w1) after a restart while ready = %d, want 1", n)
	}
}
