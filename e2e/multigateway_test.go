package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"tailgate/data/pgtest"
	"tailgate/e2e/testkit"
)

// startGatewayPair starts two gateways on one PostgreSQL database, as two
// gateway boxes of one deployment: the second gets the first's cluster
// token (copied into its data directory before it starts, as the README
// says), so workers hold one token for both. extra goes to both.
func startGatewayPair(t *testing.T, url string, extra ...string) (a, b *gatewayProcess) {
	t.Helper()
	args := append([]string{"--database", url}, extra...)
	a = startGatewayIn(t, t.TempDir(), args...)
	dirB := t.TempDir()
	tok, err := os.ReadFile(filepath.Join(a.dir, "cluster.token"))
	if err == nil {
		err = os.WriteFile(filepath.Join(dirB, "cluster.token"), tok, 0o600)
	}
	if err != nil {
		t.Fatal(err)
	}
	b = startGatewayIn(t, dirB, args...)
	return a, b
}

// TestWorkerRegistersWithEveryGateway: one worker given --gateway twice is
// routed to by both gateways; on a shared PostgreSQL it holds one
// credential for both (the second gateway accepts the first's); and when
// one gateway dies the other keeps the replica and serves through it, while
// the worker's log names the gateway it cannot reach.
func TestWorkerRegistersWithEveryGateway(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the tailgate binary and a PostgreSQL server")
	}
	gA, gB := startGatewayPair(t, pgtest.NewDatabase(t))
	w := gA.startWorker("w1", "--gateway", gB.admin)
	gA.waitReady("w1")
	gB.waitReady("w1")
	for _, g := range []*gatewayProcess{gA, gB} {
		status, h, body, err := g.chat(t.Context(), false, 4)
		if err != nil || status != 200 || h.Get("x-tailgate-replica") != "w1" {
			t.Fatalf("chat through %s: %d %v replica %q\n%s", g.api, status, err, h.Get("x-tailgate-replica"), body)
		}
	}
	var workerA, workerB string
	for _, r := range gA.replicas() {
		if r.ID == "w1" {
			workerA = r.Worker
		}
	}
	for _, r := range gB.replicas() {
		if r.ID == "w1" {
			workerB = r.Worker
		}
	}
	if workerA == "" || workerA != workerB {
		t.Errorf("worker credential on gateway A %q, on B %q: gateways sharing a database share the worker's credential", workerA, workerB)
	}
	creds, _ := filepath.Glob(filepath.Join(gA.dir, "w1", "credential-w1@*"))
	if len(creds) != 2 {
		t.Errorf("credential files %v: want one per gateway", creds)
	}

	if err := gA.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-gA.Done()
	hostA := strings.TrimPrefix(gA.admin, "http://")
	testkit.WaitWithin(t, 20*time.Second, "the worker's log names the gateway it cannot reach", func() bool {
		return strings.Contains(w.stderr.String(), "gateway unreachable at http://"+hostA)
	})
	// Beats keep going to B: the replica outlives several of its leases
	// there. A bounded number of chats, each one beat apart.
	for i := range 8 {
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		status, h, body, err := gB.chat(ctx, i%2 == 0, 4)
		cancel()
		if err != nil || status != 200 || h.Get("x-tailgate-replica") != "w1" {
			t.Fatalf("chat %d through gateway B after A died: %d %v replica %q\n%s", i, status, err, h.Get("x-tailgate-replica"), body)
		}
		time.Sleep(time.Second)
	}
	if st := gB.state("w1"); st != "ready" {
		t.Fatalf("gateway B shows w1 %s after A died, want ready", st)
	}
}
