package server

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tailgate-dev/tailgate/server/apierr"
)

// TestBodyBudgetServesWaitingTenantsInTurn: a tenant at its share waits
// while another's request is taken at once; bytes given back go to the
// waiting tenants in turn, not to the one that asked most.
func TestBodyBudgetServesWaitingTenantsInTurn(t *testing.T) {
	b := newBodyBudget(10, 6, time.Minute, prometheus.NewGauge(prometheus.GaugeOpts{Name: "x"}))
	ctx := context.Background()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(b.reserve(ctx, 1, 6)) // tenant 1 at its share
	must(b.reserve(ctx, 2, 4)) // tenant 2 fits beside it: the budget is full
	got := make(chan int64, 4)
	wait := func(tenant, n int64) {
		go func() {
			if err := b.reserve(ctx, tenant, n); err == nil {
				got <- tenant
			}
		}()
	}
	waiters := func(n int) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
			b.mu.Lock()
			have := 0
			for _, o := range b.owners {
				have += len(o.waiters)
			}
			b.mu.Unlock()
			if have == n {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d waiting, want %d", have, n)
			}
		}
	}
	wait(1, 2)
	waiters(1)
	wait(1, 2)
	waiters(2)
	wait(3, 2)
	waiters(3)
	// Tenant 2 gives 4 back: tenant 1 is at its share, so tenant 3 goes
	// first though it came last.
	b.release(2, 4)
	if first := <-got; first != 3 {
		t.Fatalf("tenant %d took the freed bytes, want tenant 3 (tenant 1 holds its share)", first)
	}
	// Tenant 1 gives 4 back: both its waiters fit in its share now.
	b.release(1, 4)
	for range 2 {
		if tenant := <-got; tenant != 1 {
			t.Fatalf("tenant %d, want 1", tenant)
		}
	}
	b.mu.Lock()
	used, owners := b.used, len(b.owners)
	b.mu.Unlock()
	if used != 2+4+2 || owners != 2 {
		t.Fatalf("used %d by %d tenants, want 8 by 2", used, owners)
	}
	// Past the share at once, and past its wait: 429 body_share_exhausted.
	short := newBodyBudget(10, 6, 10*time.Millisecond, prometheus.NewGauge(prometheus.GaugeOpts{Name: "y"}))
	must(short.reserve(ctx, 1, 6))
	var ae *apierr.Error
	if err := short.reserve(ctx, 1, 1); !errors.As(err, &ae) || ae.Code != "body_share_exhausted" || ae.Status != 429 {
		t.Fatalf("past the share: %v", err)
	}
	if err := short.reserve(ctx, 2, 7); !errors.As(err, &ae) || ae.Code != "body_share_exhausted" {
		t.Fatalf("more than a share at once: %v", err)
	}
	must(short.reserve(ctx, 2, 4))
	if err := short.reserve(ctx, 3, 1); !errors.As(err, &ae) || ae.Code != "body_budget_exhausted" || ae.Status != 503 {
		t.Fatalf("past the budget: %v", err)
	}
}
