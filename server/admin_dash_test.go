package server_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/policy"
	"github.com/tailgate-dev/tailgate/server"
	"github.com/tailgate-dev/tailgate/server/internal/servertest"
	"github.com/tailgate-dev/tailgate/serving/sim"
)

func adminGet(t *testing.T, h *servertest.Gateway, path string, out any) int {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, h.Admin.URL+path, nil)
	req.Header.Set("Authorization", "Bearer "+servertest.AdminToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if out != nil && resp.StatusCode == http.StatusOK {
		if err := json.Unmarshal(body, out); err != nil {
			t.Fatalf("%s: %v\n%s", path, err, body)
		}
	}
	return resp.StatusCode
}

type historyAnswer struct {
	Data        []server.HistoryPoint          `json:"data"`
	Transitions map[string][]server.Transition `json:"transitions"`
}

// The last hour counts requests, errors by class, TTFT and ejections per
// interval, and each replica's state changes, from what the gateway already
// records.
func TestHistoryRecordsRequestsErrorsTTFTAndReplicaStates(t *testing.T) {
	h := servertest.Start(t, servertest.Options{Replicas: 1, DeadUpstreams: 1, Server: server.Config{HistoryInterval: 100 * time.Millisecond}})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = h.Srv.RunHistory(ctx) }()
	defer func() { cancel(); <-done }()

	secret := h.Key(policy.KeyOptions{Tenant: "hist"})
	for range 6 {
		resp := h.Post("/v1/chat/completions", secret, hiStreamBody)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	resp := h.Post("/v1/chat/completions", secret, `{"model":"tailgate-sim","messages":"not a list"}`) // 400
	resp.Body.Close()

	var got historyAnswer
	var requests, bad, ttftN, ejections float64
	for range 100 {
		if adminGet(t, h, "/admin/v1/history", &got) != http.StatusOK {
			t.Fatal("GET /admin/v1/history failed")
		}
		requests, bad, ttftN, ejections = 0, 0, 0, 0
		for _, p := range got.Data {
			requests += p.Requests
			bad += p.Errors["4xx"]
			ttftN += p.TTFT["stream"].N + p.TTFT["json"].N
			for _, n := range p.Ejections {
				ejections += n
			}
		}
		if requests >= 7 && bad >= 1 && ejections >= 1 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if requests != 7 || bad != 1 || ttftN != 6 || ejections < 1 {
		t.Errorf("the last hour counts %v requests, %v 4xx, %v TTFTs, %v ejections; want 7, 1, 6, at least 1", requests, bad, ttftN, ejections)
	}
	sawEjected := false
	for _, tr := range got.Transitions["dead-a"] {
		sawEjected = sawEjected || (tr.To == "ejected" && tr.Reason != "")
	}
	if !sawEjected {
		t.Errorf("dead-a's state history has no ejection with its reason: %+v", got.Transitions)
	}
	if n := len(got.Transitions["sim-a"]); n != 1 || got.Transitions["sim-a"][0].To != "ready" {
		t.Errorf("sim-a's state history: %+v, want one entry: first seen ready", got.Transitions["sim-a"])
	}
	last := got.Data[len(got.Data)-1]
	if _, ok := last.Replicas["sim-a"]; !ok {
		t.Errorf("the last point has no load of sim-a: %+v", last.Replicas)
	}
}

// The request log filters by tenant, key, model, status and replica, finds
// one request by id, and lists the requests still in flight.
func TestRequestLogFiltersAndInflight(t *testing.T) {
	h := servertest.Start(t, servertest.Options{Replicas: 1, Sim: sim.Config{TTFT: 5 * time.Millisecond}})
	a := h.Key(policy.KeyOptions{Tenant: "alpha"})
	b := h.Key(policy.KeyOptions{Tenant: "beta"})
	var ids []string
	for _, k := range []string{a, a, b} {
		resp := h.Post("/v1/chat/completions", k, hiBody)
		ids = append(ids, resp.Header.Get("X-Request-Id"))
		resp.Body.Close()
	}
	resp := h.Post("/v1/chat/completions", b, `{"model":"nope","messages":[{"role":"user","content":"hi"}]}`)
	resp.Body.Close()

	count := func(q string) (n int, firstID string) {
		var out struct {
			Data []map[string]any `json:"data"`
		}
		if code := adminGet(t, h, "/admin/v1/requests?"+q, &out); code != http.StatusOK {
			t.Fatalf("?%s: %d", q, code)
		}
		if len(out.Data) > 0 {
			firstID, _ = out.Data[0]["id"].(string)
		}
		return len(out.Data), firstID
	}
	for q, want := range map[string]int{
		"tenant=alpha": 2, "tenant=beta": 2, "status=200": 3, "status=404": 1, "model=tailgate-sim": 3,
		"replica=sim-a": 3, "replica=sim-z": 0, "tenant=beta&status=200": 1,
	} {
		if n, _ := count(q); n != want {
			t.Errorf("?%s: %d rows, want %d", q, n, want)
		}
	}
	if n, id := count("id=" + ids[1]); n != 1 || id != ids[1] {
		t.Errorf("search by id %s: %d rows, first %q", ids[1], n, id)
	}
	var keys struct {
		Data []server.KeyView `json:"data"`
	}
	adminGet(t, h, "/admin/v1/keys?tenant=beta", &keys)
	if n, _ := count("key=" + keys.Data[0].ID); n != 2 {
		t.Errorf("?key=%s: %d rows, want 2", keys.Data[0].ID, n)
	}
	if code := adminGet(t, h, "/admin/v1/requests?status=abc", nil); code != http.StatusBadRequest {
		t.Errorf("?status=abc: %d, want 400", code)
	}

	// A request waiting for its first token is listed in flight, then not.
	slow := servertest.Start(t, servertest.Options{Replicas: 1, Sim: sim.Config{TTFT: 20 * time.Second, TTFTSigma: -1}})
	key := slow.Key(policy.KeyOptions{Tenant: "waiting"})
	rctx, cancel := context.WithCancel(context.Background())
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		req, _ := http.NewRequestWithContext(rctx, http.MethodPost, slow.Public.URL+"/v1/chat/completions", strings.NewReader(hiStreamBody))
		req.Header.Set("Authorization", "Bearer "+key)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}()
	var live struct {
		Data []server.LiveCall `json:"data"`
	}
	for range 100 {
		adminGet(t, slow, "/admin/v1/requests/inflight", &live)
		if len(live.Data) > 0 {
			break
		}
		time.Sleep(30 * time.Millisecond)
	}
	if len(live.Data) != 1 || live.Data[0].Tenant != "waiting" || live.Data[0].Endpoint != "/v1/chat/completions" || !strings.HasPrefix(live.Data[0].ID, "req_") {
		t.Errorf("in flight: %+v, want the waiting request", live.Data)
	}
	cancel()
	<-finished
	for range 100 {
		adminGet(t, slow, "/admin/v1/requests/inflight", &live)
		if len(live.Data) == 0 {
			break
		}
		time.Sleep(30 * time.Millisecond)
	}
	if len(live.Data) != 0 {
		t.Errorf("a request the client abandoned is still in flight: %+v", live.Data)
	}
}

