package router

import (
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
