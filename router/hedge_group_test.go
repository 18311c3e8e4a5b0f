package router

import (
	"context"
	"sync"
	"testing"
	"time"
)

// teachTwoLevels fills model m's JSON first-token window with 200 samples:
// 92 % at 100ms and 8 % at 200ms, so its p90 is 100ms and its p95 200ms.
func teachTwoLevels(f *fleet) {
	for i := range 200 {
		t1 := 100 * time.Millisecond
		if i%25 < 2 {
			t1 = 200 * time.Millisecond
		}
		f.serve(hint("m"), t1, 5*time.Second) // a hedge, if one starts, loses
	}
}

func TestGroupPartIsHedgedEarlierThanALoneRequest(t *testing.T) {
	// Budget 0.2: parts may go down to the 85th percentile; a part of a
	// group of 4 is hedged at the 90th (one (1-p) lower per doubling).
	f := newFleet(t, Config{Hedge: HedgeConfig{Budget: 0.2, Burst: 1e6}})
	teachTwoLevels(f)
	if d, ok := f.reg.HedgeDelay("m", false); !ok || d != 200*time.Millisecond {
		t.Fatalf("lone hedge delay %v %v, want the p95 of 200ms", d, ok)
	}

	// A request whose first token takes 150ms, and whose hedge would take
	// 10ms: past the group's p90, short of the model's p95.
	lone := f.serve(hint("m"), 150*time.Millisecond, 10*time.Millisecond)
	if lone.Hedged {
		t.Errorf("a lone request was hedged %v after its start; want none before the p95 of 200ms", f.c.armed)
	}

	// The same request as one of 4 parts of a document in flight.
	hb := f.reg.hedges.budget("m")
	for range 3 {
		defer hb.join("doc-1", 0.2, 1e6)()
	}
	part := hint("m")
	part.Group = "doc-1"
	res := f.serve(part, 150*time.Millisecond, 10*time.Millisecond)
	if !res.Hedged || res.Reason != ReasonHedge {
		t.Fatalf("a part of a group of 4 was not answered by a hedge (hedged %v, winner %v); want its hedge at the group's p90", res.Hedged, res.Reason)
	}
	if f.c.armed != 100*time.Millisecond {
		t.Errorf("part hedged %v after its start, want at the p90 of 100ms", f.c.armed)
	}
}

// manualTimer is a Config.After whose timers the test fires.
type manualTimer struct {
	mu     sync.Mutex
	delays []time.Duration
	armed  chan chan time.Time
}

func (m *manualTimer) After(d time.Duration) <-chan time.Time {
	m.mu.Lock()
	m.delays = append(m.delays, d)
	m.mu.Unlock()
	c := make(chan time.Time, 1)
	m.armed <- c
	return c
}

func TestGroupOfOneWaitsForTheLoneDelay(t *testing.T) {
	// A part is armed for the earliest any part may be due; when its
	// group turns out to be itself alone, it waits on to the lone delay.
	now := time.Unix(1000, 0)
	mt := &manualTimer{armed: make(chan chan time.Time, 4)}
	reg := newRegistry(t, Config{Now: func() time.Time { return now }, After: mt.After,
		Hedge: HedgeConfig{Enabled: true, Budget: 0.2, Burst: 1e6, MinSamples: 10, Min: time.Millisecond}})
	reg.Add(readyReplica("a", "m"))
	reg.Add(readyReplica("b", "m"))
	for i := range 100 { // p85 10ms, p95 300ms
		d := 10 * time.Millisecond
		if i%10 == 0 {
			d = 300 * time.Millisecond
		}
		reg.hedges.observe("m", false, d)
	}
	part := hint("m")
	part.Group = "alone"
	answer := make(chan struct{})
	done := make(chan *Call, 1)
	go func() {
		res, err := reg.Do(context.Background(), part, func(ctx context.Context, _ *Replica, n int, _ AttemptReason) (Attempt, error) {
			if n > 1 {
				return &fakeAttempt{}, nil
			}
			select {
			case <-answer:
				return &fakeAttempt{}, nil
			case <-ctx.Done():
				return nil, ErrNoToken(ctx.Err(), "")
			}
		})
		if err != nil {
			t.Error(err)
		}
		done <- res
	}()
	bound := time.After(10 * time.Second)
	for i := range 2 {
		select {
		case c := <-mt.armed:
			if i == 0 { // the earliest delay passes; the lone one does not
				c <- now
			}
		case <-bound:
			close(answer)
			<-done
			t.Fatal("hedge timer not armed twice in 10s")
		}
	}
	close(answer)
	res := <-done
	res.Finish()
	res.Losers()
	mt.mu.Lock()
	defer mt.mu.Unlock()
	if res.Hedged || len(mt.delays) != 2 || mt.delays[0] != 10*time.Millisecond || mt.delays[1] != 300*time.Millisecond {
		t.Fatalf("hedged %v, timers %v; want armed at the parts' earliest 10ms, then at the lone 300ms, no hedge", res.Hedged, mt.delays)
	}
}

func TestGroupPartIsHeldToAFasterPace(t *testing.T) {
	reg := newRegistry(t, Config{Hedge: HedgeConfig{Enabled: true, Budget: 0.2, MinSamples: 10}})
	for i := range 200 { // p90 10ms a token, p95 20ms
		d := 10 * time.Millisecond
		if i%25 < 2 {
			d = 20 * time.Millisecond
		}
		reg.hedges.observePace("m", d)
	}
	hb := reg.hedges.budget("m")
	for range 4 {
		defer hb.join("doc-1", 0.2, 20)()
	}
	for _, tc := range []struct {
		group string
		want  time.Duration
	}{{"", 20 * time.Millisecond}, {"doc-1", 10 * time.Millisecond}} {
		req := hint("m")
		req.Group = tc.group
		res := &Call{reg: reg, req: req, won: &attempt{}}
		if p, ok := res.Pace(); !ok || p.Per != tc.want {
			t.Errorf("group %q: pace %v a token (%v), want %v", tc.group, p.Per, ok, tc.want)
		}
	}
}

func TestPartPercentile(t *testing.T) {
	for _, tc := range []struct {
		p, budget float64
		n         int
		want      float64
	}{
		{0.95, 0.10, 1, 0.95},  // lone
		{0.95, 0.10, 2, 0.95},  // one doubling: still p
		{0.95, 0.20, 4, 0.90},  // two doublings
		{0.95, 0.10, 8, 0.925}, // floored: ¾ of the budget
		{0.99, 0.10, 8, 0.97},  // three doublings of a 1 % tail
		{0.95, 0.04, 8, 0.95},  // a budget too small to go below p
		{0.95, 0.10, 1 << 30, 0.925},
	} {
		if got := partPercentile(tc.p, tc.budget, tc.n); got < tc.want-1e-9 || got > tc.want+1e-9 {
			t.Errorf("partPercentile(%v, %v, %d) = %v, want %v", tc.p, tc.budget, tc.n, got, tc.want)
		}
	}
}
