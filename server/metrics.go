package server

import (
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"tailgate/router"
)

// Stage names used in Server-Timing, metrics and the ledger.
const (
	stageGateway      = "gateway"
	stageConnect      = "connect"
	stageUpstreamTTFT = "upstream_ttft"
	stageEngineQueue  = "engine_queue"
	stageEngineTTFT   = "engine_ttft"
	stageNetwork      = "network"
	stageTTFT         = "ttft"
	stageTotal        = "total"
)

// metrics holds the gateway's Prometheus collectors.
type metrics struct {
	requests  *prometheus.CounterVec
	stages    *prometheus.HistogramVec
	ttft      *prometheus.HistogramVec
	attempts  *prometheus.CounterVec
	hedges    *prometheus.CounterVec
	tokens    *prometheus.CounterVec
	ejections *prometheus.CounterVec
	inflight  prometheus.Gauge

	ejectDelay  prometheus.Histogram
	retries     *prometheus.CounterVec
	attemptsPer prometheus.Histogram

	stageObs [8]prometheus.Observer // indexed like stageNames
	perModel sync.Map               // model → *modelMetrics
}

var stageNames = [8]string{stageGateway, stageConnect, stageUpstreamTTFT, stageEngineQueue, stageEngineTTFT, stageNetwork, stageTTFT, stageTotal}

// latencyBuckets run from 100 µs to 60 s: gateway stages live at the bottom,
// model time at the top.
var latencyBuckets = []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}

func newMetrics(reg prometheus.Registerer, routes *router.Registry) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tailgate_requests_total", Help: "Requests answered, by model and HTTP status code.",
		}, []string{"model", "code"}),
		stages: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "tailgate_stage_duration_seconds", Help: "Duration of each stage of a request.", Buckets: latencyBuckets,
		}, []string{"stage"}),
		ttft: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "tailgate_ttft_seconds", Help: "Client-visible time to first token.", Buckets: latencyBuckets,
		}, []string{"model"}),
		attempts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tailgate_upstream_attempts_total", Help: "Upstream attempts by reason (first, retry, hedge).",
		}, []string{"model", "reason"}),
		hedges: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tailgate_hedges_total", Help: "Hedged attempts by outcome (won, lost).",
		}, []string{"model", "outcome"}),
		tokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tailgate_tokens_total", Help: "Tokens by kind (prompt, completion, hedge_overhead).",
		}, []string{"model", "kind"}),
		ejections: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tailgate_ejections_total", Help: "Replicas taken out of routing, by reason.",
		}, []string{"replica", "reason"}),
		ejectDelay: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "tailgate_ejection_delay_seconds", Help: "Time from a replica's first failure to its ejection.", Buckets: latencyBuckets,
		}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tailgate_retries_total", Help: "Attempts retried on another replica, by failure class (not_sent, declined, no_token).",
		}, []string{"model", "class"}),
		attemptsPer: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "tailgate_request_attempts", Help: "Upstream attempts per routed request.", Buckets: []float64{1, 2, 3, 4},
		}),
		inflight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tailgate_inflight_requests", Help: "Requests being served now.",
		}),
	}
	for i, name := range stageNames {
		m.stageObs[i] = m.stages.WithLabelValues(name)
	}
	reg.MustRegister(m.requests, m.stages, m.ttft, m.attempts, m.hedges, m.tokens, m.ejections, m.ejectDelay,
		m.retries, m.attemptsPer, m.inflight,
		&replicaCollector{reg: routes, desc: prometheus.NewDesc("tailgate_replica_inflight",
			"Requests the gateway has in flight on each replica.", []string{"replica"}, nil),
			stateDesc: prometheus.NewDesc("tailgate_replica_ready",
				"1 if the replica may take traffic, else 0.", []string{"replica"}, nil),
			waitingDesc: prometheus.NewDesc("tailgate_replica_engine_waiting",
				"Requests waiting in the replica's engine, from its last heartbeat.", []string{"replica"}, nil),
			ttftDesc: prometheus.NewDesc("tailgate_replica_ttft_estimate_seconds",
				"The replica's recent time to first token as the gateway sees it (selection input).", []string{"replica"}, nil),
			scoreDesc: prometheus.NewDesc("tailgate_replica_score",
				"The replica's load score (expected wait; lower is picked first).", []string{"replica"}, nil),
			budgetDesc: prometheus.NewDesc("tailgate_retry_budget_tokens",
				"Tokens left in the retry and hedge budget.", nil, nil)})
	return m
}

