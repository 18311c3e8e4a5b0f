package router

import (
	"context"
	"errors"
	"testing"
)

// TestIsDeclinedOfNoErrorAllocatesNothing: Start asks IsDeclined of every
// request that was answered (a nil error).
func TestIsDeclinedOfNoErrorAllocatesNothing(t *testing.T) {
	if IsDeclined(nil) || !IsDeclined(ErrDeclined(errors.New("draining"))) || IsDeclined(errors.New("other")) {
		t.Fatal("IsDeclined misreads nil, a Declined or another error")
	}
	if n := testing.AllocsPerRun(100, func() { _ = IsDeclined(nil) }); n != 0 {
		t.Errorf("IsDeclined(nil) allocates %.0f times, want 0", n)
	}
}

// TestPickAllocatesNothing: every attempt picks its replica among the
// candidates held on the stack, with the default selector (P2C, a nil Selector) and round
// robin alike, scored or best of all.
func TestPickAllocatesNothing(t *testing.T) {
	for name, sel := range map[string]Selector{"p2c": nil, "round robin": &RoundRobin{}} {
		reg := newRegistry(t, Config{Selector: sel})
		for _, id := range []string{"a", "b", "c"} {
			reg.Add(readyReplica(id, "m"))
		}
		for _, best := range []bool{false, true} {
			if rep, err := reg.pick(Hint{Model: "m"}, nil, ClassStandard, best); err != nil || rep == nil {
				t.Fatalf("%s: pick = %v, %v", name, rep, err)
			}
			if n := testing.AllocsPerRun(100, func() { _, _ = reg.pick(Hint{Model: "m"}, nil, ClassStandard, best) }); n != 0 {
				t.Errorf("%s (best %v): a pick allocates %.0f times, want 0", name, best, n)
			}
		}
	}
}

// TestHedgedRequestAllocations: a request armed for a hedge whose first
// attempt answers before the delay — most requests once the delay is
// learnt — costs its call (which holds what its caller and its timer
// share), its outcomes channel (two: a buffer of pointers is apart), the
// channel the caller and the timer signal each other on (one: no buffer),
// the timer and the timer's function, and its attempt's context and
// cancel.
func TestHedgedRequestAllocations(t *testing.T) {
	reg, _ := primed(t, Config{})
	att := &fakeAttempt{}
	open := func(context.Context, *Replica, int, AttemptReason) (Attempt, error) { return att, nil }
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	run := func() {
		c, err := reg.Do(ctx, hint("m"), open)
		if err != nil || c.Hedged {
			t.Fatalf("Do = %+v, %v: want the first attempt, unhedged", c, err)
		}
		c.Finish()
	}
	run()
	if _, ok := reg.HedgeDelay("m", false); !ok {
		t.Fatal("no hedge delay learnt: the request was not armed")
	}
	if n := testing.AllocsPerRun(200, run); n > 8 {
		t.Errorf("a hedged request allocates %.1f times, want at most 8", n)
	}
}
