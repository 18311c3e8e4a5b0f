// Package worker runs the worker role of one GPU box: the engine's launcher,
// the sidecar that fronts it, and the heartbeats that register it with a
// gateway (each of several gateways independently), with the drain on
// shutdown that ties them together.
//
// # Overview
//
// [New] checks a [Config] and builds the parts; [Worker.Run] serves until
// its context ends, then drains. The replica's state at the gateway is the
// launcher's, failed while the sidecar finds a ready engine not answering
// (frozen or wedged), and draining at the end; each change is sent at once,
// and while the replica is not ready each heartbeat carries the engine's last
// error lines. A preemption notice (a file, a URL, a signal: see
// [Config.PreemptFile]) drains it as a shutdown does, with the reason
// "preempted: …" so the gateway replaces it at once. On shutdown: the gateway is told at once that the
// replica is draining (so it stops routing here), in-flight requests get
// [Config.DrainGrace] to finish, and only then is the engine's process group
// stopped. An engine that cannot be started at all, or a sidecar listener
// that fails, ends Run with the same drain.
//
// The engine listens on a Unix socket only the worker's user can open, and
// the sidecar reaches it there (see the launcher): nothing on the box
// reaches the engine over TCP, around the sidecar and the gateway's metering.
//
// The package owns no listener set-up and no tailnet: the caller passes the
// sidecar's [net.Listener] and, in mesh mode, a dial function for the
// gateway, so it never imports the mesh.
package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/tailgate-dev/tailgate/serving"
	"github.com/tailgate-dev/tailgate/serving/launcher"
	"github.com/tailgate-dev/tailgate/serving/sidecar"
)

// Worker is one GPU box's worker role. Run may be called once.
type Worker struct {
	cfg    Config // defaults applied
	log    *slog.Logger
	addr   string // advertised sidecar URL
	id     string
	launch *launcher.Launcher
	side   *sidecar.Sidecar
	beats  []*sidecar.Heartbeater // one per gateway
	legacy string                 // credential-<id> of a worker that had one gateway; "" if none
	// registering lets one heartbeater at a time obtain a credential; the
	// others then borrow it.
	registering sync.Mutex
	ran         atomic.Bool

	mu       sync.Mutex // orders launcher state changes against the drain
	draining bool
}

