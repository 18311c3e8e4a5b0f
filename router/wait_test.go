package router

import (
	"context"
	"errors"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tailgate-dev/tailgate/e2e/testkit"
)

func startingReplica(id string, models ...string) *Replica {
	r := NewReplica(id, "http://"+id)
	r.SetModels(models)
	return r // a new replica is starting
}

// fakeProvisioner can start replicas of the models it lists and counts
// wake-ups.
type fakeProvisioner struct {
	mu      sync.Mutex
	models  map[string]bool
	wakes   int
	canWake bool // it wakes sleeping replicas of any model
}

func (p *fakeProvisioner) CanStart(m string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.models[m]
}
func (p *fakeProvisioner) CanWake(string) bool { return p.canWake }
func (p *fakeProvisioner) Wake(string)         { p.mu.Lock(); p.wakes++; p.mu.Unlock() }
func (p *fakeProvisioner) Models() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Collect(maps.Keys(p.models))
}

var holdLong = HoldOptions{Queue: 8, Timeout: time.Minute}

func TestHoldRefusesWhenNothingIsComing(t *testing.T) {
	reg := newRegistry(t, Config{})
	reg.Add(NewReplica("x", "http://x")).SetModels([]string{"m"})
	reg.Get("x").SetState(StateFailed, "crashed")
	if err := reg.Hold(context.Background(), "m", ClassStandard, holdLong); !errors.Is(err, ErrNoReplica) {
		t.Fatalf("failed replica only: got %v, want ErrNoReplica", err)
	}
	if err := reg.Hold(context.Background(), "other", ClassStandard, holdLong); !errors.Is(err, ErrNoReplica) {
		t.Fatalf("unknown model: got %v, want ErrNoReplica", err)
	}
}

func TestHoldReleasedWhenReplicaBecomesReady(t *testing.T) {
	pr := prometheus.NewRegistry()
	reg := newRegistry(t, Config{Registerer: pr})
	rep := reg.Add(startingReplica("a", "m"))
	done := make(chan error, 1)
	go func() { done <- reg.Hold(context.Background(), "m", ClassStandard, holdLong) }()
	testkit.WaitFor(t, "the request to wait", func() bool { return reg.Waiting("m") == 1 })
	if got := modelGauge(t, pr, "tailgate_model_waiting_requests", "m"); got != 1 {
		t.Fatalf("tailgate_model_waiting_requests = %v, want 1", got)
	}
	rep.SetState(StateReady, "")
	if err := <-done; err != nil {
		t.Fatalf("released hold: %v", err)
	}
	if reg.Waiting("m") != 0 || modelGauge(t, pr, "tailgate_model_waiting_requests", "m") != 0 {
		t.Fatal("waiting count not back to 0 after release")
	}
}

func TestHoldQueueBound(t *testing.T) {
	reg := newRegistry(t, Config{})
	rep := reg.Add(startingReplica("a", "m"))
	opt := HoldOptions{Queue: 2, Timeout: time.Minute}
	errs := make(chan error, 2)
	for range 2 {
		go func() { errs <- reg.Hold(context.Background(), "m", ClassStandard, opt) }()
	}
	testkit.WaitFor(t, "two waiters", func() bool { return reg.Waiting("m") == 2 })
	if err := reg.Hold(context.Background(), "m", ClassInteractive, opt); !errors.Is(err, ErrHoldFull) {
		t.Fatalf("third request: got %v, want ErrHoldFull", err)
	}
	rep.SetState(StateReady, "")
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatalf("queued request: %v", err)
		}
	}
}

func TestHoldDeadlineAndCancel(t *testing.T) {
	reg := newRegistry(t, Config{})
	reg.Add(startingReplica("a", "m"))
	err := reg.Hold(context.Background(), "m", ClassStandard, HoldOptions{Queue: 4, Timeout: 20 * time.Millisecond})
	if !errors.Is(err, ErrHoldTimeout) {
		t.Fatalf("got %v, want ErrHoldTimeout", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		testkit.WaitFor(t, "a waiter", func() bool { return reg.Waiting("m") == 1 })
		cancel()
	}()
	if err := reg.Hold(ctx, "m", ClassStandard, holdLong); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: got %v", err)
	}
	if n := reg.Waiting("m"); n != 0 {
		t.Fatalf("%d still waiting after timeout and cancel", n)
	}
}

func TestHoldReleasesInClassOrder(t *testing.T) {
	reg := newRegistry(t, Config{})
	rep := reg.Add(startingReplica("a", "m"))
	classes := []Class{ClassBatch, ClassStandard, ClassBatch, ClassInteractive, ClassStandard}
	var wg sync.WaitGroup
	for i, c := range classes {
		wg.Go(func() {
			if err := reg.Hold(context.Background(), "m", c, holdLong); err != nil {
				t.Errorf("waiter %d: %v", i, err)
			}
		})
		testkit.WaitFor(t, "the waiter to queue", func() bool { return reg.Waiting("m") == i+1 })
	}
	// Keep the waiters to read their release order.
	reg.holds.mu.Lock()
	q := reg.holds.models["m"]
	var ws []*holdWaiter
	for s := range q.byClass {
		ws = append(ws, q.byClass[s]...)
	}
	reg.holds.mu.Unlock()
	rep.SetState(StateReady, "")
	wg.Wait()
	orderOf := map[Class][]int{}
	for _, w := range ws {
		orderOf[w.class] = append(orderOf[w.class], w.order)
	}
	if got := orderOf[ClassInteractive]; len(got) != 1 || got[0] != 1 {
		t.Fatalf("interactive released %v, want first", got)
	}
	if got := orderOf[ClassStandard]; len(got) != 2 || got[0] != 2 || got[1] != 3 {
		t.Fatalf("standard released %v, want 2nd and 3rd in arrival order", got)
	}
	if got := orderOf[ClassBatch]; len(got) != 2 || got[0] != 4 || got[1] != 5 {
		t.Fatalf("batch released %v, want last in arrival order", got)
	}
}

func TestHoldForProvisionerWakesIt(t *testing.T) {
	reg := newRegistry(t, Config{})
	p := &fakeProvisioner{models: map[string]bool{"m": true}}
	reg.SetProvisioner(p)
	if !reg.Startable("m") || reg.Startable("n") {
		t.Fatal("Startable does not follow the provisioner")
	}
	var progress []string
	var mu sync.Mutex
	done := make(chan error, 1)
	go func() {
		done <- reg.Hold(context.Background(), "m", ClassStandard, HoldOptions{Queue: 1, Timeout: time.Minute, Every: 5 * time.Millisecond,
			Progress: func(s string, _ time.Duration) { mu.Lock(); progress = append(progress, s); mu.Unlock() }})
	}()
	testkit.WaitFor(t, "progress", func() bool { mu.Lock(); defer mu.Unlock(); return len(progress) > 0 })
	reg.Add(readyReplica("new", "m")) // a replica added ready releases too
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.wakes != 1 {
		t.Fatalf("provisioner woken %d times, want 1", p.wakes)
	}
	mu.Lock()
	defer mu.Unlock()
	if progress[0] != "provisioning" {
		t.Fatalf("progress state %q, want provisioning", progress[0])
	}
}

// modelGauge reads name{model} from a registry; -1 when it is absent.
func modelGauge(t *testing.T, g prometheus.Gatherer, name, model string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "model" && l.GetValue() == model {
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	return -1
}
