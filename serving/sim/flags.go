package sim

import (
	"cmp"
	"flag"
	"fmt"
	"time"
)

// Flags are the simulated engine's knobs as command-line flags (--sim-*),
// shared by `sim`, `up` and `worker --engine sim`; the zero value is filled
// in by Register with the flags' defaults.
type Flags struct {
	ttft        time.Duration
	ttftSigma   float64
	tpot        time.Duration
	stallProb   float64
	stallFactor float64
	maxSeqs     int
	seed        int64
	seededLat   bool
	maxTokens   int
	maxModelLen int

	reasoningTokens int
	reasoningField  string
	embeddingDim    int
	errorRate       float64
	rateLimitRate   float64
	retryAfter      time.Duration
	hangRate        float64
	keepAlive       time.Duration
	streamInterval  int
	kvCacheTokens   int
	prefillPerToken time.Duration
	batchedTokens   int
	tensorParallel  int
	prefixBlocks    int
	sleepMode       bool
	schedPolicy     string
	wakeDelay       time.Duration
	wakeDelay2      time.Duration
	startDelay      time.Duration
}

// Register defines the --sim-* flags on fs.
func (f *Flags) Register(fs *flag.FlagSet) {
	fs.DurationVar(&f.ttft, "sim-ttft", 150*time.Millisecond, "simulated engine: median time to first token")
	fs.Float64Var(&f.ttftSigma, "sim-ttft-sigma", 0.25, "simulated engine: lognormal spread of the time to first token (negative: none)")
	fs.DurationVar(&f.tpot, "sim-tpot", 15*time.Millisecond, "simulated engine: time per output token")
	fs.Float64Var(&f.stallProb, "sim-stall-prob", 0, "simulated engine: probability that a request stalls")
	fs.Float64Var(&f.stallFactor, "sim-stall-factor", 10, "simulated engine: latency multiplier of a stalled request")
	fs.IntVar(&f.maxSeqs, "sim-max-seqs", 256, "simulated engine: concurrent sequences; more requests queue (FIFO)")
	fs.Int64Var(&f.seed, "sim-seed", 1, "simulated engine: seed of the latency draws")
	fs.BoolVar(&f.seededLat, "sim-seeded-latency", false, "simulated engine: fix each chat/completions request's latency (jitter and stall) by its content (prompt text and seed field) and --sim-seed instead of arrival order, so A/B runs see the same latencies request for request on each replica while replicas draw independently")
	fs.IntVar(&f.maxTokens, "sim-default-max-tokens", 256, "simulated engine: completion cap when a request sets none")
	fs.IntVar(&f.maxModelLen, "sim-max-model-len", 0, "simulated engine: context length in tokens, as vLLM's --max-model-len: a longer prompt is refused (0: 32768)")
	fs.IntVar(&f.reasoningTokens, "sim-reasoning-tokens", 0, "simulated engine: reasoning tokens before every chat, Responses and Messages answer (0: no reasoning phase); they last N×TPOT and count as completion tokens")
	fs.StringVar(&f.reasoningField, "sim-reasoning-field", ReasoningFieldReasoning, "simulated engine: name of the reasoning text in chat deltas: reasoning (vLLM ≥ 0.12), reasoning_content (≤ 0.10) or both (0.11 to 0.1x)")
	fs.IntVar(&f.embeddingDim, "sim-embedding-dim", 64, "simulated engine: length of /v1/embeddings vectors")
	fs.Float64Var(&f.errorRate, "sim-error-rate", 0, "simulated engine: share of requests answered 500 (seeded)")
	fs.Float64Var(&f.rateLimitRate, "sim-429-rate", 0, "simulated engine: share of requests answered 429 with Retry-After (seeded)")
	fs.DurationVar(&f.retryAfter, "sim-retry-after", time.Second, "simulated engine: the wait a 429 asks for (Retry-After, whole seconds rounded up)")
	fs.Float64Var(&f.hangRate, "sim-hang-rate", 0, "simulated engine: share of requests that hang before their first token until the client goes away (seeded)")
	fs.IntVar(&f.kvCacheTokens, "sim-kv-cache-tokens", 0, "simulated engine: KV cache size in tokens (at least the max model len; 0: none): a request waits, with slots free, until its prompt and output fit, as on a vLLM short of KV blocks")
	// 40µs a token is Llama-3.1-8B's prefill on one H100: about 2×8e9
	// FLOP a token at roughly 40 % of the GPU's 989 TFLOP/s bf16 peak,
	// some 25,000 prompt tokens a second.
	fs.DurationVar(&f.prefillPerToken, "sim-prefill-per-token", 40*time.Microsecond, "simulated engine: prefill time per prompt token the prefix cache does not hold, added to the time to first token (0: prefill is free)")
	fs.IntVar(&f.batchedTokens, "sim-max-num-batched-tokens", 0, "simulated engine: token budget of one engine step, as vLLM's --max-num-batched-tokens with chunked prefill: prompts are prefilled first come first served, at most the budget less the running decodes a step, a step lasting at least --sim-tpot (0: no budget, each prompt prefills on its own at --sim-prefill-per-token)")
	fs.IntVar(&f.tensorParallel, "sim-tensor-parallel-size", 1, "simulated engine: GPUs the model is split over, as vLLM's --tensor-parallel-size: prefill and TPOT are divided by N less 10 % a doubling (2: 1.8x, 4: 3.24x), a modelling assumption")
	fs.IntVar(&f.prefixBlocks, "sim-prefix-cache-blocks", 0, "simulated engine: automatic prefix cache size in blocks of 16 tokens, least recently used evicted first (0: the KV cache's blocks with --sim-kv-cache-tokens, else 65536; -1: no prefix caching)")
	fs.IntVar(&f.streamInterval, "sim-stream-interval", 1, "simulated engine: tokens merged into one chat or completions stream chunk, as vLLM's --stream-interval (a request's stream_interval may raise it)")
	fs.BoolVar(&f.sleepMode, "sim-sleep-mode", false, "simulated engine: serve vLLM's sleep mode endpoints (POST /sleep?level=1|2, POST /wake_up, GET /is_sleeping), as vllm serve --enable-sleep-mode with VLLM_SERVER_DEV_MODE=1; a generation request waits while the engine sleeps")
	fs.StringVar(&f.schedPolicy, "sim-scheduling-policy", "fcfs", "simulated engine: fcfs, or priority as vllm serve --scheduling-policy priority: waiting requests go by their priority field, lower first, then by arrival (with fcfs a priority other than 0 is refused with 400, as vLLM refuses it)")
	fs.DurationVar(&f.wakeDelay, "sim-wake-delay", DefaultWakeDelay, "simulated engine: time to wake from sleep level 1 (weights offloaded to CPU memory; a level 1 sleep takes as long)")
	fs.DurationVar(&f.wakeDelay2, "sim-wake-delay-level2", DefaultWakeDelayLevel2, "simulated engine: time to wake from sleep level 2 (weights discarded and reloaded; a level 2 sleep takes a tenth)")
	fs.DurationVar(&f.startDelay, "sim-start-delay", 0, "simulated engine: time to load before it listens, as vLLM refuses connections until its engine is loaded (0: listen at once)")
	fs.DurationVar(&f.keepAlive, "sim-keep-alive", 0, "simulated engine: idle keep-alive connections are closed after this long, as vLLM's uvicorn does (0: $"+KeepAliveEnv+" seconds, else 5s)")
}

