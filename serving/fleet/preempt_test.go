package fleet

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/router"
)

// waitUntil polls cond every 5 ms, at most 500 times.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for range 500 {
		if cond() {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("timed out waiting: %s", what)
}

// A replica whose worker drains it on a preemption notice is replaced at
// once — while it still drains, not after its lease — and stopped only once
// its drain is over; both show in the status as what they were.
func TestPreemptedReplicaIsReplacedAtOnce(t *testing.T) {
	c, reg, cl, pr := newTestController(t, Model{Min: 1, Max: 1}, nil)
	c.cfg.Interval = time.Hour // only Wake makes it look: "at once" means on the notice
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	waitUntil(t, "min 1 ready", func() bool { return reg.ReadyFor("m") })
	old := c.Replicas("m")[0]

	// The worker's heartbeat: draining, preempted.
	reg.Get(old).SetState(router.StateDraining, "preempted: notice file /run/tailgate/preempt appeared")
	c.Wake("m") // the gateway wakes it on a draining heartbeat
	waitUntil(t, "a replacement", func() bool {
		ids := c.Replicas("m")
		return len(ids) == 1 && ids[0] != old && reg.ReadyFor("m")
	})
	cl.mu.Lock()
	stillThere := cl.alive[old]
	cl.mu.Unlock()
	if !stillThere {
		t.Fatal("the preempted replica was stopped while it drained: its requests in flight were cut")
	}
	st := c.Status()
	if len(st.Models) != 1 || st.Models[0].Current != 1 || st.Models[0].Draining != 1 || st.Models[0].Desired != 1 {
		t.Fatalf("status %+v, want 1 current (the replacement), 1 draining, 1 desired", st.Models)
	}
	if i := slices.IndexFunc(st.Actions, func(a Action) bool { return a.Kind == "start" && a.Reason == "preempted" }); i < 0 || st.Actions[i].Outcome != "ok" {
		t.Fatalf("actions %+v, want an ok start for the preempted replica", st.Actions)
	}

	// The drain is over: the worker is gone (its lease ran out and the
	// gateway forgot it).
	reg.Remove(old)
	c.Wake("m")
	waitUntil(t, "the preempted replica stopped", func() bool {
		cl.mu.Lock()
		defer cl.mu.Unlock()
		return !cl.alive[old]
	})
	waitUntil(t, "the preempted action recorded", func() bool {
		return counter(t, pr, "tailgate_fleet_actions_total", map[string]string{"action": "preempted", "outcome": "ok"}) == 1
	})
	st = c.Status()
	if i := slices.IndexFunc(st.Actions, func(a Action) bool { return a.Kind == "preempted" }); i < 0 || st.Actions[i].Replica != old {
		t.Fatalf("actions %+v, want preempted %s", st.Actions, old)
	}
	if st.Models[0].Draining != 0 || st.Models[0].Current != 1 {
		t.Fatalf("status %+v after the drain", st.Models)
	}
	if n := counter(t, pr, "tailgate_fleet_actions_total", map[string]string{"action": "start", "outcome": "ok"}); n != 2 {
		t.Fatalf("%v starts, want 2 (min, then one replacement)", n)
	}
	cancel()
	<-done
}

// A failing provider shows in the status: the failed starts with their
// error, the consecutive failures and when the next try is due.
func TestStatusShowsAFailingProvider(t *testing.T) {
	c, _, _, _ := newTestController(t, Model{Min: 1, Max: 2}, errors.New("no GPU available in region"))
	c.cfg.Backoff, c.cfg.MaxBackoff = time.Hour, time.Hour // one try, then a long backoff
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	waitUntil(t, "a failed start", func() bool { return c.Status().Models[0].Failures == 1 })
	for range 20 { // woken again and again: still one try
		c.Wake("m")
		time.Sleep(time.Millisecond)
	}
	st := c.Status()
	m := st.Models[0]
	if m.Model != "m" || m.Min != 1 || m.Max != 2 || m.Desired != 1 || m.Current != 0 || m.Failures != 1 || m.NextRetry == nil {
		t.Fatalf("model status %+v, want min 1 max 2 desired 1, none current, 1 failure and a next retry", m)
	}
	if len(st.Actions) != 1 || st.Actions[0].Kind != "start" || st.Actions[0].Outcome != "error" ||
		st.Actions[0].Error != "no GPU available in region" || st.Actions[0].Reason != "min" {
		t.Fatalf("actions %+v, want one failed start saying why", st.Actions)
	}
	cancel()
	<-done
}

// Between a worker's draining heartbeat and the controller's next look, a
// request for the model finds its only replica draining: a replacement is
// coming (it is started at once, even at Max), so the request is worth
// holding — CanStart says so — instead of refused with no_replica.
func TestDrainingReplicaAtMaxLeavesRoomForItsReplacement(t *testing.T) {
	c, reg, _, _ := newTestController(t, Model{Min: 1, Max: 1}, nil)
	c.cfg.Interval = time.Hour // no look but the ones asked for
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	waitUntil(t, "min 1 ready", func() bool { return reg.ReadyFor("m") })
	if c.CanStart("m") {
		t.Fatal("CanStart at max with the replica ready")
	}
	old := c.Replicas("m")[0]
	reg.Get(old).SetState(router.StateDraining, "preempted: notice file /run/tailgate/preempt appeared")
	if !c.CanStart("m") {
		t.Fatal("CanStart is false while the model's only replica drains and its replacement is owed: a request in this window is refused")
	}
	c.Wake("m")
	waitUntil(t, "the replacement ready", func() bool {
		ids := c.Replicas("m")
		return len(ids) == 1 && ids[0] != old && reg.ReadyFor("m")
	})
	if c.CanStart("m") {
		t.Fatal("CanStart at max once the replacement is ready")
	}
	cancel()
	<-done
}
