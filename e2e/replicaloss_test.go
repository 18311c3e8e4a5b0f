package e2e

import (
	"context"
	"net/http"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/e2e/testkit"
)

// lossRow is the part of a /admin/v1/replicas row that says why a replica
// went away.
type lossRow struct {
	ID            string  `json:"id"`
	State         string  `json:"state"`
	Reason        string  `json:"reason"`
	Inflight      int64   `json:"inflight"`
	EngineRunning float64 `json:"engine_running"`
	EngineWaiting float64 `json:"engine_waiting"`
	SidecarIn     float64 `json:"sidecar_inflight"`
	Ejections     *int64  `json:"ejections"`
	LastLoss      *struct {
		Reason string `json:"reason"`
		Was    string `json:"was"`
	} `json:"last_loss"`
}

func (g *gatewayProcess) lossRow(id string) lossRow {
	g.t.Helper()
	for _, r := range replicasAs[lossRow](g) {
		if r.ID == id {
			return r
		}
	}
	return lossRow{ID: id, State: "gone"}
}

// TestKilledWorkerIsListedLostWithWhyAcrossARestart: a worker SIGKILLed
// while its engine runs requests is listed as lost saying why (its
// sidecar refuses connections, or its lease ran out), with its ejection
// counted and no load left over from its last heartbeat; a gateway
// restarted on the same data directory lists it as lost again with the
// same reason and tailgate_replica_lost 1, so the TailgateReplicaLost alert
// goes on — until the operator forgets it.
func TestKilledWorkerIsListedLostWithWhyAcrossARestart(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the tailgate binary")
	}
	g := startGateway(t)
	w1 := g.startFleet(1, "--sim-tpot", "20ms")[0]

	// Long answers keep the engine busy, so its heartbeats carry a load.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for i := range 3 {
		go func() { _, _, _, _ = g.chatDistinct(ctx, true, 2000, i) }()
	}
	testkit.WaitWithin(t, 15*time.Second, "the engine reports requests running", func() bool {
		return g.lossRow("w1").EngineRunning >= 1
	})
	if err := w1.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testkit.WaitWithin(t, 15*time.Second, "killed worker listed as lost", func() bool { return g.state("w1") == "lost" })
	cancel()

	r := g.lossRow("w1")
	t.Logf("lost: %+v", r)
	if !strings.HasPrefix(r.Reason, "worker unreachable: connection refused") && !strings.HasPrefix(r.Reason, "heartbeat lease expired: ") {
		t.Errorf("lost replica's reason %q does not say why it went away", r.Reason)
	}
	if r.Ejections == nil || *r.Ejections < 1 {
		t.Errorf("ejections of the killed replica: %v, want ≥ 1", r.Ejections)
	}
	if n := g.metric("tailgate_ejections_total", `replica="w1"`); n < 1 {
		t.Errorf("tailgate_ejections_total{replica=\"w1\"} = %v, want ≥ 1", n)
	}
	testkit.WaitWithin(t, 10*time.Second, "the gateway's own in-flight count on the lost replica back to 0", func() bool {
		return g.lossRow("w1").Inflight == 0
	})
	if r.EngineRunning != 0 || r.EngineWaiting != 0 || r.SidecarIn != 0 {
		t.Errorf("lost replica keeps its last load: running %v, waiting %v, sidecar in flight %v", r.EngineRunning, r.EngineWaiting, r.SidecarIn)
	}
	if r.LastLoss == nil || r.LastLoss.Reason != r.Reason {
		t.Errorf("last_loss %+v, want the reason %q", r.LastLoss, r.Reason)
	}

	// The gateway restarts on the same data directory: w1 is still lost.
	if err := g.Stop(5 * time.Second); err != nil {
		t.Logf("gateway stop: %v", err)
	}
	g2 := startGatewayIn(t, g.dir)
	after := g2.lossRow("w1")
	if after.State != "lost" || after.Reason != r.Reason {
		t.Fatalf("after a restart w1 is %q (%q), want lost with %q", after.State, after.Reason, r.Reason)
	}
	if v := g2.metric("tailgate_replica_lost", `replica="w1"`); v != 1 {
		t.Fatalf("after a restart tailgate_replica_lost{replica=\"w1\"} = %v, want 1 (TailgateReplicaLost keeps firing)", v)
	}

	// Forgotten by the operator: gone, and gone after another restart.
	req, _ := http.NewRequest(http.MethodDelete, g2.admin+"/admin/v1/replicas/w1", nil)
	req.Header.Set("Authorization", "Bearer "+g2.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("forget: %d", resp.StatusCode)
	}
	if err := g2.Stop(5 * time.Second); err != nil {
		t.Logf("gateway stop: %v", err)
	}
	g3 := startGatewayIn(t, g.dir)
	if st := g3.state("w1"); st != "gone" {
		t.Fatalf("a forgotten replica is back as %q after a restart", st)
	}
}

// TestUpSaysWhyAKilledWorkerWentAway: `up` replaces a SIGKILLed worker (at
// a new address, under the same replica id); the replica's row then says
// why its predecessor went away (last_loss) and counts the ejection,
// instead of reading "starting: waiting for the engine" with none.
func TestUpSaysWhyAKilledWorkerWentAway(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the tailgate binary")
	}
	p := startUp(t, "--replicas", "2", "--sim-ttft", "5ms", "--sim-tpot", "1ms", "--warmup", "1")
	g := &gatewayProcess{t: t, admin: p.admin, api: p.api, key: p.demoKey, token: readToken(t, filepath.Join(p.dir, "admin.token"))}
	g.waitReady("worker-1", "worker-2")
	before := g.replica("worker-2").Address
	pid := childPID(t, p.PID(), "worker-2")
	if pid == 0 {
		t.Fatal("no worker-2 child process found")
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testkit.WaitWithin(t, 30*time.Second, "replacement worker ready", func() bool {
		r := g.replica("worker-2")
		return r.State == "ready" && r.Address != before
	})
	r := g.lossRow("worker-2")
	t.Logf("replaced: ejections %v, last_loss %+v", r.Ejections, r.LastLoss)
	if r.Ejections == nil || *r.Ejections < 1 {
		t.Errorf("ejections of the killed worker's replica: %v, want ≥ 1", r.Ejections)
	}
	if r.LastLoss == nil || r.LastLoss.Reason == "" {
		t.Fatalf("the replaced replica does not say why its predecessor went away: %+v", r.LastLoss)
	}
	if !strings.Contains(r.LastLoss.Reason, "connection refused") && !strings.Contains(r.LastLoss.Reason, "worker restarted") {
		t.Errorf("last_loss reason %q names neither the refused connection nor the restart", r.LastLoss.Reason)
	}
}