// New returns a worker for cfg; nothing runs until [Worker.Run].
func New(cfg Config) (*Worker, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	w := &Worker{cfg: cfg, log: cfg.Log, addr: cfg.Advertise, id: cfg.ReplicaID}
	if w.addr == "" {
		w.addr = "http://" + cfg.Listener.Addr().String()
	}
	if w.id == "" {
		host, _ := os.Hostname()
		_, port, _ := net.SplitHostPort(cfg.Listener.Addr().String())
		w.id = host + "-" + port
	}
	var err error
	w.launch, err = launcher.New(launcher.Config{
		Command: cfg.Command, Model: cfg.Model, StartupTimeout: cfg.StartupTimeout,
		Warmup: cfg.Warmup, NoWarmup: cfg.NoWarmup,
		Log: cfg.Log.With("engine", cfg.Engine), OnState: w.engineState,
	})
	if err != nil {
		return nil, fmt.Errorf("worker: %w", err)
	}
	w.side, err = sidecar.New(sidecar.Config{EngineURL: w.launch.EngineURL, EngineSocket: w.launch.EngineSocket,
		EngineKey: w.launch.EngineKey, ClusterToken: cfg.ClusterToken, Log: cfg.Log,
		UpstreamClient: cfg.UpstreamClient, Tracer: cfg.Tracer, SleepMode: cfg.SleepMode,
		OnStateChange: func(string, string) { w.kick() }})
	if err != nil {
		return nil, fmt.Errorf("worker: %w", err)
	}
	if cfg.DataDir != "" {
		if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
			return nil, fmt.Errorf("worker: --data: %w", err)
		}
	}
	// The worker's key: an operator's approval binds its code (kept in
	// --data, so a restart keeps the code; in memory without one).
	keyFile := filepath.Join(cfg.DataDir, "worker.key")
	if cfg.DataDir == "" {
		keyFile = filepath.Join(os.TempDir(), fmt.Sprintf("tailgate-worker-%d.key", os.Getpid()))
		defer os.Remove(keyFile)
	}
	key, err := serving.LoadWorkerKey(keyFile)
	if err != nil {
		return nil, fmt.Errorf("worker: %w", err)
	}
	var legacy string // a one-gateway worker's credential, offered to each of several
	for _, g := range cfg.Gateways {
		hc := sidecar.HeartbeatConfig{GatewayURL: strings.TrimSuffix(g, "/"), ClusterToken: cfg.ClusterToken,
			JoinToken: cfg.JoinToken, Key: key, Build: w.heartbeat, Log: cfg.Log, Borrow: w.credentials, Registering: &w.registering}
		if cfg.DataDir != "" {
			hc.CredentialFile = CredentialFile(cfg.DataDir, w.id)
			if len(cfg.Gateways) > 1 {
				if b, err := os.ReadFile(hc.CredentialFile); err == nil {
					legacy = strings.TrimSpace(string(b))
				}
				u, _ := url.Parse(g)
				hc.CredentialFile += "@" + url.PathEscape(u.Host)
			}
		}
		if cfg.DialGateway != nil {
			hc.Client = &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DialContext: cfg.DialGateway}}
		}
		hb, err := sidecar.NewHeartbeater(hc)
		if err != nil {
			return nil, fmt.Errorf("worker: %w", err)
		}
		w.beats = append(w.beats, hb)
	}
	w.legacy = legacy
	return w, nil
}

// credentials returns the credentials the worker holds from its gateways
// (and the one it kept from when it had one gateway), for a gateway it
// has none from yet: gateways sharing a database accept each other's.
func (w *Worker) credentials() []string {
	var cs []string
	for _, b := range w.beats {
		if c := b.Credential(); c != "" && !slices.Contains(cs, c) {
			cs = append(cs, c)
		}
	}
	if w.legacy != "" && !slices.Contains(cs, w.legacy) {
		cs = append(cs, w.legacy)
	}
	return cs
}

// kick asks every gateway's heartbeater to beat now.
func (w *Worker) kick() {
	for _, b := range w.beats {
		b.Kick()
	}
}

// ReplicaID returns the name the replica registers under.
func (w *Worker) ReplicaID() string { return w.id }

// Address returns the sidecar URL the gateway is given.
func (w *Worker) Address() string { return w.addr }

// engineState receives the launcher's state changes. Once draining, the
// replica stays draining whatever the engine does.
func (w *Worker) engineState(state, reason string) {
	w.mu.Lock()
	if w.draining {
		w.mu.Unlock()
		return
	}
	w.side.SetState(state, reason)
	w.mu.Unlock()
	w.log.Info("replica state", "state", state, "reason", reason)
	w.kick() // tell the gateways now rather than at the next beat
}

func (w *Worker) heartbeat() serving.Heartbeat {
	state, reason := w.side.State()
	hb := serving.Heartbeat{ReplicaID: w.id, Address: w.addr, Models: []string{w.cfg.Model}, State: state,
		Reason: reason, Engine: w.cfg.Engine, PriorityScheduling: w.cfg.PriorityScheduling, Load: w.side.Load()}
	if state != serving.StateReady {
		hb.EngineLog = w.launch.EngineLog()
	}
	return hb
}

