package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"tailgate/e2e/testkit"
)

// TestRestartedWorkerKeepsItsReplicaID: a worker keeps its credential in
// its --data directory, so after a SIGKILL it comes back as the same
// replica — at another address, with the same worker id — while another
// process holding the cluster token cannot take that replica id, even
// while the owner is down; it is told whose id it is and how to free it.
func TestRestartedWorkerKeepsItsReplicaID(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the tailgate binary")
	}
	g := startGateway(t)
	w := g.startWorker("w1")
	g.waitReady("w1")
	before := g.replica("w1")
	if before.Worker == "" {
		t.Fatalf("no worker id: %+v", before)
	}
	if fi, err := os.Stat(filepath.Join(g.dir, "w1", "credential-w1")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("credential file: %v %v", fi, err)
	}
	if err := w.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testkit.WaitWithin(t, 15*time.Second, "killed worker's lease ended", func() bool { return g.state("w1") == "lost" })

	// Not the owner: the same replica id, its own --data.
	impostor := startProc(t, "impostor", false, "worker", "--gateway", g.admin,
		"--cluster-token-file", filepath.Join(g.dir, "cluster.token"), "--engine", "sim", "--listen", "127.0.0.1:0",
		"--replica-id", "w1", "--data", filepath.Join(g.dir, "impostor"), "--warmup", "0")
	testkit.WaitWithin(t, 20*time.Second, "the impostor is told the id is taken", func() bool {
		return strings.Contains(impostor.stderr.String(), "belongs to worker "+before.Worker)
	})
	if st := g.state("w1"); st != "lost" {
		t.Fatalf("the impostor registered w1: %s", st)
	}
	_ = impostor.Stop(0)

	g.startWorker("w1") // the owner again: same --data, a new port
	g.waitReady("w1")
	after := g.replica("w1")
	if after.Worker != before.Worker || after.Address == before.Address {
		t.Fatalf("restarted worker: %+v, before %+v; want the same worker id at a new address", after, before)
	}
}
