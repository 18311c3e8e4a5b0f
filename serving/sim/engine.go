// Package sim is tailgate's simulated inference engine: an in-process stand-in
// for one vLLM replica that speaks the part of vLLM's OpenAI-compatible HTTP
// API tailgate uses, so the whole product runs, is tested and is benchmarked on
// machines without a GPU.
//
// # Overview
//
// An [Engine] serves GET /v1/models, POST /v1/chat/completions and
// POST /v1/completions (JSON and SSE), GET /health and GET /metrics (vLLM's
// metric names). Its answers are filler words, never a model's output; callers
// must say so wherever a person could mistake them for real answers.
//
// Latency follows a small model: a request waits for one of [Config.MaxSeqs]
// slots in FIFO order, emits its first token after a lognormal draw around
// [Config.TTFT], then one token every [Config.TPOT]. With probability
// [Config.StallProb] a request stalls: both delays are multiplied by
// [Config.StallFactor]. A client that disconnects aborts its request at once.
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
// Token counts are deterministic and documented on [ChatPromptTokens],
// [TextPromptTokens] and [CompletionTokens], so tests and the gateway's
// metering can predict them exactly.
//
// The package owns no goroutines and no listener: callers mount
// [Engine.Handler] on a server they run.
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
	// Seed seeds the latency draws: engines with the same seed draw the same
	// sequence of latencies.
	Seed int64
	// DefaultMaxTokens caps the completion when a request sets neither
	// max_tokens nor max_completion_tokens; 0 means 256.
	DefaultMaxTokens int
	// MaxModelLen is the context length reported by /v1/models and enforced
	// like vLLM does (prompt plus completion cap); 0 means 32768.
	MaxModelLen int
}

const (
	defaultModel       = "tailgate-sim"
	defaultTTFTSigma   = 0.25
	defaultStallFactor = 10
	defaultMaxSeqs     = 256
	defaultMaxTokens   = 256
	defaultMaxModelLen = 32768
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
	case c.DefaultMaxTokens < 0:
		return errors.New("sim: default max tokens must not be negative")
	case c.MaxModelLen < 0:
		return errors.New("sim: max model len must not be negative")
	}
	if d := c.withDefaults(); d.DefaultMaxTokens > d.MaxModelLen {
		return fmt.Errorf("sim: default max tokens %d exceed max model len %d", d.DefaultMaxTokens, d.MaxModelLen)
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
	return c
}

// Stats is a snapshot of an engine's load and history.
type Stats struct {
	Running int // requests holding a slot
	Waiting int // requests queued for a slot
	// Completed counts requests that generated their last token.
	Completed int64
	// Aborted counts requests cancelled by their client's disconnect.
	Aborted int64
}

// Engine is one simulated vLLM replica. It is safe for concurrent use.
type Engine struct {
	cfg       Config // defaults applied
	modelJSON []byte // cfg.Model as a JSON string
	models    []byte // the /v1/models body

	lat     *latencyModel
	sched   *scheduler
	metrics *metrics
	handler http.Handler
	bufs    sync.Pool // of *[]byte, see getBuf

	completed atomic.Int64
	aborted   atomic.Int64
}

// New returns an engine for cfg. Its metrics always live in a registry of its
// own, served at /metrics as vLLM does; when reg is not nil they are also
// registered there.
func New(cfg Config, reg prometheus.Registerer) (*Engine, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	modelJSON, err := json.Marshal(cfg.Model)
	if err != nil {
		return nil, fmt.Errorf("sim: encode model name: %w", err)
	}
	own := prometheus.NewRegistry()
	m := newMetrics(cfg.Model, cfg.MaxSeqs)
	if err := m.register(own); err != nil {
		return nil, fmt.Errorf("sim: %w", err)
	}
	if reg != nil {
		if err := m.register(reg); err != nil {
			return nil, fmt.Errorf("sim: %w", err)
		}
	}
	e := &Engine{
		cfg:       cfg,
		modelJSON: modelJSON,
		models:    modelList(cfg, time.Now()),
		lat:       newLatencyModel(cfg),
		metrics:   m,
	}
	e.sched = newScheduler(cfg.MaxSeqs, m.setLoad)
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
	}
}

// modelList renders the /v1/models body once; it never changes.
func modelList(cfg Config, now time.Time) []byte {
	type card struct {
		ID          string   `json:"id"`
		Object      string   `json:"object"`
		Created     int64    `json:"created"`
		OwnedBy     string   `json:"owned_by"`
		Root        string   `json:"root"`
		Parent      *string  `json:"parent"`
		MaxModelLen int      `json:"max_model_len"`
		Permission  []string `json:"permission"`
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
			OwnedBy:     "tailgate-sim",
			Root:        cfg.Model,
			MaxModelLen: cfg.MaxModelLen,
			Permission:  []string{},
		}},
	})
	return body
}