// Run serves until ctx ends, then drains and stops the engine. It returns
// nil after a drain that ctx started, or the error that ended it early: the
// engine could not be started, or the sidecar's listener failed. It closes
// the Listener.
func (w *Worker) Run(ctx context.Context) error {
	if !w.ran.CompareAndSwap(false, true) {
		return errors.New("worker: Run called twice")
	}
	w.log.Info("worker starting", "replica", w.id, "engine", w.cfg.Engine, "model", w.cfg.Model,
		"sidecar", w.addr, "gateways", w.cfg.Gateways)
	if w.cfg.Engine == "sim" {
		w.log.Info("engine is the SIMULATED engine: answers are filler text, not a model")
	}
	srv := &http.Server{Handler: w.side.Handler(), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 120 * time.Second,
		ErrorLog: slog.NewLogLogger(w.log.Handler(), slog.LevelWarn)}

	// The engine and the background loops outlive ctx: they stop only
	// after the drain.
	engineCtx, stopEngine := context.WithCancel(context.Background())
	defer stopEngine()
	bgCtx, stopBg := context.WithCancel(context.Background())
	defer stopBg()
	var g errgroup.Group
	engineDone := make(chan error, 1)
	go func() { engineDone <- w.launch.Run(engineCtx) }()
	g.Go(func() error { return w.side.Run(bgCtx) })
	// A heartbeater stops only when its gateway URL cannot be one (a 404):
	// the worker stops too, saying so, rather than serve unregistered.
	beatErr := make(chan error, len(w.beats))
	for _, b := range w.beats {
		g.Go(func() error {
			if err := b.Run(bgCtx); err != nil {
				beatErr <- err
			}
			return nil
		})
	}
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(w.cfg.Listener) }()
	preempted := w.watchPreempt(bgCtx, &g)

	var runErr error
	why := "worker shutting down"
	select {
	case <-ctx.Done():
	case err := <-engineDone:
		engineDone <- err
		if err != nil {
			runErr = fmt.Errorf("engine: %w", err)
			why = "worker stopping: the engine cannot start: " + err.Error()
		}
	case err := <-serveErr:
		serveErr <- err
		runErr = fmt.Errorf("sidecar: %w", err)
		why = "worker stopping: " + runErr.Error()
	case err := <-beatErr:
		runErr = fmt.Errorf("register: %w", err)
		why = "worker stopping: " + runErr.Error()
	case notice := <-preempted:
		why = preemptedWhy(notice)
		w.log.Warn("preemption notice: draining; the gateway starts a replacement", "notice", notice)
	}

	w.drain(why)
	stopEngine()
	if err := <-engineDone; err != nil && runErr == nil {
		runErr = fmt.Errorf("engine: %w", err)
	}
	sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
	_ = srv.Shutdown(sctx)
	scancel()
	<-serveErr
	stopBg()
	_ = g.Wait()
	w.log.Info("worker stopped")
	return runErr
}

// drain says the replica is draining and why (the gateway stops routing
// here) and lets in-flight requests finish within DrainGrace.
func (w *Worker) drain(why string) {
	w.mu.Lock()
	w.draining = true
	w.side.SetState(serving.StateDraining, why)
	w.mu.Unlock()
	bctx, bcancel := context.WithTimeout(context.Background(), 2*time.Second)
	var told sync.WaitGroup
	for _, b := range w.beats {
		told.Go(func() { _ = b.Beat(bctx) })
	}
	told.Wait()
	bcancel()
	w.log.Info("draining: waiting for in-flight requests", "inflight", w.side.Inflight(), "grace", w.cfg.DrainGrace)
	dctx, dcancel := context.WithTimeout(context.Background(), w.cfg.DrainGrace)
	defer dcancel()
	if err := w.side.Drain(dctx); err != nil {
		w.log.Warn("drain grace over; cutting in-flight requests", "inflight", w.side.Inflight())
	}
}

// CredentialFile is where a worker with data directory dir keeps the
// credential of replica id (of its one gateway; with several, one file a
// gateway, named after this one and the gateway's host).
func CredentialFile(dir, id string) string {
	return filepath.Join(dir, "credential-"+url.PathEscape(id))
}
