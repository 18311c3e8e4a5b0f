package batch_test

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"

	"github.com/tailgate-dev/tailgate/router"
	"github.com/tailgate-dev/tailgate/server/internal/servertest"
	"github.com/tailgate-dev/tailgate/serving/sim"
)

// preferReplica sends every first attempt to the replica it names, and a
// hedge or a retry to whatever else is left.
type preferReplica string

func (p preferReplica) Select(cands []*router.Replica, _ router.Hint) *router.Replica {
	for _, c := range cands {
		if c.ID == string(p) {
			return c
		}
	}
	return cands[0]
}

// TestBatchLinesHedgeAsOneGroup: the lines of one batch are parts of one
// fan-out, like requests with the same x-tailgate-group header: on a slow
// replica they all hedge, past the burst cap that stops as many lone
// requests (their batch's pot and credit, see router.hedgeBudget).
func TestBatchLinesHedgeAsOneGroup(t *testing.T) {
	const lines = 4
	fleet := servertest.StartSims(t, 2, sim.Config{}, map[int]sim.Config{
		0: {TTFT: time.Second, TTFTSigma: -1},
		1: {TTFT: 5 * time.Millisecond, TTFTSigma: -1},
	})
	g := startBatchGateway(t, t.TempDir(), fleet, batchOpts{router: router.Config{Selector: preferReplica("fleet-0"),
		Hedge: router.HedgeConfig{Enabled: true, MinSamples: 5, Min: time.Millisecond, Budget: 0.001, Burst: 2}}})
	secret := key(g, "acme")
	i := 0
	// A short hedge delay, learnt on the fast replica. The warm-up opts out
	// of hedging: one that hedged (a slow -race run) would spend a token the
	// batch is counted on.
	g.LearnWithout(g.Reg.Get("fleet-0"), 6, func() {
		body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"warm %d"}],"max_tokens":1}`, servertest.SimModel, i)
		i++
		req, err := http.NewRequest(http.MethodPost, g.Public.URL+"/v1/chat/completions", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+secret)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("x-tailgate-hedge", "off")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("warm-up request: %d", resp.StatusCode)
		}
	})

	c := g.Client(secret)
	b := createBatch(t, c, uploadBatchFile(t, c, chatLines(lines)).ID, openai.BatchNewParamsEndpointV1ChatCompletions)
	b = waitBatch(t, c, b.ID, statusIs(openai.BatchStatusCompleted, openai.BatchStatusFailed))
	if b.Status != openai.BatchStatusCompleted {
		t.Fatalf("batch = %s", b.RawJSON())
	}
	hedged := 0
	for _, r := range g.LedgerRows() {
		if strings.HasPrefix(r.ID, "req_"+b.ID) && r.Hedged {
			hedged++
		}
	}
	if hedged != lines {
		t.Errorf("%d of %d lines on the slow replica hedged, want all: the lines of a batch share its pot (a lone request gets the burst of 2)", hedged, lines)
	}
}
