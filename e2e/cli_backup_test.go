package e2e

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"tailgate/e2e/testkit"
)

// TestBackupCannotHurtTheLiveDatabaseAndRestoreRoundTrips, with the real
// binary and a running gateway: a backup aimed at the live database, its
// -wal, or into its directory under another name, is refused even with
// --force, and the gateway and the CLI still share one database (a key the
// CLI makes is accepted); restore refuses while the gateway runs; once it
// is stopped, restore puts the backup back, keeps what it replaced, and the
// gateway started again accepts the key and the billed rows are there.
func TestBackupCannotHurtTheLiveDatabaseAndRestoreRoundTrips(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the tailgate binary")
	}
	p := startUp(t, "--replicas", "1", "--sim-ttft", "1ms", "--sim-tpot", "0s")
	secret := testkit.LastLine(tailgate(t, "keys", "create", "--data", p.dir, "--tenant", "team-a"))
	ctx := context.Background()
	params := openai.ChatCompletionNewParams{Model: "tailgate-sim", MaxTokens: openai.Int(3),
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hello")}}
	chat := func(api, key string) error {
		c := openai.NewClient(option.WithBaseURL(api), option.WithAPIKey(key), option.WithMaxRetries(0))
		_, err := c.Chat.Completions.New(ctx, params)
		return err
	}
	for range 3 {
		if err := chat(p.api, secret); err != nil {
			t.Fatal(err)
		}
	}

	db := filepath.Join(p.dir, "tailgate.db")
	link := filepath.Join(t.TempDir(), "data-link")
	if err := os.Symlink(p.dir, link); err != nil {
		t.Fatal(err)
	}
	for _, target := range []string{db, db + "-wal", filepath.Join(link, "tailgate.db"), filepath.Join(p.dir, "copy.db")} {
		code, stderr := runToExit(t, 30*time.Second, "backup", "--data", p.dir, "--force", target)
		if code != 1 || !strings.Contains(stderr, "live database") {
			t.Errorf("backup --force %s: exit %d, stderr %q; want it refused, naming the live database", target, code, stderr)
		}
	}
	later := testkit.LastLine(tailgate(t, "keys", "create", "--data", p.dir, "--tenant", "team-b"))
	if err := chat(p.api, later); err != nil {
		t.Fatalf("after the refused backups, a key the CLI made is not accepted: %v", err)
	}

	backup := filepath.Join(t.TempDir(), "copy.db")
	tailgate(t, "backup", "--data", p.dir, backup)
	if err := chat(p.api, secret); err != nil { // billed, but not in the backup
		t.Fatal(err)
	}
	code, stderr := runToExit(t, 30*time.Second, "restore", "--data", p.dir, backup)
	if code != 1 || !strings.Contains(stderr, "running") || !strings.Contains(stderr, "stop it first") {
		t.Fatalf("restore under a running gateway: exit %d, stderr %q; want it refused", code, stderr)
	}

	if err := p.Stop(10 * time.Second); err != nil && !strings.Contains(err.Error(), "signal") {
		t.Logf("gateway stopped: %v", err)
	}
	out := tailgate(t, "restore", "--data", p.dir, backup)
	m := regexp.MustCompile(`kept as (\S+)`).FindStringSubmatch(out)
	if m == nil || !strings.HasPrefix(m[1], db+".replaced-") {
		t.Fatalf("restore said:\n%s\nwant the replaced database's name", out)
	}
	if _, err := os.Stat(m[1]); err != nil {
		t.Errorf("the replaced database: %v", err)
	}

	var usage []struct {
		Tenant   string `json:"tenant"`
		Requests int64  `json:"requests"`
	}
	if err := json.Unmarshal([]byte(tailgate(t, "usage", "--data", p.dir, "--tenant", "team-a", "--json")), &usage); err != nil {
		t.Fatal(err)
	}
	if len(usage) != 1 || usage[0].Requests != 3 {
		t.Errorf("usage after restore: %+v; want the 3 requests billed before the backup", usage)
	}

	again := startProc(t, "tailgate up (restored)", true, "up", "--data", p.dir, "--listen", "127.0.0.1:0",
		"--admin-listen", "127.0.0.1:0", "--replicas", "1", "--sim-ttft", "1ms", "--sim-tpot", "0s")
	var api string
	again.scanUntil(func(line string) bool {
		if m := apiLine.FindStringSubmatch(line); m != nil {
			api = m[1]
		}
		return api != ""
	})
	if api == "" {
		t.Fatalf("the gateway on the restored database printed no API address:\n%s", again.stderr.String())
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := chat(api, secret)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the key made before the backup is not accepted by the gateway on the restored database: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
