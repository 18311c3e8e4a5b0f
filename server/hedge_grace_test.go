package server_test

import (
	"io"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/policy"
	"github.com/tailgate-dev/tailgate/router"
	"github.com/tailgate-dev/tailgate/server/internal/servertest"
	"github.com/tailgate-dev/tailgate/serving/sim"
)

// TestStalledStreamIsAnsweredByItsHedgeThoughItsFirstTokenCameFirst: a
// stream whose replica stalls — its first token late, every token after
// it late too — is hedged; its first token then beats the hedge's, but so
// narrowly (within the model's median time to first token) that the gateway
// holds it back, the hedge's first token comes, and the client gets the
// hedge's stream instead of a crawl it could never be rescued from. The
// stalled original is the loser: cancelled, its prompt and first token
// recorded as hedge overhead as its engine counted them.
func TestStalledStreamIsAnsweredByItsHedgeThoughItsFirstTokenCameFirst(t *testing.T) {
	// Every first token takes 300ms on sim-b, where the delay is learnt:
	// the hedge delay (p95) and the grace (median) are both ~300ms. sim-a
	// stalls: its first token at 450ms, between the hedge's start (~300ms)
	// and the hedge's first token (~600ms), which is well within the grace
	// (~750ms); then a token every 300ms.
	h := servertest.Start(t, servertest.Options{
		Replicas: 2,
		Sims: map[int]sim.Config{
			0: {TTFT: 450 * time.Millisecond, TTFTSigma: -1, TPOT: 300 * time.Millisecond},
			1: {TTFT: 300 * time.Millisecond, TTFTSigma: -1, TPOT: 2 * time.Millisecond},
		},
		Router: router.Config{Selector: prefer("sim-a"),
			Hedge: router.HedgeConfig{Enabled: true, MinSamples: 5, Min: 20 * time.Millisecond}},
	})
	secret := h.Key(policy.KeyOptions{})
	h.LearnWithout(h.Reg.Get("sim-a"), 5, func() { tokenRequest(t, h, secret, true, "learn the first token", 2) })
	if _, ok := h.Reg.HedgeDelay(servertest.SimModel, true); !ok {
		t.Fatal("no hedge delay learnt")
	}

	const prompt = "a part that stalls"
	promptTokens := int64(sim.ChatPromptTokens(prompt))
	base := engineTokens(t, h)
	before := len(h.LedgerRows())
	resp := h.Post("/v1/chat/completions", secret, `{"model":"`+servertest.SimModel+`","max_tokens":6,"ignore_eos":true,"stream":true,`+
		`"messages":[{"role":"user","content":"`+prompt+`"}]}`)
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.HasSuffix(string(raw), "data: [DONE]\n\n") {
		t.Fatalf("%d: %s", resp.StatusCode, raw)
	}
	if got := resp.Header.Get("X-Tailgate-Replica"); got != "sim-b" || resp.Header.Get("X-Tailgate-Winner") != "hedge" {
		t.Fatalf("streamed from %q (winner %q); want the hedge on sim-b", got, resp.Header.Get("X-Tailgate-Winner"))
	}
	if got := counterSum(t, h, "tailgate_hedge_graces_total", "winner", "hedge"); got != 1 {
		t.Errorf("tailgate_hedge_graces_total{winner=hedge} = %v, want 1", got)
	}

	rows := h.LedgerRows()
	if len(rows) != before+1 {
		t.Fatalf("%d ledger rows for one request", len(rows)-before)
	}
	r := rows[before]
	if r.Outcome != "ok" || r.Upstream != "sim-b" || !r.Hedged || r.PromptTokens != promptTokens || r.CompletionTokens != 6 {
		t.Fatalf("ledger row %+v: want ok from sim-b, hedged, the hedge's %d+6 tokens billed", r, promptTokens)
	}
	// The original had its first token before the hedge did: its prompt and
	// that token are overhead, as its engine counted them.
	engine := engineTokens(t, h) - base
	if r.HedgeOverheadTokens <= promptTokens || math.Abs(engine-ledgerTokens(r)) > 2 {
		t.Fatalf("ledger: billed %d+%d, overhead %d; the engines counted %v", r.PromptTokens, r.CompletionTokens, r.HedgeOverheadTokens, engine)
	}
	log := requestAttempts(t, h, r.ID)
	if len(log) != 2 || log[0].Replica != "sim-a" || log[0].Role != "first" || log[0].Outcome != "cancelled" ||
		log[1].Replica != "sim-b" || log[1].Role != "hedge" || log[1].Outcome != "won" {
		t.Fatalf("attempt log %+v: want the stalled first attempt cancelled, the hedge on sim-b won", log)
	}
}
