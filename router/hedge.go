package router

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// HedgeConfig configures delayed hedging: when an attempt has produced no
// first token after the hedge delay, a second attempt goes to another
// replica and the first to produce a token wins. The delay adapts per model
// to a high percentile of recent request-level times to first token.
//
// An answer the client sees only whole (JSON assembled by the gateway, a
// Batch API line) may also be hedged on its decode pace: an attempt that,
// after its first token, falls behind the same percentile of recent time per
// output token gets a hedge on another replica, and the first whole answer
// wins (see [Call.Whole]). Every switch and budget here applies to
// both kinds of hedge.
//
// A part of a fan-out (requests with the same group, see [Request.Group])
// is hedged at a lower percentile than a lone request, the lower the more
// parts its group has in flight, within what the budget pays for (see
// partPercentile).
type HedgeConfig struct {
	// Enabled turns hedging on for every model unless Models says otherwise.
	// The gateway turns it on unless told --hedge=false.
	Enabled bool
	// Budget is the hedges every request earns per model, a fraction of
	// requests; 0 means 0.10. Hedges have their own bucket; the retry
	// budget ([BudgetConfig]) is for retries only.
	Budget float64
	// Burst caps a model's hedge bucket: the hedges that may start at once
	// beyond their Budget share; 0 means 20. Parts of a fan-out group may
	// run up to one more Burst ahead on credit (see hedgeBudget).
	Burst float64
	// Percentile of recent TTFT used as the delay; 0 means 0.95.
	Percentile float64
	// Min and Max clamp the delay; 0 means 20ms and 30s. Min is also the
	// least time an attempt must fall behind the pace percentile before a
	// pace hedge (see PaceLead).
	Min, Max time.Duration
	// PaceLead is how many output tokens, at the pace percentile, an attempt
	// must fall behind it before a pace hedge starts (or Min, whichever is
	// longer), so the jitter of a few tokens does not trip it; 0 means 4.
	PaceLead int
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
	Enabled       *bool
	Percentile    float64
	Min, Max      time.Duration
	Budget, Burst float64
}

// Hedge budget defaults, sized for fan-out: a document split into parts
// takes its slowest part's time, so a handful of unhedged stalls decides its
// tail. 10 % of requests is what the seed paper spent (~10 % extra tokens)
// for its ÷4.6 cut of document P95; a burst of 20 lets a few documents' parts
// that trip the delay at once all hedge (4–8 parts each, about one in four
// on a slow replica), and refills in 200 requests.
const (
	defaultHedgeBudget = 0.10
	defaultHedgeBurst  = 20
)

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
	if c.Window < 0 || c.MinSamples < 0 || c.MaxQueue < 0 || c.PaceLead < 0 {
		return errors.New("router: hedge window, min samples, max queue and pace lead must not be negative")
	}
	budget := func(ratio, burst float64, where string) error {
		if ratio < 0 || ratio > 1 {
			return fmt.Errorf("router: hedge budget%s %v: want a fraction of requests between 0 and 1, e.g. 0.1 (0 means the default %v)", where, ratio, defaultHedgeBudget)
		}
		if burst < 0 {
			return fmt.Errorf("router: hedge burst%s %v: must not be negative (0 means the default %v)", where, burst, defaultHedgeBurst)
		}
		return nil
	}
	if err := budget(c.Budget, c.Burst, ""); err != nil {
		return err
	}
	for m, mc := range c.Models {
		if err := budget(mc.Budget, mc.Burst, " of "+m); err != nil {
			return err
		}
	}
	return nil
}

// hedger keeps per-model TTFT windows and the delay derived from them, the
// decode pace windows, and each model's hedge budget.
type hedger struct {
	cfg HedgeConfig
	now func() time.Time

	mu      sync.Mutex // the maps only
	models  map[windowKey]*ttftWindow
	paces   map[string]*ttftWindow  // by model: time per output token
	budgets map[string]*hedgeBudget // by model

	// routed are the models requests were routed to, each with its
	// settings, windows and budget: a request looks its model up once, in
	// a map no lock guards (replaced whole, under mu, when a model is
	// added), and reads the rest from what it found.
	routed atomic.Pointer[map[string]*hedgeModel]
}

