package fleet

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tailgate-dev/tailgate/router"
)

// beds is a Sleeper whose replicas report their new state at once, as a
// sidecar's heartbeat would.
type beds struct {
	mu          sync.Mutex
	sleeps      int
	wakes       int
	levels      []int
	off         map[string]bool // replicas without sleep mode
	offRefusals int
}

func (b *beds) Sleep(_ context.Context, rep *router.Replica, level int) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.off[rep.ID] {
		b.offRefusals++
		return ErrSleepModeOff
	}
	b.sleeps++
	b.levels = append(b.levels, level)
	rep.SetState(router.StateSleeping, "engine asleep")
	return nil
}

func (b *beds) Wake(_ context.Context, rep *router.Replica) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.wakes++
	rep.SetState(router.StateReady, "")
	return nil
}

func newSleepyController(t *testing.T, m Model, b *beds) (*Controller, *router.Registry, *cloud, *prometheus.Registry) {
	t.Helper()
	pr := prometheus.NewRegistry()
	reg, err := router.New(router.Config{Registerer: pr}, nil)
	if err != nil {
		t.Fatal(err)
	}
	cl := &cloud{reg: reg, alive: map[string]bool{}}
	c, err := New(Config{Models: map[string]Model{"m": m}, Interval: time.Millisecond, Backoff: 20 * time.Millisecond,
		MaxBackoff: 80 * time.Millisecond, Registerer: pr, Sleeper: b}, reg, cl, nil)
	if err != nil {
		t.Fatal(err)
	}
	return c, reg, cl, pr
}

