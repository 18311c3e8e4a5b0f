package server_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"tailgate/policy"
	"tailgate/server"
	"tailgate/server/internal/servertest"
	"tailgate/server/slo"
	"tailgate/serving/sim"
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
