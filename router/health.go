package router

import (
	"context"
	"errors"
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
}

// withDefaults returns c with every zero field filled in.
func (c HealthConfig) withDefaults() HealthConfig {
	if c.Interval == 0 {
		c.Interval = time.Second
	}
	if c.Timeout == 0 {
		c.Timeout = time.Second
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
type HealthChecker struct {
	reg    *Registry
	prober Prober
	cfg    HealthConfig
}

// NewHealthChecker returns a checker for reg's replicas.
func NewHealthChecker(reg *Registry, p Prober, cfg HealthConfig) *HealthChecker {
	return &HealthChecker{reg: reg, prober: p, cfg: cfg.withDefaults()}
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
	for _, rep := range h.reg.Replicas() {
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
