package data

import (
	"context"
	"testing"
	"time"
)

// A key is claimed once; its record is found by the next claim (on another
// gateway sharing the database too), answered, expired and swept; another
// tenant's same key is its own.
func TestIdempotencyRecordLifecycle(t *testing.T) {
	forEachEngine(t, func(t *testing.T, e engineCase) {
		ctx := context.Background()
		loc := e.newDB(t)
		a := openAt(t, loc)
		b := a
		if e.name == "postgres" {
			b = openAt(t, loc) // another gateway
			if _, err := a.Renew(ctx); err != nil {
				t.Fatal(err)
			}
		}
		t0 := now()
		rec := IdemRecord{TenantID: 1, Key: "k", Fingerprint: "f1", RequestID: "req_a", Created: t0, Expires: t0.Add(time.Hour)}
		if got, ok, err := a.ClaimIdempotency(ctx, rec); err != nil || !ok || got != nil {
			t.Fatalf("first claim: %v %v %v", got, ok, err)
		}
		retry := rec
		retry.RequestID = "req_b"
		got, ok, err := b.ClaimIdempotency(ctx, retry)
		if err != nil || ok || got.RequestID != "req_a" || got.State != IdemPending || got.Fingerprint != "f1" {
			t.Fatalf("second claim: %+v %v %v", got, ok, err)
		}
		if alive, err := b.IdemOwnerAlive(ctx, got.Owner); err != nil || !alive {
			t.Fatalf("owner %q alive = %v, %v; want alive (it runs it)", got.Owner, alive, err)
		}
		if err := a.FinishIdempotency(ctx, 1, "k", "req_a", "m", 200, "application/json", []byte(`{"id":"x"}`)); err != nil {
			t.Fatal(err)
		}
		got, _, _ = b.ClaimIdempotency(ctx, retry)
		if got.State != IdemDone || string(got.Body) != `{"id":"x"}` || got.Model != "m" || got.Status != 200 || got.ContentType != "application/json" {
			t.Fatalf("done record %+v", got)
		}
		other := rec
		other.TenantID = 2
		if _, ok, err := b.ClaimIdempotency(ctx, other); err != nil || !ok {
			t.Fatalf("another tenant's key: %v %v", ok, err)
		}
		// Past its retention the key is free again.
		late := retry
		late.Created, late.Expires = t0.Add(2*time.Hour), t0.Add(3*time.Hour)
		if _, ok, err := b.ClaimIdempotency(ctx, late); err != nil || !ok {
			t.Fatalf("claim after expiry: %v %v", ok, err)
		}
		if n, err := a.SweepIdempotency(ctx, t0.Add(2*time.Hour), 0); err != nil || n != 1 {
			t.Fatalf("sweep removed %d (%v), want tenant 2's expired record", n, err)
		}
	})
}

// A pending record whose gateway died is taken over by one retry only;
// a failed run's record is released for the next.
func TestIdempotencyTakeOverFromDeadOwner(t *testing.T) {
	forEachEngine(t, func(t *testing.T, e engineCase) {
		ctx := context.Background()
		loc := e.newDB(t)
		dead := openAt(t, loc)
		t0 := now()
		rec := IdemRecord{TenantID: 1, Key: "k", Fingerprint: "f", RequestID: "req_dead", Created: t0, Expires: t0.Add(time.Hour)}
		if _, ok, err := dead.ClaimIdempotency(ctx, rec); err != nil || !ok {
			t.Fatal(ok, err)
		}
		dead.Close() // SIGKILL: no lease renewed, nothing released
		live := openAt(t, loc)
		got, _, err := live.ClaimIdempotency(ctx, IdemRecord{TenantID: 1, Key: "k", Fingerprint: "f", RequestID: "req_new", Created: t0, Expires: t0.Add(time.Hour)})
		if err != nil {
			t.Fatal(err)
		}
		if alive, err := live.IdemOwnerAlive(ctx, got.Owner); err != nil || alive {
			t.Fatalf("dead owner alive = %v, %v", alive, err)
		}
		if ok, err := live.TakeOverIdempotency(ctx, 1, "k", "req_dead", "req_new"); err != nil || !ok {
			t.Fatalf("take over: %v %v", ok, err)
		}
		if ok, _ := live.TakeOverIdempotency(ctx, 1, "k", "req_dead", "req_other"); ok {
			t.Fatal("a second retry took the record over too")
		}
		if err := live.ReleaseIdempotency(ctx, 1, "k", "req_new"); err != nil {
			t.Fatal(err)
		}
		if _, err := live.Idempotency(ctx, 1, "k"); err != ErrNotFound {
			t.Fatalf("released record: %v", err)
		}
	})
}

// The sweep holds each tenant to its count, oldest finished records first.
func TestIdempotencySweepBoundsTenantCount(t *testing.T) {
	ctx := context.Background()
	s := openTestStore(t)
	t0 := now()
	for i, k := range []string{"a", "b", "c", "d"} {
		at := t0.Add(time.Duration(i) * time.Second)
		if _, ok, err := s.ClaimIdempotency(ctx, IdemRecord{TenantID: 1, Key: k, Fingerprint: "f", RequestID: "r" + k, Created: at, Expires: at.Add(time.Hour)}); err != nil || !ok {
			t.Fatal(ok, err)
		}
		if err := s.FinishIdempotency(ctx, 1, k, "r"+k, "m", 200, "application/json", []byte("{}")); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := s.SweepIdempotency(ctx, t0, 2); err != nil || n != 2 {
		t.Fatalf("swept %d (%v), want 2", n, err)
	}
	for k, want := range map[string]error{"a": ErrNotFound, "b": ErrNotFound, "c": nil, "d": nil} {
		if _, err := s.Idempotency(ctx, 1, k); err != want {
			t.Fatalf("key %s: %v, want %v", k, err, want)
		}
	}
}
