package server_test

import (
	"encoding/json"
	"io"
	"math"
	"net/http"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/policy"
	"github.com/tailgate-dev/tailgate/router"
	"github.com/tailgate-dev/tailgate/server/internal/servertest"
	"github.com/tailgate-dev/tailgate/serving/sim"
)

// crawlHarness has two replicas whose first token comes at once (5ms):
// sim-a then decodes a token every 60ms, sim-b every 2ms. Every first
// attempt goes to sim-a; the decode pace (and the first-token delay, at
// least 50ms) is learnt from answers of sim-b alone, streamed or JSON.
func crawlHarness(t *testing.T, learnStreamed bool) (*servertest.Gateway, string) {
	t.Helper()
	h := servertest.Start(t, servertest.Options{
		Replicas: 2,
		Sims: map[int]sim.Config{
			0: {TTFT: 5 * time.Millisecond, TTFTSigma: -1, TPOT: 60 * time.Millisecond},
			1: {TTFT: 5 * time.Millisecond, TTFTSigma: -1, TPOT: 2 * time.Millisecond},
		},
		Router: router.Config{Selector: prefer("sim-a"),
			Hedge: router.HedgeConfig{Enabled: true, MinSamples: 5, Min: 50 * time.Millisecond}},
	})
	secret := h.Key(policy.KeyOptions{})
	h.LearnWithout(h.Reg.Get("sim-a"), 5, func() { tokenRequest(t, h, secret, learnStreamed, "learn the pace", 20) })
	return h, secret
}

// pacedHedges reads tailgate_pace_hedges_total{outcome}, summed over models.
func pacedHedges(t *testing.T, h *servertest.Gateway, outcome string) float64 {
	return counterSum(t, h, "tailgate_pace_hedges_total", "outcome", outcome)
}

// TestJSONAnswerThatCrawlsIsHedgedOnPace: a JSON answer whose first token
// came in time but whose tokens then crawl (a replica decoding at a
// thirtieth of the model's pace) is hedged on another replica once it falls
// behind the pace, and the client gets the hedge's whole answer at once.
// The ledger bills the hedge's answer and counts what the crawling attempt
// burned, as its engine counted it, as overhead; its attempt log shows
// both attempts. Streams are not hedged on pace, but they teach it.
func TestJSONAnswerThatCrawlsIsHedgedOnPace(t *testing.T) {
	for _, learn := range []string{"json", "stream"} {
		t.Run("learnt from "+learn, func(t *testing.T) { crawlIsHedgedOnPace(t, learn == "stream") })
	}
}

func crawlIsHedgedOnPace(t *testing.T, learnStreamed bool) {
	h, secret := crawlHarness(t, learnStreamed)
	const prompt = "a part of a document that crawls"
	promptTokens := int64(sim.ChatPromptTokens(prompt))
	base := engineTokens(t, h)
	before := len(h.LedgerRows())
	body := `{"model":"` + servertest.SimModel + `","max_tokens":40,"ignore_eos":true,"messages":[{"role":"user","content":"` + prompt + `"}]}`
	resp := h.Post("/v1/chat/completions", secret, body)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var answer struct {
		Usage struct {
			CompletionTokens int64 `json:"completion_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(b, &answer); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("%d: %s (%v)", resp.StatusCode, b, err)
	}
	if got := resp.Header.Get("X-Tailgate-Replica"); got != "sim-b" || resp.Header.Get("X-Tailgate-Winner") != "hedge" ||
		resp.Header.Get("X-Tailgate-Attempts") != "2" || answer.Usage.CompletionTokens != 40 {
		t.Fatalf("answered by %q (winner %q, %s attempts, %d tokens); want the whole answer from the pace hedge on sim-b",
			got, resp.Header.Get("X-Tailgate-Winner"), resp.Header.Get("X-Tailgate-Attempts"), answer.Usage.CompletionTokens)
	}
	if pacedHedges(t, h, "won") != 1 {
		t.Errorf("tailgate_pace_hedges_total{won} = %v, want 1", pacedHedges(t, h, "won"))
	}

	rows := h.LedgerRows()
	if len(rows) != before+1 {
		t.Fatalf("%d ledger rows for one request", len(rows)-before)
	}
	r := rows[before]
	if r.Outcome != "ok" || r.Upstream != "sim-b" || !r.Hedged || r.Attempts != 2 || r.PromptTokens != promptTokens || r.CompletionTokens != 40 {
		t.Fatalf("ledger row %+v: want ok from sim-b, hedged, 2 attempts, the hedge's %d+40 tokens billed", r, promptTokens)
	}
	// The crawling attempt had its prompt and a few tokens when it was
	// cancelled: overhead, as its engine counted it (a token in flight at
	// the cancel may be unseen).
	engine := engineTokens(t, h) - base
	if r.HedgeOverheadTokens <= promptTokens || math.Abs(engine-ledgerTokens(r)) > 2 {
		t.Fatalf("ledger: billed %d+%d, overhead %d; the engines counted %v", r.PromptTokens, r.CompletionTokens, r.HedgeOverheadTokens, engine)
	}
	log := requestAttempts(t, h, r.ID)
	if len(log) != 2 || log[0].Replica != "sim-a" || log[0].Role != "first" || log[0].Outcome != "cancelled" ||
		log[0].PromptTokens+log[0].CompletionTokens != r.HedgeOverheadTokens ||
		log[1].Replica != "sim-b" || log[1].Role != "hedge" || log[1].Outcome != "won" || log[1].CompletionTokens != 40 {
		t.Fatalf("attempt log %+v: want the crawling first attempt cancelled with its overhead, the hedge on sim-b won", log)
	}
}

// TestOptedOutJSONAnswerIsNotHedgedOnPace: a request with x-tailgate-hedge:
// off crawls to its end on the replica it started on, and the hedge it
// would have had is counted as skipped for opting out.
func TestOptedOutJSONAnswerIsNotHedgedOnPace(t *testing.T) {
	h, secret := crawlHarness(t, false)
	resp := postOptedOut(t, h, secret, `{"model":"`+servertest.SimModel+`","max_tokens":8,"ignore_eos":true,"messages":[{"role":"user","content":"leave me be"}]}`)
	if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Tailgate-Replica") != "sim-a" || resp.Header.Get("X-Tailgate-Attempts") != "1" {
		t.Fatalf("%d via %q after %s attempts; want the opted-out answer from sim-a alone", resp.StatusCode,
			resp.Header.Get("X-Tailgate-Replica"), resp.Header.Get("X-Tailgate-Attempts"))
	}
	if got := skippedHedges(t, h, "opt_out"); got != 1 {
		t.Errorf("tailgate_hedges_skipped_total{opt_out} = %v, want 1", got)
	}
	if got := pacedHedges(t, h, "skipped"); got != 1 {
		t.Errorf("tailgate_pace_hedges_total{skipped} = %v, want 1", got)
	}
}