// modelMetrics caches the per-model children so the hot path does no label
// hashing.
type modelMetrics struct {
	ttft        prometheus.Observer
	prompt      prometheus.Counter
	completion  prometheus.Counter
	overhead    prometheus.Counter
	codes       sync.Map // int → prometheus.Counter
	model       string
	requestsVec *prometheus.CounterVec
}

func (m *metrics) model(name string) *modelMetrics {
	if mm, ok := m.perModel.Load(name); ok {
		return mm.(*modelMetrics)
	}
	mm := &modelMetrics{
		ttft:        m.ttft.WithLabelValues(name),
		prompt:      m.tokens.WithLabelValues(name, "prompt"),
		completion:  m.tokens.WithLabelValues(name, "completion"),
		overhead:    m.tokens.WithLabelValues(name, "hedge_overhead"),
		model:       name,
		requestsVec: m.requests,
	}
	actual, _ := m.perModel.LoadOrStore(name, mm)
	return actual.(*modelMetrics)
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

type replicaCollector struct {
	reg                                               *router.Registry
	desc, stateDesc, waitingDesc, ttftDesc, scoreDesc *prometheus.Desc
	budgetDesc                                        *prometheus.Desc
}

func (c *replicaCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.desc, c.stateDesc, c.waitingDesc, c.ttftDesc, c.scoreDesc, c.budgetDesc} {
		ch <- d
	}
}

func (c *replicaCollector) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(c.budgetDesc, prometheus.GaugeValue, c.reg.Budget().Tokens())
	for _, r := range c.reg.Replicas() {
		_, waiting, ttft, _, score := c.reg.ScoreInputs(r)
		ch <- prometheus.MustNewConstMetric(c.waitingDesc, prometheus.GaugeValue, waiting, r.ID)
		ch <- prometheus.MustNewConstMetric(c.ttftDesc, prometheus.GaugeValue, ttft, r.ID)
		ch <- prometheus.MustNewConstMetric(c.scoreDesc, prometheus.GaugeValue, score, r.ID)
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(r.Inflight()), r.ID)
		ready := 0.0
		if r.State() == router.StateReady {
			ready = 1
		}
		ch <- prometheus.MustNewConstMetric(c.stateDesc, prometheus.GaugeValue, ready, r.ID)
	}
}

// CountEjection counts a replica taken out of routing; wire it to
// router.Config.OnEject.
func (s *Server) CountEjection(rep *router.Replica, reason string, delay time.Duration) {
	s.m.ejections.WithLabelValues(rep.ID, reason).Inc()
	s.m.ejectDelay.Observe(delay.Seconds())
}

// Events returns the router.Events that feed the gateway's attempt, retry
// and hedge metrics; wire it to router.Config.Events.
func (s *Server) Events() router.Events { return routerEvents{s.m} }

// routerEvents adapts the router's attempt events to metrics.
type routerEvents struct{ m *metrics }

func (e routerEvents) Attempt(model string, reason router.AttemptReason) {
	e.m.attempts.WithLabelValues(model, reason.String()).Inc()
}

func (e routerEvents) Retry(model, class string) { e.m.retries.WithLabelValues(model, class).Inc() }

func (e routerEvents) Hedge(model string, won bool) {
	outcome := "lost"
	if won {
		outcome = "won"
	}
	e.m.hedges.WithLabelValues(model, outcome).Inc()
}
