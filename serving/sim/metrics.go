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

// metrics are the engine's Prometheus series, named as vLLM names them and
// labelled with model_name.
type metrics struct {
	maxSeqs float64

	running, waiting, kvUsage prometheus.Gauge
	ttft, e2e, queue, tpot    prometheus.Histogram
	promptTokens, genTokens   prometheus.Counter
	success                   *prometheus.CounterVec
	successStop               prometheus.Counter
	successLength             prometheus.Counter
	successAbort              prometheus.Counter
	aborted                   prometheus.Counter
}

func newMetrics(model string, maxSeqs int) *metrics {
	labels := prometheus.Labels{"model_name": model}
	gauge := func(name, help string) prometheus.Gauge {
		return prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help, ConstLabels: labels})
	}
	hist := func(name, help string, buckets []float64) prometheus.Histogram {
		return prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, ConstLabels: labels, Buckets: buckets})
	}
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: labels})
	}
	m := &metrics{
		maxSeqs:      float64(maxSeqs),
		running:      gauge("vllm:num_requests_running", "Number of requests in model execution batches."),
		waiting:      gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed."),
		kvUsage:      gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage (simulated: running/max_num_seqs)."),
		ttft:         hist("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", ttftBuckets),
		e2e:          hist("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", requestBuckets),
		queue:        hist("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", requestBuckets),
		tpot:         hist("vllm:time_per_output_token_seconds", "Histogram of time per output token in seconds.", tpotBuckets),
		promptTokens: counter("vllm:prompt_tokens_total", "Number of prefill tokens processed."),
		genTokens:    counter("vllm:generation_tokens_total", "Number of generation tokens processed."),
		success: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name:        "vllm:request_success_total",
			Help:        "Count of finished requests, by finished reason.",
			ConstLabels: labels,
		}, []string{"finished_reason"}),
		aborted: counter("tailgate_sim_aborted_total", "Requests aborted because their client disconnected."),
	}
	m.successStop = m.success.WithLabelValues("stop")
	m.successLength = m.success.WithLabelValues("length")
	m.successAbort = m.success.WithLabelValues("abort")
	return m
}

func (m *metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{
		m.running, m.waiting, m.kvUsage,
		m.ttft, m.e2e, m.queue, m.tpot,
		m.promptTokens, m.genTokens, m.success, m.aborted,
	}
}

// register adds every collector to reg, or none of them.
func (m *metrics) register(reg prometheus.Registerer) error {
	var done []prometheus.Collector
	for _, c := range m.collectors() {
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

// setLoad publishes the scheduler's state; the simulator has no KV cache, so
// its usage is the share of slots taken.
func (m *metrics) setLoad(running, waiting int) {
	m.running.Set(float64(running))
	m.waiting.Set(float64(waiting))
	m.kvUsage.Set(float64(running) / m.maxSeqs)
}

// prefilled records a request's first token: its prompt is processed.
func (m *metrics) prefilled(promptTokens int, arrived, first time.Time) {
	m.ttft.Observe(first.Sub(arrived).Seconds())
	m.promptTokens.Add(float64(promptTokens))
}

// finished records a request that generated all its tokens.
func (m *metrics) finished(completionTokens int, length bool, arrived, first, end time.Time) {
	m.e2e.Observe(end.Sub(arrived).Seconds())
	if completionTokens > 1 {
		m.tpot.Observe(end.Sub(first).Seconds() / float64(completionTokens-1))
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
