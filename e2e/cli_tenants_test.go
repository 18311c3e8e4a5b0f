package e2e

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"tailgate/e2e/testkit"
)

// TestTenantsAndKeyEditAgainstRunningGateway: the CLI edits a key and a
// tenant's budget in the database of a running `tailgate up`, and the
// gateway applies each within a second or two: a lowered RPM answers 429,
// an expiry in the past 401 saying the key expired and when, an extended
// expiry serves again, a lowered budget answers insufficient_quota.
// `tenants list|show` show the budget and spend, `keys list` the expiry,
// and `usage` counts the refused requests apart.
func TestTenantsAndKeyEditAgainstRunningGateway(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the tailgate binary")
	}
	p := startUp(t, "--replicas", "1", "--sim-ttft", "1ms", "--sim-tpot", "0s")
	secret := testkit.LastLine(tailgate(t, "keys", "create", "--data", p.dir, "--tenant", "team-a", "--expires", "30d"))
	prefix := secret[:11]
	post := func() (int, string, string) {
		req, _ := http.NewRequest(http.MethodPost, p.api+"/chat/completions",
			strings.NewReader(`{"model":"tailgate-sim","max_tokens":3,"messages":[{"role":"user","content":"hi"}]}`))
		req.Header.Set("Authorization", "Bearer "+secret)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		var e struct {
			Error struct{ Message, Code string } `json:"error"`
		}
		json.Unmarshal(raw, &e)
		return resp.StatusCode, e.Error.Code, e.Error.Message
	}
	// until polls for at most 3s: the gateway polls the key version every 250ms.
	until := func(what string, cond func(code int, errCode, msg string) bool) {
		t.Helper()
		for range 150 {
			if cond(post()) {
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Fatalf("%s: not within 3s", what)
	}
	if code, _, msg := post(); code != 200 {
		t.Fatalf("new key: %d %s", code, msg)
	}
	list := tailgate(t, "keys", "list", "--data", p.dir, "--tenant", "team-a")
	if want := time.Now().Add(30 * 24 * time.Hour).UTC().Format("2006-01-02"); !strings.Contains(list, want) || !strings.Contains(list, "EXPIRES") {
		t.Errorf("keys list does not show the expiry (%s):\n%s", want, list)
	}

	out := tailgate(t, "keys", "edit", "--data", p.dir, prefix, "--rpm", "1")
	if !strings.Contains(out, "rpm 1") {
		t.Errorf("keys edit says %q", out)
	}
	until("rpm 1 refuses", func(code int, errCode, _ string) bool { return code == 429 && errCode == "rate_limit_exceeded" })

	tailgate(t, "keys", "edit", "--data", p.dir, prefix, "--rpm", "0", "--expires", "2020-01-31T00:00:00Z")
	until("expired key refused", func(code int, errCode, msg string) bool {
		return code == 401 && errCode == "expired_api_key" && strings.Contains(msg, "expired at 2020-01-31T00:00:00Z")
	})
	if list := tailgate(t, "keys", "list", "--data", p.dir, "--tenant", "team-a"); !strings.Contains(list, "expired") {
		t.Errorf("keys list does not say expired:\n%s", list)
	}
	tailgate(t, "keys", "edit", "--data", p.dir, prefix, "--expires", "1d")
	until("extended key serves", func(code int, _, _ string) bool { return code == 200 })

	out = tailgate(t, "tenants", "set", "--data", p.dir, "team-a", "--budget-tokens", "1")
	if !strings.Contains(out, "budget tokens 1") {
		t.Errorf("tenants set says %q", out)
	}
	until("lowered budget refuses", func(code int, errCode, _ string) bool { return code == 429 && errCode == "insufficient_quota" })

	list = tailgate(t, "tenants", "list", "--data", p.dir)
	if !strings.Contains(list, "team-a") || !strings.Contains(list, "SPENT") {
		t.Errorf("tenants list:\n%s", list)
	}
	var views []map[string]any
	if err := json.Unmarshal([]byte(tailgate(t, "tenants", "list", "--data", p.dir, "--json")), &views); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, v := range views {
		if v["name"] == "team-a" {
			found = true
			if v["budget_tokens"] != 1.0 || v["spent_tokens"].(float64) <= 0 || v["reserved_tokens"] != nil {
				t.Errorf("tenants list --json: %v (reserved must be null: the CLI cannot know it)", v)
			}
		}
	}
	if !found {
		t.Errorf("tenants list --json lacks team-a: %v", views)
	}
	show := tailgate(t, "tenants", "show", "--data", p.dir, "team-a")
	if !strings.Contains(show, "budget tokens  1") || !strings.Contains(show, "1 active of 1") {
		t.Errorf("tenants show:\n%s", show)
	}

	var usage []struct {
		Tenant   string `json:"tenant"`
		Requests int64  `json:"requests"`
		Rejected int64  `json:"rejected"`
	}
	if err := json.Unmarshal([]byte(tailgate(t, "usage", "--data", p.dir, "--tenant", "team-a", "--json")), &usage); err != nil {
		t.Fatal(err)
	}
	if len(usage) != 1 || usage[0].Rejected < 2 || usage[0].Requests < 2 {
		t.Errorf("usage: %+v; want the served requests and at least the 2 refusals (rpm, budget) apart", usage)
	}
	if table := tailgate(t, "usage", "--data", p.dir); !strings.Contains(table, "REJECTED") {
		t.Errorf("usage table has no REJECTED column:\n%s", table)
	}
}
