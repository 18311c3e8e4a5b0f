package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"tailgate/data"
	"tailgate/data/pgtest"
	"tailgate/e2e/testkit"
)

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
