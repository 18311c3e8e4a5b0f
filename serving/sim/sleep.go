package sim

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/tailgate-dev/tailgate/serving"
)

// Sleep mode, as vLLM serves it.
//
// vLLM (v0.11 to v0.1x; read at vllm/entrypoints/serve/sleep/api_router.py,
// and before that in vllm/entrypoints/openai/api_server.py under
// `if envs.VLLM_SERVER_DEV_MODE`) serves three development endpoints when
// started with VLLM_SERVER_DEV_MODE=1, and they work only with
// --enable-sleep-mode (the CuMem allocator that can offload and free):
//
//	POST /sleep?level=1|2   level 1 offloads the weights to CPU memory and
//	                        discards the KV cache; level 2 discards both.
//	                        200, empty body, once asleep.
//	POST /wake_up[?tags=weights&tags=kv_cache]
//	                        wakes what tags name (all when none); 200, empty
//	                        body, once done.
//	GET  /is_sleeping       {"is_sleeping": bool}
//
// While asleep, vLLM's /health still answers 200, /v1/models, /tokenize and
// /detokenize still work, and /metrics says vllm:engine_sleep_state. vLLM does
// not refuse a generation request sent to a sleeping engine: on the v0 engine
// it crashed (vllm-project/vllm#15483; #16536, which would have answered 503,
// was closed unmerged); on the v1 engine, whose sleep pauses the scheduler,
// the request waits until /wake_up. The simulator does the latter: a request
// for an endpoint that needs the weights (every generation and pooling
// endpoint) waits, without a slot, until the engine is awake or its client
// goes away. The sidecar never sends it one (it refuses with 503 while the
// engine sleeps).
//
// vLLM's /sleep takes mode=abort (default), wait or keep for the requests in
// flight; the simulator always waits for them (mode=wait). tailgate puts
// only an idle engine to sleep, where the modes agree.

// Tags of /wake_up?tags=…: what a partial wake restores.
const (
	tagWeights = "weights"
	tagKVCache = "kv_cache"
)

// DefaultWakeDelay and DefaultWakeDelayLevel2 are how long a simulated
// engine takes to wake from sleep level 1 and level 2 (see
// [Config.WakeDelay]).
//
// vLLM's own figures (blog.vllm.ai/2025/10/26/sleep-mode.html, "Zero-Reload
// Model Switching with vLLM Sleep Mode"): waking is 18–200× faster than a
// full reload; level 1 woke in 0.1 s (Qwen3-0.6B) to about 6 s (a 235B model
// over several GPUs), level 2 in 0.8–2.6 s for the small models on an A4000,
// and the first prompt after a wake with a one-token warm-up took 0.96 s
// against 4.12 s after a reload. For the 7–8B model on one GPU that
// tailgate's defaults assume, level 1 copies about 16 GB of bf16 weights
// back from pinned host memory over PCIe 4 (~25 GB/s): about 0.7 s, 1 s
// with the KV cache reallocated. Level 2 reloads the weights from disk
// (the OS page cache after the first load, some 5–8 GB/s): about 3 s.
const (
	DefaultWakeDelay       = time.Second
	DefaultWakeDelayLevel2 = 3 * time.Second
)

// sleepDelay is how long /sleep at level takes: level 1 copies the weights
// to host memory (the same bytes over the same bus as its wake), level 2
// only frees them.
func (c Config) sleepDelay(level int) time.Duration {
	if level == 2 {
		return c.WakeDelayLevel2 / 10
	}
	return c.WakeDelay
}

// wakeDelay is how long /wake_up takes for an engine asleep at level,
// waking what tags name: restoring the weights costs the level's wake
// delay; reallocating the (empty) KV cache costs nothing worth modelling.
func (c Config) wakeDelay(level int, tags []string) time.Duration {
	if level == 0 || !wakes(tags, tagWeights) {
		return 0
	}
	if level == 2 {
		return c.WakeDelayLevel2
	}
	return c.WakeDelay
}

// wakes reports whether a wake of tags (none: all) restores tag.
func wakes(tags []string, tag string) bool {
	if len(tags) == 0 {
		return true
	}
	for _, t := range tags {
		if t == tag {
			return true
		}
	}
	return false
}

// sleeper is an engine's sleep state. Requests that need the weights pass
// through guard; sleep and wake_up change the state one at a time.
type sleeper struct {
	cfg     Config
	metrics *metrics
	pause   func(ctx context.Context, d time.Duration) error

	op sync.Mutex // one /sleep or /wake_up at a time

	mu       sync.Mutex
	level    int             // 0 awake, else the level it sleeps at
	asleep   map[string]bool // tags still asleep (weights, kv_cache)
	awake    chan struct{}   // closed while requests may run
	inflight int             // requests past guard
	held     int             // requests waiting in guard for the engine to wake
	idle     chan struct{}   // closed when inflight reaches 0, while a sleep waits
}

func newSleeper(cfg Config, m *metrics) *sleeper {
	s := &sleeper{cfg: cfg, metrics: m, pause: pause, awake: make(chan struct{})}
	close(s.awake)
	m.setSleepState(0)
	return s
}

