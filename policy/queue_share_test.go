package policy

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestQueueSharePerTenant: with the model busy, a tenant whose waiters
// fill its share of a class's queue is refused (Full) at once, while
// another tenant's request still waits and is admitted first when a slot
// frees (tenants take turns).
func TestQueueSharePerTenant(t *testing.T) {
	q := NewQueue(QueueConfig{Capacity: func(string) int64 { return 1 }, Headroom: -1, MaxQueue: 8, MaxQueuePerTenant: 2, MaxWait: time.Minute})
	ctx := context.Background()
	running, err := q.Wait(ctx, "m", ClassStandard, 1)
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		tenant int64
		slot   *Slot
		err    error
	}
	done := make(chan result, 4)
	wait := func(tenant int64) {
		go func() {
			s, err := q.Wait(ctx, "m", ClassStandard, tenant)
			done <- result{tenant, s, err}
		}()
	}
	waiting := func(n int64) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); q.Waiting(ClassStandard) != n; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%d waiting, want %d", q.Waiting(ClassStandard), n)
			}
		}
	}
	wait(1)
	waiting(1)
	wait(1)
	waiting(2)
	_, err = q.Wait(ctx, "m", ClassStandard, 1)
	var qe *QueueError
	if !errors.As(err, &qe) || !qe.Full {
		t.Fatalf("tenant 1 past its share: %v, want a full queue", err)
	}
	wait(2)
	waiting(3)
	running.Release()
	// Tenant 1's first waiter goes first (it came first), then tenant 2's
	// before tenant 1's second.
	order := []int64{}
	for range 3 {
		r := <-done
		if r.err != nil {
			t.Fatal(r.err)
		}
		order = append(order, r.tenant)
		r.slot.Release()
	}
	if order[0] != 1 || order[1] != 2 || order[2] != 1 {
		t.Fatalf("admitted in tenant order %v, want [1 2 1]", order)
	}
}
