package data

import (
	"context"
	"slices"
	"testing"
	"time"
)

// TestLostReplicasStored: a lost replica saved is listed with its worker,
// address, reason, models and time (the e2e test restarts a gateway on
// it); saving again replaces it, deleting forgets it.
func TestLostReplicasStored(t *testing.T) {
	forEachEngine(t, func(t *testing.T, e engineCase) {
		s := e.open(t)
		ctx := context.Background()
		at := time.Date(2026, 12, 7, 16, 0, 0, 123000, time.UTC)
		l := LostReplica{ReplicaID: "w1", WorkerID: "wkr_0123456789abcdef", Address: "http://127.0.0.1:9000",
			Models: []string{"llama", "qwen"}, Reason: "worker unreachable: connection refused", Was: "ejected", LostAt: at}
		if err := s.SaveLostReplica(ctx, l); err != nil {
			t.Fatal(err)
		}
		if err := s.SaveLostReplica(ctx, LostReplica{ReplicaID: "w2", Address: "http://127.0.0.1:9001", Reason: "heartbeat lease expired", LostAt: at}); err != nil {
			t.Fatal(err)
		}
		l.Reason = "heartbeat lease expired: no heartbeat for 3s"
		if err := s.SaveLostReplica(ctx, l); err != nil {
			t.Fatal(err)
		}
		got, err := s.LostReplicas(ctx)
		if err != nil || len(got) != 2 {
			t.Fatalf("LostReplicas = %+v, %v; want w1 and w2", got, err)
		}
		g := got[0]
		if g.ReplicaID != "w1" || g.WorkerID != l.WorkerID || g.Address != l.Address || !slices.Equal(g.Models, l.Models) ||
			g.Reason != l.Reason || g.Was != "ejected" || !g.LostAt.Equal(at) {
			t.Errorf("w1 = %+v, want %+v", g, l)
		}
		if got[1].ReplicaID != "w2" || len(got[1].Models) != 0 {
			t.Errorf("w2 = %+v", got[1])
		}
		if err := s.DeleteLostReplica(ctx, "w2"); err != nil {
			t.Fatal(err)
		}
		if err := s.DeleteLostReplica(ctx, "never-lost"); err != nil {
			t.Fatalf("deleting an id never lost: %v", err)
		}
		if got, err := s.LostReplicas(ctx); err != nil || len(got) != 1 || got[0].ReplicaID != "w1" {
			t.Fatalf("after deleting w2: %+v, %v", got, err)
		}
	})
}
