package sim

import (
	"math"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		ok   bool
	}{
		{"zero value", Config{}, true},
		{"full", Config{Model: "m", TTFT: time.Second, TTFTSigma: -1, TPOT: time.Millisecond, StallProb: 1, StallFactor: 2, MaxSeqs: 4, Seed: -3, DefaultMaxTokens: 10}, true},
		{"negative ttft", Config{TTFT: -1}, false},
		{"negative tpot", Config{TPOT: -1}, false},
		{"sigma NaN", Config{TTFTSigma: math.NaN()}, false},
		{"stall prob above one", Config{StallProb: 1.5}, false},
		{"stall prob negative", Config{StallProb: -0.1}, false},
		{"stall factor negative", Config{StallFactor: -2}, false},
		{"negative max seqs", Config{MaxSeqs: -1}, false},
		{"negative default max tokens", Config{DefaultMaxTokens: -1}, false},
		{"default max tokens above context", Config{DefaultMaxTokens: 500, MaxModelLen: 100}, false},
		{"agent knobs", Config{ReasoningTokens: 50, ReasoningField: "reasoning_content", EmbeddingDim: 1024, ErrorRate: 0.2, RateLimitRate: 0.3, HangRate: 0.5, RetryAfter: time.Second}, true},
		{"negative reasoning tokens", Config{ReasoningTokens: -1}, false},
		{"unknown reasoning field", Config{ReasoningField: "thoughts"}, false},
		{"negative embedding dim", Config{EmbeddingDim: -1}, false},
		{"error rate above one", Config{ErrorRate: 1.5}, false},
		{"429 rate negative", Config{RateLimitRate: -0.1}, false},
		{"hang rate NaN", Config{HangRate: math.NaN()}, false},
		{"fault rates above one together", Config{ErrorRate: 0.5, RateLimitRate: 0.5, HangRate: 0.1}, false},
		{"negative retry-after", Config{RetryAfter: -time.Second}, false},
	}
	for _, tt := range tests {
		err := tt.cfg.Validate()
		if (err == nil) != tt.ok {
			t.Errorf("%s: Validate() = %v", tt.name, err)
		}
		if _, nerr := New(tt.cfg, nil); (nerr == nil) != tt.ok {
			t.Errorf("%s: New() = %v", tt.name, nerr)
		}
	}
}

var vllmMetrics = []string{
	"vllm:num_requests_running",
	"vllm:num_requests_waiting",
	"vllm:kv_cache_usage_perc",
	"vllm:time_to_first_token_seconds",
	"vllm:e2e_request_latency_seconds",
	"vllm:request_queue_time_seconds",
	"vllm:request_prefill_time_seconds",
	"vllm:inter_token_latency_seconds",
	"vllm:request_time_per_output_token_seconds",
	"vllm:num_requests_waiting_by_reason",
	"vllm:num_preemptions_total",
	"vllm:prefix_cache_queries_total",
	"vllm:prefix_cache_hits_total",
	"vllm:engine_sleep_state",
	"vllm:prompt_tokens_total",
	"vllm:generation_tokens_total",
	"vllm:request_success_total",
	"tailgate_sim_aborted_total",
}

func TestMetricsUseVLLMNames(t *testing.T) {
	_, srv := start(t, Config{Model: "m"})
	status, _, _ := post(t, srv.URL+"/v1/chat/completions", `{"messages":[{"role":"user","content":"hello"}],"max_tokens":4,"ignore_eos":true}`)
	if status != http.StatusOK {
		t.Fatalf("status %d", status)
	}
	status, body := get(t, srv.URL+"/metrics")
	if status != http.StatusOK {
		t.Fatalf("/metrics status %d", status)
	}
	for _, name := range vllmMetrics {
		if !strings.Contains(string(body), "\n"+name+`{engine="0",`) && !strings.Contains(string(body), "\n"+name+`_bucket{engine="0",`) {
			t.Errorf("/metrics lacks %s{engine=\"0\",…}", name)
		}
	}
	if strings.Contains(string(body), "vllm:time_per_output_token_seconds") {
		t.Errorf("/metrics still has vllm:time_per_output_token_seconds, removed in vLLM 0.13")
	}
	for series, want := range map[string]float64{
		`vllm:prompt_tokens_total{engine="0",model_name="m"}`:                                9,
		`vllm:generation_tokens_total{engine="0",model_name="m"}`:                            4,
		`vllm:request_success_total{engine="0",finished_reason="length",model_name="m"}`:     1,
		`vllm:time_to_first_token_seconds_count{engine="0",model_name="m"}`:                  1,
		`vllm:e2e_request_latency_seconds_count{engine="0",model_name="m"}`:                  1,
		`vllm:request_time_per_output_token_seconds_count{engine="0",model_name="m"}`:        1,
		`vllm:inter_token_latency_seconds_count{engine="0",model_name="m"}`:                  3,
		`vllm:num_requests_waiting_by_reason{engine="0",model_name="m",reason="capacity"}`:   0,
		`vllm:num_requests_waiting_by_reason{engine="0",model_name="m",reason="deferred"}`:   0,
		`vllm:num_preemptions_total{engine="0",model_name="m"}`:                              0,
		`vllm:prefix_cache_queries_total{engine="0",model_name="m"}`:                         9,
		`vllm:engine_sleep_state{engine="0",model_name="m",sleep_state="awake"}`:             1,
		`vllm:engine_sleep_state{engine="0",model_name="m",sleep_state="weights_offloaded"}`: 0,
		`vllm:engine_sleep_state{engine="0",model_name="m",sleep_state="discard_all"}`:       0,
		`vllm:kv_cache_usage_perc{engine="0",model_name="m"}`:                                0,
	} {
		if got := metricValue(t, body, series); got != want {
			t.Errorf("%s = %v, want %v", series, got, want)
		}
	}
}

func TestMetricsAlsoGoToTheGivenRegisterer(t *testing.T) {
	reg := prometheus.NewRegistry()
	if _, err := New(Config{Model: "a"}, reg); err != nil {
		t.Fatal(err)
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, f := range families {
		got[f.GetName()] = true
	}
	for _, name := range vllmMetrics {
		if !got[name] {
			t.Errorf("registerer lacks %s", name)
		}
	}
	if _, err := New(Config{Model: "a"}, reg); err == nil {
		t.Errorf("a second engine for the same model registered into the same registry")
	}
	if _, err := New(Config{Model: "b"}, reg); err != nil {
		t.Errorf("an engine for another model: %v", err)
	}
	// Engines with private registries never collide.
	for range 2 {
		if _, err := New(Config{Model: "a"}, nil); err != nil {
			t.Errorf("private registry: %v", err)
		}
	}
}
