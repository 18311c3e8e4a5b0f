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
	"sync"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/data"
	"github.com/tailgate-dev/tailgate/data/pgtest"
	"github.com/tailgate-dev/tailgate/e2e/testkit"
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

// TestPostgresOutageFailsClosedAndRecovers: PostgreSQL stops under load.
// The gateway answers 503 ledger_unavailable (and /healthz 503) instead of
// serving what it could not bill; once PostgreSQL is back it serves again
// by itself, and every answer a client received has its ledger row.
func TestPostgresOutageFailsClosedAndRecovers(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the tailgate binary and a PostgreSQL server")
	}
	pg := pgtest.Dedicated(t)
	url := pg.NewDatabase()
	p := startUp(t, "--database", url, "--replicas", "1", "--sim-ttft", "1ms", "--sim-tpot", "0s")
	healthz := strings.TrimSuffix(p.api, "/v1") + "/healthz"
	client := &http.Client{Timeout: 30 * time.Second}

	type result struct {
		status int
		code   string
		id     string
	}
	call := func() result {
		req, _ := http.NewRequest(http.MethodPost, p.api+"/chat/completions", strings.NewReader(
			`{"model":"tailgate-sim","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`))
		req.Header.Set("Authorization", "Bearer "+p.demoKey)
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			return result{}
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var e struct {
			Error struct {
				Code string `json:"code"`
			} `json:"error"`
		}
		_ = json.Unmarshal(body, &e)
		return result{status: resp.StatusCode, code: e.Error.Code, id: resp.Header.Get("x-request-id")}
	}
	health := func() int {
		resp, err := client.Get(healthz)
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}

	var (
		mu       sync.Mutex
		answered []string // request ids of 200 answers
		refused  int      // 503 ledger_unavailable
		other    []result
		stop     = make(chan struct{})
		wg       sync.WaitGroup
	)
	for range 4 {
		wg.Go(func() {
			for i := 0; i < 100_000; i++ {
				select {
				case <-stop:
					return
				default:
				}
				r := call()
				mu.Lock()
				switch {
				case r.status == 200:
					answered = append(answered, r.id)
				case r.status == 503 && r.code == "ledger_unavailable":
					refused++
				case r.status != 0:
					other = append(other, r)
				}
				mu.Unlock()
				if r.status != 200 {
					time.Sleep(20 * time.Millisecond)
				}
			}
		})
	}
	count := func() (int, int) {
		mu.Lock()
		defer mu.Unlock()
		return len(answered), refused
	}
	waitFor := func(what string, d time.Duration, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(d)
		for !cond() {
			if time.Now().After(deadline) {
				close(stop)
				wg.Wait()
				t.Fatalf("%s: not within %v\ngateway stderr:\n%s", what, d, p.stderr.String())
			}
			time.Sleep(50 * time.Millisecond)
		}
	}

	waitFor("answers before the outage", 30*time.Second, func() bool { n, _ := count(); return n >= 20 })
	pg.Stop()
	waitFor("503 ledger_unavailable while PostgreSQL is down", 30*time.Second, func() bool { _, r := count(); return r >= 5 })
	waitFor("/healthz 503 while PostgreSQL is down", 30*time.Second, func() bool { return health() == 503 })
	before, _ := count()
	pg.Start()
	waitFor("answers again after PostgreSQL came back", 60*time.Second, func() bool { n, _ := count(); return n >= before+20 })
	waitFor("/healthz 200 after PostgreSQL came back", 30*time.Second, func() bool { return health() == 200 })
	close(stop)
	wg.Wait()

	mu.Lock()
	defer mu.Unlock()
	if len(other) > 0 {
		t.Errorf("%d answers were neither 200 nor 503 ledger_unavailable, e.g. %+v", len(other), other[0])
	}
	st, err := data.Open(url)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	// Rows queued during the outage land once it is over: wait for them,
	// bounded.
	var missing []string
	deadline := time.Now().Add(20 * time.Second)
	for {
		rows, err := st.LedgerRows(context.Background(), data.UsageFilter{})
		if err != nil {
			t.Fatal(err)
		}
		billed := make(map[string]bool, len(rows))
		for _, r := range rows {
			if r.Status == 200 && r.Outcome == data.OutcomeOK {
				billed[r.ID] = true
			}
		}
		missing = missing[:0]
		for _, id := range answered {
			if !billed[id] {
				missing = append(missing, id)
			}
		}
		if len(missing) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if len(missing) > 0 {
		t.Fatalf("%d of %d answers the clients received have no ledger row, e.g. %s", len(missing), len(answered), missing[0])
	}
	t.Logf("%d answers, %d refused with 503 ledger_unavailable during the outage", len(answered), refused)
}

