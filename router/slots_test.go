package router

import (
	"context"
	"sync"
	"testing"
	"time"
)

// TestSlotsAreLearntOnlyFromWaitsForCapacity pins what the router takes as
// an engine's concurrency. vLLM keeps requests waiting for reasons other
// than full sequence slots (the step's token budget, KV blocks, a grammar
// compiling), so a queue next to a running count well below what the engine
// has run before is no slot limit; learning it would pause hedging onto an
// engine with room.
func TestSlotsAreLearntOnlyFromWaitsForCapacity(t *testing.T) {
	deferred := func(running, n float64) Load {
		return Load{Running: running, Waiting: n, WaitReasons: true, WaitingDeferred: n}
	}
	capacity := func(running, n float64) Load {
		return Load{Running: running, Waiting: n, WaitReasons: true, WaitingCapacity: n}
	}
	tests := []struct {
		name  string
		beats []Load
		want  int64
	}{
		{"a queue behind the running peak (the simulated engine)", []Load{{Running: 2, Waiting: 1}}, 2},
		{"waits for capacity at the running peak", []Load{{Running: 8}, capacity(8, 2)}, 8},
		{"waits deferred while running is below its peak", []Load{{Running: 8}, deferred(3, 2)}, 0},
		{"waits deferred at the running peak", []Load{{Running: 8}, deferred(8, 2)}, 0},
		{"waits for capacity far below the running peak (KV, token budget)", []Load{{Running: 8}, capacity(3, 2)}, 0},
		{"an older vLLM that gives no reason, far below the peak", []Load{{Running: 8}, {Running: 3, Waiting: 2}}, 0},
		{"running falling while requests wait (preemption)", []Load{{Running: 8}, capacity(7, 1)}, 0},
		{"a count the engine later exceeds is forgotten", []Load{capacity(4, 1), {Running: 8}}, 0},
		{"a learnt count stays when a deferred wait comes later", []Load{capacity(8, 1), deferred(3, 2)}, 8},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg := newRegistry(t, Config{})
			var rep *Replica
			for _, l := range tt.beats {
				rep = reg.Heartbeat(Update{ID: "w", URL: "http://w", Models: []string{"m"}, State: StateReady, Load: l, Lease: time.Minute})
			}
			if got := rep.Slots(); got != tt.want {
				t.Errorf("slots = %d, want %d", got, tt.want)
			}
		})
	}
}

// TestHedgeGoesToAnEngineWhoseWaitsAreNotForCapacity: a replica whose
// engine keeps requests waiting for reasons of their own, or below the most
// it has run, still takes a hedge.
func TestHedgeGoesToAnEngineWhoseWaitsAreNotForCapacity(t *testing.T) {
	tests := []struct {
		name  string
		beats []Load
	}{
		{"waits deferred", []Load{{Running: 1, Waiting: 3, WaitReasons: true, WaitingDeferred: 3}}},
		{"a queue far below the running peak, then the gateway's own 3 in flight", []Load{{Running: 8},
			{Running: 3, Waiting: 2, WaitReasons: true, WaitingDeferred: 2}, {Running: 3}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg, ev := primed(t, Config{})
			for _, r := range reg.Replicas() {
				for _, l := range tt.beats {
					reg.Heartbeat(Update{ID: r.ID, URL: r.URL, Models: r.Models(), State: StateReady, Load: l, Lease: time.Minute})
				}
				r.inflight.Store(3)
			}
			var aborted sync.Map
			res, err := reg.Do(context.Background(), hint("m"), slowFirst(&aborted))
			if err != nil {
				t.Fatal(err)
			}
			res.Finish()
			if !res.Hedged || ev.attempts() != 1 {
				t.Fatalf("no hedge (result %+v): the other replica has room", res)
			}
		})
	}
}
