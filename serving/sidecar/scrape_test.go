package sidecar

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"tailgate/serving"
	"tailgate/serving/sim"
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
	if l := s.Load(); l != (serving.Load{}) {
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
	waitFor(t, "the scrape to see the queue", func() bool {
		l = s.Load()
		return l.Waiting >= 1 && l.Running == 1
	})
	waitFor(t, "the scrape to see the whole queue", func() bool { l = s.Load(); return l.Waiting == 2 })
	if l.Inflight != 3 || l.KVCacheUsage != 1 {
		t.Errorf("load under a queue = %+v, want 3 in flight and a full cache", l)
	}
	waitFor(t, "the first token", func() bool { return tokens.Load() == 1 })
	if p50 := s.Load().TTFTMillisP50; p50 <= 0 {
		t.Errorf("TTFT p50 = %v after a token", p50)
	}

	disconnect()
	wg.Wait()
	waitFor(t, "the scrape to see the engine idle", func() bool {
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

func TestParseMetrics(t *testing.T) {
	tests := []struct {
		name string
		text string
		want engineLoad
	}{
		{"current names, summed over engines", metricsCurrent, engineLoad{waiting: 5, running: 5, kvUsage: 0.375}},
		{"only the old cache name", metricsOld, engineLoad{waiting: 12, running: 7, kvUsage: 0.875}},
		{"the new cache name wins", metricsCurrent + "vllm:gpu_cache_usage_perc 0.9\n", engineLoad{waiting: 5, running: 5, kvUsage: 0.375}},
		{"untyped series", "vllm:num_requests_waiting 2\nvllm:num_requests_running 1\n", engineLoad{waiting: 2, running: 1}},
		{"none of them", "process_cpu_seconds_total 12.5\n", engineLoad{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseMetrics(strings.NewReader(tt.text))
			if err != nil {
				t.Fatalf("parseMetrics: %v", err)
			}
			if *got != tt.want {
				t.Errorf("got %+v, want %+v", *got, tt.want)
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
	waitFor(t, "a scrape", func() bool { return s.Load() == want })
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
	waitFor(t, "a scrape", func() bool { return s.Load() == want })

	f.set("", true)
	from := scrapes.Load()
	waitFor(t, "failed scrapes", func() bool { return scrapes.Load() > from+3 })
	if got := s.Load(); got != want {
		t.Errorf("load after failed scrapes = %+v, want the last good one", got)
	}
	f.set(metricsCurrent, false)
	// The loop logs the recovery just after it stores the load.
	waitFor(t, "a good scrape", func() bool {
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