type historyWithWindow struct {
	historyAnswer
	Window     server.Window   `json:"window"`
	SpendToday *float64        `json:"spend_today"`
	Priced     map[string]bool `json:"priced"`
}

// A restarted gateway's last hour is rebuilt from the ledger: its
// requests, errors, TTFT and tokens are there at once, marked as coming
// from the ledger, and the first line's last minute counts them; money is
// shown for a priced model.
func TestHistoryIsKeptAcrossARestart(t *testing.T) {
	dir := t.TempDir()
	prices := map[string]policy.Price{servertest.SimModel: {InputMicrosPerM: 1_000_000, OutputMicrosPerM: 2_000_000}}
	opts := servertest.Options{Dir: dir, Replicas: 1, Prices: prices, Server: server.Config{HistoryInterval: 100 * time.Millisecond}}
	first := servertest.Start(t, opts)
	secret := first.Key(policy.KeyOptions{Tenant: "restart"})
	for range 4 {
		resp := first.Post("/v1/chat/completions", secret, hiStreamBody)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	resp := first.Post("/v1/chat/completions", secret, `{"model":"nope","messages":[{"role":"user","content":"hi"}]}`) // 404
	resp.Body.Close()
	first.Close()

	h := servertest.Start(t, opts)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = h.Srv.RunHistory(ctx) }()
	defer func() { cancel(); <-done }()

	var got historyWithWindow
	var requests, notFound, streams, output float64
	for range 100 {
		if adminGet(t, h, "/admin/v1/history", &got) != http.StatusOK {
			t.Fatal("GET /admin/v1/history failed")
		}
		requests, notFound, streams, output = 0, 0, 0, 0
		for _, p := range got.Data {
			if p.FromLedger {
				requests += p.Requests
				notFound += p.Errors["4xx"]
				streams += p.TTFT["stream"].N
				output += p.CompletionTokens
			}
		}
		if requests > 0 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if requests != 5 || notFound != 1 || streams != 4 || output < 4 {
		t.Errorf("after the restart the last hour has %v requests, %v 4xx, %v streams' TTFT, %v output tokens from the ledger; want 5, 1, 4, at least 4",
			requests, notFound, streams, output)
	}
	w := got.Window
	if w.Requests != 5 || w.RequestsPerS <= 0 || w.ErrorRatio == nil || *w.ErrorRatio != 0.2 || w.TTFTP95 == nil || w.OutputTokensPerS <= 0 {
		t.Errorf("the last minute: %+v, want 5 requests, 20 %% errors, a TTFT p95 and output tokens/s", w)
	}
	if got.SpendToday == nil || *got.SpendToday <= 0 || !got.Priced[servertest.SimModel] {
		t.Errorf("spend today %v, priced %v: want money for the priced model", got.SpendToday, got.Priced)
	}
}

// Without a price, the first line has no money figure.
func TestHistoryHasNoSpendWithoutPrices(t *testing.T) {
	h := servertest.Start(t, servertest.Options{Replicas: 1})
	secret := h.Key(policy.KeyOptions{Tenant: "free"})
	resp := h.Post("/v1/chat/completions", secret, hiBody)
	resp.Body.Close()
	var got historyWithWindow
	if adminGet(t, h, "/admin/v1/history", &got) != http.StatusOK {
		t.Fatal("GET /admin/v1/history failed")
	}
	if got.SpendToday != nil || got.Priced[servertest.SimModel] {
		t.Errorf("no price configured, yet spend today %v, priced %v", got.SpendToday, got.Priced)
	}
}
