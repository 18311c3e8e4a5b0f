package server

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tailgate-dev/tailgate/data"
)

// TestGenAIMetricsObserveWithoutAllocating: a request that ended ok is
// counted in the GenAI metrics through its model's cached children, with
// no allocation (no label hashing) on the hot path.
func TestGenAIMetricsObserveWithoutAllocating(t *testing.T) {
	g := newGenAIMetrics()
	prometheus.NewRegistry().MustRegister(g.duration, g.ttft, g.tpot, g.tokens)
	m := &metrics{genAI: g}
	cl := &call{ep: endpoint{path: "/v1/chat/completions", generates: true}, mm: &modelMetrics{model: "m"},
		req: &parsedRequest{stream: true}, outcome: data.OutcomeOK, stages: data.UnknownStages()}
	cl.stages.Total, cl.stages.TTFT = time.Second, 100*time.Millisecond
	cl.usage.PromptTokens, cl.usage.CompletionTokens = 10, 20
	m.observeGenAI(cl) // the first of its model and endpoint makes the children
	if n := testing.AllocsPerRun(1000, func() { m.observeGenAI(cl) }); n != 0 {
		t.Fatalf("observing an ok request allocates %v times", n)
	}
}
