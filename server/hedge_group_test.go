package server_test

import (
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/policy"
	"github.com/tailgate-dev/tailgate/router"
	"github.com/tailgate-dev/tailgate/server/internal/servertest"
	"github.com/tailgate-dev/tailgate/serving/sim"
)

// prefer sends every first attempt to the replica it names, and a hedge or
// a retry to whatever else is left.
type prefer string

func (p prefer) Select(cands []*router.Replica, _ router.Hint) *router.Replica {
	for _, c := range cands {
		if c.ID == string(p) {
			return c
		}
	}
	return cands[0]
}

// TestGroupHeaderLetsPartsHedgeTogether: the parts of one fan-out, sent
// at once with the same x-tailgate-group header, all hedge past the
// burst cap that stops the same parts without the header (the group's
// share is kept for it and it may run one burst ahead on credit).
func TestGroupHeaderLetsPartsHedgeTogether(t *testing.T) {
	const parts = 4
	hedged := func(t *testing.T, group string) int {
		h := servertest.Start(t, servertest.Options{
			Replicas: 2,
			Sims: map[int]sim.Config{
				0: {TTFT: time.Second, TTFTSigma: -1},
				1: {TTFT: 5 * time.Millisecond, TTFTSigma: -1},
			},
			Router: router.Config{Selector: prefer("sim-a"),
				Hedge: router.HedgeConfig{Enabled: true, MinSamples: 5, Min: time.Millisecond, Budget: 0.001, Burst: 2}},
		})
		secret := h.Key(policy.KeyOptions{})
		slow := h.Reg.Get("sim-a")
		slow.SetState(router.StateDraining, "test")
		for range 6 {
			resp := h.Post("/v1/chat/completions", secret, `{"model":"tailgate-sim","max_tokens":1,"stream":true,"messages":[{"role":"user","content":"hi"}]}`)
			_, _ = io.ReadAll(resp.Body)
			resp.Body.Close()
		}
		slow.SetState(router.StateReady, "")
		var n atomic.Int64
		var wg sync.WaitGroup
		for range parts {
			wg.Go(func() {
				resp, err := postPart(h, secret, group)
				if err != nil {
					t.Error(err)
					return
				}
				if resp.Header.Get("X-Tailgate-Hedged") == "true" {
					n.Add(1)
				}
			})
		}
		wg.Wait()
		return int(n.Load())
	}
	if n := hedged(t, ""); n != 2 {
		t.Errorf("%d of %d ungrouped parts hedged, want the burst of 2", n, parts)
	}
	if n := hedged(t, "doc-1"); n != parts {
		t.Errorf("%d of %d parts of one group hedged, want all", n, parts)
	}
}

// TestGroupPartOnASlowReplicaIsAnsweredByItsHedge: with a window whose
// p95 is long and whose p90 is short, a part of a 4-part document on a
// slow replica is hedged at the group's lower percentile and answered by
// the hedge, while the same request without x-tailgate-group waits for
// the slow replica's answer (its delay is the model's p95).
func TestGroupPartOnASlowReplicaIsAnsweredByItsHedge(t *testing.T) {
	const parts = 4
	answered := func(t *testing.T, group string) (hedged int, replicas []string) {
		h := servertest.Start(t, servertest.Options{
			Replicas: 3,
			Sims: map[int]sim.Config{
				0: {TTFT: 400 * time.Millisecond, TTFTSigma: -1},  // sim-a: slow; every first attempt goes there
				1: {TTFT: 50 * time.Millisecond, TTFTSigma: -1},   // sim-b: where hedges go
				2: {TTFT: 1200 * time.Millisecond, TTFTSigma: -1}, // sim-c: the window's slow tail
			},
			// Budget 0.2 lets parts go down to the 85th percentile; a
			// part of 4 is hedged at the 90th.
			Router: router.Config{Selector: prefer("sim-a"),
				Hedge: router.HedgeConfig{Enabled: true, MinSamples: 20, Min: time.Millisecond, Budget: 0.2}},
		})
		secret := h.Key(policy.KeyOptions{})
		a, b, c := h.Reg.Get("sim-a"), h.Reg.Get("sim-b"), h.Reg.Get("sim-c")
		teach := func(n int, only *router.Replica) {
			for _, r := range []*router.Replica{a, b, c} {
				if r != only {
					r.SetState(router.StateDraining, "test")
				}
			}
			var wg sync.WaitGroup
			for range n {
				wg.Go(func() {
					resp := h.Post("/v1/chat/completions", secret, `{"model":"tailgate-sim","max_tokens":1,"stream":true,"messages":[{"role":"user","content":"hi"}]}`)
					_, _ = io.ReadAll(resp.Body)
					resp.Body.Close()
				})
				if only == b {
					wg.Wait() // one at a time: the fast samples come first
				}
			}
			wg.Wait()
			for _, r := range []*router.Replica{a, b, c} {
				r.SetState(router.StateReady, "")
			}
		}
		// 18 samples of 50ms, then 2 of 1.2s: p90 ~50ms, p95 1.2s.
		teach(18, b)
		teach(2, c)
		if d, ok := h.Reg.HedgeDelay("tailgate-sim", true); !ok || d < time.Second {
			t.Fatalf("lone hedge delay %v %v, want the 1.2s of the window's p95", d, ok)
		}
		c.SetState(router.StateDraining, "test") // hedges go to sim-b
		var mu sync.Mutex
		var wg sync.WaitGroup
		for range parts {
			wg.Go(func() {
				resp, err := postPart(h, secret, group)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				defer mu.Unlock()
				if resp.Header.Get("X-Tailgate-Hedged") == "true" {
					hedged++
				}
				replicas = append(replicas, resp.Header.Get("X-Tailgate-Replica"))
			})
		}
		wg.Wait()
		return hedged, replicas
	}
	if n, reps := answered(t, ""); n != 0 || slices.ContainsFunc(reps, func(r string) bool { return r != "sim-a" }) {
		t.Errorf("without a group: %d of %d hedged, answered by %v; want none hedged, all by the slow sim-a", n, parts, reps)
	}
	if n, reps := answered(t, "doc-1"); n != parts || slices.Contains(reps, "sim-a") {
		t.Errorf("parts of one group: %d of %d hedged, answered by %v; want all answered by their hedge on sim-b", n, parts, reps)
	}
}

// postPart streams one part of a document, in group unless group is "",
// and reads the answer whole; its headers say how it was served.
func postPart(h *servertest.Gateway, secret, group string) (*http.Response, error) {
	req, _ := http.NewRequest(http.MethodPost, h.Public.URL+"/v1/chat/completions",
		strings.NewReader(`{"model":"tailgate-sim","max_tokens":2,"stream":true,"messages":[{"role":"user","content":"part"}]}`))
	req.Header.Set("Authorization", "Bearer "+secret)
	if group != "" {
		req.Header.Set("X-Tailgate-Group", group)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	_, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, nil
}
