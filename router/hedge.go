package router

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// HedgeConfig configures delayed hedging: when an attempt has produced no
// first token after the hedge delay, a second attempt goes to another
// replica and the first to produce a token wins. The delay adapts per model
// to a high percentile of recent times to first token.
type HedgeConfig struct {
	// Enabled turns hedging on for every model unless Models says otherwise.
	Enabled bool
	// Percentile of recent TTFT used as the delay; 0 means 0.95.
	Percentile float64
	// Min and Max clamp the delay; 0 means 20ms and 30s.
	Min, Max time.Duration
	// Window is how many recent samples per model are kept; 0 means 1000.
	Window int
	// MinSamples is how many samples a model needs before it is hedged;
	// 0 means 50.
	MinSamples int
	// MaxQueue pauses hedging when the replica a hedge would go to has this
	// many requests waiting for room in its engine's batch (or more); 0
	// means 1. Requests the engine says it defers for their own sake (vLLM's
	// reason "deferred") do not count.
	MaxQueue float64
	// Models overrides the settings per model.
	Models map[string]HedgeModel
}

// HedgeModel overrides hedging for one model; zero fields inherit.
type HedgeModel struct {
	Enabled    *bool
	Percentile float64
	Min, Max   time.Duration
}

func (c HedgeConfig) validate() error {
	check := func(p float64, lo, hi time.Duration, where string) error {
		if p < 0 || p >= 1 {
			return fmt.Errorf("router: hedge percentile%s must be in (0,1), e.g. 0.95", where)
		}
		if lo < 0 || hi < 0 || (hi > 0 && lo > hi) {
			return fmt.Errorf("router: hedge min/max delay%s must be positive with min ≤ max", where)
		}
		return nil
	}
	if err := check(c.Percentile, c.Min, c.Max, ""); err != nil {
		return err
	}
	for m, mc := range c.Models {
		if err := check(mc.Percentile, mc.Min, mc.Max, " of "+m); err != nil {
			return err
		}
	}
	if c.Window < 0 || c.MinSamples < 0 || c.MaxQueue < 0 {
		return errors.New("router: hedge window, min samples and max queue must not be negative")
	}
	return nil
}

// hedger keeps per-model TTFT windows and the delay derived from them.
type hedger struct {
	cfg HedgeConfig
	now func() time.Time

	mu     sync.Mutex
	models map[string]*ttftWindow
}

type ttftWindow struct {
	samples []time.Duration // ring
	next    int
	full    bool
	seen    int
	delay   atomic.Int64 // cached delay in ns; 0 = not enough samples
}

// withDefaults returns c with every zero field that has a default filled in.
func (c HedgeConfig) withDefaults() HedgeConfig {
	if c.Percentile == 0 {
		c.Percentile = 0.95
	}
	if c.Min == 0 {
		c.Min = 20 * time.Millisecond
	}
	if c.Max == 0 {
		c.Max = 30 * time.Second
	}
	if c.Window == 0 {
		c.Window = 1000
	}
	if c.MinSamples == 0 {
		c.MinSamples = 50
	}
	if c.MaxQueue == 0 {
		c.MaxQueue = 1
	}
	return c
}

func newHedger(cfg HedgeConfig, now func() time.Time) *hedger {
	return &hedger{cfg: cfg.withDefaults(), now: now, models: map[string]*ttftWindow{}}
}

func (h *hedger) settings(model string) (enabled bool, p float64, lo, hi time.Duration) {
	enabled, p, lo, hi = h.cfg.Enabled, h.cfg.Percentile, h.cfg.Min, h.cfg.Max
	if mc, ok := h.cfg.Models[model]; ok {
		if mc.Enabled != nil {
			enabled = *mc.Enabled
		}
		if mc.Percentile > 0 {
			p = mc.Percentile
		}
		if mc.Min > 0 {
			lo = mc.Min
		}
		if mc.Max > 0 {
			hi = mc.Max
		}
	}
	return enabled, p, lo, hi
}

func (h *hedger) window(key string) *ttftWindow {
	h.mu.Lock()
	defer h.mu.Unlock()
	w := h.models[key]
	if w == nil {
		w = &ttftWindow{samples: make([]time.Duration, h.cfg.Window)}
		h.models[key] = w
	}
	return w
}

// observe adds a sample for key (a model, or model plus answer kind) and
// refreshes the delay every few samples.
func (h *hedger) observe(model, key string, d time.Duration) {
	enabled, p, lo, hi := h.settings(model)
	if !enabled {
		return
	}
	w := h.window(key)
	h.mu.Lock()
	defer h.mu.Unlock()
	w.samples[w.next] = d
	w.next = (w.next + 1) % len(w.samples)
	if w.next == 0 {
		w.full = true
	}
	w.seen++
	n := w.next
	if w.full {
		n = len(w.samples)
	}
	if n < h.cfg.MinSamples || (w.seen%8 != 0 && w.delay.Load() != 0) {
		return
	}
	sorted := slices.Clone(w.samples[:n])
	slices.Sort(sorted)
	q := sorted[min(n-1, int(math.Ceil(p*float64(n)))-1)]
	w.delay.Store(int64(min(max(q, lo), hi)))
}

// delay returns the hedge delay for key, false when the model is not hedged
// or has too few samples yet.
func (h *hedger) delay(model, key string) (time.Duration, bool) {
	if enabled, _, _, _ := h.settings(model); !enabled {
		return 0, false
	}
	d := h.window(key).delay.Load()
	return time.Duration(d), d > 0
}

// HedgeDelay returns the current hedge delay for a model's streams or JSON
// answers (for the admin API and tests).
func (r *Registry) HedgeDelay(model string, stream bool) (time.Duration, bool) {
	return r.hedges.delay(model, hedgeKey(model, stream))
}

func hedgeKey(model string, stream bool) string {
	if stream {
		return model
	}
	return model + "\x00json"
}
