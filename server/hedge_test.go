package server_test

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/tailgate-dev/tailgate/policy"
	"github.com/tailgate-dev/tailgate/router"
	"github.com/tailgate-dev/tailgate/server/internal/servertest"
	"github.com/tailgate-dev/tailgate/serving/sim"
)

// hedgeHarness has replica sim-a slow (1s to first token) and sim-b fast,
// hedging on with a delay learnt from a few fast requests, and selection
// forced to try sim-a first.
func hedgeHarness(t *testing.T) (*servertest.Gateway, string) {
	t.Helper()
	h := servertest.Start(t, servertest.Options{
		Replicas: 2,
		Sims: map[int]sim.Config{
			0: {TTFT: time.Second, TTFTSigma: -1},
			1: {TTFT: 5 * time.Millisecond, TTFTSigma: -1},
		},
		Router: router.Config{
			Rand:  func(n int) int { return 0 }, // no slow start: sim-a is put back to ready below and the forced pick holds
			Hedge: router.HedgeConfig{Enabled: true, MinSamples: 5, Min: time.Millisecond},
		},
	})
	secret := h.Key(policy.KeyOptions{})
	// Learn the model's time to first token on the fast replica alone.
	slow := h.Reg.Get("sim-a")
	slow.SetState(router.StateDraining, "test")
	for range 8 {
		for _, stream := range []bool{true, false} {
			body := `{"model":"tailgate-sim","max_tokens":3,"messages":[{"role":"user","content":"hi"}]}`
			if stream {
				body = `{"model":"tailgate-sim","max_tokens":3,"stream":true,"messages":[{"role":"user","content":"hi"}]}`
			}
			resp := h.Post("/v1/chat/completions", secret, body)
			_, _ = io.ReadAll(resp.Body)
			resp.Body.Close()
		}
	}
	if _, ok := h.Reg.HedgeDelay(servertest.SimModel, true); !ok {
		t.Fatal("no hedge delay learnt")
	}
	slow.SetState(router.StateReady, "")
	return h, secret
}

func TestHedgeBeatsASlowReplicaAndCancelsIt(t *testing.T) {
	for _, stream := range []bool{true, false} {
		name := map[bool]string{true: "stream", false: "json"}[stream]
		t.Run(name, func(t *testing.T) {
			h, secret := hedgeHarness(t)
			before := len(h.LedgerRows())
			body := `{"model":"tailgate-sim","max_tokens":4,"messages":[{"role":"user","content":"hedge me"}]}`
			if stream {
				body = `{"model":"tailgate-sim","max_tokens":4,"stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hedge me"}]}`
			}
			start := time.Now()
			resp := h.Post("/v1/chat/completions", secret, body)
			raw, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			took := time.Since(start)
			if resp.StatusCode != 200 || resp.Header.Get("X-Tailgate-Hedged") != "true" ||
				resp.Header.Get("X-Tailgate-Winner") != "hedge" || resp.Header.Get("X-Tailgate-Replica") != "sim-b" {
				t.Fatalf("status %d hedged %q winner %q replica %q (took %v)", resp.StatusCode, resp.Header.Get("X-Tailgate-Hedged"),
					resp.Header.Get("X-Tailgate-Winner"), resp.Header.Get("X-Tailgate-Replica"), took)
			}
			if stream && !strings.HasSuffix(string(raw), "data: [DONE]\n\n") {
				t.Fatalf("hedged stream incomplete: %s", raw)
			}
			// The slow replica's engine saw the cancel.
			deadline := time.Now().Add(3 * time.Second)
			for h.Engines[0].Stats().Aborted < 1 {
				if time.Now().After(deadline) {
					t.Fatalf("the losing attempt was not cancelled: %+v", h.Engines[0].Stats())
				}
				time.Sleep(5 * time.Millisecond)
			}
			rows := h.LedgerRows()[before:]
			if len(rows) != 1 {
				t.Fatalf("%d ledger rows for one hedged request", len(rows))
			}
			r := rows[0]
			wantPrompt := int64(sim.ChatPromptTokens("hedge me"))
			// The slow original was cancelled before its first token: its
			// engine counted none of its tokens, so neither does the ledger
			// (TestHedgeOverheadMatchesWhatTheEnginesCounted has the rest).
			if !r.Hedged || r.Upstream != "sim-b" || r.PromptTokens != wantPrompt || r.CompletionTokens != 4 ||
				r.HedgeOverheadTokens != 0 || r.Attempts != 2 {
				t.Fatalf("ledger row %+v: want hedged, billed %d+4 for the winner only, no overhead counted", r, wantPrompt)
			}
		})
	}
}

// postOptedOut sends a chat request with x-tailgate-hedge: off and reads
// its answer to the end.
func postOptedOut(t *testing.T, h *servertest.Gateway, secret, body string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, h.Public.URL+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+secret)
	req.Header.Set("X-Tailgate-Hedge", "off")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp
}

func TestHedgeOptOutHeader(t *testing.T) {
	h, secret := hedgeHarness(t)
	resp := postOptedOut(t, h, secret, `{"model":"tailgate-sim","max_tokens":2,"stream":true,"messages":[{"role":"user","content":"once only"}]}`)
	if resp.Header.Get("X-Tailgate-Hedged") != "false" || resp.Header.Get("X-Tailgate-Replica") != "sim-a" {
		t.Fatalf("opted-out request: hedged %q via %q", resp.Header.Get("X-Tailgate-Hedged"), resp.Header.Get("X-Tailgate-Replica"))
	}
	if h.Engines[0].Stats().Aborted != 0 || h.Engines[1].Stats().Completed != 16 {
		t.Fatalf("a second attempt ran: slow %+v fast %+v", h.Engines[0].Stats(), h.Engines[1].Stats())
	}
}

