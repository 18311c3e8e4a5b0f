// Package fleet is the gateway's fleet controller for teams without
// Kubernetes: per model it keeps between Min and Max replicas, starts one
// when requests wait for the model (or its in-flight load passes a
// threshold), stops one after an idle period, and replaces a replica it
// started that the registry reports lost or failed, or that its worker
// drains (a preemption notice: replaced at once, see preempt.go). With a
// [Sleeper] it puts an idle replica to vLLM sleep before stopping it, and
// wakes a sleeping one rather than start another (sleep.go). Capacity
// comes from a
// [Provider]: [Local] (child workers of this binary, as `tailgate up` starts
// them) or [Exec] (an operator's start/stop scripts).
//
// Every action is bounded by a timeout, retried with capped exponential
// backoff (a failing provider does not loop), logged, and counted in
// tailgate_fleet_actions_total{model,action,outcome}. The controller never
// has more than Max replicas of a model started or starting.
//
// It reads the registry (package router) and must not import server.
package fleet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tailgate-dev/tailgate/router"
)

// Provider starts and stops replicas. Start returns once the replica is on
// its way (it registers with the gateway itself); both are called with a
// deadline.
type Provider interface {
	Start(ctx context.Context, model, id string) error
	Stop(ctx context.Context, model, id string) error
}

// Model is one managed model's bounds and thresholds.
type Model struct {
	// Min and Max bound the replicas the controller keeps; Min 0 scales
	// to zero. Max 0 means Min (and at least 1).
	Min int `yaml:"min"`
	Max int `yaml:"max"`
	// ScaleUpWaiting starts a replica when this many requests are held for
	// the model (and none of its replicas is already starting); 0 means 1.
	ScaleUpWaiting int `yaml:"scale_up_waiting"`
	// ScaleUpInflight starts a replica when the in-flight attempts per
	// started replica reach it; 0 means never on in-flight load.
	ScaleUpInflight int `yaml:"scale_up_inflight"`
	// IdleAfter stops a replica above Min after the model had nothing in
	// flight or waiting this long; 0 means 5 minutes.
	IdleAfter time.Duration `yaml:"idle_after"`
	// SleepAfter puts the replicas the controller started to sleep (vLLM
	// sleep mode, through their sidecars) after the model had nothing in
	// flight or waiting this long; they are woken when requests wait, and
	// still stopped after IdleAfter above Min. 0 means never; it needs
	// Config.Sleeper.
	SleepAfter time.Duration `yaml:"sleep_after"`
	// SleepLevel is vLLM's sleep level: 1 (weights offloaded to CPU memory,
	// the faster wake) or 2 (weights discarded). 0 means 1.
	SleepLevel int `yaml:"sleep_level"`
}