// hedgeModel is one model's hedging as a request uses it: the settings, the
// windows of its JSON answers and streams and of its decode pace, and its
// hedge budget (the same windows and budget the hedger's maps hold).
type hedgeModel struct {
	s      hedgeSettings
	ttft   [2]*ttftWindow // JSON answers, streams
	pace   *ttftWindow
	budget *hedgeBudget
}

// windowOf returns hm's first-token window of streams or JSON answers.
func (hm *hedgeModel) windowOf(stream bool) *ttftWindow {
	if stream {
		return hm.ttft[1]
	}
	return hm.ttft[0]
}

// ttftWindow is a model's recent samples of one duration — time to first
// token, or time per output token after it — and their percentile.
//
// Every request adds a sample, to the ring and to the same samples kept in
// order (a binary search and a move of the values between the sample it
// replaces and its own); every few samples one of them copies the ordered
// samples to refresh the percentile. (Sorting a copy of the ring on each
// refresh instead cost 0.56 % of the gateway's CPU at 1000 req/s:
// /work/wt/profile tg3.script, router.(*hedger).add and pdqsort under it.)
// The copy holds no lock a request waits on but the window's own: with it
// under the hedger's one lock, a refreshing goroutine descheduled by a GC
// phase held up every request's budget lookup behind it (2 ms convoys in
// an execution trace at 1000 req/s on 2 cores).
type ttftWindow struct {
	model  string
	stream bool
	p      float64 // the model's percentile: the one delay caches

	mu      sync.Mutex      // samples, order, next, full, seen
	samples []time.Duration // ring
	order   []time.Duration // the ring's samples, ascending
	next    int
	full    bool
	seen    int

	delay atomic.Int64 // cached percentile in ns; 0 = not enough samples

	refreshing atomic.Bool     // one refresh at a time; a sample due while one runs skips it
	spare      []time.Duration // the refresher's buffer, the last sort but one

	// sorted are the samples as of the last refresh of delay, sorted, and
	// lo, hi its clamp: other percentiles (a group part's) are read from
	// them. nil before MinSamples. A refresh swaps them in under snap.
	snap   sync.RWMutex
	sorted []time.Duration
	lo, hi time.Duration
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
	if c.Budget == 0 {
		c.Budget = defaultHedgeBudget
	}
	if c.Burst == 0 {
		c.Burst = defaultHedgeBurst
	}
	if c.PaceLead == 0 {
		c.PaceLead = 4
	}
	return c
}

func newHedger(cfg HedgeConfig, now func() time.Time) *hedger {
	h := &hedger{cfg: cfg.withDefaults(), now: now, models: map[windowKey]*ttftWindow{}, paces: map[string]*ttftWindow{}, budgets: map[string]*hedgeBudget{}}
	h.routed.Store(&map[string]*hedgeModel{})
	return h
}