// firstTokenHarness has two replicas with the same latency model (first
// token after 5ms, then one token every 20ms), except as a overrides for
// sim-a; it learns the hedge delay from short answers of sim-b alone and
// forces selection to try sim-a first. The delay is at least 150ms, far
// above the first token and far below a long answer.
func firstTokenHarness(t *testing.T, a sim.Config) (*servertest.Gateway, string) {
	t.Helper()
	fast := sim.Config{TTFT: 5 * time.Millisecond, TTFTSigma: -1, TPOT: 20 * time.Millisecond}
	h := servertest.Start(t, servertest.Options{
		Replicas: 2,
		Sims:     map[int]sim.Config{0: a, 1: fast},
		Router: router.Config{
			Rand:  func(n int) int { return 0 },
			Hedge: router.HedgeConfig{Enabled: true, MinSamples: 5, Min: 150 * time.Millisecond},
		},
	})
	secret := h.Key(policy.KeyOptions{})
	h.LearnWithout(h.Reg.Get("sim-a"), 6, func() {
		resp := h.Post("/v1/chat/completions", secret, `{"model":"tailgate-sim","max_tokens":1,"messages":[{"role":"user","content":"hi"}]}`)
		_, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
	})
	if _, learnt := h.Reg.HedgeDelay(servertest.SimModel, true); !learnt {
		t.Fatal("no hedge delay learnt")
	}
	return h, secret
}

// TestJSONIsHedgedOnFirstTokenNotOnLength: a JSON request is hedged when
// its replica stalls before the first token, and not when a long answer
// started promptly (it used to be hedged on the whole answer's time, so
// long answers were hedged for their length and half the hedges wasted).
func TestJSONIsHedgedOnFirstTokenNotOnLength(t *testing.T) {
	t.Run("stalled before the first token", func(t *testing.T) {
		h, secret := firstTokenHarness(t, sim.Config{HangRate: 1})
		before := len(h.LedgerRows())
		body := `{"model":"tailgate-sim","max_tokens":4,"ignore_eos":true,"messages":[{"role":"user","content":"hedge me"}]}`
		resp := h.Post("/v1/chat/completions", secret, body)
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || resp.Header.Get("X-Tailgate-Hedged") != "true" || resp.Header.Get("X-Tailgate-Winner") != "hedge" ||
			resp.Header.Get("X-Tailgate-Replica") != "sim-b" {
			t.Fatalf("status %d hedged %q winner %q replica %q: %s", resp.StatusCode, resp.Header.Get("X-Tailgate-Hedged"),
				resp.Header.Get("X-Tailgate-Winner"), resp.Header.Get("X-Tailgate-Replica"), raw)
		}
		if got := gjson.GetBytes(raw, "object").Str; got != "chat.completion" {
			t.Fatalf("answer object %q: %s", got, raw)
		}
		rows := h.LedgerRows()[before:]
		if len(rows) != 1 {
			t.Fatalf("%d ledger rows", len(rows))
		}
		// The stalled loser generated nothing before it was cancelled and
		// its engine counted no token of it (vLLM counts a prompt with its
		// first token): no overhead, and none of the winner's tokens.
		r := rows[0]
		if !r.Hedged || r.Attempts != 2 || r.Upstream != "sim-b" || r.CompletionTokens != 4 || r.HedgeOverheadTokens != 0 {
			t.Fatalf("ledger row %+v: want hedged to sim-b, 4 tokens billed, no overhead", r)
		}
	})
	t.Run("long answer that started promptly", func(t *testing.T) {
		h, secret := firstTokenHarness(t, sim.Config{TTFT: 5 * time.Millisecond, TTFTSigma: -1, TPOT: 20 * time.Millisecond})
		before := len(h.LedgerRows())
		// 30 tokens 20ms apart: the answer takes about 600ms, four times the
		// hedge delay, but its first token comes at once.
		resp := h.Post("/v1/chat/completions", secret, `{"model":"tailgate-sim","max_tokens":30,"ignore_eos":true,"messages":[{"role":"user","content":"a long one"}]}`)
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || resp.Header.Get("X-Tailgate-Hedged") != "false" || resp.Header.Get("X-Tailgate-Replica") != "sim-a" {
			t.Fatalf("status %d hedged %q replica %q: a long answer that started at once was hedged", resp.StatusCode,
				resp.Header.Get("X-Tailgate-Hedged"), resp.Header.Get("X-Tailgate-Replica"))
		}
		if n := gjson.GetBytes(raw, "usage.completion_tokens").Int(); n != 30 {
			t.Fatalf("completion_tokens %d: %s", n, raw)
		}
		rows := h.LedgerRows()[before:]
		if len(rows) != 1 || rows[0].Hedged || rows[0].Attempts != 1 || rows[0].HedgeOverheadTokens != 0 || rows[0].CompletionTokens != 30 {
			t.Fatalf("ledger rows %+v: want one unhedged attempt billed 30 tokens", rows)
		}
		if s := h.Engines[1].Stats(); s.Completed != 6 || s.Aborted != 0 {
			t.Fatalf("sim-b saw a hedge: %+v", s)
		}
	})
}
