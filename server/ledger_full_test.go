package server_test

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"tailgate/data"
	"tailgate/policy"
	"tailgate/server/internal/servertest"
)

// TestFullDiskFailsClosedAndRecovers: when the database fills mid-load, the
// gateway stops starting answers it could not bill (503
// ledger_unavailable, /healthz 503, tailgate_ledger_up 0), and once space
// returns it serves again without a restart; every answer a client got has
// its ledger row.
func TestFullDiskFailsClosedAndRecovers(t *testing.T) {
	h := servertest.Start(t, servertest.Options{Replicas: 1})
	secret := h.Key(policy.KeyOptions{})
	body := `{"model":"` + servertest.SimModel + `","max_tokens":5,"messages":[{"role":"user","content":"` + strings.Repeat("padding ", 200) + `"}]}`
	post := func() (int, string) {
		resp := h.Post("/v1/chat/completions", secret, body)
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(raw)
	}
	healthz := func() int {
		resp, err := http.Get(h.Public.URL + "/healthz")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	answered := 0
	for range 3 {
		if code, raw := post(); code != 200 {
			t.Fatalf("before the fill: %d %s", code, raw)
		}
		answered++
	}

	// Fill: no page may be added any more.
	if err := h.Store.SetMaxPageCount(1); err != nil {
		t.Fatal(err)
	}
	refused, afterFill := 0, 0
	for i := 0; i < 400 && refused < 5; i++ {
		code, raw := post()
		switch {
		case code == 200:
			answered++
			afterFill++
			if refused > 0 {
				t.Fatalf("an answer was served after the gateway had refused for a full ledger")
			}
		case code == 503 && strings.Contains(raw, `"ledger_unavailable"`):
			refused++
		default:
			t.Fatalf("while full: %d %s", code, raw)
		}
	}
	if refused == 0 {
		t.Fatalf("the database never filled (%d answers after the fill)", afterFill)
	}
	if healthz() != 503 || gauge(t, h, "tailgate_ledger_up") != 0 {
		t.Fatal("/healthz and tailgate_ledger_up must say the ledger is down")
	}
	t.Logf("%d answers between the fill and the first refusal (the writes that found the disk full)", afterFill)

	// Space returns: the gateway recovers by itself.
	if err := h.Store.SetMaxPageCount(1 << 30); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		code, _ := post()
		if code == 200 {
			answered++
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("still %d 15 s after space returned", code)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if healthz() != 200 {
		t.Fatal("/healthz still 503 after recovery")
	}
	ok := 0
	for _, r := range h.LedgerRows() {
		if r.Outcome == data.OutcomeOK {
			ok++
		}
	}
	if ok != answered {
		t.Fatalf("%d answers served, %d ok ledger rows", answered, ok)
	}
}

func gauge(t *testing.T, h *servertest.Gateway, name string) float64 {
	t.Helper()
	mfs, err := h.Metrics.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) > 0 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}
