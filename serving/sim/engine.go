// Package sim is tailgate's simulated inference engine: an in-process stand-in
// for one vLLM replica that speaks vLLM's HTTP API, so the whole product runs,
// is tested and is benchmarked on machines without a GPU.
//
// # Overview
//
// An [Engine] serves what a client may call on vLLM through a gateway, in
// vLLM's wire formats (read from vLLM's source; each encoder names the files
// it follows): GET /v1/models, POST /v1/chat/completions and
// /v1/completions (JSON and SSE, n choices, tool calls, a reasoning phase,
// continuous usage), /v1/responses (JSON and SSE events), /v1/messages
// (Anthropic's Messages API, JSON and SSE), /v1/embeddings, /v1/rerank,
// /rerank, /v2/rerank, /v1/score, /score, /tokenize, /detokenize,
// /v1/audio/transcriptions and /v1/audio/translations, GET /health and GET
// /metrics (vLLM's metric names). Bodies are validated as vLLM's pydantic
// models validate them, with the same 400s. Its answers are filler words,
// never a model's output; callers must say so wherever a person could
// mistake them for real answers. A request that constrains its output
// (response_format, structured_outputs, guided_*, a forced tool call) gets
// filler that satisfies the constraint (structured.go, schema.go).
//
// Latency follows a small model: a request waits for one of [Config.MaxSeqs]
// slots in FIFO order, emits its first token after a lognormal draw around
// [Config.TTFT] plus the prefill of the prompt tokens the prefix cache did
// not hold ([Config.PrefillPerToken] each), then one token every [Config.TPOT] (one per choice when
// n > 1). With probability [Config.StallProb] a request stalls: both delays
// are multiplied by [Config.StallFactor]. The draws follow arrival order, or
// with [Config.LatencyFromContent] each request's content. Pooling requests (embeddings,
// rerank, score) take a slot for one TTFT. A client that disconnects aborts
// its request at once. Faults are injected on request: a share of 500s
// ([Config.ErrorRate]), of 429s with Retry-After ([Config.RateLimitRate]) and
// of requests that hang before their first token ([Config.HangRate]).
//
// Unlike vLLM, the simulator reports each request's queue time (arrival to
// slot, in milliseconds with three decimals): a JSON answer carries it in the
// [tailgate/serving.HeaderSimQueue] header; a stream, whose 200 goes out
// before the slot is taken (as vLLM sends it), carries it in a comment event
// sent just before the first token event:
//
//	: sim-queue-ms=1.234
//
// SSE clients ignore comments; tailgate's sidecar reads and strips it.
//
// Token counts and outputs are deterministic and documented on
// [ChatPromptTokens], [TextPromptTokens] and [CompletionTokens] and in the
// README's sim section, so tests and the gateway's metering can predict them
// exactly. Random draws (latency, faults) come from [Config.Seed].
//
// The package owns no goroutines and runs no listener: callers run
// [Engine.NewServer] (or mount [Engine.Handler] on a server of their own,
// which then keeps its own idle-connection rules) on a TCP listener or on
// a private Unix socket from [ListenUnix].
package sim

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Config describes one simulated replica. The zero value is a valid, instant
// engine serving "tailgate-sim".
type Config struct {
	// Model is the served model name; "" means "tailgate-sim". Requests naming
	// another model get 404, as from vLLM.
	Model string
	// TTFT is the median time from taking a slot to the first token; the
	// actual delay is drawn from a lognormal distribution around it. 0 means
	// the first token is immediate.
	TTFT time.Duration
	// TTFTSigma is the sigma of the lognormal TTFT draw; 0 means 0.25 and a
	// negative value turns jitter off (every TTFT equals the median).
	TTFTSigma float64
	// TPOT is the time per output token after the first; 0 means none.
	TPOT time.Duration
	// StallProb is the probability, in [0, 1], that a request stalls.
	StallProb float64
	// StallFactor multiplies a stalled request's TTFT and TPOT; 0 means 10.
	StallFactor float64
	// MaxSeqs is the number of requests generating at once; more wait in
	// FIFO order. 0 means 256.
	MaxSeqs int
	// KVCacheTokens is the size of the simulated KV cache, in tokens; 0
	// means none is simulated and only MaxSeqs bounds admission. A request
	// needs room for its prompt and all its output (the simulator reserves
	// at admission what vLLM allocates as it decodes, so it never
	// preempts); one that does not fit waits, and holds up those behind it,
	// while slots may be free: vllm:num_requests_waiting > 0 with
	// vllm:num_requests_running < MaxSeqs, as on a vLLM short of KV blocks.
	// vllm:kv_cache_usage_perc is then the share reserved. Like vLLM, which
	// refuses to start when one max_model_len sequence does not fit its
	// cache, it must be at least MaxModelLen.
	KVCacheTokens int
	// PrefillPerToken is the time to prefill one prompt token the prefix
	// cache did not hold; it is added to the drawn TTFT, so the first token
	// comes the queue time, the TTFT draw and the uncached tokens' prefill
	// after arrival (see prefix.go). 0 means prefill is free.
	PrefillPerToken time.Duration
	// MaxNumBatchedTokens is the token budget of one engine step, as
	// vLLM's --max-num-batched-tokens with chunked prefill (see sched.go's
	// prefillLane): prompts are prefilled first come first served, at most
	// the budget less the running decodes a step, a step lasting at least
	// TPOT, so concurrent prefills queue behind one another. 0 means no
	// budget: each request's prefill takes PrefillPerToken a token, in
	// parallel with the others'.
	MaxNumBatchedTokens int
	// TensorParallelSize is the GPUs the simulated model is split over, as
	// vLLM's --tensor-parallel-size: prefill and TPOT are divided by
	// [TPSpeedup]. 0 means 1.
	TensorParallelSize int
	// PrefixCacheBlocks bounds the automatic prefix cache, in blocks of 16
	// tokens; the least recently used are forgotten first. 0 means
	// KVCacheTokens/16 when a KV cache is simulated, else 65536; a negative
	// value turns prefix caching off, as vLLM's --no-enable-prefix-caching.
	PrefixCacheBlocks int
	// Seed seeds the latency draws: engines with the same seed draw the same
	// sequence of latencies.
	Seed int64
	// LatencyFromContent fixes a chat or completions request's latency by
	// what it asks instead of drawing it in arrival order: its TTFT jitter
	// and whether it stalls are functions of its prompt text, its seed field
	// and Seed. Each replica gives the same request the same latency run
	// after run, whatever the order requests arrive in, so two benchmark
	// runs that send the same requests see the same stalls request for
	// request on each replica; replicas with different seeds draw
	// independently, as their load would make them, so a hedge to another
	// replica does not meet the original's stall (or its slow jitter).
	// Pooling requests keep the seeded stream.
	LatencyFromContent bool
	// DefaultMaxTokens caps a chat, Responses or Messages answer when the
	// request sets no cap; 0 means 256. /v1/completions defaults to 16
	// tokens, as vLLM's CompletionRequest does.
	DefaultMaxTokens int
	// MaxModelLen is the context length reported by /v1/models and enforced
	// like vLLM does (prompt plus completion cap); 0 means 32768.
	MaxModelLen int

	// StreamInterval is the number of tokens a stream may merge into one
	// chat or completions chunk, as vLLM's --stream-interval; a request's
	// stream_interval field raises it for that request. The first token and
	// the last are sent at once. 0 means 1: every token its own chunk.
	StreamInterval int
	// NoEOSToken makes a text answer that finishes with "stop" end on its
	// last word. By default it ends as vLLM's does: with the end-of-sequence
	// token, which counts in completion_tokens but decodes to nothing (the
	// last chunk is {"content":""} with finish_reason "stop"), so a stream
	// has one content event fewer than completion_tokens.
	NoEOSToken bool

	// ReasoningTokens is the length of the reasoning phase that starts every
	// choice of a chat, Responses or Messages answer, as on a model served
	// with a reasoning parser; 0 means none. It lasts ReasoningTokens×TPOT,
	// counts as completion tokens and shares the completion cap.
	ReasoningTokens int
	// ReasoningField names the reasoning text of chat deltas and messages:
	// "reasoning" (vLLM from 0.12; "" means it), "reasoning_content" (vLLM
	// up to 0.10) or "both" (vLLM 0.11 to 0.1x sent the two, same text).
	ReasoningField string
	// EmbeddingDim is the length of /v1/embeddings vectors; 0 means 64.
	EmbeddingDim int

	// ErrorRate is the share of requests, in [0, 1], answered 500 instead of
	// being served.
	ErrorRate float64
	// RateLimitRate is the share answered 429 with a Retry-After header.
	RateLimitRate float64
	// RetryAfter is the wait the 429s ask for, in whole seconds rounded up;
	// 0 means 1s.
	RetryAfter time.Duration
	// HangRate is the share that hang before their first token (a stream
	// after its 200) until the client goes away. ErrorRate, RateLimitRate
	// and HangRate add up to at most 1.
	HangRate float64

	// KeepAlive is how long a server made by [Engine.NewServer] keeps an
	// idle keep-alive connection open before closing it, as uvicorn does in
	// front of vLLM (timeout_keep_alive, from VLLM_HTTP_TIMEOUT_KEEP_ALIVE;
	// see [KeepAliveEnv]); 0 means 5s, vLLM's default. A client that keeps
	// idle connections longer meets connections the engine has closed.
	KeepAlive time.Duration

	// SleepMode serves vLLM's sleep mode endpoints (POST /sleep, POST
	// /wake_up, GET /is_sleeping; see sleep.go), as vLLM started with
	// --enable-sleep-mode and VLLM_SERVER_DEV_MODE=1 does. false: they
	// answer 404, as on a vLLM without dev mode.
	SleepMode bool
	// PriorityScheduling orders the waiting requests by their priority
	// field, a lower value first, then by arrival, as vLLM started with
	// --scheduling-policy priority does (vllm/v1/core/sched/request_queue.py,
	// PriorityRequestQueue). false is vLLM's default policy, fcfs: a request
	// whose priority is not 0 is refused with 400, as vLLM refuses it
	// (ChatCompletionRequest.priority in
	// vllm/entrypoints/openai/chat_completion/protocol.py: "Any priority
	// other than 0 will raise an error if the served model does not use
	// priority scheduling"; the engine says "Got priority … but Priority
	// scheduling is not enabled.").
	PriorityScheduling bool
	// WakeDelay is how long a wake from sleep level 1 (weights offloaded to
	// CPU memory) takes, and so a level 1 sleep; 0 means DefaultWakeDelay.
	WakeDelay time.Duration
	// WakeDelayLevel2 is how long a wake from sleep level 2 (weights
	// discarded) takes; a level 2 sleep takes a tenth of it. 0 means
	// DefaultWakeDelayLevel2.
	WakeDelayLevel2 time.Duration

	// APIKey, when set, is the bearer token every request to a /v1 path
	// must carry, as with vLLM's --api-key or VLLM_API_KEY: others get 401
	// {"error":"Unauthorized"}. "" means no authentication.
	APIKey string
}

