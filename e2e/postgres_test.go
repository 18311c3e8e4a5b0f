package e2e

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"tailgate/data"
	"tailgate/data/pgtest"
	"tailgate/e2e/testkit"
)

// TestUpOnPostgresBillsIntoPostgres: `up --database postgres://…` keeps
// everything in PostgreSQL: the demo key works, a metered request's ledger
// row is in PostgreSQL with the usage the client was sent, no SQLite file is
// made, and the admin commands on the same --data reach the same database.
func TestUpOnPostgresBillsIntoPostgres(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the tailgate binary")
	}
	url := pgtest.NewDatabase(t)
	p := startUp(t, "--database", url, "--replicas", "1", "--sim-ttft", "1ms", "--sim-tpot", "0s")

	req, _ := http.NewRequest(http.MethodPost, p.api+"/chat/completions", strings.NewReader(
		`{"model":"tailgate-sim","max_tokens":5,"messages":[{"role":"user","content":"Say hello"}]}`))
	req.Header.Set("Authorization", "Bearer "+p.demoKey)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	var answer struct {
		Usage struct {
			PromptTokens     int64 `json:"prompt_tokens"`
			CompletionTokens int64 `json:"completion_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(body, &answer); err != nil || answer.Usage.CompletionTokens == 0 {
		t.Fatalf("answer %s: %v (want usage)", body, err)
	}
	reqID := resp.Header.Get("x-request-id")

	// The answer was billed before it was sent: its row is there now.
	st, err := data.Open(url)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	rows, err := st.LedgerRows(context.Background(), data.UsageFilter{})
	if err != nil {
		t.Fatal(err)
	}
	var found bool
	for _, r := range rows {
		if r.ID != reqID {
			continue
		}
		found = true
		if r.Status != 200 || r.PromptTokens != answer.Usage.PromptTokens || r.CompletionTokens != answer.Usage.CompletionTokens {
			t.Errorf("ledger row in PostgreSQL = status %d, %d+%d tokens; the client got 200, %d+%d",
				r.Status, r.PromptTokens, r.CompletionTokens, answer.Usage.PromptTokens, answer.Usage.CompletionTokens)
		}
	}
	if !found {
		t.Fatalf("no ledger row %q in PostgreSQL (%d rows)", reqID, len(rows))
	}
	if _, err := os.Stat(filepath.Join(p.dir, "tailgate.db")); !os.IsNotExist(err) {
		t.Errorf("a SQLite file was made beside the PostgreSQL database (stat: %v)", err)
	}

	// The admin commands find the database through --data.
	secret := testkit.LastLine(tailgate(t, "keys", "create", "--data", p.dir, "--tenant", "team-pg"))
	keys, err := st.Keys(context.Background(), "team-pg")
	if err != nil || len(keys) != 1 || !strings.HasPrefix(secret, keys[0].Prefix) {
		t.Errorf("keys create --data on a PostgreSQL deployment: keys in PostgreSQL = %+v, %v", keys, err)
	}
	out, err := exec.Command(binPath, "backup", "--data", p.dir, filepath.Join(t.TempDir(), "copy.db")).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "pg_dump") {
		t.Errorf("backup of a PostgreSQL deployment = %v:\n%s\nwant an error naming pg_dump", err, out)
	}
}
