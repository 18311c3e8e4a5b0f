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

// cloud is a provider whose replicas join reg at once, ready (or, with
// fail set, whose starts fail). It records the most replicas alive at once.
type cloud struct {
	reg  *router.Registry
	fail error

	mu           sync.Mutex
	alive        map[string]bool
	most, starts int
}

func (c *cloud) Start(_ context.Context, model, id string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.starts++
	if c.fail != nil {
		return c.fail
	}
	c.alive[id] = true
	c.most = max(c.most, len(c.alive))
	rep := router.NewReplica(id, "http://"+id)
	rep.SetModels([]string{model})
	rep.SetState(router.StateReady, "")
	c.reg.Add(rep)
	return nil
}

func (c *cloud) Stop(_ context.Context, _, id string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.alive, id)
	c.reg.Remove(id)
	return nil
}

type noAttempt struct{}

func (noAttempt) Abort() {}

func newTestController(t *testing.T, m Model, fail error) (*Controller, *router.Registry, *cloud, *prometheus.Registry) {
	t.Helper()
	pr := prometheus.NewRegistry()
	reg, err := router.New(router.Config{Registerer: pr}, nil)
	if err != nil {
		t.Fatal(err)
	}
	cl := &cloud{reg: reg, fail: fail, alive: map[string]bool{}}
	c, err := New(Config{Models: map[string]Model{"m": m}, Interval: time.Millisecond, Backoff: 20 * time.Millisecond,
		MaxBackoff: 80 * time.Millisecond, Registerer: pr}, reg, cl, nil)
	if err != nil {
		t.Fatal(err)
	}
	return c, reg, cl, pr
}

func counter(t *testing.T, pr *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := pr.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if v, ok := labels[l.GetName()]; ok && v != l.GetValue() {
					continue next
				}
			}
			return m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return 0
}

// A burst held at zero replicas, then kept in flight, scales the model up
// to its max and never past it.
func TestBurstNeverExceedsMax(t *testing.T) {
	c, reg, cl, pr := newTestController(t, Model{Min: 0, Max: 2, ScaleUpInflight: 1, IdleAfter: time.Hour}, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	hold := make(chan struct{})
	var wg sync.WaitGroup
	for range 40 {
		wg.Go(func() {
			if err := reg.Hold(ctx, "m", router.ClassStandard, router.HoldOptions{Queue: 64, Timeout: 10 * time.Second}); err != nil {
				t.Errorf("hold: %v", err)
				return
			}
			call := reg.NewCall(router.Request{Hint: router.Hint{Model: "m"}, NoHedge: true}, func(ctx context.Context, _ *router.Replica, _ int, _ router.AttemptReason) (router.Attempt, error) {
				<-hold // in flight until the test ends
				return noAttempt{}, nil
			})
			_ = call.Start(ctx)
			call.Finish()
		})
	}
	for range 500 {
		if len(c.Replicas("m")) == 2 && reg.Inflight("m") == 40 {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	for range 50 { // keep waking it: the bound must hold under pressure
		c.Wake("m")
		time.Sleep(time.Millisecond)
	}
	if n := len(c.Replicas("m")); n != 2 {
		t.Fatalf("%d replicas with 40 requests in flight, want max 2", n)
	}
	if c.CanStart("m") {
		t.Fatal("CanStart at max")
	}
	if got := counter(t, pr, "tailgate_model_desired_replicas", map[string]string{"model": "m"}); got != 2 {
		t.Fatalf("desired replicas %v, want 2", got)
	}
	close(hold)
	wg.Wait()
	cancel()
	<-done
	cl.mu.Lock()
	defer cl.mu.Unlock()
	if cl.most > 2 {
		t.Fatalf("%d replicas alive at once, max is 2", cl.most)
	}
	if len(cl.alive) != 0 {
		t.Fatalf("replicas %v still alive after the controller stopped", cl.alive)
	}
}

// A provider that fails is retried with growing backoff, not in a loop, and
// each failure is counted.
func TestFailingProviderBacksOff(t *testing.T) {
	c, reg, cl, pr := newTestController(t, Model{Min: 1, Max: 1}, errors.New("no GPU available in region"))
	ctx, cancel := context.WithTimeout(context.Background(), 400*time.Millisecond)
	defer cancel()
	_ = c.Run(ctx)
	cl.mu.Lock()
	starts := cl.starts
	cl.mu.Unlock()
	// 400 ms at a 1 ms interval would be hundreds of tries without
	// backoff; 20, 40, 80, 80… ms allows well under a dozen.
	if starts < 2 || starts > 12 {
		t.Fatalf("%d start attempts in 400 ms, want a few (retried with backoff)", starts)
	}
	if got := counter(t, pr, "tailgate_fleet_actions_total", map[string]string{"model": "m", "action": "start", "outcome": "error"}); int(got) != starts {
		t.Fatalf("tailgate_fleet_actions_total{start,error} = %v, want %d", got, starts)
	}
	if reg.ReadyFor("m") || len(c.Replicas("m")) != 0 {
		t.Fatal("a failed start counts as a replica")
	}
}

// A replica it started that is lost is replaced; one idle past IdleAfter
// above min is stopped.
func TestReplaceLostAndScaleDownIdle(t *testing.T) {
	c, reg, cl, pr := newTestController(t, Model{Min: 0, Max: 1, IdleAfter: 50 * time.Millisecond}, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	if err := reg.Hold(ctx, "m", router.ClassStandard, router.HoldOptions{Queue: 1, Timeout: 5 * time.Second}); err != nil {
		t.Fatal(err)
	}
	first := c.Replicas("m")
	if len(first) != 1 {
		t.Fatalf("replicas %v after a held request", first)
	}
	// Idle: back to zero.
	for range 500 {
		if len(c.Replicas("m")) == 0 {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	if n := len(c.Replicas("m")); n != 0 {
		t.Fatalf("%d replicas after the idle period, want 0 (min)", n)
	}
	if counter(t, pr, "tailgate_fleet_actions_total", map[string]string{"action": "stop", "outcome": "ok"}) != 1 {
		t.Fatal("the idle stop is not counted")
	}
	cancel()
	<-done
	_ = cl
}

func TestLostReplicaIsReplaced(t *testing.T) {
	c, reg, cl, pr := newTestController(t, Model{Min: 1, Max: 1}, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	for range 500 {
		if reg.ReadyFor("m") {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	old := c.Replicas("m")
	if len(old) != 1 {
		t.Fatalf("replicas %v, want min 1", old)
	}
	reg.Get(old[0]).SetState(router.StateFailed, "engine died")
	for range 500 {
		if ids := c.Replicas("m"); len(ids) == 1 && ids[0] != old[0] && reg.ReadyFor("m") {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	if ids := c.Replicas("m"); len(ids) != 1 || ids[0] == old[0] {
		t.Fatalf("replicas %v after %s failed, want one replacement", ids, old[0])
	}
	if counter(t, pr, "tailgate_fleet_actions_total", map[string]string{"action": "replace", "outcome": "ok"}) != 1 {
		t.Fatal("the replacement is not counted")
	}
	cancel()
	<-done
	_ = cl
}