const (
	defaultModel       = "tailgate-sim"
	defaultTTFTSigma   = 0.25
	defaultStallFactor = 10
	defaultMaxSeqs     = 256
	defaultMaxTokens   = 256
	defaultMaxModelLen = 32768
	defaultEmbedDim    = 64
	maxEmbedDim        = 1 << 16
	defaultRetryAfter  = time.Second
	defaultKeepAlive   = 5 * time.Second
)

// Validate reports whether c is usable.
func (c Config) Validate() error {
	switch {
	case c.TTFT < 0:
		return errors.New("sim: ttft must not be negative")
	case c.TPOT < 0:
		return errors.New("sim: tpot must not be negative")
	case math.IsNaN(c.TTFTSigma) || math.IsInf(c.TTFTSigma, 0):
		return errors.New("sim: ttft sigma must be a finite number")
	case math.IsNaN(c.StallProb) || c.StallProb < 0 || c.StallProb > 1:
		return errors.New("sim: stall probability must be between 0 and 1")
	case math.IsNaN(c.StallFactor) || math.IsInf(c.StallFactor, 0) || c.StallFactor < 0:
		return errors.New("sim: stall factor must be a non-negative finite number")
	case c.MaxSeqs < 0:
		return errors.New("sim: max seqs must not be negative")
	case c.PrefillPerToken < 0:
		return errors.New("sim: prefill per token must not be negative")
	case c.MaxNumBatchedTokens < 0:
		return errors.New("sim: max num batched tokens must not be negative")
	case c.TensorParallelSize < 0 || c.TensorParallelSize > 64:
		return errors.New("sim: tensor parallel size must be between 0 (one GPU) and 64")
	case c.KVCacheTokens < 0:
		return errors.New("sim: kv cache tokens must not be negative")
	case c.DefaultMaxTokens < 0:
		return errors.New("sim: default max tokens must not be negative")
	case c.MaxModelLen < 0:
		return errors.New("sim: max model len must not be negative")
	case c.StreamInterval < 0:
		return errors.New("sim: stream interval must not be negative")
	case c.ReasoningTokens < 0:
		return errors.New("sim: reasoning tokens must not be negative")
	case c.ReasoningField != "" && c.ReasoningField != ReasoningFieldReasoning &&
		c.ReasoningField != ReasoningFieldContent && c.ReasoningField != ReasoningFieldBoth:
		return fmt.Errorf("sim: reasoning field %q is none of reasoning, reasoning_content, both", c.ReasoningField)
	case c.EmbeddingDim < 0 || c.EmbeddingDim > maxEmbedDim:
		return fmt.Errorf("sim: embedding dimension must be between 0 and %d", maxEmbedDim)
	case !isShare(c.ErrorRate) || !isShare(c.RateLimitRate) || !isShare(c.HangRate):
		return errors.New("sim: error, 429 and hang rates must be between 0 and 1")
	case c.ErrorRate+c.RateLimitRate+c.HangRate > 1+1e-9:
		return errors.New("sim: error, 429 and hang rates must add up to at most 1")
	case c.RetryAfter < 0:
		return errors.New("sim: retry-after must not be negative")
	case c.KeepAlive < 0:
		return errors.New("sim: keep-alive must not be negative")
	case c.WakeDelay < 0, c.WakeDelayLevel2 < 0:
		return errors.New("sim: wake delays must not be negative")
	}
	d := c.withDefaults()
	if d.DefaultMaxTokens > d.MaxModelLen {
		return fmt.Errorf("sim: default max tokens %d exceed max model len %d", d.DefaultMaxTokens, d.MaxModelLen)
	}
	if d.KVCacheTokens > 0 && d.KVCacheTokens < d.MaxModelLen {
		return fmt.Errorf("sim: a kv cache of %d tokens cannot hold one sequence of max model len %d", d.KVCacheTokens, d.MaxModelLen)
	}
	return nil
}

