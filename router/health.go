package router

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Prober asks a replica whether it is up and which models it serves.
type Prober interface {
	Probe(ctx context.Context, rep *Replica) (models []string, err error)
}

// HealthConfig configures a HealthChecker.
type HealthConfig struct {
	// Interval between probe rounds; 0 means 1s.
	Interval time.Duration
	// Timeout of one probe; 0 means 1s.
	Timeout time.Duration
	// LogEvery is how often a replica that keeps failing its probe for the
	// same reason is logged again; 0 means 30s. A new reason is logged at
	// once.
	LogEvery time.Duration
}

// withDefaults returns c with every zero field filled in.
func (c HealthConfig) withDefaults() HealthConfig {
	if c.Interval == 0 {
		c.Interval = time.Second
	}
	if c.Timeout == 0 {
		c.Timeout = time.Second
	}
	if c.LogEvery == 0 {
		c.LogEvery = 30 * time.Second
	}
	return c
}

// ErrProbeNotReady is what a Prober returns for a replica that answered but
// is not ready (starting, warming, draining): alive, so not ejected.
var ErrProbeNotReady = errors.New("replica answered but is not ready")

// HealthChecker probes every replica each round and expires leases. A
// static replica that answers becomes (or stays) ready with the models it
// lists. A registered replica reports its own state by heartbeat; the probe
// only decides whether it is reachable: one that does not answer is ejected
// (a hung worker is caught within a probe interval plus timeout), and an
// ejected one that answers again is let back in.
//
// Why a replica fails its probe is logged at WARN: at the first failure,
// when the reason changes, and every LogEvery while it lasts — a static
// upstream that never becomes ready would otherwise leave only 404s
// (model_not_found) to go by.
type HealthChecker struct {
	reg    *Registry
	prober Prober
	cfg    HealthConfig

	mu      sync.Mutex
	failing map[string]*probeFailure // by replica id
}

// probeFailure is what was last logged of a replica's failing probes.
type probeFailure struct {
	reason   string
	since    time.Time // first failure of the run
	loggedAt time.Time
	count    int // failures since since
}

// NewHealthChecker returns a checker for reg's replicas.
func NewHealthChecker(reg *Registry, p Prober, cfg HealthConfig) *HealthChecker {
	return &HealthChecker{reg: reg, prober: p, cfg: cfg.withDefaults(), failing: map[string]*probeFailure{}}
}

// noteFailure logs a failed probe of rep unless the same reason was logged
// less than LogEvery ago.
func (h *HealthChecker) noteFailure(rep *Replica, err error, now time.Time) {
	reason := probeReason(err, h.cfg.Timeout)
	h.mu.Lock()
	f := h.failing[rep.ID]
	if f == nil {
		f = &probeFailure{since: now}
		h.failing[rep.ID] = f
	}
	f.count++
	logIt := f.reason != reason || now.Sub(f.loggedAt) >= h.cfg.LogEvery
	count, since := f.count, now.Sub(f.since)
	if logIt {
		f.reason, f.loggedAt = reason, now
	}
	h.mu.Unlock()
	if logIt {
		h.reg.log.Warn("replica probe failed; it takes no traffic until a probe succeeds", "replica", rep.ID, "url", rep.URL, "err", reason,
			"failing_for", since.Round(time.Second), "failures", count)
	}
}

// forgetGone drops the failures of replicas no longer registered.
func (h *HealthChecker) forgetGone(reps []*Replica) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.failing) == 0 {
		return
	}
	known := make(map[string]bool, len(reps))
	for _, r := range reps {
		known[r.ID] = true
	}
	for id := range h.failing {
		if !known[id] {
			delete(h.failing, id)
		}
	}
}

// noteOK forgets rep's failures.
func (h *HealthChecker) noteOK(rep *Replica) {
	h.mu.Lock()
	delete(h.failing, rep.ID)
	h.mu.Unlock()
}

// Run probes until ctx is done. The first round runs at once.
func (h *HealthChecker) Run(ctx context.Context) error {
	t := time.NewTicker(h.cfg.Interval)
	defer t.Stop()
	for {
		h.reg.ExpireLeases(h.reg.cfg.Now())
		h.ProbeAll(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// ProbeAll probes every static replica and every ejected registered
// replica once, concurrently, and waits.
func (h *HealthChecker) ProbeAll(ctx context.Context) {
	var wg sync.WaitGroup
	reps := h.reg.Replicas()
	defer h.forgetGone(reps)
	for _, rep := range reps {
		switch rep.State() {
		case StateReady, StateEjected:
		default:
			if !rep.Static {
				continue // starting, warming, draining: its heartbeats speak for it
			}
		}
		wg.Go(func() { h.probe(ctx, rep) })
	}
	wg.Wait()
}

func (h *HealthChecker) probe(ctx context.Context, rep *Replica) {
	ctx, cancel := context.WithTimeout(ctx, h.cfg.Timeout)
	defer cancel()
	models, err := h.prober.Probe(ctx, rep)
	if ctx.Err() != nil && err != nil && ctx.Err() == context.Canceled {
		return // shutting down
	}
	if errors.Is(err, ErrProbeNotReady) {
		return // alive; its heartbeat carries the state
	}
	now := h.reg.cfg.Now()
	if err != nil {
		h.noteFailure(rep, err, now)
		perr := probeReason(err, h.cfg.Timeout)
		rep.probeErr.Store(&perr)
		switch cur := rep.State(); cur {
		case StateReady:
			h.reg.Eject(rep, "probe")
		case StateStarting, StateEjected:
			rep.markFailure(now)
			rep.transition(cur, cur, "probe: "+err.Error(), now)
		}
		return
	}
	rep.markOK(now)
	rep.probeErr.Store(nil)
	h.noteOK(rep)
	if !rep.Static {
		// A registered replica's state is its worker's to report; a good
		// probe only lifts the gateway's own ejection.
		if rep.transition(StateEjected, StateReady, "", now) {
			h.reg.log.Info("replica re-admitted after a good probe", "replica", rep.ID)
		}
		return
	}
	rep.SetModels(models)
	// A static replica is ready once it answers, unless it said it is
	// draining (see Registry.Drain).
	if cur := rep.State(); cur != StateReady && cur != StateDraining && rep.transition(cur, StateReady, "", now) {
		h.reg.log.Info("replica ready", "replica", rep.ID, "models", models)
	}
}

// probeReason says why a probe failed, in the words the log and a lost
// replica's reason use.
func probeReason(err error, timeout time.Duration) string {
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Sprintf("no answer within %v", timeout)
	}
	return err.Error()
}
