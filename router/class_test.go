package router

import (
	"context"
	"testing"
	"time"
)

// hold starts a request of class c on f's registry whose first attempt
// stays in flight until the returned func is called; it returns the replica
// it is on. The request is not hedged.
func (f *fleet) hold(c Class) (*Replica, func()) {
	f.t.Helper()
	on := make(chan *Replica, 1)
	release := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		req := hint("m")
		req.Class, req.NoHedge = c, true
		res, err := f.reg.Do(context.Background(), req, func(ctx context.Context, rep *Replica, _ int, _ AttemptReason) (Attempt, error) {
			on <- rep
			select {
			case <-release:
				return &fakeAttempt{}, nil
			case <-ctx.Done():
				return nil, ErrNoToken(ctx.Err(), "")
			}
		})
		if err == nil {
			res.Finish()
		}
	}()
	var rep *Replica
	select {
	case rep = <-on:
	case <-time.After(10 * time.Second):
		f.t.Fatal("held request did not start in 10s")
	}
	return rep, func() {
		close(release)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			f.t.Fatal("held request did not end in 10s")
		}
	}
}

func TestHedgeNeverGoesToAReplicaServingAHigherClass(t *testing.T) {
	for _, tc := range []struct {
		name       string
		held, req  Class
		wantHedged bool
	}{
		{"batch hedge beside interactive", ClassInteractive, ClassBatch, false},
		{"batch hedge beside standard", ClassStandard, ClassBatch, false},
		{"standard hedge beside interactive", ClassInteractive, ClassStandard, false},
		{"standard hedge beside standard", ClassStandard, ClassStandard, true},
		{"standard hedge beside batch", ClassBatch, ClassStandard, true},
		{"interactive hedge beside interactive", ClassInteractive, ClassInteractive, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFleet(t, Config{Hedge: HedgeConfig{Budget: 1, Burst: 100}})
			for range 100 { // learn a 100ms delay
				f.serve(hint("m"), 100*time.Millisecond, 0)
			}
			busy, release := f.hold(tc.held)
			defer release()
			if got := busy.InflightClass(tc.held); got != 1 {
				t.Fatalf("%s in flight on %s: %d, want 1", tc.held, busy.ID, got)
			}
			req := hint("m")
			req.Class = tc.req
			// Slow first attempt (on the other replica: the busy one scores
			// worse), fast hedge.
			res := f.serve(req, time.Second, 10*time.Millisecond)
			if res.Hedged != tc.wantHedged {
				t.Fatalf("%s request hedged = %v with %s in flight on %s, want %v", tc.req, res.Hedged, tc.held, busy.ID, tc.wantHedged)
			}
			if got := metricValue(t, f.prom, "tailgate_hedges_skipped_total", "model", "m", "reason", "priority"); got != map[bool]float64{true: 0, false: 1}[tc.wantHedged] {
				t.Errorf("tailgate_hedges_skipped_total{m,priority} = %v", got)
			}
			if res.Hedged && res.Replica != busy {
				t.Errorf("hedge won on %s, want %s (the only other replica)", res.Replica.ID, busy.ID)
			}
			if !res.Hedged && res.Replica == busy {
				t.Fatalf("first attempt went to %s beside the held request; the test needs it on the other replica", busy.ID)
			}
		})
	}
}

