package router

import (
	"errors"
	"testing"
	"time"
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