// Config is the engine configuration the flags ask for, serving model.
func (f *Flags) Config(model string) Config {
	return Config{
		Model: model, TTFT: f.ttft, TTFTSigma: f.ttftSigma, TPOT: f.tpot, StallProb: f.stallProb,
		StallFactor: f.stallFactor, MaxSeqs: f.maxSeqs, Seed: f.seed, LatencyFromContent: f.seededLat, DefaultMaxTokens: f.maxTokens,
		MaxModelLen:     f.maxModelLen,
		ReasoningTokens: f.reasoningTokens, ReasoningField: f.reasoningField, EmbeddingDim: f.embeddingDim,
		ErrorRate: f.errorRate, RateLimitRate: f.rateLimitRate, RetryAfter: f.retryAfter, HangRate: f.hangRate,
		KeepAlive: f.keepAlive, StreamInterval: f.streamInterval, KVCacheTokens: f.kvCacheTokens,
		PrefillPerToken: f.prefillPerToken, PrefixCacheBlocks: f.prefixBlocks,
		MaxNumBatchedTokens: f.batchedTokens, TensorParallelSize: f.tensorParallel,
		SleepMode: f.sleepMode, PriorityScheduling: f.schedPolicy == "priority", WakeDelay: f.wakeDelay, WakeDelayLevel2: f.wakeDelay2,
	}
}

