package server

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tailgate-dev/tailgate/data"
	"github.com/tailgate-dev/tailgate/server/slo"
)

// BenchmarkCallBookkeeping is what a JSON request costs the lookups around
// its answer, on every core at once: listed live, its model's metrics when
// admitted and again when counted, its tenant's cache salt, its status
// code's counter, its GenAI children, its latency budgets.
func BenchmarkCallBookkeeping(b *testing.B) {
	m, err := newMetrics(prometheus.NewRegistry(), nil, nil)
	if err != nil {
		b.Fatal(err)
	}
	live := newLiveCalls()
	salts := &cacheSalts{secret: []byte("bench")}
	ev, err := slo.New(slo.Config{}, nil)
	if err != nil {
		b.Fatal(err)
	}
	st := data.UnknownStages()
	st.Gateway, st.TTFT, st.Total = 100*time.Microsecond, 3*time.Millisecond, 3*time.Millisecond
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		var calls [64]call
		for i := range calls {
			calls[i] = call{id: "req", start: time.Now(), ep: chatEndpoint, source: slo.SourceDefault}
		}
		i := 0
		for pb.Next() {
			cl := &calls[i%len(calls)]
			i++
			bookkeep(m, live, salts, ev, cl, st)
		}
	})
}

func bookkeep(m *metrics, live *liveCalls, salts *cacheSalts, ev *slo.Evaluator, cl *call, st data.Stages) {
	slot := live.track(cl)
	cl.mm = m.model("m")
	_ = salts.of(42)
	mm := cl.mm
	mm.request(200)
	_ = mm.genAIFor(&m.genAI, cl.ep)
	ev.Observe(slo.Request{Model: mm.model, Source: cl.source, Kind: slo.JSON, Answered: true, Stages: st, End: cl.start.Add(st.Total)})
	live.untrack(slot)
}