// withDefaults returns c with zero values replaced by their defaults and a
// negative TTFTSigma turned into 0 (no jitter).
func (c Config) withDefaults() Config {
	if c.Model == "" {
		c.Model = defaultModel
	}
	switch {
	case c.TTFTSigma == 0:
		c.TTFTSigma = defaultTTFTSigma
	case c.TTFTSigma < 0:
		c.TTFTSigma = 0
	}
	if c.StallFactor == 0 {
		c.StallFactor = defaultStallFactor
	}
	if c.MaxSeqs == 0 {
		c.MaxSeqs = defaultMaxSeqs
	}
	if c.DefaultMaxTokens == 0 {
		c.DefaultMaxTokens = defaultMaxTokens
	}
	if c.MaxModelLen == 0 {
		c.MaxModelLen = defaultMaxModelLen
	}
	if c.StreamInterval == 0 {
		c.StreamInterval = 1
	}
	if c.ReasoningField == "" {
		c.ReasoningField = ReasoningFieldReasoning
	}
	if c.EmbeddingDim == 0 {
		c.EmbeddingDim = defaultEmbedDim
	}
	if c.RetryAfter == 0 {
		c.RetryAfter = defaultRetryAfter
	}
	if c.KeepAlive == 0 {
		c.KeepAlive = defaultKeepAlive
	}
	if c.WakeDelay == 0 {
		c.WakeDelay = DefaultWakeDelay
	}
	if c.WakeDelayLevel2 == 0 {
		c.WakeDelayLevel2 = DefaultWakeDelayLevel2
	}
	switch {
	case c.PrefixCacheBlocks == 0 && c.KVCacheTokens > 0:
		c.PrefixCacheBlocks = c.KVCacheTokens / blockTokens
	case c.PrefixCacheBlocks == 0:
		c.PrefixCacheBlocks = defaultPrefixBlocks
	case c.PrefixCacheBlocks < 0:
		c.PrefixCacheBlocks = 0
	}
	return c
}

