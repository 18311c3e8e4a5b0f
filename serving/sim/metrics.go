package sim

import (
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Bucket bounds as vLLM uses them, so dashboards built for vLLM read the
// simulator unchanged.
var (
	ttftBuckets    = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80, 160, 640, 2560}
	tpotBuckets    = []float64{0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80}
	requestBuckets = []float64{0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120, 240, 480, 960, 1920, 7680}
)

// metrics are the engine's Prometheus series, named and labelled as vLLM
// v1's PrometheusStatLogger names them (vllm/v1/metrics/loggers.py): every
// series carries model_name and engine ("0": one engine core).
type metrics struct {
	maxSeqs, kvCap float64

	running, waiting, kvUsage                prometheus.Gauge
	waitingCapacity, waitingDeferred         prometheus.Gauge
	ttft, e2e, queue, itl, requestTPOT       prometheus.Histogram
	prefillTime                              prometheus.Histogram
	promptTokens, genTokens                  prometheus.Counter
	preemptions, prefixQueries, prefixHits   prometheus.Counter
	sleepState                               *prometheus.GaugeVec
	success                                  *prometheus.CounterVec
	successStop, successLength, successAbort prometheus.Counter
	aborted                                  prometheus.Counter
	collected                                []prometheus.Collector
}

func newMetrics(model string, maxSeqs, kvCap int) *metrics {
	labels := prometheus.Labels{"model_name": model, "engine": "0"}
	gauge := func(name, help string) prometheus.Gauge {
		return prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help, ConstLabels: labels})
	}
	hist := func(name, help string, buckets []float64) prometheus.Histogram {
		return prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, ConstLabels: labels, Buckets: buckets})
	}
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: labels})
	}
	byReason := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "vllm:num_requests_waiting_by_reason",
		Help: "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for scheduling capacity; " +
			"'deferred' = deferred by transient constraints (LoRA budget, KV transfer, blocked status). " +
			"Sum of all reasons equals vllm:num_requests_waiting.",
		ConstLabels: labels,
	}, []string{"reason"})
	m := &metrics{
		maxSeqs:         float64(maxSeqs),
		kvCap:           float64(kvCap),
		running:         gauge("vllm:num_requests_running", "Number of requests in model execution batches."),
		waiting:         gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed."),
		waitingCapacity: byReason.WithLabelValues("capacity"),
		waitingDeferred: byReason.WithLabelValues("deferred"),
		kvUsage:         gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."),
		ttft:            hist("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", ttftBuckets),
		e2e:             hist("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", requestBuckets),
		queue:           hist("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", requestBuckets),
		prefillTime:     hist("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.", requestBuckets),
		itl:             hist("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", tpotBuckets),
		requestTPOT:     hist("vllm:request_time_per_output_token_seconds", "Histogram of time_per_output_token_seconds per request.", tpotBuckets),
		promptTokens:    counter("vllm:prompt_tokens_total", "Number of prefill tokens processed."),
		genTokens:       counter("vllm:generation_tokens_total", "Number of generation tokens processed."),
		preemptions:     counter("vllm:num_preemptions_total", "Cumulative number of preemption from the engine."),
		prefixQueries:   counter("vllm:prefix_cache_queries_total", "Prefix cache queries, in terms of number of queried tokens."),
		prefixHits:      counter("vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens."),
		sleepState: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "vllm:engine_sleep_state",
			Help: "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is awake; " +
				"weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.",
			ConstLabels: labels,
		}, []string{"sleep_state"}),
		success: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name:        "vllm:request_success_total",
			Help:        "Count of successfully processed requests.",
			ConstLabels: labels,
		}, []string{"finished_reason"}),
		aborted: counter("tailgate_sim_aborted_total", "Requests aborted because their client disconnected."),
	}
	m.setSleepState(0) // awake until a /sleep (sleep.go)
	m.waitingDeferred.Set(0)
	m.successStop = m.success.WithLabelValues("stop")
	m.successLength = m.success.WithLabelValues("length")
	m.successAbort = m.success.WithLabelValues("abort")
	m.collected = []prometheus.Collector{
		m.running, m.waiting, byReason, m.kvUsage, m.sleepState,
		m.ttft, m.e2e, m.queue, m.prefillTime, m.itl, m.requestTPOT,
		m.promptTokens, m.genTokens, m.preemptions, m.prefixQueries, m.prefixHits,
		m.success, m.aborted,
	}
	return m
}

// setSleepState sets vllm:engine_sleep_state: 1 on the state's series
// (awake, or the level's), 0 on the others, as vLLM does.
func (m *metrics) setSleepState(level int) {
	for l := range 3 {
		v := 0.0
		if l == level {
			v = 1
		}
		m.sleepState.WithLabelValues(sleepStateName(l)).Set(v)
	}
}

// register adds every collector to reg, or none of them.
func (m *metrics) register(reg prometheus.Registerer) error {
	var done []prometheus.Collector
	for _, c := range m.collected {
		if err := reg.Register(c); err != nil {
			for _, d := range done {
				reg.Unregister(d)
			}
			return fmt.Errorf("register metrics: %w", err)
		}
		done = append(done, c)
	}
	return nil
}

// setLoad publishes the scheduler's state. Every waiting request waits for
// capacity (slots or KV room): the simulator defers none. KV usage is the
// share of the cache the running requests hold, or, without a KV limit, the
// share of slots taken.
func (m *metrics) setLoad(running, waiting, kv int) {
	m.running.Set(float64(running))
	m.waiting.Set(float64(waiting))
	m.waitingCapacity.Set(float64(waiting))
	if m.kvCap > 0 {
		m.kvUsage.Set(float64(kv) / m.kvCap)
	} else {
		m.kvUsage.Set(float64(running) / m.maxSeqs)
	}
}

// scheduled records a request's prompt meeting the prefix cache.
func (m *metrics) scheduled(promptTokens, hits int) {
	m.prefixQueries.Add(float64(promptTokens))
	m.prefixHits.Add(float64(hits))
}

// prefilled records a request's first token: its prompt is processed.
func (m *metrics) prefilled(promptTokens int, arrived, first time.Time) {
	m.ttft.Observe(first.Sub(arrived).Seconds())
	m.promptTokens.Add(float64(promptTokens))
}

// finished records a request that generated all its tokens over steps
// decoding steps.
func (m *metrics) finished(completionTokens, steps int, length bool, arrived, first, end time.Time) {
	m.e2e.Observe(end.Sub(arrived).Seconds())
	if steps > 1 {
		// vLLM: the mean gap per request, from the first token to the last.
		m.requestTPOT.Observe(end.Sub(first).Seconds() / float64(steps-1))
	}
	m.genTokens.Add(float64(completionTokens))
	if length {
		m.successLength.Inc()
	} else {
		m.successStop.Inc()
	}
}

// abortedRequest records a request its client gave up on after generated
// tokens.
func (m *metrics) abortedRequest(generated int) {
	m.genTokens.Add(float64(generated))
	m.aborted.Inc()
	m.successAbort.Inc()
}
