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