func isShare(p float64) bool { return !math.IsNaN(p) && p >= 0 && p <= 1 }

// Stats is a snapshot of an engine's load and history.
type Stats struct {
	Running int // requests holding a slot
	Waiting int // requests queued for a slot
	// Completed counts requests that generated their last token.
	Completed int64
	// Aborted counts requests cancelled by their client's disconnect.
	Aborted int64
	// Faulted counts requests answered with an injected fault (a 500, a
	// 429 or a hang).
	Faulted int64
}

// Engine is one simulated vLLM replica. It is safe for concurrent use.
type Engine struct {
	cfg         Config // defaults applied
	modelJSON   []byte // cfg.Model as a JSON string
	fingerprint []byte // system_fingerprint as a JSON string
	models      []byte // the /v1/models body

	lat     *latencyModel
	faults  *faultModel
	sched   *scheduler
	lane    *prefillLane
	prefix  *prefixCache
	metrics *metrics
	sleep   *sleeper // nil unless Config.SleepMode
	handler http.Handler
	bufs    sync.Pool // of *[]byte, see getBuf

	completed atomic.Int64
	aborted   atomic.Int64
	faulted   atomic.Int64
}

// New returns an engine for cfg. Its metrics always live in a registry of its
// own, served at /metrics as vLLM does; when reg is not nil they are also
// registered there.
func New(cfg Config, reg prometheus.Registerer) (*Engine, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	own := prometheus.NewRegistry()
	m := newMetrics(cfg.Model, cfg.MaxSeqs, cfg.KVCacheTokens)
	if err := m.register(own); err != nil {
		return nil, fmt.Errorf("sim: %w", err)
	}
	if reg != nil {
		if err := m.register(reg); err != nil {
			return nil, fmt.Errorf("sim: %w", err)
		}
	}
	e := &Engine{
		cfg:         cfg,
		modelJSON:   appendJSONString(nil, cfg.Model),
		fingerprint: appendJSONString(nil, fingerprint(cfg.Model)),
		models:      modelList(cfg, time.Now()),
		lat:         newLatencyModel(cfg),
		faults:      newFaultModel(cfg),
		prefix:      newPrefixCache(cfg.PrefixCacheBlocks),
		metrics:     m,
	}
	e.sched = newScheduler(cfg.MaxSeqs, cfg.KVCacheTokens, cfg.PriorityScheduling, m.setLoad)
	e.lane = newPrefillLane(cfg)
	if cfg.SleepMode {
		e.sleep = newSleeper(cfg, m)
	}
	e.handler = e.routes(promhttp.HandlerFor(own, promhttp.HandlerOpts{}))
	return e, nil
}

