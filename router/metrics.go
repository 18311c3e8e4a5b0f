package router

import (
	"fmt"
	"maps"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics holds the router's Prometheus collectors: what happened to
// attempts (counted where a [Call] decides it) and, read at scrape time, each
// replica's load and score and the budget's level.
type metrics struct {
	attempts    *prometheus.CounterVec // tailgate_upstream_attempts_total{model,reason}
	retries     *prometheus.CounterVec // tailgate_retries_total{model,class}
	hedges      *prometheus.CounterVec // tailgate_hedges_total{model,outcome}
	skips       *prometheus.CounterVec // tailgate_hedges_skipped_total{model,reason}
	paced       *prometheus.CounterVec // tailgate_pace_hedges_total{model,outcome}
	graces      *prometheus.CounterVec // tailgate_hedge_graces_total{model,winner}
	attemptsPer prometheus.Histogram   // tailgate_request_attempts
	ejections   *prometheus.CounterVec // tailgate_ejections_total{replica,reason}
	ejectDelay  prometheus.Histogram   // tailgate_ejection_delay_seconds
	sessions    *prometheus.CounterVec // tailgate_session_routes_total{outcome}

	// attemptsBy caches attempts' children per model, one per reason: a
	// label lookup per attempt (hashing both labels, the vec's lock) was
	// prometheus.GetMetricWithLabelValues in the gateway's CPU profile. It
	// is read without a lock (a sync.Map's load, hashing through an
	// interface, was 8 of the gateway's 41,038 samples at 1000 req/s in
	// /work/wt/profile tg3.script) and replaced whole under attemptsMu
	// when a model is added.
	attemptsBy atomic.Pointer[map[string]*[3]prometheus.Counter]
	attemptsMu sync.Mutex
}

// latencyBuckets run from 100 µs to 60 s, as the gateway's other latency
// histograms do.
var latencyBuckets = []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}

// newMetrics makes the router's collectors and registers them with reg; a
// nil reg leaves them unregistered (counted, never exported).
func newMetrics(reg prometheus.Registerer, r *Registry) (*metrics, error) {
	m := &metrics{
		attempts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tailgate_upstream_attempts_total", Help: "Upstream attempts by reason (first, retry, hedge).",
		}, []string{"model", "reason"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tailgate_retries_total", Help: "Attempts retried on another replica, by failure class (not_sent, declined, no_token).",
		}, []string{"model", "class"}),
		hedges: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tailgate_hedges_total", Help: "Hedged attempts by outcome (won, lost).",
		}, []string{"model", "outcome"}),
		skips: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tailgate_hedges_skipped_total",
			Help: "Hedges not started when a request passed its hedge delay, by reason (budget: the model's share of requests is spent; burst: earned but beyond --hedge-burst; saturation: the other replica is full or queueing; opt_out: x-tailgate-hedge: off; disabled: hedging is off for the model; priority: every other replica has requests of a higher priority class in flight).",
		}, []string{"model", "reason"}),
		paced: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tailgate_pace_hedges_total",
			Help: "Hedges on decode pace (an answer the client sees only whole fell behind the model's time per token), by outcome (won, lost; skipped: not started, the reason counted in tailgate_hedges_skipped_total). Those started count in tailgate_hedges_total and tailgate_upstream_attempts_total{reason=\"hedge\"} too.",
		}, []string{"model", "outcome"}),
		graces: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tailgate_hedge_graces_total",
			Help: "Hedged requests whose original produced its first token while the hedge had none yet, so the original was held back for a grace (the model's median time to first token), by winner (hedge: the hedge's first token came within the grace, the original was cancelled as the loser; original: it did not, or the hedge failed).",
		}, []string{"model", "winner"}),
		attemptsPer: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "tailgate_request_attempts", Help: "Upstream attempts per routed request.", Buckets: []float64{1, 2, 3, 4},
		}),
		ejections: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tailgate_ejections_total", Help: "Replicas taken out of routing, by reason: connect, probe, ttft_deadline, idle_deadline, midstream (after failures); lost (its lease ended while ready); engine (its worker reported the engine failed); restarted (its worker came back at another address while it was ready).",
		}, []string{"replica", "reason"}),
		ejectDelay: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "tailgate_ejection_delay_seconds", Help: "Time from a replica's first failure to its ejection.", Buckets: latencyBuckets,
		}),
		sessions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tailgate_session_routes_total",
			Help: "Attempts of requests that named a session, with --affinity=session, by outcome (stayed: on the replica of the session's last turn; placed: a session not known, its first turn or one forgotten; moved_gone: its replica is gone, not ready or tried already; moved_load: its replica was over the load bound).",
		}, []string{"outcome"}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.attempts, m.retries, m.hedges, m.skips, m.paced, m.graces, m.attemptsPer, m.ejections, m.ejectDelay, m.sessions, newReplicaCollector(r)} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("router: register metrics: %w", err)
		}
	}
	return m, nil
}

func (m *metrics) attempt(model string, reason AttemptReason) {
	if by := m.attemptsBy.Load(); by != nil {
		if c := (*by)[model]; c != nil {
			c[reason].Inc()
			return
		}
	}
	m.attemptsMu.Lock()
	defer m.attemptsMu.Unlock()
	by := map[string]*[3]prometheus.Counter{}
	if old := m.attemptsBy.Load(); old != nil {
		maps.Copy(by, *old)
	}
	c := by[model]
	if c == nil {
		c = new([3]prometheus.Counter)
		for r := range c {
			c[r] = m.attempts.WithLabelValues(model, AttemptReason(r).String())
		}
		by[model] = c
		m.attemptsBy.Store(&by)
	}
	c[reason].Inc()
}

