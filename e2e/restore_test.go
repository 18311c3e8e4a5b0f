package e2e

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"

	"github.com/tailgate-dev/tailgate/e2e/testkit"
)

// TestRestoreOnANewBoxServes walks docs/deploying.md's "Restore on a new
// box": a backup of one box's database, restored into a new data
// directory, and `tailgate up` there serves the old box's keys — its own
// workers take their replica ids from the credentials the backup brought
// (registration refused, /healthz 503 forever, without that). Then a second
// region from the same backup: `restore --forget-workers` says which
// credentials it revoked, and that region's fresh worker registers under a
// replica id the first region's worker held.
func TestRestoreOnANewBoxServes(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the tailgate binary")
	}
	ctx := context.Background()
	fast := []string{"--replicas", "2", "--sim-ttft", "1ms", "--sim-tpot", "0s", "--warmup", "0"}
	params := openai.ChatCompletionNewParams{Model: "tailgate-sim", MaxTokens: openai.Int(3),
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hello")}}

	// The old box: keys made, requests served, a backup taken.
	old := startUp(t, fast...)
	secret := testkit.LastLine(tailgate(t, "keys", "create", "--data", old.dir, "--tenant", "team-a"))
	c := old.client(secret)
	if _, err := c.Chat.Completions.New(ctx, params); err != nil {
		t.Fatal(err)
	}
	backup := filepath.Join(t.TempDir(), "tailgate-backup.db")
	tailgate(t, "backup", "--data", old.dir, backup)
	_ = old.Stop(10 * time.Second)

	// The new box: restore says the backup holds the old box's worker
	// credentials, and up adopts its own ids.
	box := filepath.Join(t.TempDir(), "data")
	out := tailgate(t, "restore", "--data", box, backup)
	if !strings.Contains(out, "2 active worker credential(s)") || !strings.Contains(out, "worker-1 (wkr_") || !strings.Contains(out, "--forget-workers") {
		t.Errorf("restore on a new box said:\n%s\nwant the old box's 2 worker credentials named and --forget-workers offered", out)
	}
	up := startUpIn(t, box, fast...) // waits for /healthz 200
	g := &gatewayProcess{t: t, dir: box, admin: up.admin, token: readToken(t, filepath.Join(box, "admin.token"))}
	g.waitReady("worker-1", "worker-2")
	c = up.client(secret)
	if _, err := c.Chat.Completions.New(ctx, params); err != nil {
		t.Fatalf("the old box's key on the new box: %v", err)
	}
	if log := up.stderr.String(); strings.Contains(log, "registration refused") {
		t.Errorf("the new box refused its own workers:\n%s", log)
	}

	// A second region from the same backup, with a worker of its own.
	region := filepath.Join(t.TempDir(), "region-b")
	out = tailgate(t, "restore", "--data", region, "--forget-workers", backup)
	if !strings.Contains(out, "forgot 2 worker credential(s)") || !strings.Contains(out, "workers approve") {
		t.Errorf("restore --forget-workers said:\n%s\nwant the 2 revoked credentials and how to approve", out)
	}
	gw := startGatewayIn(t, region)
	gw.startWorker("worker-1")
	gw.waitReady("worker-1")
	gw.key = secret
	if code, _, body, err := gw.chat(ctx, false, 3); err != nil || code != 200 {
		t.Fatalf("the first region's key in the second region: %d %s %v", code, body, err)
	}
}
