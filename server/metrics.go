package server

import (
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tailgate-dev/tailgate/data"
	"github.com/tailgate-dev/tailgate/policy"
)

// metrics holds the server's Prometheus collectors: requests, stages,
// tokens and time to first token. Routing metrics (attempts, retries,
// hedges, ejections, per-replica load) are the router's own.
type metrics struct {
	requests *prometheus.CounterVec
	stages   *prometheus.HistogramVec
	ttft     *prometheus.HistogramVec
	tokens   *prometheus.CounterVec
	inflight prometheus.Gauge
	// bodyBytes is the request-body bytes held now (Config.MaxBodyBytesInFlight).
	bodyBytes prometheus.Gauge
	// rowsSkipped counts refused requests whose ledger row was not written
	// (over Config.RejectedRows).
	rowsSkipped prometheus.Counter

	// queueWait observes how long each admitted request waited in the
	// admission queue, by its class (0 when admitted at once).
	queueWait [len(policy.Classes)]prometheus.Observer // indexed by policy.Class

	stageObs [len(data.StageNames)]prometheus.Observer // indexed like data.StageNames
	perModel sync.Map                                  // model → *modelMetrics

	genAI genAIMetrics
}

// latencyBuckets run from 100 µs to 60 s: gateway stages live at the bottom,
// model time at the top.
var latencyBuckets = []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}

// newMetrics makes the server's collectors and registers them with reg.
func newMetrics(reg prometheus.Registerer, ledger *data.LedgerWriter, queue *policy.AdmissionQueue) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tailgate_requests_total", Help: "Requests answered, by model and HTTP status code.",
		}, []string{"model", "code"}),
		stages: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "tailgate_stage_duration_seconds", Help: "Duration of each stage of a request.", Buckets: latencyBuckets,
		}, []string{"stage"}),
		ttft: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "tailgate_ttft_seconds", Help: "Client-visible time to first token, by model and answer (stream, or json: a whole answer's first byte is its last).", Buckets: latencyBuckets,
		}, []string{"model", "answer"}),
		tokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tailgate_tokens_total", Help: "Tokens by kind (prompt, completion, hedge_overhead).",
		}, []string{"model", "kind"}),
		inflight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tailgate_inflight_requests", Help: "Requests being served now.",
		}),
		bodyBytes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tailgate_request_body_bytes_inflight", Help: "Request-body bytes the gateway holds now, against --max-body-bytes-in-flight.",
		}),
		rowsSkipped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tailgate_ledger_rows_skipped_total", Help: "Refused requests not written to the ledger (over the rejected-rows rate).",
		}),
	}
	for i, name := range data.StageNames {
		m.stageObs[i] = m.stages.WithLabelValues(name)
	}
	ledgerUp := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "tailgate_ledger_up", Help: "1 while the ledger persists rows and new requests are taken; 0 while it cannot (the gateway refuses with 503 ledger_unavailable).",
	}, func() float64 {
		if ledger.Healthy() != nil {
			return 0
		}
		return 1
	})
	backlog := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "tailgate_ledger_backlog_rows", Help: "Ledger rows waiting to be written.",
	}, func() float64 { return float64(ledger.Backlog()) })
	queueWait := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "tailgate_admission_wait_seconds", Help: "Time admitted generation requests waited in the admission queue, by priority class.", Buckets: latencyBuckets,
	}, []string{"class"})
	m.genAI = newGenAIMetrics()
	cs := []prometheus.Collector{m.requests, m.stages, m.ttft, m.tokens, m.inflight, m.bodyBytes, m.rowsSkipped, ledgerUp, backlog, queueWait,
		m.genAI.duration, m.genAI.ttft, m.genAI.tpot, m.genAI.tokens}
	for _, c := range policy.Classes {
		m.queueWait[c] = queueWait.WithLabelValues(c.String())
		cs = append(cs, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "tailgate_admission_queue_length", Help: "Generation requests waiting in the admission queue now, by priority class.",
			ConstLabels: prometheus.Labels{"class": c.String()},
		}, func() float64 { return float64(queue.Waiting(c)) }))
	}
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("server: register metrics: %w", err)
		}
	}
	return m, nil
}

// modelMetrics caches the per-model children so the hot path does no label
// hashing.
type modelMetrics struct {
	ttft        [2]prometheus.Observer // by answer: ttftJSON, ttftStream
	prompt      prometheus.Counter
	completion  prometheus.Counter
	overhead    prometheus.Counter
	codes       sync.Map // int → prometheus.Counter
	genAI       sync.Map // endpoint path → *genAIObservers
	model       string
	requestsVec *prometheus.CounterVec
}

func (m *metrics) model(name string) *modelMetrics {
	if mm, ok := m.perModel.Load(name); ok {
		return mm.(*modelMetrics)
	}
	mm := &modelMetrics{
		ttft:        [2]prometheus.Observer{m.ttft.WithLabelValues(name, "json"), m.ttft.WithLabelValues(name, "stream")},
		prompt:      m.tokens.WithLabelValues(name, "prompt"),
		completion:  m.tokens.WithLabelValues(name, "completion"),
		overhead:    m.tokens.WithLabelValues(name, "hedge_overhead"),
		model:       name,
		requestsVec: m.requests,
	}
	actual, _ := m.perModel.LoadOrStore(name, mm)
	return actual.(*modelMetrics)
}

// Indexes of modelMetrics.ttft: the answer label's two values.
const (
	ttftJSON   = 0
	ttftStream = 1
)

// observeTTFT counts a client-visible time to first token apart for streams
// and JSON answers: one histogram of both would put whole answers into the
// streams' percentiles.
func (mm *modelMetrics) observeTTFT(stream bool, d time.Duration) {
	i := ttftJSON
	if stream {
		i = ttftStream
	}
	mm.ttft[i].Observe(d.Seconds())
}

func (mm *modelMetrics) request(code int) {
	if c, ok := mm.codes.Load(code); ok {
		c.(prometheus.Counter).Inc()
		return
	}
	c := mm.requestsVec.WithLabelValues(mm.model, strconv.Itoa(code))
	mm.codes.Store(code, c)
	c.Inc()
}