// pause waits d or until ctx ends.
func pause(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// guard makes a request that needs the weights wait until the engine is
// awake (or its client goes away), and counts it in flight meanwhile.
func (s *sleeper) guard(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		for {
			s.mu.Lock()
			awake := s.awake
			select {
			case <-awake:
				s.inflight++
				s.mu.Unlock()
				defer s.done()
				next(w, r)
				return
			default:
			}
			s.held++
			s.mu.Unlock()
			select {
			case <-awake:
			case <-r.Context().Done():
			}
			s.mu.Lock()
			s.held--
			s.mu.Unlock()
			if r.Context().Err() != nil {
				return // the client went away while the engine slept
			}
		}
	}
}

func (s *sleeper) done() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.inflight--; s.inflight == 0 && s.idle != nil {
		close(s.idle)
		s.idle = nil
	}
}

// sleeping reports whether the engine sleeps (not fully awake).
func (s *sleeper) sleeping() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.level != 0
}

// sleep puts the engine to sleep at level: new requests wait from now,
// those in flight finish, then the weights go (sleepDelay).
func (s *sleeper) sleep(ctx context.Context, level int) error {
	s.op.Lock()
	defer s.op.Unlock()
	s.mu.Lock()
	if s.level != 0 {
		s.mu.Unlock()
		return nil // already asleep
	}
	s.awake = make(chan struct{}) // not closed: new requests wait
	var idle chan struct{}
	if s.inflight > 0 {
		s.idle = make(chan struct{})
		idle = s.idle
	}
	s.mu.Unlock()
	if idle != nil {
		select {
		case <-idle:
		case <-ctx.Done():
			s.reopen()
			return ctx.Err()
		}
	}
	if err := s.pause(ctx, s.cfg.sleepDelay(level)); err != nil {
		s.reopen()
		return err
	}
	s.mu.Lock()
	s.level, s.asleep = level, map[string]bool{tagWeights: true, tagKVCache: true}
	s.mu.Unlock()
	s.metrics.setSleepState(level)
	return nil
}

// reopen lets requests run again after a sleep that did not happen.
func (s *sleeper) reopen() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.idle = nil
	select {
	case <-s.awake:
	default:
		close(s.awake)
	}
}

// wake restores what tags name (all when none); the engine serves again
// once nothing is left asleep.
func (s *sleeper) wake(ctx context.Context, tags []string) error {
	s.op.Lock()
	defer s.op.Unlock()
	s.mu.Lock()
	level := s.level
	weightsAsleep := s.asleep[tagWeights]
	s.mu.Unlock()
	if level == 0 {
		return nil
	}
	d := time.Duration(0)
	if weightsAsleep {
		d = s.cfg.wakeDelay(level, tags)
	}
	if err := s.pause(ctx, d); err != nil {
		return err
	}
	s.mu.Lock()
	for tag := range s.asleep {
		if wakes(tags, tag) {
			delete(s.asleep, tag)
		}
	}
	awake := len(s.asleep) == 0
	if awake {
		s.level = 0
		close(s.awake)
	}
	s.mu.Unlock()
	if awake {
		s.metrics.setSleepState(0)
	}
	return nil
}

// handlePostSleep is vLLM's POST /sleep?level=N (default 1).
func (s *sleeper) handlePostSleep(w http.ResponseWriter, r *http.Request) {
	level := 1
	if v := r.URL.Query().Get("level"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || (n != 1 && n != 2) {
			writeError(w, badRequest("level", "level must be 1 (offload the weights to CPU memory) or 2 (discard them), not "+strconv.Quote(v)))
			return
		}
		level = n
	}
	if err := s.sleep(r.Context(), level); err != nil {
		return // the client went away; nothing changed
	}
	w.WriteHeader(http.StatusOK)
}

// handlePostWakeUp is vLLM's POST /wake_up[?tags=…].
func (s *sleeper) handlePostWakeUp(w http.ResponseWriter, r *http.Request) {
	tags := r.URL.Query()["tags"]
	for _, t := range tags {
		if t != tagWeights && t != tagKVCache {
			writeError(w, badRequest("tags", "tags must be weights or kv_cache, not "+strconv.Quote(t)))
			return
		}
	}
	if err := s.wake(r.Context(), tags); err != nil {
		return
	}
	w.WriteHeader(http.StatusOK)
}

// handleGetIsSleeping is vLLM's GET /is_sleeping.
func (s *sleeper) handleGetIsSleeping(w http.ResponseWriter, _ *http.Request) {
	body, _ := json.Marshal(struct {
		IsSleeping bool `json:"is_sleeping"`
	}{s.sleeping()})
	writeJSON(w, http.StatusOK, body)
}

// sleepStateName is vllm:engine_sleep_state's label for level.
func sleepStateName(level int) string {
	switch level {
	case 1:
		return serving.SleepWeightsOffloaded
	case 2:
		return serving.SleepDiscardAll
	}
	return serving.SleepAwake
}
