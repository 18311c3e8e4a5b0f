package server_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/policy"
	"github.com/tailgate-dev/tailgate/server"
	"github.com/tailgate-dev/tailgate/server/internal/servertest"
	"github.com/tailgate-dev/tailgate/server/slo"
	"github.com/tailgate-dev/tailgate/serving/sim"
)

// getSLO reads GET /admin/v1/slo with query q.
func getSLO(t *testing.T, h *servertest.Gateway, q string) slo.Snapshot {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, h.Admin.URL+"/admin/v1/slo"+q, nil)
	req.Header.Set("Authorization", "Bearer "+servertest.AdminToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /admin/v1/slo%s: %d %s", q, resp.StatusCode, raw)
	}
	var s slo.Snapshot
	if err := json.Unmarshal(raw, &s); err != nil {
		t.Fatal(err)
	}
	return s
}

func sloRow(rows []slo.Row, model, source string, kind slo.Kind, stage, obj string) *slo.Row {
	for i := range rows {
		r := &rows[i]
		if r.Model == model && r.Source == source && r.Kind == kind && r.Stage == stage && r.Objective == obj {
			return r
		}
	}
	return nil
}

// TestSLOEvaluatesRequestsPerModelKindAndSource: requests through the
// gateway land in the budget evaluation — a model whose engine is slower
// than the TTFT budget shows over it, streams and JSON answers apart, and
// the x-tailgate-source header splits the rows by source, unknown labels
// folded into "other". The same figures are Prometheus gauges.
func TestSLOEvaluatesRequestsPerModelKindAndSource(t *testing.T) {
	budgets := slo.DefaultBudgets()
	if err := budgets.ParseFlag("stream.ttft=p95:60ms"); err != nil {
		t.Fatal(err)
	}
	h := servertest.Start(t, servertest.Options{
		Replicas: 2,
		Sims: map[int]sim.Config{
			0: {Model: "fast", TTFT: 5 * time.Millisecond, TTFTSigma: -1},
			1: {Model: "slow", TTFT: 150 * time.Millisecond, TTFTSigma: -1},
		},
		Server: server.Config{SLO: slo.Config{Default: &budgets, Sources: slo.SourceConfig{Labels: []string{"eu"}}}},
	})
	secret := h.Key(policy.KeyOptions{Tenant: "slo"})
	send := func(model, source string, stream bool) {
		body := `{"model":"` + model + `","messages":[{"role":"user","content":"hi"}],"max_tokens":2,"stream":` + map[bool]string{true: "true", false: "false"}[stream] + `}`
		req, _ := http.NewRequest(http.MethodPost, h.Public.URL+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+secret)
		req.Header.Set("Content-Type", "application/json")
		if source != "" {
			req.Header.Set("X-Tailgate-Source", source)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: status %d", model, resp.StatusCode)
		}
	}
	for range 3 {
		send("fast", "eu", true)
		send("fast", "mars", true)
		send("slow", "", true)
		send("slow", "", false)
	}

	snap := getSLO(t, h, "")
	fast, slow := sloRow(snap.Data, "fast", "", slo.Stream, "ttft", "p95"), sloRow(snap.Data, "slow", "", slo.Stream, "ttft", "p95")
	if fast == nil || slow == nil {
		t.Fatalf("no ttft rows: %+v", snap.Data)
	}
	if !fast.OK || fast.Requests != 6 || *fast.WithinRatio != 1 || fast.BudgetMS != 60 {
		t.Errorf("fast %+v: a 5ms engine is within a 60ms budget", fast)
	}
	if slow.OK || slow.Requests != 3 || *slow.WithinRatio != 0 || *slow.P50MS < 120 || slow.Burn["5m"] != 20 {
		t.Errorf("slow %+v: a 150ms engine is over a 60ms budget", slow)
	}
	if r := sloRow(snap.Data, "slow", "", slo.JSON, "total", "p95"); r == nil || r.Requests != 3 || !r.OK {
		t.Errorf("slow's JSON answers: %+v, want them counted apart against the total budget", r)
	}
	if r := sloRow(snap.Data, "slow", "", slo.JSON, "ttft", "p95"); r != nil {
		t.Errorf("JSON answers have a ttft row: %+v", r)
	}
	if len(snap.Default) == 0 || snap.Default[0].Kind != slo.Stream {
		t.Errorf("default objectives %+v", snap.Default)
	}

	bySrc := getSLO(t, h, "?by=source")
	for src, n := range map[string]uint64{"eu": 3, "other": 3} {
		if r := sloRow(bySrc.Data, "fast", src, slo.Stream, "ttft", "p95"); r == nil || r.Requests != uint64(n) {
			t.Errorf("fast from %s: %+v, want %d requests", src, r, n)
		}
	}
	if r := sloRow(bySrc.Data, "slow", "default", slo.Stream, "ttft", "p95"); r == nil || r.Requests != 3 {
		t.Errorf("slow without a source header: %+v", r)
	}

	mfs, err := h.Metrics.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var within, burn float64 = -1, -1
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			l := map[string]string{}
			for _, lp := range m.GetLabel() {
				l[lp.GetName()] = lp.GetValue()
			}
			if l["model"] == "slow" && l["kind"] == "stream" && l["stage"] == "ttft" && l["objective"] == "p95" && l["window"] == "1h" {
				switch mf.GetName() {
				case "tailgate_slo_within_budget_ratio":
					within = m.GetGauge().GetValue()
				case "tailgate_slo_burn_rate":
					burn = m.GetGauge().GetValue()
				}
			}
		}
	}
	if within != 0 || burn != 20 {
		t.Errorf("slow's 1h gauges: within %v burn %v, want 0 and 20", within, burn)
	}

	req, _ := http.NewRequest(http.MethodGet, h.Admin.URL+"/admin/v1/slo?by=tenant", nil)
	req.Header.Set("Authorization", "Bearer "+servertest.AdminToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(raw), "by=source") {
		t.Errorf("by=tenant: %d %s, want a 400 naming by=source", resp.StatusCode, raw)
	}
}

