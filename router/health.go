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

// NewHealthChecker returns a checker for reg's static replicas.
func NewHealthChecker(reg *Registry, p Prober, cfg HealthConfig) *HealthChecker {
	if cfg.Interval <= 0 {
		cfg.Interval = time.Second
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = time.Second
	}
	return &HealthChecker{reg: reg, prober: p, cfg: cfg}
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
	if err != nil {
		switch rep.State() {
		case StateReady:
			h.reg.Eject(rep, "probe")
		case StateStarting, StateEjected:
			rep.failures.Add(1)
			rep.SetState(rep.State(), "probe: "+err.Error())
		}
		return
	}
	if !rep.Static {
		// A registered replica's state is its worker's to report; a good
		// probe only lifts the gateway's own ejection.
		if rep.state.CompareAndSwap(int32(StateEjected), int32(StateReady)) {
			rep.reason.Store(new(string))
			rep.readySince.Store(h.reg.cfg.Now().UnixNano())
			h.reg.log.Info("replica re-admitted after a good probe", "replica", rep.ID)
		}
		rep.markOK(h.reg.cfg.Now())
		return
	}
	rep.SetModels(models)
	rep.markOK(h.reg.cfg.Now())
	if s := rep.State(); s != StateReady && s != StateDraining {
		h.reg.log.Info("replica ready", "replica", rep.ID, "models", models)
		rep.SetState(StateReady, "")
	}
}
