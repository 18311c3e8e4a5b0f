package router

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// TestClaim pins who may register which replica id and address: never a
// static upstream's, another worker's only once its lease ended.
func TestClaim(t *testing.T) {
	now := time.Unix(1000, 0)
	reg := newRegistry(t, Config{Now: func() time.Time { return now }})
	static := readyReplica("gpu-a")
	static.Static = true
	reg.Add(static)
	reg.Heartbeat(Update{ID: "w1", URL: "http://w1", State: StateReady, Lease: 3 * time.Second, Worker: "wkr_a"})
	for _, tc := range []struct {
		name, id, url, worker string
		taken                 bool
	}{
		{"static id", "gpu-a", "http://x", "wkr_b", true},
		{"static address", "x", "http://gpu-a", "wkr_b", true},
		{"static id, no worker", "gpu-a", "http://x", "", true},
		{"another worker's id", "w1", "http://x", "wkr_b", true},
		{"another worker's address", "x", "http://w1", "wkr_b", true},
		{"its own replica", "w1", "http://w1", "wkr_a", false},
		{"a free id and address", "w2", "http://w2", "wkr_b", false},
	} {
		err := reg.Claim(tc.id, tc.url, tc.worker)
		if got := errors.Is(err, ErrTaken); got != tc.taken {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
	now = now.Add(4 * time.Second) // w1's lease ended, not yet swept
	if err := reg.Claim("w1", "http://x", "wkr_b"); err != nil {
		t.Errorf("id of an expired lease: %v", err)
	}
	if reg.Heartbeat(Update{ID: "gpu-a", URL: "http://gpu-a", State: StateFailed, Lease: time.Second}) != nil ||
		reg.Get("gpu-a") != static || static.State() != StateReady {
		t.Error("a heartbeat changed a static replica")
	}
	reg.Heartbeat(Update{ID: "w1", URL: "http://w1", State: StateReady, Lease: 3 * time.Second, Worker: "wkr_a"})
	if gone := reg.RemoveWorker("wkr_a"); len(gone) != 1 || reg.Get("w1") != nil || reg.Get("gpu-a") == nil {
		t.Errorf("RemoveWorker: %v", gone)
	}
}

// TestLostReplicaStaysListedUntilForgotten pins what an operator and an
// alert see when a worker dies: its replica stays listed as lost with
// ready 0 (the series does not vanish), is never picked, comes back with
// its worker's next heartbeat, and is forgotten after ForgetLost or when an
// operator forgets it.
func TestLostReplicaStaysListedUntilForgotten(t *testing.T) {
	now := time.Unix(1000, 0)
	prom := prometheus.NewRegistry()
	reg := newRegistry(t, Config{Now: func() time.Time { return now }, Registerer: prom, ForgetLost: time.Hour})
	beat := func(id string) {
		reg.Heartbeat(Update{ID: id, URL: "http://" + id, Models: []string{"m"}, State: StateReady, Lease: 3 * time.Second, Worker: "wkr_" + id})
	}
	beat("w1")
	beat("w2")
	waiting := reg.Get("w1").Ejected()

	now = now.Add(2 * time.Second)
	beat("w2")
	now = now.Add(2 * time.Second) // w1's lease ended, w2's did not
	if forgot := reg.ExpireLeases(now); len(forgot) != 0 {
		t.Fatalf("forgot %v at once", forgot)
	}
	w1 := reg.Get("w1")
	if w1 == nil || w1.State() != StateLost || !strings.Contains(w1.Reason(), "no heartbeat") {
		t.Fatalf("w1 after its lease: %v", w1)
	}
	select {
	case <-waiting:
	default:
		t.Error("attempts waiting on the lost replica were not woken")
	}
	for range 20 {
		if rep, err := reg.Pick(Hint{Model: "m"}, nil); err != nil || rep.ID != "w2" {
			t.Fatalf("picked %v, %v; want w2 only", rep, err)
		}
	}
	if v := metricValue(t, prom, "tailgate_replica_ready", "replica", "w1"); v != 0 || !hasSeries(t, prom, "tailgate_replica_ready", "w1") {
		t.Errorf("tailgate_replica_ready{replica=w1} = %v (series present: %v), want a 0 sample", v, hasSeries(t, prom, "tailgate_replica_ready", "w1"))
	}
	if v := metricValue(t, prom, "tailgate_replica_lost", "replica", "w1"); v != 1 {
		t.Errorf("tailgate_replica_lost{replica=w1} = %v, want 1", v)
	}
	if v := metricValue(t, prom, "tailgate_model_ready_replicas", "model", "m"); v != 1 {
		t.Errorf("tailgate_model_ready_replicas{model=m} = %v, want 1", v)
	}

	// Every replica gone: the model is still listed, with 0 ready, and a
	// request for it finds no replica (503), not an unknown model (404).
	now = now.Add(4 * time.Second)
	reg.ExpireLeases(now)
	if v := metricValue(t, prom, "tailgate_model_ready_replicas", "model", "m"); v != 0 || !hasSeries(t, prom, "tailgate_model_ready_replicas", "m") {
		t.Errorf("tailgate_model_ready_replicas{model=m} with every replica lost = %v, want a 0 sample", v)
	}
	if _, err := reg.Pick(Hint{Model: "m"}, nil); !errors.Is(err, ErrNoReplica) {
		t.Errorf("pick with every replica lost: %v, want ErrNoReplica", err)
	}

	// The worker is heard again: ready at once.
	beat("w1")
	if st := reg.Get("w1").State(); st != StateReady {
		t.Errorf("w1 after a heartbeat: %v, want ready", st)
	}

	// An operator forgets a lost replica; a ready one is refused.
	if ok, err := reg.Forget("w1"); !ok || !errors.Is(err, ErrNotLost) || reg.Get("w1") == nil {
		t.Errorf("Forget(ready w1) = %v, %v", ok, err)
	}
	if ok, err := reg.Forget("w2"); !ok || err != nil || reg.Get("w2") != nil {
		t.Errorf("Forget(lost w2) = %v, %v", ok, err)
	}
	if ok, _ := reg.Forget("nope"); ok {
		t.Error("Forget(unknown) found a replica")
	}

	// Gone for longer than ForgetLost: forgotten by the sweep.
	now = now.Add(4 * time.Second)
	reg.ExpireLeases(now)
	if st := reg.Get("w1").State(); st != StateLost {
		t.Fatalf("w1: %v, want lost", st)
	}
	now = now.Add(time.Hour)
	if forgot := reg.ExpireLeases(now); !slices.Equal(forgot, []string{"w1"}) || reg.Get("w1") != nil {
		t.Errorf("after ForgetLost: forgot %v", forgot)
	}
	if hasSeries(t, prom, "tailgate_model_ready_replicas", "m") {
		t.Error("a model no listed replica serves is still reported")
	}
}

// hasSeries reports whether family name has a sample whose first label's
// value is value.
func hasSeries(t *testing.T, g prometheus.Gatherer, name, value string) bool {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if len(m.GetLabel()) > 0 && m.GetLabel()[0].GetValue() == value {
				return true
			}
		}
	}
	return false
}