func TestBatchHedgeGoesOnceTheInteractiveRequestEnds(t *testing.T) {
	f := newFleet(t, Config{Hedge: HedgeConfig{Budget: 1, Burst: 100}})
	for range 100 {
		f.serve(hint("m"), 100*time.Millisecond, 0)
	}
	batch := hint("m")
	batch.Class = ClassBatch

	busy, release := f.hold(ClassInteractive)
	if got := metricValue(t, f.prom, "tailgate_replica_inflight_class", "replica", busy.ID, "class", "interactive"); got != 1 {
		t.Errorf("tailgate_replica_inflight_class{%s,interactive} = %v, want 1", busy.ID, got)
	}
	if res := f.serve(batch, time.Second, 10*time.Millisecond); res.Hedged {
		t.Fatalf("batch request hedged to %s while an interactive request runs there", res.Replica.ID)
	}
	release()
	if got := busy.InflightClass(ClassInteractive); got != 0 {
		t.Fatalf("interactive in flight on %s after it ended: %d", busy.ID, got)
	}
	res := f.serve(batch, time.Second, 10*time.Millisecond)
	if !res.Hedged {
		t.Fatal("batch request not hedged once the other replica is free of interactive requests")
	}
	if got := metricValue(t, f.prom, "tailgate_hedges_skipped_total", "reason", "priority"); got != 1 {
		t.Errorf("tailgate_hedges_skipped_total{priority} = %v, want 1", got)
	}
	for _, rep := range f.reg.Replicas() {
		for _, c := range []Class{ClassBatch, ClassStandard, ClassInteractive} {
			if n := rep.InflightClass(c); n != 0 {
				t.Errorf("%s: %d %s attempts in flight after every request ended", rep.ID, n, c)
			}
		}
	}
}

// TestInteractiveRequestFindsTheOneFreeReplica: three replicas are full of
// batch work and one is free; P2C's two draws see only full ones, and a
// standard request goes to one of them, but an interactive request goes
// to the free one, first attempt and hedge alike.
func TestInteractiveRequestFindsTheOneFreeReplica(t *testing.T) {
	reg := newRegistry(t, Config{Rand: func(int) int { return 0 }}) // draws the first two candidates
	reg.Add(readyReplica("a", "m")).inflight.Store(8)
	reg.Add(readyReplica("b", "m")).inflight.Store(8)
	reg.Add(readyReplica("c", "m")).inflight.Store(8)
	reg.Add(readyReplica("d", "m"))
	answer := func(context.Context, *Replica, int, AttemptReason) (Attempt, error) { return &fakeAttempt{}, nil }
	for _, tc := range []struct {
		class Class
		want  string
	}{{ClassStandard, "a"}, {ClassInteractive, "d"}} {
		res, err := reg.Do(context.Background(), Request{Hint: Hint{Model: "m"}, Class: tc.class}, answer)
		if err != nil || res.Replica.ID != tc.want {
			t.Fatalf("%s request went to %s (%v), want %s", tc.class, res.Replica.ID, err, tc.want)
		}
		res.Finish()
	}
	// Its hedge too: with a, the first attempt's replica, tried, two draws
	// would see b and c, both full.
	rep, why := reg.hedgeTarget(Request{Hint: Hint{Model: "m"}, Class: ClassInteractive}, []*Replica{reg.Get("a")})
	if why != "" || rep.ID != "d" {
		t.Fatalf("interactive hedge target %v (%q), want d", rep.ID, why)
	}
}

// TestInteractiveRequestPrefersAFreeSlotToALowScore: a replica whose
// engine slots the gateway's own requests fill scores better than a slower
// one with room (its recent TTFT is lower); a standard request goes by the
// score and queues there, an interactive one takes the free slot.
func TestInteractiveRequestPrefersAFreeSlotToALowScore(t *testing.T) {
	reg := newRegistry(t, Config{Rand: func(int) int { return 0 }})
	full := reg.Add(readyReplica("full", "m"))
	full.slots.Store(8)
	full.inflight.Store(8)
	full.ObserveTTFT(10 * time.Millisecond)
	room := reg.Add(readyReplica("room", "m"))
	room.slots.Store(8)
	room.inflight.Store(2)
	room.ObserveTTFT(100 * time.Millisecond)
	answer := func(context.Context, *Replica, int, AttemptReason) (Attempt, error) { return &fakeAttempt{}, nil }
	for _, tc := range []struct {
		class Class
		want  string
	}{{ClassStandard, "full"}, {ClassInteractive, "room"}} {
		res, err := reg.Do(context.Background(), Request{Hint: Hint{Model: "m"}, Class: tc.class}, answer)
		if err != nil || res.Replica.ID != tc.want {
			t.Fatalf("%s request went to %s (%v), want %s", tc.class, res.Replica.ID, err, tc.want)
		}
		res.Finish()
	}
}
