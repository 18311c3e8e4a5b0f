package server_test

import (
	"io"
	"strings"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/policy"
	"github.com/tailgate-dev/tailgate/server"
	"github.com/tailgate-dev/tailgate/server/internal/servertest"
)

// TestRejectedRequestsCannotFloodTheLedger: refused requests with a
// megabyte model name store a bounded string, and past the rejected-rows
// rate they are counted but not stored, so bad requests cannot fill the
// disk; unauthenticated requests store nothing.
func TestRejectedRequestsCannotFloodTheLedger(t *testing.T) {
	h := servertest.Start(t, servertest.Options{Replicas: 1, Server: server.Config{RejectedRows: 2, MaxBodyBytes: 2 << 20}})
	secret := h.Key(policy.KeyOptions{})
	huge := strings.Repeat("m", 256<<10)
	const sent = 40
	start := time.Now()
	for range sent {
		resp := h.Post("/v1/chat/completions", secret, `{"model":"`+huge+`","messages":[{"role":"user","content":"hi"}]}`)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 404 {
			t.Fatalf("status %d", resp.StatusCode)
		}
		resp = h.Post("/v1/chat/completions", "tg-not-a-key", `{"model":"x","messages":[{"role":"user","content":"hi"}]}`)
		resp.Body.Close()
	}
	elapsed := time.Since(start)
	rows := h.LedgerRows()
	// The burst is 5 seconds' worth (10), refilled at 2 a second while the
	// requests were being sent.
	if allowed := 10 + int(2*elapsed.Seconds()) + 1; len(rows) == 0 || len(rows) > allowed {
		t.Fatalf("%d ledger rows for %d rejections in %v, want at most %d", len(rows), sent, elapsed, allowed)
	}
	for _, r := range rows {
		if len(r.Model) > 300 {
			t.Fatalf("a ledger row stores a %d-byte model name", len(r.Model))
		}
		if r.KeyID == "" {
			t.Fatal("an unauthenticated request has a row")
		}
	}
	skipped := 0.0
	mfs, _ := h.Metrics.Gather()
	for _, mf := range mfs {
		if mf.GetName() == "tailgate_ledger_rows_skipped_total" {
			skipped = mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	if int(skipped)+len(rows) != sent {
		t.Fatalf("skipped %v + stored %d != %d rejections", skipped, len(rows), sent)
	}
}
