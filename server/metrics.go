package server

import (
	"fmt"
	"maps"
	"strconv"
	"sync"
	"sync/atomic"
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
	perModel readMap[string, *modelMetrics]

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

// readMap is a map that readers look up without a lock or an interface's
// hashing: the map is replaced whole, under a lock, when a key is added.
// For the few keys the hot path looks up on every request (models, status
// codes, endpoints), which are added rarely: sync.Map's loads of them were
// 0.3 % of the gateway's CPU at 1000 req/s (/work/wt/profile tg3.script,
// HashTrieMap.Load under metrics.model, modelMetrics.request).
type readMap[K comparable, V any] struct {
	mu sync.Mutex
	m  atomic.Pointer[map[K]V]
}

// load returns k's value; false when it has none.
func (r *readMap[K, V]) load(k K) (V, bool) {
	if m := r.m.Load(); m != nil {
		v, ok := (*m)[k]
		return v, ok
	}
	var zero V
	return zero, false
}

// loadOrMake returns k's value, made by mk and added the first time.
func (r *readMap[K, V]) loadOrMake(k K, mk func() V) V {
	if v, ok := r.load(k); ok {
		return v
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if v, ok := r.load(k); ok {
		return v
	}
	v := mk()
	next := map[K]V{k: v}
	if m := r.m.Load(); m != nil {
		maps.Copy(next, *m)
	}
	r.m.Store(&next)
	return v
}

// modelMetrics caches the per-model children so the hot path does no label
// hashing.
type modelMetrics struct {
	ttft        [2]prometheus.Observer // by answer: ttftJSON, ttftStream
	prompt      prometheus.Counter
	completion  prometheus.Counter
	overhead    prometheus.Counter
	codes       readMap[int, prometheus.Counter]
	genAI       readMap[string, *genAIObservers] // by endpoint path
	model       string
	requestsVec *prometheus.CounterVec
}

// model returns the children of model name, made the first time. A call
// looks its model up once, when it is admitted (call.mm).
func (m *metrics) model(name string) *modelMetrics {
	return m.perModel.loadOrMake(name, func() *modelMetrics {
		return &modelMetrics{
			ttft:        [2]prometheus.Observer{m.ttft.WithLabelValues(name, "json"), m.ttft.WithLabelValues(name, "stream")},
			prompt:      m.tokens.WithLabelValues(name, "prompt"),
			completion:  m.tokens.WithLabelValues(name, "completion"),
			overhead:    m.tokens.WithLabelValues(name, "hedge_overhead"),
			model:       name,
			requestsVec: m.requests,
		}
	})
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
	mm.codes.loadOrMake(code, func() prometheus.Counter {
		return mm.requestsVec.WithLabelValues(mm.model, strconv.Itoa(code))
	}).Inc()
}
