package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/tailgate-dev/tailgate/data"
	"github.com/tailgate-dev/tailgate/e2e/testkit"
	"github.com/tailgate-dev/tailgate/policy"
)

func TestUpServesStreamingChatWithDemoKey(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the tailgate binary")
	}
	p := startUp(t, "--replicas", "2", "--sim-ttft", "5ms", "--sim-tpot", "1ms")
	req, _ := http.NewRequest(http.MethodPost, p.api+"/chat/completions", strings.NewReader(
		`{"model":"tailgate-sim","stream":true,"messages":[{"role":"user","content":"Say hello"}]}`))
	req.Header.Set("Authorization", "Bearer "+p.demoKey)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || !strings.Contains(string(body), `"delta":{"content":`) || !strings.HasSuffix(string(body), "data: [DONE]\n\n") {
		t.Fatalf("status %d body:\n%s", resp.StatusCode, body)
	}
	if !strings.Contains(p.stderr.String(), "simulated") {
		t.Fatal("up does not say plainly that it serves simulated output")
	}
}

func TestKeysCLIAgainstRunningGateway(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the tailgate binary")
	}
	p := startUp(t, "--replicas", "1", "--sim-ttft", "1ms", "--sim-tpot", "0s")
	secret := testkit.LastLine(tailgate(t, "keys", "create", "--data", p.dir, "--tenant", "team-a", "--rpm", "600"))
	client := p.client(secret)
	ctx := context.Background()
	params := openai.ChatCompletionNewParams{Model: "tailgate-sim", MaxTokens: openai.Int(3),
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hello")}}
	if _, err := client.Chat.Completions.New(ctx, params); err != nil {
		t.Fatalf("a key created by the CLI while the gateway runs is not accepted at once: %v", err)
	}
	list := tailgate(t, "keys", "list", "--data", p.dir, "--tenant", "team-a")
	if !strings.Contains(list, secret[:11]) || strings.Contains(list, secret) {
		t.Fatalf("keys list shows prefix? secret? :\n%s", list)
	}
	tailgate(t, "keys", "revoke", "--data", p.dir, secret[:11])
	revoked := time.Now()
	for {
		_, err := client.Chat.Completions.New(ctx, params)
		var apiErr *openai.Error
		if err != nil && asAPIError(err, &apiErr) && apiErr.StatusCode == 401 {
			break
		}
		if time.Since(revoked) > time.Second {
			t.Fatalf("revoked key still works %v after `keys revoke` (err %v)", time.Since(revoked), err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func asAPIError(err error, target **openai.Error) bool {
	e, ok := err.(*openai.Error)
	if ok {
		*target = e
	}
	return ok
}

// TestLedgerExactAfterSIGTERMDuringLoad: every request a client saw complete
// is in the ledger with the usage the client saw, none more, after a clean
// stop in the middle of load.
func TestLedgerExactAfterSIGTERMDuringLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the tailgate binary")
	}
	p := startUp(t, "--replicas", "2", "--sim-ttft", "20ms", "--sim-tpot", "2ms")
	client := p.client(p.demoKey)
	var (
		wg                    sync.WaitGroup
		stop                  atomic.Bool
		completed, sumP, sumC atomic.Int64
	)
	for w := range 8 {
		wg.Go(func() {
			for i := 0; !stop.Load() && i < 500; i++ {
				ctx := context.Background()
				content := fmt.Sprintf("worker %d request %d", w, i)
				params := openai.ChatCompletionNewParams{Model: "tailgate-sim", MaxTokens: openai.Int(int64(3 + i%10)),
					Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(content)}}
				var u openai.CompletionUsage
				if i%2 == 0 {
					resp, err := client.Chat.Completions.New(ctx, params)
					if err != nil {
						return // the gateway is gone
					}
					u = resp.Usage
				} else {
					params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
					s := client.Chat.Completions.NewStreaming(ctx, params)
					var acc openai.ChatCompletionAccumulator
					for s.Next() {
						acc.AddChunk(s.Current())
					}
					if s.Err() != nil || acc.Usage.TotalTokens == 0 {
						return
					}
					u = acc.Usage
				}
				completed.Add(1)
				sumP.Add(u.PromptTokens)
				sumC.Add(u.CompletionTokens)
			}
		})
	}
	// Let load build up, then stop the gateway in the middle of it.
	deadline := time.Now().Add(20 * time.Second)
	for completed.Load() < 100 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if err := p.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.Done():
	case <-time.After(40 * time.Second):
		t.Fatal("tailgate up did not stop within 40s of SIGTERM")
	}
	stop.Store(true)
	wg.Wait()
	if err := p.Err(); err != nil {
		t.Fatalf("up exited with %v\n%s", err, p.stderr.String())
	}

	req, pt, ct := usageTotals(t, p.dir)
	t.Logf("clients completed %d requests (%d+%d tokens); ledger: %d requests (%d+%d)", completed.Load(), sumP.Load(), sumC.Load(), req, pt, ct)
	if completed.Load() < 100 {
		t.Fatalf("only %d requests completed before the stop", completed.Load())
	}
	if pt != sumP.Load() || ct != sumC.Load() {
		t.Fatalf("ledger tokens %d+%d, clients received %d+%d", pt, ct, sumP.Load(), sumC.Load())
	}
}

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
	// A refusal by the key's own rate limit comes before the body is read
	// (no key takes a shared pool past its limits), so its row names no
	// model and stands apart from the model's row: the totals are summed.
	var requests, rejected int64
	for _, u := range usage {
		if u.Tenant != "team-a" {
			t.Errorf("usage --tenant team-a: a row of %q", u.Tenant)
		}
		requests, rejected = requests+u.Requests, rejected+u.Rejected
	}
	if rejected < 2 || requests < 2 {
		t.Errorf("usage: %+v; want the served requests and at least the 2 refusals (rpm, budget) apart", usage)
	}
	if table := tailgate(t, "usage", "--data", p.dir); !strings.Contains(table, "REJECTED") {
		t.Errorf("usage table has no REJECTED column:\n%s", table)
	}
}

