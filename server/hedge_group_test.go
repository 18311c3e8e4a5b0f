package server_test

import (
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"tailgate/policy"
	"tailgate/router"
	"tailgate/server/internal/servertest"
	"tailgate/serving/sim"
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
				req, _ := http.NewRequest(http.MethodPost, h.Public.URL+"/v1/chat/completions",
					strings.NewReader(`{"model":"tailgate-sim","max_tokens":2,"stream":true,"messages":[{"role":"user","content":"part"}]}`))
				req.Header.Set("Authorization", "Bearer "+secret)
				if group != "" {
					req.Header.Set("X-Tailgate-Group", group)
				}
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Error(err)
					return
				}
				_, _ = io.ReadAll(resp.Body)
				resp.Body.Close()
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