func (m *metrics) retry(model, class string) { m.retries.WithLabelValues(model, class).Inc() }

// hedged counts a hedged request's outcome: won is true when the hedge (not
// the first attempt) produced the answer.
func (m *metrics) hedged(model string, won bool) {
	outcome := "lost"
	if won {
		outcome = "won"
	}
	m.hedges.WithLabelValues(model, outcome).Inc()
}

// skipped counts a hedge that did not start, for one of the skip* reasons.
func (m *metrics) skipped(model, reason string) { m.skips.WithLabelValues(model, reason).Inc() }

// paceHedge counts a pace hedge's outcome: "won", "lost" or "skipped".
func (m *metrics) paceHedge(model, outcome string) { m.paced.WithLabelValues(model, outcome).Inc() }

// graced counts a late original's grace by its winner: "hedge" or "original".
func (m *metrics) graced(model, winner string) { m.graces.WithLabelValues(model, winner).Inc() }

func (m *metrics) session(outcome string) { m.sessions.WithLabelValues(outcome).Inc() }

// routed records how many attempts a request took (none when no replica
// could be picked).
func (m *metrics) routed(attempts int) {
	if attempts > 0 {
		m.attemptsPer.Observe(float64(attempts))
	}
}

// replicaCollector reads each replica's selection inputs, the budgets'
// levels and the hedge delays when scraped.
type replicaCollector struct {
	reg                                           *Registry
	inflight, ready, waiting, ttft, score, budget *prometheus.Desc
	inflightClass, hedgeDelay, hedgeBudget        *prometheus.Desc
	lost, modelReady                              *prometheus.Desc
}

func newReplicaCollector(r *Registry) *replicaCollector {
	per := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, []string{"replica"}, nil)
	}
	return &replicaCollector{
		reg:      r,
		inflight: per("tailgate_replica_inflight", "Requests the gateway has in flight on each replica."),
		inflightClass: prometheus.NewDesc("tailgate_replica_inflight_class",
			"Requests the gateway has in flight on each replica by priority class (a hedge does not go where a higher class runs).",
			[]string{"replica", "class"}, nil),
		ready: per("tailgate_replica_ready", "1 if the replica may take traffic, else 0 (also while it is lost, until it is forgotten)."),
		lost:  per("tailgate_replica_lost", "1 if the replica's lease ended (its worker stopped sending heartbeats): listed, never routed to, until its worker is heard again, an operator forgets it or the forget time passes; else 0."),
		modelReady: prometheus.NewDesc("tailgate_model_ready_replicas",
			"Ready replicas per model any listed replica serves (lost ones included): 0 means every request for the model is refused with 503 no_replica.",
			[]string{"model"}, nil),
		waiting: per("tailgate_replica_engine_waiting", "Requests waiting in the replica's engine, from its last heartbeat."),
		ttft:    per("tailgate_replica_ttft_estimate_seconds", "The replica's recent time to first token as the gateway sees it (selection input)."),
		score:   per("tailgate_replica_score", "The replica's load score (expected wait; lower is picked first)."),
		budget:  prometheus.NewDesc("tailgate_retry_budget_tokens", "Tokens left in the retry budget.", nil, nil),
		hedgeDelay: prometheus.NewDesc("tailgate_hedge_delay_seconds",
			"The hedge delay in force per model and answer kind (stream, json): the percentile of recent time to first token; absent until learnt or while hedging is off for the model.",
			[]string{"model", "answer"}, nil),
		hedgeBudget: prometheus.NewDesc("tailgate_hedge_budget_tokens",
			"Hedges the model's budget holds now (below zero while fan-out parts' credit is repaid).", []string{"model"}, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *replicaCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.inflight, c.ready, c.waiting, c.ttft, c.score, c.budget, c.inflightClass, c.hedgeDelay, c.hedgeBudget, c.lost, c.modelReady} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *replicaCollector) Collect(ch chan<- prometheus.Metric) {
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	gauge(c.budget, c.reg.budget.Tokens())
	for _, w := range c.reg.hedges.delays() {
		answer := "json"
		if w.stream {
			answer = "stream"
		}
		gauge(c.hedgeDelay, time.Duration(w.delay.Load()).Seconds(), w.model, answer)
	}
	for model, level := range c.reg.hedges.levels() {
		gauge(c.hedgeBudget, level, model)
	}
	readyPer := map[string]int{}
	for _, r := range c.reg.Replicas() {
		isReady := r.State() == StateReady
		for _, m := range r.Models() {
			n := readyPer[m]
			if isReady {
				n++
			}
			readyPer[m] = n // listed with 0 when none is ready
		}
		_, waiting, ttft, _, score := c.reg.ScoreInputs(r)
		gauge(c.waiting, waiting, r.ID)
		gauge(c.ttft, ttft, r.ID)
		gauge(c.score, score, r.ID)
		gauge(c.inflight, float64(r.Inflight()), r.ID)
		for _, cl := range []Class{ClassBatch, ClassStandard, ClassInteractive} {
			gauge(c.inflightClass, float64(r.InflightClass(cl)), r.ID, cl.String())
		}
		ready := 0.0
		if r.State() == StateReady {
			ready = 1
		}
		gauge(c.ready, ready, r.ID)
		lost := 0.0
		if r.State() == StateLost {
			lost = 1
		}
		gauge(c.lost, lost, r.ID)
	}
	for m, n := range readyPer {
		gauge(c.modelReady, float64(n), m)
	}
}
