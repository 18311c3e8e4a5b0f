package sidecar

import (
	"context"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/e2e/testkit"
	"github.com/tailgate-dev/tailgate/serving"
	"github.com/tailgate-dev/tailgate/serving/sim"
)

// runSidecar runs s.Run until the test ends and checks it returns nil.
func runSidecar(t *testing.T, s *Sidecar) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run = %v", err)
		}
	})
}

func TestLoadFollowsTheEngineQueue(t *testing.T) {
	eng := startEngine(t, sim.Config{Model: "m", MaxSeqs: 1, TPOT: time.Hour})
	s, sc := startSidecar(t, eng.srv.URL, func(c *Config) { c.ScrapeInterval = 5 * time.Millisecond })
	runSidecar(t, s)
	// What an idle engine reports of itself (awake, nothing waiting for
	// any reason) may be there or not; the load is none.
	if l := s.Load(); l.Inflight != 0 || l.Waiting != 0 || l.Running != 0 || l.KVCacheUsage != 0 || l.TTFTMillisP50 != 0 {
		t.Errorf("idle load = %+v", l)
	}

	ctx, disconnect := context.WithCancel(context.Background())
	defer disconnect()
	var wg sync.WaitGroup
	var tokens atomic.Int32
	for range 3 {
		wg.Go(func() {
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, sc.URL+"/v1/chat/completions",
				strings.NewReader(`{"messages":[{"role":"user","content":"long"}],"max_tokens":100,"ignore_eos":true,"stream":true}`))
			req.Header.Set("Authorization", "Bearer "+testToken)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				if ctx.Err() == nil {
					t.Errorf("open stream: %v", err)
				}
				return // disconnected before the headers came
			}
			defer resp.Body.Close()
			buf := make([]byte, 4096)
			for {
				n, err := resp.Body.Read(buf)
				if strings.Contains(string(buf[:n]), serving.TimingComment) {
					tokens.Add(1)
				}
				if err != nil {
					return
				}
			}
		})
	}
	var l serving.Load
	testkit.WaitFor(t, "the scrape to see the queue", func() bool {
		l = s.Load()
		return l.Waiting >= 1 && l.Running == 1
	})
	testkit.WaitFor(t, "the scrape to see the whole queue", func() bool { l = s.Load(); return l.Waiting == 2 })
	if l.Inflight != 3 || l.KVCacheUsage != 1 {
		t.Errorf("load under a queue = %+v, want 3 in flight and a full cache", l)
	}
	testkit.WaitFor(t, "the first token", func() bool { return tokens.Load() == 1 })
	if p50 := s.Load().TTFTMillisP50; p50 <= 0 {
		t.Errorf("TTFT p50 = %v after a token", p50)
	}

	disconnect()
	wg.Wait()
	testkit.WaitFor(t, "the scrape to see the engine idle", func() bool {
		l = s.Load()
		return l.Waiting == 0 && l.Running == 0 && l.Inflight == 0 && l.KVCacheUsage == 0
	})
}

const metricsCurrent = `# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 2.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 4.0
vllm:num_requests_waiting{engine="1",model_name="m"} 1.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.25
`

// metricsOld is what vLLM builds before the cache metric's rename expose.
const metricsOld = `# HELP vllm:num_requests_running Number of requests currently running on GPU.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="old"} 7.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="old"} 12.0
# HELP vllm:num_requests_swapped Number of requests swapped to CPU.
# TYPE vllm:num_requests_swapped gauge
vllm:num_requests_swapped{model_name="old"} 0.0
# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="old"} 0.875
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{le="0.001",model_name="old"} 0.0
vllm:time_to_first_token_seconds_bucket{le="+Inf",model_name="old"} 3.0
vllm:time_to_first_token_seconds_count{model_name="old"} 3.0
vllm:time_to_first_token_seconds_sum{model_name="old"} 0.3
`