// Config configures a [Controller].
type Config struct {
	Models map[string]Model
	// Interval is how often the controller looks without being woken; 0
	// means 1s.
	Interval time.Duration
	// ActionTimeout bounds one Start or Stop; 0 means 2 minutes.
	ActionTimeout time.Duration
	// Backoff is the first wait after a failed start of a model, doubled
	// per consecutive failure up to MaxBackoff; 0 means 1s and 1 minute.
	Backoff, MaxBackoff time.Duration
	// Sleeper puts replicas to sleep and wakes them (see Model.SleepAfter);
	// nil: the controller only starts and stops.
	Sleeper Sleeper
	// Registerer receives the controller's metrics; nil: unexported.
	Registerer prometheus.Registerer
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

func (c *Config) setDefaults() {
	if c.Interval <= 0 {
		c.Interval = time.Second
	}
	if c.ActionTimeout <= 0 {
		c.ActionTimeout = 2 * time.Minute
	}
	if c.Backoff <= 0 {
		c.Backoff = time.Second
	}
	if c.MaxBackoff <= 0 {
		c.MaxBackoff = time.Minute
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	for name, m := range c.Models {
		if m.Max <= 0 {
			m.Max = max(m.Min, 1)
		}
		if m.ScaleUpWaiting <= 0 {
			m.ScaleUpWaiting = 1
		}
		if m.IdleAfter <= 0 {
			m.IdleAfter = 5 * time.Minute
		}
		if m.SleepLevel == 0 {
			m.SleepLevel = 1
		}
		c.Models[name] = m
	}
}

// Validate reports a configuration the controller cannot follow.
func (c Config) Validate() error {
	for name, m := range c.Models {
		if m.Min < 0 || m.Max < 0 || (m.Max > 0 && m.Max < m.Min) {
			return fmt.Errorf("fleet model %q: min %d, max %d: want 0 <= min <= max", name, m.Min, m.Max)
		}
		if m.SleepAfter < 0 {
			return fmt.Errorf("fleet model %q: sleep after %s: want 0 (never) or more", name, m.SleepAfter)
		}
		if m.SleepLevel < 0 || m.SleepLevel > 2 {
			return fmt.Errorf("fleet model %q: sleep level %d: want 1 (weights offloaded to CPU memory) or 2 (weights discarded)", name, m.SleepLevel)
		}
	}
	return nil
}

// replica is one replica the controller started.
type replica struct {
	id, model string
	started   time.Time
	noSleep   bool // its engine runs without sleep mode: never put to sleep
}

// modelState is what the controller keeps per model.
type modelState struct {
	busyAt   time.Time // the last time it had requests waiting or in flight
	failures int       // consecutive failed starts
	retryAt  time.Time // no start before this (backoff)
	seq      int       // replica ids: <model>-<seq>
	desired  int       // what the last look wanted
	// replace counts replicas that went away (lost, failed, drained by
	// their worker) not yet started again; replaceWhy says why.
	replace    int
	replaceWhy string
}

// Controller keeps each managed model's replicas within bounds.
type Controller struct {
	cfg  Config
	reg  *router.Registry
	prov Provider
	log  *slog.Logger
	wake chan struct{}

	mu       sync.Mutex
	replicas []*replica
	retiring []*retiree // drained by their worker: stopped once drained (preempt.go)
	models   map[string]*modelState
	sleepOps map[string]bool // replica ids with a sleep or wake under way
	acting   sync.WaitGroup
	history  history // recent actions (status.go)

	actions *prometheus.CounterVec // tailgate_fleet_actions_total{model,action,outcome}
	desired *prometheus.GaugeVec   // tailgate_model_desired_replicas{model}
}

// New returns a controller of cfg's models on reg's replicas; it also
// becomes reg's provisioner, so requests for a managed model with no ready
// replica are held while one starts.
func New(cfg Config, reg *router.Registry, prov Provider, log *slog.Logger) (*Controller, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.Models = maps(cfg.Models)
	cfg.setDefaults()
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	c := &Controller{cfg: cfg, reg: reg, prov: prov, log: log, wake: make(chan struct{}, 1), models: map[string]*modelState{}}
	for name := range cfg.Models {
		c.models[name] = &modelState{busyAt: cfg.Now()}
	}
	c.actions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tailgate_fleet_actions_total",
		Help: "Fleet controller actions by model, action (start, stop, replace, sleep, wake) and outcome (ok, error).",
	}, []string{"model", "action", "outcome"})
	c.desired = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "tailgate_model_desired_replicas",
		Help: "Replicas the fleet controller wants for a model (within its min and max).",
	}, []string{"model"})
	if cfg.Registerer != nil {
		for _, col := range []prometheus.Collector{c.actions, c.desired} {
			if err := cfg.Registerer.Register(col); err != nil {
				return nil, err
			}
		}
	}
	reg.SetProvisioner(c)
	return c, nil
}

