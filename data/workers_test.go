package data

import (
	"context"
	"errors"
	"testing"
)

// TestWorkerCredentials: a credential is found by its hash, listed oldest
// first, owns its replica id until revoked, and follows its worker to a new
// address.
func TestWorkerCredentials(t *testing.T) {
	forEachEngine(t, func(t *testing.T, e engineCase) {
		s := e.open(t)
		ctx := context.Background()
		a, err := s.CreateWorker(ctx, Worker{ReplicaID: "gpu-1", Address: "10.0.0.1:8000", Hash: hashOf("a")})
		if err != nil {
			t.Fatal(err)
		}
		b, err := s.CreateWorker(ctx, Worker{ReplicaID: "gpu-2", Address: "10.0.0.2:8000", Peer: "box2", Hash: hashOf("b")})
		if err != nil {
			t.Fatal(err)
		}
		if got, err := s.WorkerByHash(ctx, hashOf("b")); err != nil || got.ID != b.ID || got.Peer != "box2" {
			t.Errorf("WorkerByHash = %+v, %v; want %s", got, err, b.ID)
		}
		if _, err := s.WorkerByHash(ctx, hashOf("nobody")); !errors.Is(err, ErrNotFound) {
			t.Errorf("WorkerByHash of an unknown secret: %v, want ErrNotFound", err)
		}
		ws, err := s.Workers(ctx)
		if err != nil || len(ws) != 2 || ws[0].ID != a.ID || ws[1].ID != b.ID {
			t.Fatalf("Workers = %+v, %v; want %s then %s", ws, err, a.ID, b.ID)
		}
		if err := s.MoveWorker(ctx, a.ID, "10.0.0.9:8001"); err != nil {
			t.Fatal(err)
		}
		if got, err := s.ActiveWorkerFor(ctx, "gpu-1"); err != nil || got.ID != a.ID || got.Address != "10.0.0.9:8001" {
			t.Errorf("ActiveWorkerFor(gpu-1) after the move = %+v, %v", got, err)
		}
		r, err := s.RevokeWorker(ctx, "gpu-1")
		if err != nil || r.ID != a.ID || !r.Revoked() {
			t.Fatalf("RevokeWorker(gpu-1) = %+v, %v", r, err)
		}
		if _, err := s.ActiveWorkerFor(ctx, "gpu-1"); !errors.Is(err, ErrNotFound) {
			t.Errorf("gpu-1 still owned after its credential was revoked: %v", err)
		}
		if again, err := s.RevokeWorker(ctx, a.ID); err != nil || !again.RevokedAt.Equal(r.RevokedAt) {
			t.Errorf("revoking twice = %+v, %v; want it unchanged", again, err)
		}
	})
}
