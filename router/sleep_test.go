package router

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/e2e/testkit"
)

func TestPickNeverChoosesASleepingReplica(t *testing.T) {
	reg := newRegistry(t, Config{Rand: func(int) int { return 0 }})
	busy := reg.Add(readyReplica("busy", "m"))
	busy.inflight.Store(50) // by load alone, the idle one would win every time
	asleep := reg.Add(readyReplica("asleep", "m"))
	if !asleep.SetState(StateSleeping, "engine asleep") {
		t.Fatal("ready → sleeping refused")
	}
	for range 50 {
		got, err := reg.Pick(Hint{Model: "m"}, nil)
		if err != nil || got != busy {
			t.Fatalf("Pick = %v, %v; want busy, never the sleeping replica", got, err)
		}
	}
	busy.SetState(StateDraining, "stopping")
	if got, err := reg.Pick(Hint{Model: "m"}, nil); !errors.Is(err, ErrNoReplica) {
		t.Fatalf("only a sleeping replica left: Pick = %v, %v; want ErrNoReplica", got, err)
	}
	if !reg.Known("m") {
		t.Fatal("a model whose replica sleeps must stay known (served, not 404)")
	}
}

func TestHoldForASleepingReplicaAsksTheProvisionerToWakeIt(t *testing.T) {
	reg := newRegistry(t, Config{})
	rep := reg.Add(readyReplica("r", "m"))
	rep.SetState(StateSleeping, "engine asleep")
	// Without a provisioner that wakes it, no one would: the request is
	// not held.
	if err := reg.Hold(context.Background(), "m", ClassStandard, holdLong); !errors.Is(err, ErrNoReplica) {
		t.Fatalf("sleeping replica, no provisioner: got %v, want ErrNoReplica", err)
	}
	reg.SetProvisioner(&fakeProvisioner{models: map[string]bool{}})
	if err := reg.Hold(context.Background(), "m", ClassStandard, holdLong); !errors.Is(err, ErrNoReplica) {
		t.Fatalf("sleeping replica, a provisioner that does not wake it: got %v, want ErrNoReplica", err)
	}
	// At its maximum, the provisioner cannot start one but wakes this one.
	p := &fakeProvisioner{models: map[string]bool{}, canWake: true}
	reg.SetProvisioner(p)
	var mu sync.Mutex
	var progress []string
	done := make(chan error, 1)
	go func() {
		done <- reg.Hold(context.Background(), "m", ClassStandard, HoldOptions{Queue: 1, Timeout: time.Minute, Every: 5 * time.Millisecond,
			Progress: func(s string, _ time.Duration) { mu.Lock(); progress = append(progress, s); mu.Unlock() }})
	}()
	testkit.WaitFor(t, "progress", func() bool { mu.Lock(); defer mu.Unlock(); return len(progress) > 0 })
	if got := reg.Sleeping("m"); len(got) != 1 || got[0] != rep {
		t.Fatalf("Sleeping(m) = %v, want [r]", got)
	}
	rep.SetState(StateReady, "") // its worker reports it awake
	if err := <-done; err != nil {
		t.Fatalf("hold after the wake: %v", err)
	}
	p.mu.Lock()
	wakes := p.wakes
	p.mu.Unlock()
	if wakes != 1 {
		t.Fatalf("provisioner told %d times, want 1", wakes)
	}
	mu.Lock()
	defer mu.Unlock()
	if progress[0] != "sleeping" {
		t.Fatalf("progress state %q, want sleeping", progress[0])
	}
}