// metricsDP2 is a current vLLM's /metrics (the loggers.py of 2025-26, as
// prometheus_client writes it: counters' families end in _total and come with
// a _created gauge) for a model served with data parallelism 2, trimmed to
// the families the sidecar reads plus some it must skip. Rank 0 has requests
// waiting for room in its batch and one held back for its grammar; both
// ranks preempted; the engine is awake.
const metricsDP2 = `# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="Qwen/Qwen3-8B"} 6.0
vllm:num_requests_running{engine="1",model_name="Qwen/Qwen3-8B"} 4.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="Qwen/Qwen3-8B"} 3.0
vllm:num_requests_waiting{engine="1",model_name="Qwen/Qwen3-8B"} 0.0
# HELP vllm:num_requests_waiting_by_reason Number of requests waiting, by reason.
# TYPE vllm:num_requests_waiting_by_reason gauge
vllm:num_requests_waiting_by_reason{engine="0",model_name="Qwen/Qwen3-8B",reason="capacity"} 2.0
vllm:num_requests_waiting_by_reason{engine="0",model_name="Qwen/Qwen3-8B",reason="deferred"} 1.0
vllm:num_requests_waiting_by_reason{engine="1",model_name="Qwen/Qwen3-8B",reason="capacity"} 0.0
vllm:num_requests_waiting_by_reason{engine="1",model_name="Qwen/Qwen3-8B",reason="deferred"} 0.0
# HELP vllm:engine_sleep_state Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is awake; weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.
# TYPE vllm:engine_sleep_state gauge
vllm:engine_sleep_state{engine="0",model_name="Qwen/Qwen3-8B",sleep_state="awake"} 1.0
vllm:engine_sleep_state{engine="1",model_name="Qwen/Qwen3-8B",sleep_state="awake"} 1.0
vllm:engine_sleep_state{engine="0",model_name="Qwen/Qwen3-8B",sleep_state="weights_offloaded"} 0.0
vllm:engine_sleep_state{engine="1",model_name="Qwen/Qwen3-8B",sleep_state="weights_offloaded"} 0.0
vllm:engine_sleep_state{engine="0",model_name="Qwen/Qwen3-8B",sleep_state="discard_all"} 0.0
vllm:engine_sleep_state{engine="1",model_name="Qwen/Qwen3-8B",sleep_state="discard_all"} 0.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="Qwen/Qwen3-8B"} 0.9
vllm:kv_cache_usage_perc{engine="1",model_name="Qwen/Qwen3-8B"} 0.5
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="Qwen/Qwen3-8B"} 120000.0
vllm:prefix_cache_queries_total{engine="1",model_name="Qwen/Qwen3-8B"} 80000.0
# HELP vllm:prefix_cache_queries_created Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_created gauge
vllm:prefix_cache_queries_created{engine="0",model_name="Qwen/Qwen3-8B"} 1.7591e+09
vllm:prefix_cache_queries_created{engine="1",model_name="Qwen/Qwen3-8B"} 1.7591e+09
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="Qwen/Qwen3-8B"} 90000.0
vllm:prefix_cache_hits_total{engine="1",model_name="Qwen/Qwen3-8B"} 30000.0
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="Qwen/Qwen3-8B"} 7.0
vllm:num_preemptions_total{engine="1",model_name="Qwen/Qwen3-8B"} 2.0
# HELP vllm:num_preemptions_created Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_created gauge
vllm:num_preemptions_created{engine="0",model_name="Qwen/Qwen3-8B"} 1.7591e+09
vllm:num_preemptions_created{engine="1",model_name="Qwen/Qwen3-8B"} 1.7591e+09
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="Qwen/Qwen3-8B"} 200000.0
vllm:prompt_tokens_total{engine="1",model_name="Qwen/Qwen3-8B"} 150000.0
# HELP vllm:request_success_total Count of successfully processed requests.
# TYPE vllm:request_success_total counter
vllm:request_success_total{engine="0",finished_reason="stop",model_name="Qwen/Qwen3-8B"} 91.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="Qwen/Qwen3-8B"} 4.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="Qwen/Qwen3-8B"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="Qwen/Qwen3-8B"} 95.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="Qwen/Qwen3-8B"} 95.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="Qwen/Qwen3-8B"} 14.2
`

// asleep turns metricsDP2's engine to sleep at the given level.
func asleep(level string) string {
	text := strings.ReplaceAll(metricsDP2, `sleep_state="awake"} 1.0`, `sleep_state="awake"} 0.0`)
	return strings.ReplaceAll(text, `sleep_state="`+level+`"} 0.0`, `sleep_state="`+level+`"} 1.0`)
}

