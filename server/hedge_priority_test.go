package server_test

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/policy"
	"github.com/tailgate-dev/tailgate/router"
	"github.com/tailgate-dev/tailgate/server/internal/servertest"
	"github.com/tailgate-dev/tailgate/serving/sim"
)

// skippedHedges reads tailgate_hedges_skipped_total{reason}, summed over models.
func skippedHedges(t *testing.T, h *servertest.Gateway, reason string) float64 {
	return counterSum(t, h, "tailgate_hedges_skipped_total", "reason", reason)
}

// counterSum sums the counter name's series whose label is value.
func counterSum(t *testing.T, h *servertest.Gateway, name, label, value string) float64 {
	t.Helper()
	mfs, err := h.Metrics.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					n += m.GetCounter().GetValue()
				}
			}
		}
	}
	return n
}

// A batch request stuck on a slow replica is not hedged to the replica an
// interactive stream is running on; beside a stream of its own class it is.
func TestBatchHedgeKeepsOffAReplicaServingInteractive(t *testing.T) {
	for _, tc := range []struct {
		held       string // class of the stream running on sim-b
		wantHedged bool
	}{
		{"interactive", false},
		{"batch", true},
	} {
		t.Run(tc.held+" on the other replica", func(t *testing.T) {
			// sim-a is slow to its first token; sim-b is fast and streams
			// one token every 20ms, so a long answer stays in flight.
			h := servertest.Start(t, servertest.Options{
				Replicas: 2,
				Sims: map[int]sim.Config{
					0: {TTFT: time.Second, TTFTSigma: -1},
					1: {TTFT: 5 * time.Millisecond, TTFTSigma: -1, TPOT: 20 * time.Millisecond},
				},
				Router: router.Config{
					Rand:  func(n int) int { return 0 }, // p2c compares sim-a with sim-b and keeps sim-a on a tie
					Hedge: router.HedgeConfig{Enabled: true, MinSamples: 5, Min: time.Millisecond, Budget: 1},
				},
			})
			secret := h.Key(policy.KeyOptions{Class: policy.ClassInteractive})
			slow := h.Reg.Get("sim-a")
			h.LearnWithout(slow, 6, func() { // learn the hedge delay on sim-b alone
				resp := h.Post("/v1/chat/completions", secret, `{"model":"tailgate-sim","max_tokens":1,"messages":[{"role":"user","content":"hi"}]}`)
				_, _ = io.ReadAll(resp.Body)
				resp.Body.Close()
			})
			if _, ok := h.Reg.HedgeDelay(servertest.SimModel, true); !ok {
				t.Fatal("no hedge delay learnt")
			}
			slow.SetState(router.StateDraining, "test") // the held stream goes to sim-b

			// A long stream of the held class on sim-b, read up to its first chunk.
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, h.Public.URL+"/v1/chat/completions",
				strings.NewReader(`{"model":"tailgate-sim","max_tokens":500,"stream":true,"messages":[{"role":"user","content":"a long answer"}]}`))
			req.Header.Set("Authorization", "Bearer "+secret)
			req.Header.Set("X-Tailgate-Priority", tc.held)
			held, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer held.Body.Close()
			if _, err := bufio.NewReader(held.Body).ReadString('\n'); err != nil || held.Header.Get("X-Tailgate-Replica") != "sim-b" {
				t.Fatalf("held stream: %v, on %q, want sim-b", err, held.Header.Get("X-Tailgate-Replica"))
			}
			busy := h.Reg.Get("sim-b")
			if n := busy.InflightClass(map[string]router.Class{"interactive": router.ClassInteractive, "batch": router.ClassBatch}[tc.held]); n != 1 {
				t.Errorf("%s attempts in flight on sim-b: %d, want 1", tc.held, n)
			}
			slow.SetState(router.StateReady, "")

			breq, _ := http.NewRequest(http.MethodPost, h.Public.URL+"/v1/chat/completions",
				strings.NewReader(`{"model":"tailgate-sim","max_tokens":2,"messages":[{"role":"user","content":"batch work"}]}`))
			breq.Header.Set("Authorization", "Bearer "+secret)
			breq.Header.Set("X-Tailgate-Priority", "batch")
			resp, err := http.DefaultClient.Do(breq)
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.ReadAll(resp.Body)
			resp.Body.Close()
			hedged := resp.Header.Get("X-Tailgate-Hedged") == "true"
			if resp.StatusCode != http.StatusOK || hedged != tc.wantHedged {
				t.Fatalf("batch request: status %d, hedged %q, served by %q; want hedged %v",
					resp.StatusCode, resp.Header.Get("X-Tailgate-Hedged"), resp.Header.Get("X-Tailgate-Replica"), tc.wantHedged)
			}
			wantReplica, wantSkips := "sim-a", 1.0
			if tc.wantHedged {
				wantReplica, wantSkips = "sim-b", 0
			}
			if got := resp.Header.Get("X-Tailgate-Replica"); got != wantReplica {
				t.Errorf("batch request served by %q, want %q", got, wantReplica)
			}
			if got := skippedHedges(t, h, "priority"); got != wantSkips {
				t.Errorf("tailgate_hedges_skipped_total{reason=priority} = %v, want %v", got, wantSkips)
			}
		})
	}
}
