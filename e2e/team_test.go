package e2e

import (
	"encoding/csv"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/e2e/testkit"
)

// TestNamedKeyRotationAndUsageAgainstRunningGateway: against a running
// `tailgate up`, a key made with a name, owner, note and a monthly budget is
// listed under its name with its requests and spend; `usage` run right
// after a request counts it (even while its row is only in the commit log);
// `keys rotate` gives a new secret that works at once while the old one
// keeps working for its grace; `usage --by day --csv` and `tenants show`
// show the period.
func TestNamedKeyRotationAndUsageAgainstRunningGateway(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the tailgate binary")
	}
	p := startUp(t, "--replicas", "1", "--sim-ttft", "1ms", "--sim-tpot", "0s")
	secret := testkit.LastLine(tailgate(t, "keys", "create", "--data", p.dir, "--tenant", "team-b", "--name", "bob-laptop",
		"--owner", "bob@example.com", "--note", "demo laptop", "--budget-tokens", "100000", "--budget-period", "monthly"))
	post := func(key string) int {
		req, _ := http.NewRequest(http.MethodPost, p.api+"/chat/completions",
			strings.NewReader(`{"model":"tailgate-sim","max_tokens":3,"messages":[{"role":"user","content":"hi"}]}`))
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	requests := func() int64 {
		var rows []struct {
			Requests int64 `json:"requests"`
		}
		if err := json.Unmarshal([]byte(tailgate(t, "usage", "--data", p.dir, "--tenant", "team-b", "--json")), &rows); err != nil {
			t.Fatal(err)
		}
		var n int64
		for _, r := range rows {
			n += r.Requests
		}
		return n
	}
	for i := range 3 {
		if code := post(secret); code != http.StatusOK {
			t.Fatalf("request %d: status %d", i, code)
		}
		// The newest request is counted at once, not one request late.
		if n := requests(); n != int64(i+1) {
			t.Fatalf("usage right after request %d counts %d requests", i+1, n)
		}
	}
	var keys []struct {
		Name, Owner, Note string
		Requests          int64  `json:"requests"`
		SpentTokens       int64  `json:"spent_tokens"`
		LastUsedAt        string `json:"last_used_at"`
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		if err := json.Unmarshal([]byte(tailgate(t, "keys", "list", "--data", p.dir, "--tenant", "team-b", "--json")), &keys); err != nil {
			t.Fatal(err)
		}
		// keys list reads SQLite: the gateway writes its rows within its
		// batch interval.
		if len(keys) == 1 && keys[0].Requests == 3 || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if len(keys) != 1 || keys[0].Name != "bob-laptop" || keys[0].Owner != "bob@example.com" || keys[0].Note != "demo laptop" ||
		keys[0].Requests != 3 || keys[0].SpentTokens == 0 || keys[0].LastUsedAt == "" {
		t.Fatalf("keys list --json: %+v", keys)
	}
	if table := tailgate(t, "keys", "list", "--data", p.dir, "--tenant", "team-b"); !strings.Contains(table, "bob-laptop") || !strings.Contains(table, "LAST USED") {
		t.Fatalf("keys list does not show the name and last use:\n%s", table)
	}

	newSecret := testkit.LastLine(tailgate(t, "keys", "rotate", "--data", p.dir, "team-b/bob-laptop", "--grace", "1h"))
	if newSecret == secret || !strings.HasPrefix(newSecret, "tg-") {
		t.Fatalf("keys rotate printed %q", newSecret)
	}
	ok := false
	for range 150 { // the gateway polls the key version every 250ms
		if post(newSecret) == http.StatusOK {
			ok = true
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !ok {
		t.Fatal("the rotated key's new secret is not accepted within 3s")
	}
	if code := post(secret); code != http.StatusOK {
		t.Fatalf("the old secret within its grace: status %d, want 200", code)
	}

	out := tailgate(t, "usage", "--data", p.dir, "--since", "7d", "--by", "day", "--csv")
	recs, err := csv.NewReader(strings.NewReader(out)).ReadAll()
	if err != nil || len(recs) != 2 || recs[0][0] != "period" || recs[1][0] != time.Now().UTC().Format(time.DateOnly) {
		t.Fatalf("usage --by day --csv:\n%s (%v)", out, err)
	}
	if show := tailgate(t, "tenants", "show", "--data", p.dir, "team-b"); !strings.Contains(show, "monthly") || !strings.Contains(show, "resets") {
		t.Fatalf("tenants show does not show the monthly period:\n%s", show)
	}
}