func TestParseMetrics(t *testing.T) {
	tests := []struct {
		name string
		text string
		want engineLoad
	}{
		{"current names, summed over engines", metricsCurrent, engineLoad{Waiting: 5, Running: 5, KVCacheUsage: 0.375}},
		{"only the old cache name", metricsOld, engineLoad{Waiting: 12, Running: 7, KVCacheUsage: 0.875}},
		{"the new cache name wins", metricsCurrent + "vllm:gpu_cache_usage_perc 0.9\n", engineLoad{Waiting: 5, Running: 5, KVCacheUsage: 0.375}},
		{"untyped series", "vllm:num_requests_waiting 2\nvllm:num_requests_running 1\n", engineLoad{Waiting: 2, Running: 1}},
		{"none of them", "process_cpu_seconds_total 12.5\n", engineLoad{}},
		{"current vLLM, data parallel 2: reasons, preemptions, prefix cache, awake", metricsDP2, engineLoad{
			Waiting: 3, Running: 10, KVCacheUsage: 0.7,
			WaitingByReason: &serving.WaitReasons{Capacity: 2, Deferred: 1},
			Preemptions:     9, PrefixCacheQueries: 200000, PrefixCacheHits: 120000,
			SleepState: serving.SleepAwake}},
		{"asleep at level 1", asleep(serving.SleepWeightsOffloaded), engineLoad{
			Waiting: 3, Running: 10, KVCacheUsage: 0.7,
			WaitingByReason: &serving.WaitReasons{Capacity: 2, Deferred: 1},
			Preemptions:     9, PrefixCacheQueries: 200000, PrefixCacheHits: 120000,
			SleepState: serving.SleepWeightsOffloaded}},
		{"asleep at level 2", asleep(serving.SleepDiscardAll), engineLoad{
			Waiting: 3, Running: 10, KVCacheUsage: 0.7,
			WaitingByReason: &serving.WaitReasons{Capacity: 2, Deferred: 1},
			Preemptions:     9, PrefixCacheQueries: 200000, PrefixCacheHits: 120000,
			SleepState: serving.SleepDiscardAll}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseMetrics(strings.NewReader(tt.text))
			if err != nil {
				t.Fatalf("parseMetrics: %v", err)
			}
			if !reflect.DeepEqual(*got, tt.want) {
				t.Errorf("got %+v (waiting by reason %+v), want %+v (%+v)", *got, got.WaitingByReason, tt.want, tt.want.WaitingByReason)
			}
		})
	}
	if _, err := parseMetrics(strings.NewReader("vllm:num_requests_waiting{ 1\n")); err == nil {
		t.Error("malformed exposition parsed")
	}
}

// fakeMetrics serves a /metrics text the test can change or break.
type fakeMetrics struct {
	mu     sync.Mutex
	text   string
	broken bool
	srv    *httptest.Server
}

func startFakeMetrics(t *testing.T, text string) *fakeMetrics {
	f := &fakeMetrics{text: text}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		defer f.mu.Unlock()
		if r.URL.Path == "/health" {
			return // 200: only the metrics break
		}
		if r.URL.Path != "/metrics" || f.broken {
			http.Error(w, "no", http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		_, _ = w.Write([]byte(f.text))
	}))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeMetrics) set(text string, broken bool) {
	f.mu.Lock()
	f.text, f.broken = text, broken
	f.mu.Unlock()
}

func TestScrapeOfAnOldVLLM(t *testing.T) {
	f := startFakeMetrics(t, metricsOld)
	s, _ := startSidecar(t, f.srv.URL, func(c *Config) { c.ScrapeInterval = 5 * time.Millisecond })
	runSidecar(t, s)
	want := serving.Load{Waiting: 12, Running: 7, KVCacheUsage: 0.875}
	testkit.WaitFor(t, "a scrape", func() bool { return s.Load() == want })
}

