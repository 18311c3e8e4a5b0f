package e2e

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"tailgate/e2e/testkit"
)

// TestNewWorkerJoinsWithAnInviteOrAnApproval: with the real binary, a
// worker started with the join token `tailgate workers invite` printed is
// routed at once; one with the cluster token alone is refused, says once
// what the operator must run, is listed pending, and joins by itself once
// `tailgate workers approve` admits it; the spent invite admits nobody
// else.
func TestNewWorkerJoinsWithAnInviteOrAnApproval(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the tailgate binary")
	}
	g := startGateway(t, "--slow-start", "0")

	token := testkit.LastLine(tailgate(t, "workers", "invite", "--data", g.dir, "--replica-id", "w1", "--expires", "10m"))
	if !strings.HasPrefix(token, "tgj_") {
		t.Fatalf("invite printed %q, want a tgj_ token", token)
	}
	tokenFile := filepath.Join(t.TempDir(), "join.token")
	if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	g.startUnapprovedWorker("w1", "--join-token-file", tokenFile)
	g.waitReady("w1")

	w2 := g.startUnapprovedWorker("w2")
	const says = "tailgate workers approve --data DIR w2"
	testkit.WaitWithin(t, 20*time.Second, "w2 told how it gets in", func() bool { return strings.Contains(w2.stderr.String(), says) })
	var list []struct {
		ReplicaID string `json:"replica_id"`
		Status    string `json:"status"`
	}
	if err := json.Unmarshal([]byte(tailgate(t, "workers", "list", "--data", g.dir, "--json")), &list); err != nil {
		t.Fatal(err)
	}
	status := map[string]string{}
	for _, w := range list {
		status[w.ReplicaID] = w.Status
	}
	if status["w1"] != "active" || status["w2"] != "pending" {
		t.Fatalf("workers list: %+v; want w1 active, w2 pending", list)
	}
	// The spent invite admits no other box.
	w3 := g.startUnapprovedWorker("w3", "--join-token-file", tokenFile)
	testkit.WaitWithin(t, 20*time.Second, "w3 refused with the spent invite", func() bool {
		return strings.Contains(w3.stderr.String(), "was used") && strings.Contains(w3.stderr.String(), "tailgate workers invite --data DIR --replica-id w3")
	})
	if st := g.state("w2"); st != "gone" {
		t.Fatalf("w2 registered with the cluster token alone: %s", st)
	}
	// Said once while refused, not at every retry.
	if n := strings.Count(w2.stderr.String(), "waiting for the operator to admit this worker"); n != 1 {
		t.Errorf("w2 said it waits %d times; want once:\n%s", n, w2.stderr.String())
	}

	out := tailgate(t, "workers", "approve", "--data", g.dir, "w2")
	if !strings.Contains(out, "approved replica w2") {
		t.Fatalf("approve printed %q", out)
	}
	g.waitReady("w2") // its retry loop gets in by itself
	if st := g.state("w3"); st != "gone" {
		t.Fatalf("w3 registered with a spent invite: %s", st)
	}
	code, _, _, err := g.chat(context.Background(), false, 3)
	if err != nil || code != 200 {
		t.Fatalf("chat through the joined workers: %d %v", code, err)
	}
}