// EnableSleepMode turns --sim-sleep-mode on (a worker told to allow sleep).
func (f *Flags) EnableSleepMode() { f.sleepMode = true }

// EnablePriorityScheduling sets --sim-scheduling-policy priority (a worker
// whose engine is to run with priority scheduling).
func (f *Flags) EnablePriorityScheduling() { f.schedPolicy = "priority" }

// StartDelay is --sim-start-delay: how long `sim` waits, as if loading a
// model, before it listens.
func (f *Flags) StartDelay() time.Duration { return f.startDelay }

// Check reports a knob no engine can follow that Config cannot hold (the
// rest are Config.Validate's), so `up` and `worker` refuse it before
// starting engines that would fail it at every start.
func (f *Flags) Check() error {
	if f.schedPolicy != "" && f.schedPolicy != "fcfs" && f.schedPolicy != "priority" {
		return fmt.Errorf("--sim-scheduling-policy %q: want fcfs or priority", f.schedPolicy)
	}
	if f.startDelay < 0 {
		return fmt.Errorf("--sim-start-delay %s: want 0 (listen at once) or more", f.startDelay)
	}
	return nil
}

// Seed is --sim-seed.
func (f *Flags) Seed() int64 { return f.seed }

// Args renders the knobs back as flags, for child processes (the seed
// apart: each child gets its own).
func (f *Flags) Args() []string {
	return []string{
		"--sim-ttft", f.ttft.String(), "--sim-ttft-sigma", fmt.Sprint(f.ttftSigma), "--sim-tpot", f.tpot.String(),
		"--sim-stall-prob", fmt.Sprint(f.stallProb), "--sim-stall-factor", fmt.Sprint(f.stallFactor),
		"--sim-max-seqs", fmt.Sprint(f.maxSeqs), "--sim-default-max-tokens", fmt.Sprint(f.maxTokens),
		"--sim-max-model-len", fmt.Sprint(f.maxModelLen),
		"--sim-reasoning-tokens", fmt.Sprint(f.reasoningTokens), "--sim-reasoning-field", f.reasoningField,
		"--sim-embedding-dim", fmt.Sprint(f.embeddingDim), "--sim-error-rate", fmt.Sprint(f.errorRate),
		"--sim-429-rate", fmt.Sprint(f.rateLimitRate), "--sim-retry-after", f.retryAfter.String(),
		"--sim-hang-rate", fmt.Sprint(f.hangRate), "--sim-keep-alive", f.keepAlive.String(),
		"--sim-stream-interval", fmt.Sprint(f.streamInterval), "--sim-kv-cache-tokens", fmt.Sprint(f.kvCacheTokens),
		"--sim-prefill-per-token", f.prefillPerToken.String(), "--sim-prefix-cache-blocks", fmt.Sprint(f.prefixBlocks),
		"--sim-seeded-latency=" + fmt.Sprint(f.seededLat), "--sim-start-delay", f.startDelay.String(),
		"--sim-sleep-mode=" + fmt.Sprint(f.sleepMode), "--sim-scheduling-policy", cmp.Or(f.schedPolicy, "fcfs"), "--sim-wake-delay", f.wakeDelay.String(),
		"--sim-wake-delay-level2", f.wakeDelay2.String(),
		"--sim-max-num-batched-tokens", fmt.Sprint(f.batchedTokens), "--sim-tensor-parallel-size", fmt.Sprint(f.tensorParallel),
	}
}
