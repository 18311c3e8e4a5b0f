package edge

import (
	"testing"
	"time"
)

func views(a, b time.Duration) []regionView {
	v := func(i int, p50 time.Duration) regionView {
		return regionView{idx: i, healthy: true, rtt: 10 * time.Millisecond, models: map[string]modelView{"m": {ready: 1, p50: p50}}}
	}
	return []regionView{v(0, a), v(1, b)}
}

// Alternating small differences never move the route; a region better by
// more than the margin takes it only after SwitchPolls rounds in a row.
func TestRouteDoesNotFlap(t *testing.T) {
	const margin, polls = 0.2, 3
	rt := &route{current: -1, challenger: -1}
	rt.update(rank(views(100*time.Millisecond, 110*time.Millisecond), "m", 1, -1, 0.05), margin, polls, true)
	if rt.current != 0 {
		t.Fatalf("first route = %d, want region 0 (faster)", rt.current)
	}
	for i := range 20 { // each region ahead by 10 % in turn
		a, b := 100*time.Millisecond, 90*time.Millisecond
		if i%2 == 1 {
			a, b = 90*time.Millisecond, 100*time.Millisecond
		}
		rt.update(rank(views(a, b), "m", 1, -1, 0.05), margin, polls, true)
		if rt.current != 0 {
			t.Fatalf("round %d: route flapped to %d on a 10%% difference", i, rt.current)
		}
	}
	for i := range 6 { // region 1 far ahead, but only every other round
		b := 200 * time.Millisecond
		if i%2 == 0 {
			b = 20 * time.Millisecond
		}
		rt.update(rank(views(100*time.Millisecond, b), "m", 1, -1, 0.05), margin, polls, true)
		if rt.current != 0 {
			t.Fatalf("round %d: route switched on a lead not held %d rounds in a row", i, polls)
		}
	}
	for i := range polls { // now held
		rt.update(rank(views(100*time.Millisecond, 20*time.Millisecond), "m", 1, -1, 0.05), margin, polls, true)
		if want := map[bool]int{true: 1, false: 0}[i == polls-1]; rt.current != want {
			t.Fatalf("held lead, round %d: route %d, want %d", i, rt.current, want)
		}
	}
	// A ranking between rounds (after a connection failure) counts no wins.
	rt = &route{current: 0, challenger: -1}
	for range 5 {
		rt.update(rank(views(100*time.Millisecond, 20*time.Millisecond), "m", 1, -1, 0.05), margin, polls, false)
	}
	if rt.current != 0 {
		t.Fatal("rankings between poll rounds switched the route")
	}
}

// The preferred region wins a near tie, not a clear loss.
func TestPreferBreaksNearTies(t *testing.T) {
	if r := rank(views(100*time.Millisecond, 98*time.Millisecond), "m", 1, 0, 0.05); r[0].idx != 0 {
		t.Fatalf("near tie: first %d, want the preferred 0", r[0].idx)
	}
	if r := rank(views(100*time.Millisecond, 60*time.Millisecond), "m", 1, 0, 0.05); r[0].idx != 1 {
		t.Fatalf("clear loss: first %d, want 1", r[0].idx)
	}
}
