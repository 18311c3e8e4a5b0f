package router

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/e2e/testkit"
)

// TestHoldShareIsPerTenant: a tenant at its share of a model's hold queue
// is refused (ErrHoldShare, an ErrHoldFull) while another tenant still
// waits; a waiter that leaves gives its tenant's place back.
func TestHoldShareIsPerTenant(t *testing.T) {
	reg := newRegistry(t, Config{})
	rep := reg.Add(startingReplica("a", "m"))
	opt := func(tenant int64) HoldOptions {
		return HoldOptions{Queue: 8, PerTenant: 2, Tenant: tenant, Timeout: time.Minute}
	}
	errs := make(chan error, 4)
	for range 2 {
		go func() { errs <- reg.Hold(context.Background(), "m", ClassStandard, opt(1)) }()
	}
	testkit.WaitFor(t, "tenant 1's two waiters", func() bool { return reg.Waiting("m") == 2 })
	err := reg.Hold(context.Background(), "m", ClassInteractive, opt(1))
	if !errors.Is(err, ErrHoldShare) || !errors.Is(err, ErrHoldFull) {
		t.Fatalf("tenant 1 past its share: %v, want ErrHoldShare", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	left := make(chan error, 1)
	go func() { left <- reg.Hold(ctx, "m", ClassStandard, opt(2)) }()
	go func() { errs <- reg.Hold(context.Background(), "m", ClassStandard, opt(2)) }()
	testkit.WaitFor(t, "tenant 2's waiters beside tenant 1's", func() bool { return reg.Waiting("m") == 4 })
	cancel()
	if err := <-left; !errors.Is(err, context.Canceled) {
		t.Fatalf("a waiter that left: %v", err)
	}
	go func() { errs <- reg.Hold(context.Background(), "m", ClassStandard, opt(2)) }()
	testkit.WaitFor(t, "tenant 2's place taken again", func() bool { return reg.Waiting("m") == 4 })
	rep.SetState(StateReady, "")
	for range 4 {
		if err := <-errs; err != nil {
			t.Fatalf("a held request: %v", err)
		}
	}
}