// Handler returns the engine's HTTP API.
func (e *Engine) Handler() http.Handler { return e.handler }

// Stats returns the engine's current load and counters.
func (e *Engine) Stats() Stats {
	running, waiting := e.sched.load()
	return Stats{
		Running:   running,
		Waiting:   waiting,
		Completed: e.completed.Load(),
		Aborted:   e.aborted.Load(),
		Faulted:   e.faulted.Load(),
	}
}

// fingerprint is the engine's system_fingerprint, shaped like vLLM's
// default "vllm-<version>-<hash8>" (vllm/entrypoints/openai/fingerprint.py@362c535e):
// the version is "sim", the hash the model name's.
func fingerprint(model string) string {
	return "vllm-sim-" + string(appendHex64(nil, uint64(fnvString(fnvOffset, model)))[8:])
}

// modelList renders the /v1/models body once; it never changes. The card is
// vLLM's ModelCard with its one ModelPermission, every field set
// (vllm/entrypoints/openai/models/serving.py@4fe45004, show_available_models;
// the models in vllm/entrypoints/openai/engine/protocol.py). root is the
// model path vLLM was started with; the simulator's is its served name.
func modelList(cfg Config, now time.Time) []byte {
	type permission struct {
		ID                 string  `json:"id"`
		Object             string  `json:"object"`
		Created            int64   `json:"created"`
		AllowCreateEngine  bool    `json:"allow_create_engine"`
		AllowSampling      bool    `json:"allow_sampling"`
		AllowLogprobs      bool    `json:"allow_logprobs"`
		AllowSearchIndices bool    `json:"allow_search_indices"`
		AllowView          bool    `json:"allow_view"`
		AllowFineTuning    bool    `json:"allow_fine_tuning"`
		Organization       string  `json:"organization"`
		Group              *string `json:"group"`
		IsBlocking         bool    `json:"is_blocking"`
	}
	type card struct {
		ID          string       `json:"id"`
		Object      string       `json:"object"`
		Created     int64        `json:"created"`
		OwnedBy     string       `json:"owned_by"`
		Root        string       `json:"root"`
		Parent      *string      `json:"parent"`
		MaxModelLen int          `json:"max_model_len"`
		Permission  []permission `json:"permission"`
	}
	body, _ := json.Marshal(struct {
		Object string `json:"object"`
		Data   []card `json:"data"`
	}{
		Object: "list",
		Data: []card{{
			ID:          cfg.Model,
			Object:      "model",
			Created:     now.Unix(),
			OwnedBy:     "vllm",
			Root:        cfg.Model,
			MaxModelLen: cfg.MaxModelLen,
			Permission: []permission{{
				ID: "modelperm-" + randomHex(), Object: "model_permission", Created: now.Unix(),
				AllowSampling: true, AllowLogprobs: true, AllowView: true, Organization: "*",
			}},
		}},
	})
	return body
}