// TestGatewayRefusesAMoneyBudgetNoPriceReaches: a tenant's money budget
// counts only priced models. When no model the tenant may use has a price,
// the budget would silently never be enforced, so the gateway refuses to
// start and names the tenant (and the models its keys list); when some
// model its keys name is free beside priced ones, it starts and warns,
// naming the model.
func TestGatewayRefusesAMoneyBudgetNoPriceReaches(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the tailgate binary")
	}
	// A data directory as a gateway leaves it, with one tenant and its key.
	deployment := func(t *testing.T, models ...string) string {
		dir := t.TempDir()
		st, err := data.Open(filepath.Join(dir, "tailgate.db"))
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		budget := int64(10_000_000) // 10 currency units
		if _, _, err := policy.CreateKey(context.Background(), st, policy.KeyOptions{Tenant: "acme", BudgetMicros: &budget, Models: models}); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	gateway := func(dir string, extra ...string) []string {
		return append([]string{"gateway", "--data", dir, "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"}, extra...)
	}
	for _, tc := range []struct {
		name   string
		models []string
		flags  []string
		want   []string
	}{
		{"no price at all", nil, nil,
			[]string{`tenant "acme" has a money budget (10) but no model has a price, so it is never reached`, "--price MODEL=IN,OUT"}},
		{"only other models priced", []string{"llama", "qwen"}, []string{"--price", "mistral=1,2"},
			[]string{`tenant "acme"`, "none of the models its keys may use has a price (llama, qwen)"}},
		{"a price of zero", []string{"llama"}, []string{"--price", "llama=0,0"},
			[]string{`tenant "acme"`, "(llama)", "never reached"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, stderr := runToExit(t, 30*time.Second, gateway(deployment(t, tc.models...), tc.flags...)...)
			if code != 1 {
				t.Errorf("exit status %d, want 1", code)
			}
			line := errorLine(t, stderr)
			for _, w := range tc.want {
				if !strings.Contains(line, w) {
					t.Errorf("error line lacks %q", w)
				}
			}
			if t.Failed() {
				t.Logf("stderr:\n%s", stderr)
			}
		})
	}

	t.Run("one listed model free", func(t *testing.T) {
		p := startProc(t, "gateway", true, gateway(deployment(t, "llama", "qwen"), "--price", "llama=0.2,0.6")...)
		bound := time.AfterFunc(30*time.Second, func() { _ = p.Stop(0) })
		defer bound.Stop()
		served := false
		p.scanUntil(func(line string) bool {
			served = strings.HasPrefix(line, "tailgate gateway: API")
			return served
		})
		if !served {
			t.Fatalf("the gateway did not start")
		}
		// stderr is another pipe than stdout: its lines may arrive a moment
		// after the banner.
		var warn string
		for deadline := time.Now().Add(10 * time.Second); warn == "" && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			for _, l := range strings.Split(p.stderr.String(), "\n") {
				if strings.Contains(l, "level=WARN") && strings.Contains(l, "money budget") {
					warn = l
				}
			}
		}
		if !strings.Contains(warn, `tenant \"acme\"`) || !strings.Contains(warn, "does not limit qwen") {
			t.Errorf("no warning naming the tenant and the free model; stderr:\n%s", p.stderr.String())
		}
	})
}

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