func until(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for range 1000 {
		if cond() {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("timed out waiting for %s", what)
}

// An idle replica is put to sleep instead of stopped; a request held for
// the model wakes it (no second replica is started, even at Max), and the
// request goes to it.
func TestIdleReplicaSleepsAndAHeldRequestWakesIt(t *testing.T) {
	b := &beds{}
	c, reg, cl, pr := newSleepyController(t, Model{Min: 1, Max: 1, SleepAfter: 30 * time.Millisecond, SleepLevel: 2, IdleAfter: time.Hour}, b)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	defer func() { cancel(); <-done }()

	until(t, "the idle replica asleep", func() bool { return len(reg.Sleeping("m")) == 1 })
	id := c.Replicas("m")[0]
	if reg.ReadyFor("m") {
		t.Fatal("a replica of m is ready while its only replica sleeps")
	}
	if !c.CanWake("m") || c.CanWake("other") {
		t.Fatal("CanWake does not follow the managed models")
	}
	if err := reg.Hold(ctx, "m", router.ClassStandard, router.HoldOptions{Queue: 4, Timeout: 10 * time.Second}); err != nil {
		t.Fatalf("held request: %v", err)
	}
	got, err := reg.Pick(router.Hint{Model: "m"}, nil)
	if err != nil || got.ID != id {
		t.Fatalf("after the wake Pick = %v, %v; want the woken %s", got, err, id)
	}
	cl.mu.Lock()
	starts := cl.starts
	cl.mu.Unlock()
	if starts != 1 {
		t.Fatalf("%d starts: the controller started a replica instead of waking the sleeping one", starts)
	}
	b.mu.Lock()
	if b.sleeps < 1 || b.wakes != 1 || b.levels[0] != 2 {
		t.Errorf("sleeps %d (levels %v), wakes %d; want a level 2 sleep and one wake", b.sleeps, b.levels, b.wakes)
	}
	b.mu.Unlock()
	// An action is counted as it returns, a moment after the wake it made
	// released the held request.
	for _, action := range []string{"sleep", "wake"} {
		until(t, "tailgate_fleet_actions_total{action="+action+",outcome=ok} counted", func() bool {
			return counter(t, pr, "tailgate_fleet_actions_total", map[string]string{"model": "m", "action": action, "outcome": "ok"}) >= 1
		})
	}
}

// A sleeping replica above Min is still stopped after the longer idle
// period.
func TestSleepingReplicaIsStoppedAfterIdleAfter(t *testing.T) {
	b := &beds{}
	c, reg, _, pr := newSleepyController(t, Model{Min: 0, Max: 1, SleepAfter: 20 * time.Millisecond, IdleAfter: 300 * time.Millisecond}, b)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	defer func() { cancel(); <-done }()
	if err := reg.Hold(ctx, "m", router.ClassStandard, router.HoldOptions{Queue: 1, Timeout: 5 * time.Second}); err != nil {
		t.Fatal(err)
	}
	until(t, "the replica asleep", func() bool { return len(reg.Sleeping("m")) == 1 })
	until(t, "the sleeping replica stopped", func() bool { return len(c.Replicas("m")) == 0 })
	if counter(t, pr, "tailgate_fleet_actions_total", map[string]string{"action": "stop", "outcome": "ok"}) != 1 {
		t.Fatal("the stop after the idle period is not counted")
	}
}

// A replica whose engine runs without sleep mode is asked once, then left
// awake.
func TestReplicaWithoutSleepModeIsNotAskedAgain(t *testing.T) {
	b := &beds{off: map[string]bool{"m-1": true}}
	c, _, _, _ := newSleepyController(t, Model{Min: 1, Max: 1, SleepAfter: time.Millisecond, IdleAfter: time.Hour}, b)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_ = c.Run(ctx)
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.offRefusals != 1 {
		t.Fatalf("asked a replica without sleep mode %d times in 300 ms, want once", b.offRefusals)
	}
}

// slowBed is a Sleeper whose sleep call takes until released, as a sidecar's
// does while its engine offloads; it records whether the registry would
// route to the replica meanwhile, and refuses the first sleep (busy).
type slowBed struct {
	reg     *router.Registry
	release chan struct{}
	mu      sync.Mutex
	calls   int
	picked  []bool // per call: Pick chose the replica during the call
}

func (b *slowBed) Sleep(_ context.Context, rep *router.Replica, _ int) error {
	_, err := b.reg.Pick(router.Hint{Model: "m"}, nil)
	b.mu.Lock()
	b.calls++
	n := b.calls
	b.picked = append(b.picked, err == nil)
	b.mu.Unlock()
	if n == 1 {
		return errors.New("replica_busy: 1 request in flight")
	}
	<-b.release
	rep.SetState(router.StateSleeping, "engine asleep")
	return nil
}

func (b *slowBed) Wake(_ context.Context, rep *router.Replica) error {
	rep.SetState(router.StateReady, "")
	return nil
}

// While the sidecar puts its engine to sleep no request is routed to the
// replica (the sidecar would refuse it): it is out of routing before the
// call, and back in when the sleep was refused.
func TestReplicaGoingToSleepTakesNoRequest(t *testing.T) {
	pr := prometheus.NewRegistry()
	reg, err := router.New(router.Config{Registerer: pr}, nil)
	if err != nil {
		t.Fatal(err)
	}
	b := &slowBed{reg: reg, release: make(chan struct{})}
	cl := &cloud{reg: reg, alive: map[string]bool{}}
	c, err := New(Config{Models: map[string]Model{"m": {Min: 1, Max: 1, SleepAfter: 20 * time.Millisecond, IdleAfter: time.Hour}},
		Interval: time.Millisecond, Backoff: 20 * time.Millisecond, MaxBackoff: 80 * time.Millisecond, Registerer: pr, Sleeper: b}, reg, cl, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	defer func() { cancel(); <-done }()
	released := false
	defer func() {
		if !released {
			close(b.release)
		}
	}()

	until(t, "a second sleep call", func() bool { b.mu.Lock(); defer b.mu.Unlock(); return b.calls >= 2 })
	b.mu.Lock()
	picked := append([]bool(nil), b.picked...)
	b.mu.Unlock()
	for i, p := range picked {
		if p {
			t.Errorf("sleep call %d: the registry routed to the replica while it was being put to sleep", i+1)
		}
	}
	close(b.release)
	released = true
	until(t, "the replica asleep", func() bool { return len(reg.Sleeping("m")) == 1 })
}