func maps(m map[string]Model) map[string]Model {
	out := make(map[string]Model, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// CanStart reports whether model is managed and below its maximum, or a
// replica it started has not registered yet (a replacement on its way), or
// one of its replicas is drained by its worker: the controller's next look
// replaces it at once, even at the maximum, so a request that finds the
// model's only replica draining before that look is worth holding.
func (c *Controller) CanStart(model string) bool {
	m, ok := c.cfg.Models[model]
	if !ok {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.countLocked(model) < m.Max {
		return true
	}
	for _, r := range c.replicas {
		if r.model != model {
			continue
		}
		if rep := c.reg.Get(r.id); rep == nil || rep.State() == router.StateDraining {
			return true
		}
	}
	return false
}

// Models returns the models the controller manages.
func (c *Controller) Models() []string {
	out := make([]string, 0, len(c.cfg.Models))
	for name := range c.cfg.Models {
		out = append(out, name)
	}
	slices.Sort(out)
	return out
}

// Wake makes the controller look now; it never blocks.
func (c *Controller) Wake(string) {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

func (c *Controller) countLocked(model string) int {
	n := 0
	for _, r := range c.replicas {
		if r.model == model {
			n++
		}
	}
	return n
}

// Run reconciles until ctx ends, then stops the replicas it started and
// waits for every action it began.
func (c *Controller) Run(ctx context.Context) error {
	t := time.NewTicker(c.cfg.Interval)
	defer t.Stop()
	for {
		c.reconcile(ctx)
		select {
		case <-ctx.Done():
			c.acting.Wait()
			c.stopAll()
			return nil
		case <-t.C:
		case <-c.wake:
		}
	}
}

func (c *Controller) stopAll() {
	c.mu.Lock()
	rs := c.replicas
	for _, r := range c.retiring {
		rs = append(rs, r.replica)
	}
	c.replicas, c.retiring = nil, nil
	c.mu.Unlock()
	for _, r := range rs {
		c.actOn(context.Background(), Action{Model: r.model, Kind: "stop", Replica: r.id, Reason: "shutdown"},
			func(ctx context.Context) error { return c.prov.Stop(ctx, r.model, r.id) })
	}
}

// Replicas returns the ids of the replicas the controller started for model.
func (c *Controller) Replicas(model string) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var ids []string
	for _, r := range c.replicas {
		if r.model == model {
			ids = append(ids, r.id)
		}
	}
	return ids
}

// reconcile decides, per model, one step towards what it should have.
func (c *Controller) reconcile(ctx context.Context) {
	now := c.cfg.Now()
	for name, m := range c.cfg.Models {
		c.reconcileModel(ctx, name, m, now)
	}
}

func (c *Controller) reconcileModel(ctx context.Context, name string, m Model, now time.Time) {
	waiting, inflight := c.reg.Waiting(name), c.reg.Inflight(name)
	sleepers := len(c.reg.Sleeping(name))
	c.mu.Lock()
	st := c.models[name]
	if waiting > 0 || inflight > 0 {
		st.busyAt = now
	}
	if last := c.reg.LastUsed(name); last.After(st.busyAt) {
		st.busyAt = last // requests between two looks: busy all the same
	}
	// A replica it started that the registry calls lost or failed is
	// replaced: stopped here, started again below as the deficit.
	var lost []*replica
	starting := 0
	c.replicas = slices.DeleteFunc(c.replicas, func(r *replica) bool {
		if r.model != name {
			return false
		}
		rep := c.reg.Get(r.id)
		switch {
		case rep == nil:
			if now.Sub(r.started) < c.cfg.ActionTimeout {
				starting++ // not registered yet
				return false
			}
		case rep.State() == router.StateLost, rep.State() == router.StateFailed:
		case rep.State() == router.StateDraining:
			// Its worker drains it (a preemption notice, a shutdown on
			// its box): the controller's own stops leave the list first.
			c.retireLocked(r, rep.Reason(), now)
			st.replace++
			st.replaceWhy = goneWhy(rep.Reason())
			return true
		default:
			if s := rep.State(); s == router.StateStarting || s == router.StateWarming {
				starting++
			}
			return false
		}
		lost = append(lost, r)
		st.replace++
		st.replaceWhy = "lost"
		return true
	})
	retire := c.drainedLocked(name, now)
	n := c.countLocked(name)
	awake := n - sleepers // capacity that takes requests now
	want := max(n, m.Min)
	more := false // demand asks for one more replica
	why := "min"
	switch {
	case st.replace > 0:
		// What went away is started again at once, not when demand or
		// the lease says so.
		want, why = n+st.replace, st.replaceWhy
	case waiting >= m.ScaleUpWaiting && starting == 0:
		want, why, more = n+1, "waiting", true
	case m.ScaleUpInflight > 0 && awake > 0 && inflight >= int64(m.ScaleUpInflight*awake) && starting == 0:
		want, why, more = n+1, "inflight", true
	case n > m.Min && waiting == 0 && inflight == 0 && now.Sub(st.busyAt) >= m.IdleAfter:
		want = n - 1
	}
	want = min(max(want, m.Min), m.Max)
	if want <= n {
		st.replace = 0 // at max, or nothing to replace: nothing owed
	}
	st.desired = want
	c.desired.WithLabelValues(name).Set(float64(want))
	idle := waiting == 0 && inflight == 0 && m.SleepAfter > 0 && now.Sub(st.busyAt) >= m.SleepAfter
	var start *replica
	var stop *replica
	wake := false
	switch {
	case more && sleepers > 0 && c.cfg.Sleeper != nil:
		// A sleeping replica wakes faster than any other can start, and
		// does not count against Max again.
		wake = !now.Before(st.retryAt)
	case want > n && !now.Before(st.retryAt):
		st.seq++
		start = &replica{id: fmt.Sprintf("%s-%d", idSafe(name), st.seq), model: name, started: now}
		c.replicas = append(c.replicas, start) // counted at once: never past Max
		if st.replace > 0 {
			st.replace--
		}
		if want > n+1 {
			c.Wake(name) // one start per look: look again now for the next
		}
	case want < n:
		for i := len(c.replicas) - 1; i >= 0; i-- {
			if c.replicas[i].model == name {
				stop = c.replicas[i]
				c.replicas = slices.Delete(c.replicas, i, i+1)
				break
			}
		}
		st.busyAt = now // one step per idle period
	}
	c.mu.Unlock()

	if wake || (stop == nil && start == nil && idle) {
		c.reconcileSleep(ctx, name, m, wake, idle)
	}
	for _, r := range lost {
		c.log.Warn("fleet: replica lost; replacing it", "model", name, "replica", r.id)
		c.actOn(ctx, Action{Model: name, Kind: "replace", Replica: r.id, Reason: "lost"}, func(ctx context.Context) error { return c.prov.Stop(ctx, name, r.id) })
	}
	c.stopRetired(ctx, retire)
	if stop != nil {
		c.log.Info("fleet: stopping an idle replica", "model", name, "replica", stop.id)
		c.actOn(ctx, Action{Model: name, Kind: "stop", Replica: stop.id, Reason: "idle"}, func(ctx context.Context) error { return c.prov.Stop(ctx, name, stop.id) })
	}
	if start != nil {
		c.log.Info("fleet: starting a replica", "model", name, "replica", start.id, "reason", why, "waiting", waiting, "inflight", inflight)
		c.acting.Go(func() {
			err := c.actOn(ctx, Action{Model: name, Kind: "start", Replica: start.id, Reason: why}, func(ctx context.Context) error { return c.prov.Start(ctx, name, start.id) })
			c.mu.Lock()
			defer c.mu.Unlock()
			if err == nil {
				st.failures, st.retryAt = 0, time.Time{}
				return
			}
			// Not started: it does not count, and the next try waits.
			c.replicas = slices.DeleteFunc(c.replicas, func(r *replica) bool { return r == start })
			st.failures++
			if why != "min" && why != "waiting" && why != "inflight" {
				st.replace++ // still owed once the backoff ends
			}
			wait := min(c.cfg.Backoff<<min(st.failures-1, 20), c.cfg.MaxBackoff)
			st.retryAt = c.cfg.Now().Add(wait)
			c.log.Warn("fleet: start failed; retrying after backoff", "model", name, "replica", start.id, "failures", st.failures, "in", wait, "err", err)
		})
	}
}

// act runs one provider action under the action timeout, counts it and
// keeps it in the recent actions.
func (c *Controller) act(ctx context.Context, model, action string, f func(context.Context) error) error {
	return c.actOn(ctx, Action{Model: model, Kind: action}, f)
}

// actOn is act of a, which names the replica and why.
func (c *Controller) actOn(ctx context.Context, a Action, f func(context.Context) error) error {
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.ActionTimeout)
	defer cancel()
	a.Time = c.cfg.Now()
	err := f(actx)
	a.Duration = c.cfg.Now().Sub(a.Time)
	a.Outcome = "ok"
	if err != nil {
		a.Outcome = "error"
		if errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("%s took longer than %s: %w", a.Kind, c.cfg.ActionTimeout, err)
		}
		a.Error = err.Error()
		if a.Kind != "start" && a.Kind != "wake" { // those log with their backoff
			c.log.Warn("fleet: action failed", "model", a.Model, "action", a.Kind, "replica", a.Replica, "err", err)
		}
	}
	c.actions.WithLabelValues(a.Model, a.Kind, a.Outcome).Inc()
	c.history.add(a)
	return err
}

// idSafe makes a model name usable in a replica id (a Hugging Face id has
// a slash).
func idSafe(model string) string {
	b := []byte(model)
	for i, ch := range b {
		if !(ch >= 'a' && ch <= 'z' || ch >= 'A' && ch <= 'Z' || ch >= '0' && ch <= '9' || ch == '-' || ch == '.') {
			b[i] = '-'
		}
	}
	return string(b)
}