// TestSLOCountsFailuresBeforeTheAnswerOverBudget: with every replica down
// the budgets turn red — a 503 no_replica, a 502 and an engine's 429 are
// over budget however fast the error came, for JSON answers and streams,
// and the stage's percentiles stay those of the answers.
func TestSLOCountsFailuresBeforeTheAnswerOverBudget(t *testing.T) {
	h := servertest.Start(t, servertest.Options{Replicas: 1, Sim: sim.Config{TTFT: 5 * time.Millisecond, TTFTSigma: -1}})
	secret := h.Key(policy.KeyOptions{Tenant: "outage"})
	send := func(stream bool) int {
		body := `{"model":"tailgate-sim","messages":[{"role":"user","content":"hi"}],"max_tokens":2,"stream":` + map[bool]string{true: "true", false: "false"}[stream] + `}`
		resp := h.Post("/v1/chat/completions", secret, body)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, stream := range []bool{false, true} {
		if code := send(stream); code != http.StatusOK {
			t.Fatalf("before the outage: %d", code)
		}
	}
	// An engine out of room: its 429 is relayed, and over budget.
	busy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Retry-After", "30")
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusTooManyRequests)
		_, _ = io.WriteString(w, `{"error":{"message":"engine full","type":"rate_limit_error","code":429}}`)
	}))
	t.Cleanup(busy.Close)
	h.Reg.Remove("sim-a")
	h.AddReplica("busy", busy.URL, "")
	if code := send(false); code != http.StatusTooManyRequests {
		t.Fatalf("engine 429: relayed as %d", code)
	}
	// Every replica down: the dead one fails (502), then none is ready (503).
	h.Reg.Remove("busy")
	h.Upstreams[0].Close()
	h.AddReplica("sim-a", h.Upstreams[0].URL, "")
	codes := map[int]int{}
	for range 3 {
		for _, stream := range []bool{false, true} {
			codes[send(stream)]++
		}
	}
	if codes[http.StatusOK] != 0 || codes[http.StatusServiceUnavailable] == 0 {
		t.Fatalf("during the outage: %v, want failures and 503s", codes)
	}

	snap := getSLO(t, h, "")
	js, st := sloRow(snap.Data, servertest.SimModel, "", slo.JSON, "total", "p95"), sloRow(snap.Data, servertest.SimModel, "", slo.Stream, "ttft", "p95")
	if js == nil || st == nil {
		t.Fatalf("no rows: %+v", snap.Data)
	}
	// JSON: 1 answer, 1 engine 429, 3 failures; streams: 1 answer, 3 failures.
	if js.Requests != 5 || js.WithinRatio == nil || *js.WithinRatio != 0.2 || js.OK {
		t.Errorf("JSON total during the outage: %+v within %v, want 5 requests, 1 within budget, not ok", js, deref(js.WithinRatio))
	}
	if st.Requests != 4 || st.WithinRatio == nil || *st.WithinRatio != 0.25 || st.OK {
		t.Errorf("stream ttft during the outage: %+v within %v, want 4 requests, 1 within budget, not ok", st, deref(st.WithinRatio))
	}
	if js.P50MS == nil || *js.P50MS < 1 {
		t.Errorf("JSON total p50 %v ms: the failures' fast errors pulled the answers' times down", deref(js.P50MS))
	}
}

func deref(p *float64) any {
	if p == nil {
		return nil
	}
	return *p
}