// model returns model's hedging for a request routed to it, made (with
// its windows and budget) the first time.
func (h *hedger) model(model string) *hedgeModel {
	if hm := (*h.routed.Load())[model]; hm != nil {
		return hm
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	old := *h.routed.Load()
	if hm := old[model]; hm != nil {
		return hm
	}
	hm := &hedgeModel{
		s:      h.settings(model),
		ttft:   [2]*ttftWindow{windowIn(h, h.models, windowKey{model, false}, model, false), windowIn(h, h.models, windowKey{model, true}, model, true)},
		pace:   windowIn(h, h.paces, model, model, false),
		budget: h.budgetLocked(model),
	}
	routed := make(map[string]*hedgeModel, len(old)+1)
	maps.Copy(routed, old)
	routed[model] = hm
	h.routed.Store(&routed)
	return hm
}

// hedgeSettings is one model's hedging, the defaults and its override merged.
type hedgeSettings struct {
	enabled       bool
	p             float64
	lo, hi        time.Duration
	budget, burst float64
}

func (h *hedger) settings(model string) hedgeSettings {
	s := hedgeSettings{h.cfg.Enabled, h.cfg.Percentile, h.cfg.Min, h.cfg.Max, h.cfg.Budget, h.cfg.Burst}
	if mc, ok := h.cfg.Models[model]; ok {
		if mc.Enabled != nil {
			s.enabled = *mc.Enabled
		}
		if mc.Percentile > 0 {
			s.p = mc.Percentile
		}
		if mc.Min > 0 {
			s.lo = mc.Min
		}
		if mc.Max > 0 {
			s.hi = mc.Max
		}
		if mc.Budget > 0 {
			s.budget = mc.Budget
		}
		if mc.Burst > 0 {
			s.burst = mc.Burst
		}
	}
	return s
}

func (h *hedger) window(model string, stream bool) *ttftWindow {
	h.mu.Lock()
	defer h.mu.Unlock()
	return windowIn(h, h.models, windowKey{model, stream}, model, stream)
}

// windowKey names a model's window of streams or of JSON answers. (A string
// made of both cost every request an allocation to look its window up.)
type windowKey struct {
	model  string
	stream bool
}

// windowIn returns in's window for key, made for model's streams or JSON
// answers the first time; h.mu is held.
func windowIn[K comparable](h *hedger, in map[K]*ttftWindow, key K, model string, stream bool) *ttftWindow {
	w := in[key]
	if w == nil {
		w = &ttftWindow{model: model, stream: stream, p: h.settings(model).p,
			samples: make([]time.Duration, h.cfg.Window), order: make([]time.Duration, 0, h.cfg.Window)}
		in[key] = w
	}
	return w
}

// budget returns model's hedge budget.
func (h *hedger) budget(model string) *hedgeBudget {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.budgetLocked(model)
}

// budgetLocked is budget with h.mu held.
func (h *hedger) budgetLocked(model string) *hedgeBudget {
	b := h.budgets[model]
	if b == nil {
		b = newHedgeBudget(h.settings(model).burst)
		h.budgets[model] = b
	}
	return b
}

// observe adds a request's time to first token for a model's streams or
// JSON answers and refreshes the delay every few samples. It learns even
// while hedging is off for the model, so the delay is ready when it is
// turned on and "disabled" skips can be counted.
func (h *hedger) observe(model string, stream bool, d time.Duration) {
	h.observeIn(h.model(model), stream, d)
}

// observeIn is observe for a model looked up.
func (h *hedger) observeIn(hm *hedgeModel, stream bool, d time.Duration) {
	h.add(hm.windowOf(stream), d, hm.s.p, hm.s.lo, hm.s.hi)
}

// observePace adds an attempt's time per output token after its first.
func (h *hedger) observePace(model string, d time.Duration) {
	h.observePaceIn(h.model(model), d)
}

// observePaceIn is observePace for a model looked up.
func (h *hedger) observePaceIn(hm *hedgeModel, d time.Duration) {
	h.add(hm.pace, d, hm.s.p, time.Nanosecond, math.MaxInt64)
}

// add puts d in w and refreshes w's percentile p, clamped to [lo, hi],
// every few samples.
func (h *hedger) add(w *ttftWindow, d time.Duration, p float64, lo, hi time.Duration) {
	w.mu.Lock()
	if w.full {
		w.order = replaceSorted(w.order, w.samples[w.next], d)
	} else {
		w.order = insertSorted(w.order, d)
	}
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
	// Refreshed every 8 samples while the window fills, then every 1/32
	// of the window: a copy of the ordered window per refresh, by the
	// request whose sample made it due, for a percentile that moves slowly
	// once it is full.
	every := max(8, n/32)
	if n < h.cfg.MinSamples || (w.seen%every != 0 && w.delay.Load() != 0) || !w.refreshing.CompareAndSwap(false, true) {
		w.mu.Unlock()
		return
	}
	buf := append(w.spare[:0], w.order...)
	w.mu.Unlock()
	w.snap.Lock()
	w.sorted, w.spare = buf, w.sorted
	w.lo, w.hi = lo, hi
	q := w.quantileLocked(p)
	w.snap.Unlock()
	w.delay.Store(int64(q))
	w.refreshing.Store(false)
}

// insertSorted inserts d into the ascending s, which has room for it.
func insertSorted(s []time.Duration, d time.Duration) []time.Duration {
	i, _ := slices.BinarySearch(s, d)
	return slices.Insert(s, i, d)
}

// replaceSorted replaces one old (which s holds) by d in the ascending s,
// moving only the values between the two.
func replaceSorted(s []time.Duration, old, d time.Duration) []time.Duration {
	i, _ := slices.BinarySearch(s, old)
	j, _ := slices.BinarySearch(s, d)
	switch {
	case d > old: // s[i+1:j] are below d: they move down one
		copy(s[i:j-1], s[i+1:j])
		s[j-1] = d
	case d < old: // s[j:i] are at least d: they move up one
		copy(s[j+1:i+1], s[j:i])
		s[j] = d
	}
	return s
}

// quantileLocked returns w's percentile p as of its last refresh, clamped;
// 0 before it has one. w.snap must be held.
func (w *ttftWindow) quantileLocked(p float64) time.Duration {
	n := len(w.sorted)
	if n == 0 {
		return 0
	}
	return min(max(w.sorted[max(0, min(n-1, int(math.Ceil(p*float64(n)))-1))], w.lo), w.hi)
}

// at returns w's percentile p: its cached delay when p is the model's
// percentile, else read from its last refresh; false with too few samples.
func (h *hedger) at(w *ttftWindow, p float64) (time.Duration, bool) {
	if p == w.p {
		d := w.delay.Load()
		return time.Duration(d), d > 0
	}
	w.snap.RLock()
	defer w.snap.RUnlock()
	d := w.quantileLocked(p)
	return d, d > 0
}

// partPercentile is the percentile a request's hedge delay and decode pace
// are read at: the model's p for a lone request, lower for a part of a
// group that has had n requests in flight at once.
//
// A fan-out is as slow as its slowest part, so its tail is made of parts
// that were hedged: each costs its document the delay plus a hedge's own
// first token, and a lone request's delay makes that the document's P95.
// A part is hedged earlier, then — at a percentile one (1-p) lower for
// each doubling of its group (p95: p90 for 4 parts, p85 for 8), the more
// parts the likelier one of them decides the document — but never below
// 1 − ¾·budget: first-token hedges of parts then use at most three
// quarters of the hedge budget, leaving the rest for pace hedges and for
// documents that bunch up, so a stalled part is not refused a hedge that
// spurious ones spent. Never above p: a budget too small for that leaves
// parts at the lone percentile.
func partPercentile(p, budget float64, n int) float64 {
	if n < 2 {
		return p
	}
	return min(p, max(1-(1-p)*math.Log2(float64(n)), 1-0.75*budget))
}

// delayFor returns the hedge delay of a request of model that is one of n
// in flight in its group (1 for a lone request), whether or not hedging is
// on for the model; false with too few samples yet.
func (h *hedger) delayFor(model string, stream bool, n int) (time.Duration, bool) {
	s := h.settings(model)
	return h.at(h.window(model, stream), partPercentile(s.p, s.budget, n))
}

// delayIn is delayFor for a model looked up.
func (h *hedger) delayIn(hm *hedgeModel, stream bool, n int) (time.Duration, bool) {
	return h.at(hm.windowOf(stream), partPercentile(hm.s.p, hm.s.budget, n))
}

// grace returns how long a hedged request's original, whose first token
// came while its hedge had produced none yet, is held back for the
// hedge's: the model's median time to first token (as learnt in the same
// window as its delay), clamped to [Min, delay]; 0 while too few samples.
//
// An original so late that it was hedged is evidence of a slow or loaded
// replica — in the simulated engine a stall that stretches every token, in
// vLLM a long queue or a large batch that slows its decode too — so it
// should not win a close race outright: the hedge, on a replica that was
// not late, gets the time a typical first token takes. A stream cannot be
// hedged on pace once its client has the original's tokens, and an
// assembled answer's pace hedge would come only after the original fell
// behind; the grace costs the client at most its own length, and an
// original that loses it its prompt and first token as hedge overhead.
func (h *hedger) grace(model string, stream bool, delay time.Duration) time.Duration {
	return h.graceIn(h.model(model), stream, delay)
}

// graceIn is grace for a model looked up.
func (h *hedger) graceIn(hm *hedgeModel, stream bool, delay time.Duration) time.Duration {
	med, ok := h.at(hm.windowOf(stream), 0.5)
	if !ok {
		return 0
	}
	return min(max(med, hm.s.lo), delay)
}

// Pace is a model's decode pace as learnt when it was read: its percentile
// time per output token after the first, and the lead an attempt may fall
// behind it.
type Pace struct {
	Per, Lead time.Duration
}

// Due returns how long after its first token an attempt that has produced
// k more output tokens is behind the pace: by Lead more than k tokens take
// at the percentile time per token.
func (p Pace) Due(k int64) time.Duration {
	return p.Per*time.Duration(max(k, 0)) + p.Lead
}

// pace returns model's decode pace for a request that is one of n in
// flight in its group (1 for a lone request; see partPercentile), its lead
// PaceLead tokens at the pace percentile or Min, whichever is longer; false
// while the pace has too few samples.
func (h *hedger) pace(model string, n int) (Pace, bool) {
	return h.paceIn(h.model(model), n)
}

// paceIn is pace for a model looked up.
func (h *hedger) paceIn(hm *hedgeModel, n int) (Pace, bool) {
	s := hm.s
	per, ok := h.at(hm.pace, partPercentile(s.p, s.budget, n))
	if !ok {
		return Pace{}, false
	}
	return Pace{Per: per, Lead: max(per*time.Duration(h.cfg.PaceLead), s.lo)}, true
}

// delay returns a lone request's hedge delay, false when the model is not
// hedged or has too few samples yet.
func (h *hedger) delay(model string, stream bool) (time.Duration, bool) {
	if !h.settings(model).enabled {
		return 0, false
	}
	return h.delayFor(model, stream, 1)
}

// delays returns the windows with a delay, for the metrics.
func (h *hedger) delays() []*ttftWindow {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []*ttftWindow
	for _, w := range h.models {
		if w.delay.Load() > 0 && h.settings(w.model).enabled {
			out = append(out, w)
		}
	}
	return out
}

// levels returns each model's hedge budget level, for the metrics.
func (h *hedger) levels() map[string]float64 {
	h.mu.Lock()
	bs := maps.Clone(h.budgets)
	h.mu.Unlock()
	out := make(map[string]float64, len(bs))
	for m, b := range bs {
		out[m] = b.level()
	}
	return out
}

// HedgeDelay returns the current hedge delay for a model's streams or JSON
// answers (for the admin API and tests).
func (r *Registry) HedgeDelay(model string, stream bool) (time.Duration, bool) {
	return r.hedges.delay(model, stream)
}

// RecentTTFT returns model's recent request-level time to first token at
// percentile p (0 < p < 1) of its streams, read from the window the hedge
// delay is learnt from (clamped to the hedge's Min and Max like the delay);
// false while the window has too few samples. The regional status an edge
// polls reports it.
func (r *Registry) RecentTTFT(model string, p float64) (time.Duration, bool) {
	return r.hedges.at(r.hedges.window(model, true), p)
}