// tenantRow is a row of GET /admin/v1/tenants.
type tenantRow struct {
	Name           string `json:"name"`
	SpentTokens    int64  `json:"spent_tokens"`
	ReservedTokens int64  `json:"reserved_tokens"`
}

// tenant returns the admin API's row of tenant name.
func (g *gatewayProcess) tenant(name string) tenantRow {
	g.t.Helper()
	req, _ := http.NewRequest(http.MethodGet, g.admin+"/admin/v1/tenants", nil)
	req.Header.Set("Authorization", "Bearer "+g.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		g.t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct{ Data []tenantRow }
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		g.t.Fatal(err)
	}
	for _, r := range out.Data {
		if r.Name == name {
			return r
		}
	}
	g.t.Fatalf("no tenant %q in GET /admin/v1/tenants", name)
	return tenantRow{}
}

// TestTenantsOnPostgresShowTheDatabasesTotals: two gateways on one
// PostgreSQL serve one tenant; each gateway's GET /admin/v1/tenants shows
// the tenant's whole spend as the database holds it, not the share that
// gateway served, and a request in flight on one gateway shows as reserved
// on the other.
func TestTenantsOnPostgresShowTheDatabasesTotals(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the tailgate binary and a PostgreSQL server")
	}
	url := pgtest.NewDatabase(t)
	gA, gB := startGatewayPair(t, url)
	gA.startWorker("w1", "--gateway", gB.admin, "--sim-tpot", "1ms")
	gA.waitReady("w1")
	gB.waitReady("w1")

	// Tenant "test" (both gateways' keys) spends through both.
	for i, g := range []*gatewayProcess{gA, gA, gA, gB} {
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		status, _, body, err := g.chat(ctx, false, 8)
		cancel()
		if err != nil || status != 200 {
			t.Fatalf("chat %d: %d %v\n%s", i, status, err, body)
		}
	}
	st, err := data.Open(url)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ten, err := st.TenantByName(t.Context(), "test")
	if err != nil {
		t.Fatal(err)
	}
	var inDB int64
	testkit.WaitWithin(t, 10*time.Second, "both gateways show the database's spend of the tenant", func() bool {
		spend, err := st.TenantSpend(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		inDB = spend[ten.ID].Tokens
		return inDB > 0 && gA.tenant("test").SpentTokens == inDB && gB.tenant("test").SpentTokens == inDB
	})
	if a, b := gA.tenant("test").SpentTokens, gB.tenant("test").SpentTokens; a != inDB || b != inDB {
		t.Fatalf("spent_tokens: gateway A %d, B %d; the database holds %d", a, b, inDB)
	}

	// A budget, and a slow stream in flight on A: B shows it reserved.
	req, _ := http.NewRequest(http.MethodPatch, gA.admin+"/admin/v1/tenants/test", strings.NewReader(`{"budget_tokens":1000000}`))
	req.Header.Set("Authorization", "Bearer "+gA.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("set budget: %v %v", resp, err)
	}
	resp.Body.Close()
	time.Sleep(time.Second) // the gateways' poll picks the budget up (250 ms)
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, _, _, _ = gA.chatBody(ctx, `{"model":"tailgate-sim","stream":true,"max_tokens":4000,"ignore_eos":true,"messages":[{"role":"user","content":"hello"}]}`)
	}()
	testkit.WaitWithin(t, 10*time.Second, "gateway B shows the reservation of a stream running on A", func() bool {
		return gB.tenant("test").ReservedTokens > 0
	})
	cancel()
	wg.Wait()
}
