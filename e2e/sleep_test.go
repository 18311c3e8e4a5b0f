package e2e

import (
	"context"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/e2e/testkit"
)

// TestFleetSleepsAnIdleReplicaAndARequestWakesIt: `up` with the fleet
// controller and --fleet-sleep-after puts its idle replica to sleep (the
// simulated engine's vLLM sleep mode, through the worker's sidecar), the
// router sends it nothing while it sleeps, and a request that arrives is
// held, wakes it, and is answered by it.
func TestFleetSleepsAnIdleReplicaAndARequestWakesIt(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the tailgate binary")
	}
	p := startUp(t, "--fleet-min", "1", "--fleet-max", "1", "--fleet-idle", "1h", "--fleet-sleep-after", "300ms",
		"--sim-wake-delay", "200ms", "--hold-progress", "100ms")
	g := &gatewayProcess{process: p.process, t: t, dir: p.dir, api: p.api, admin: p.admin, key: p.demoKey,
		token: readToken(t, filepath.Join(p.dir, "admin.token"))}
	var id string
	testkit.WaitWithin(t, 30*time.Second, "the idle replica asleep", func() bool {
		for _, r := range g.replicas() {
			if r.State == "sleeping" {
				id = r.ID
				return true
			}
		}
		return false
	})
	// "going to sleep" while the sidecar's call is under way (the
	// controller takes it out of routing first), then the sidecar's word.
	testkit.WaitWithin(t, 10*time.Second, "the sleeping replica's reason saying the engine sleeps", func() bool {
		return strings.Contains(g.replica(id).Reason, "engine asleep")
	})
	// The replica reports sleeping as soon as its engine sleeps; the
	// controller counts the action once the sidecar's answer is back.
	testkit.WaitWithin(t, 10*time.Second, "the sleep counted", func() bool {
		return g.metric("tailgate_fleet_actions_total", `action="sleep"`, `outcome="ok"`) >= 1
	})

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	code, hdr, body, err := g.chat(ctx, true, 4)
	if err != nil || code != http.StatusOK {
		t.Fatalf("request to a model whose replica sleeps: %d %v\n%s", code, err, body)
	}
	if !strings.Contains(body, ": waiting for a replica of tailgate-sim: ") || !strings.Contains(body, "[DONE]") {
		t.Errorf("held stream lacks its progress comment or its end:\n%s", body)
	}
	if got := hdr.Get("X-Tailgate-Replica"); got != "" && got != id {
		t.Errorf("answered by %q, want the woken replica %q", got, id)
	}
	testkit.WaitWithin(t, 10*time.Second, "the wake counted", func() bool {
		return g.metric("tailgate_fleet_actions_total", `action="wake"`, `outcome="ok"`) >= 1
	})
	if n := g.metric("tailgate_fleet_actions_total", `action="start"`); n != 1 {
		t.Errorf("%v starts: the controller started a replica instead of waking the sleeping one", n)
	}
}