func TestScrapeFailuresKeepTheLastLoadAndLogOnce(t *testing.T) {
	f := startFakeMetrics(t, metricsOld)
	var logs logBuffer
	var scrapes atomic.Int32
	s, _ := startSidecar(t, f.srv.URL, func(c *Config) {
		// Long enough that a loaded test machine does not time scrapes out.
		c.ScrapeInterval = 100 * time.Millisecond
		c.Log = newLogger(&logs)
		c.Transport = countingTransport{&scrapes}
	})
	runSidecar(t, s)
	want := serving.Load{Waiting: 12, Running: 7, KVCacheUsage: 0.875}
	testkit.WaitFor(t, "a scrape", func() bool { return s.Load() == want })

	f.set("", true)
	from := scrapes.Load()
	testkit.WaitFor(t, "failed scrapes", func() bool { return scrapes.Load() > from+3 })
	if got := s.Load(); got != want {
		t.Errorf("load after failed scrapes = %+v, want the last good one", got)
	}
	f.set(metricsCurrent, false)
	// The loop logs the recovery just after it stores the load.
	testkit.WaitFor(t, "a good scrape", func() bool {
		return s.Load().Waiting == 5 && logs.count("engine metrics scraped again") > 0
	})
	if n := logs.count("scrape engine metrics"); n != 1 {
		t.Errorf("failure logged %d times, want once:\n%s", n, logs.String())
	}
	if n := logs.count("engine metrics scraped again"); n != 1 {
		t.Errorf("recovery logged %d times, want once:\n%s", n, logs.String())
	}
	if !strings.Contains(logs.String(), "level=WARN") {
		t.Errorf("a ready replica's failed scrape is not a warning:\n%s", logs.String())
	}
}

type countingTransport struct{ n *atomic.Int32 }

func (c countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	c.n.Add(1)
	return http.DefaultTransport.RoundTrip(r)
}

// TestSleepingEngineIsNotReady: vLLM's sleep mode leaves /health at 200 but
// the engine serves nothing; the replica reports sleeping with the reason,
// refuses generation with 503, and comes back once the engine wakes. The
// worker hears of each change at once.
func TestSleepingEngineIsNotReady(t *testing.T) {
	f := startFakeMetrics(t, metricsDP2)
	var logs logBuffer
	changes := make(chan [2]string, 16)
	s, sc := startSidecar(t, f.srv.URL, func(c *Config) {
		c.ScrapeInterval = 5 * time.Millisecond
		c.Log = newLogger(&logs)
		c.OnStateChange = func(state, reason string) { changes <- [2]string{state, reason} }
	})
	runSidecar(t, s)
	testkit.WaitFor(t, "a scrape", func() bool { return s.Load().SleepState == serving.SleepAwake })
	if state, reason := s.State(); state != serving.StateReady {
		t.Fatalf("awake engine: state %q (%s)", state, reason)
	}

	f.set(asleep(serving.SleepWeightsOffloaded), false)
	var ch [2]string
	select {
	case ch = <-changes:
	case <-time.After(10 * time.Second):
		t.Fatal("no state change reported after the engine fell asleep")
	}
	if ch[0] != serving.StateSleeping || !strings.HasPrefix(ch[1], "engine asleep (vLLM sleep level 1") {
		t.Errorf("state change %q, want sleeping with the sleep reason", ch)
	}
	if state, reason := s.State(); state != serving.StateSleeping || reason != ch[1] {
		t.Errorf("State() = %q %q", state, reason)
	}
	if s.Load().SleepState != serving.SleepWeightsOffloaded {
		t.Errorf("heartbeat sleep state %q", s.Load().SleepState)
	}
	status, _, body := send(t, context.Background(), http.MethodGet, sc.URL+"/health", "")
	if status != http.StatusServiceUnavailable || !strings.Contains(string(body), "engine asleep") {
		t.Errorf("/health while asleep: %d %s", status, body)
	}
	status, _, body = send(t, context.Background(), http.MethodPost, sc.URL+"/v1/chat/completions", chatBody)
	if status != http.StatusServiceUnavailable || !strings.Contains(string(body), "replica_not_ready") || !strings.Contains(string(body), "engine asleep") {
		t.Errorf("generation while asleep: %d %s", status, body)
	}
	if !strings.Contains(logs.String(), "engine asleep: replica out of service") {
		t.Errorf("no log line says the engine sleeps:\n%s", logs.String())
	}

	f.set(metricsDP2, false)
	select {
	case ch = <-changes:
	case <-time.After(10 * time.Second):
		t.Fatal("no state change reported after the engine woke")
	}
	if ch != [2]string{serving.StateReady, ""} {
		t.Errorf("state change after waking %q, want ready", ch)
	}
}
