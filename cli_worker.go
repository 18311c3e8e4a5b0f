package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"tailgate/mesh"
	"tailgate/serving"
	"tailgate/serving/launcher"
	"tailgate/serving/sidecar"
)

// workerFlags configure one GPU box: launcher + sidecar + registration.
type workerFlags struct {
	dataDir          string
	gateway          string
	clusterToken     string
	clusterTokenFile string
	engine           string
	model            string
	servedModelName  string
	listen           string
	advertise        string
	replicaID        string
	vllm             launcher.VLLMOptions
	vllmArgs         stringList
	startupTimeout   time.Duration
	warmup           int
	drainGrace       time.Duration
	sim              simFlags
	mesh             meshFlags
}

func (w *workerFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&w.dataDir, "data", "tailgate-worker", "worker data directory")
	fs.StringVar(&w.gateway, "gateway", "", "gateway admin URL to register with, e.g. http://gateway-host:8081 (required)")
	fs.StringVar(&w.clusterToken, "cluster-token", "", "cluster token (the gateway's DIR/cluster.token); or use --cluster-token-file")
	fs.StringVar(&w.clusterTokenFile, "cluster-token-file", "", "file holding the cluster token")
	fs.StringVar(&w.engine, "engine", "vllm", "engine: vllm or sim")
	fs.StringVar(&w.model, "model", "", "model to serve (vllm: a Hugging Face id or path; sim: the name to serve)")
	fs.StringVar(&w.servedModelName, "served-model-name", "", "model name clients use (default: --model)")
	fs.StringVar(&w.listen, "listen", "127.0.0.1:9000", "sidecar listen address (the gateway calls it)")
	fs.StringVar(&w.advertise, "advertise", "", "sidecar URL the gateway should use (default: http://<listen address>)")
	fs.StringVar(&w.replicaID, "replica-id", "", "replica name (default: host name and sidecar port)")
	fs.StringVar(&w.vllm.Binary, "vllm-binary", "", "vllm executable (default: vllm on PATH)")
	fs.StringVar(&w.vllm.GPUs, "gpus", "", "GPUs for the engine (sets CUDA_VISIBLE_DEVICES), e.g. 0,1")
	fs.IntVar(&w.vllm.TensorParallelSize, "tensor-parallel-size", 0, "vLLM --tensor-parallel-size (0: vLLM's default)")
	fs.IntVar(&w.vllm.MaxNumSeqs, "max-num-seqs", 0, "vLLM --max-num-seqs (0: vLLM's default)")
	fs.IntVar(&w.vllm.MaxNumBatchedTokens, "max-num-batched-tokens", 0, "vLLM --max-num-batched-tokens (0: vLLM's default)")
	fs.Float64Var(&w.vllm.GPUMemoryUtilization, "gpu-memory-utilization", 0, "vLLM --gpu-memory-utilization (0: vLLM's default)")
	fs.Var(&w.vllmArgs, "vllm-arg", "extra argument passed to vllm serve as is (repeatable), e.g. --vllm-arg=--enable-prefix-caching")
	fs.DurationVar(&w.startupTimeout, "startup-timeout", 20*time.Minute, "how long the engine may take to become ready (model download and load)")
	fs.IntVar(&w.warmup, "warmup", 3, "short generations run before the replica is announced ready (0: none)")
	fs.DurationVar(&w.drainGrace, "drain-grace", 30*time.Second, "on SIGTERM, how long in-flight requests may finish")
	w.sim.register(fs)
	w.mesh.register(fs, "")
}

func cmdWorker(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("worker", "worker --gateway URL (--cluster-token T | --cluster-token-file F) --engine vllm|sim [--model M] ...", stderr)
	var (
		wf workerFlags
		lf logFlags
	)
	wf.register(fs)
	lf.register(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	log, err := lf.logger(stderr)
	if err != nil {
		return err
	}
	w, err := newWorker(ctx, &wf, log)
	if err != nil {
		return err
	}
	defer w.close()
	return w.run(ctx)
}

// worker is one GPU box's process: engine launcher, sidecar, heartbeats.
type worker struct {
	flags  *workerFlags
	log    *slog.Logger
	model  string
	token  string
	ln     net.Listener
	addr   string // advertised sidecar URL
	id     string
	launch *launcher.Launcher
	side   *sidecar.Sidecar
	beats  *sidecar.Heartbeater
	node   *mesh.Node

	mu       sync.Mutex
	state    string
	reason   string
	draining bool
}

func newWorker(ctx context.Context, wf *workerFlags, log *slog.Logger) (_ *worker, err error) {
	w := &worker{flags: wf, log: log, state: serving.StateStarting, reason: "engine starting"}
	defer func() {
		if err != nil {
			w.close()
		}
	}()
	if wf.gateway == "" {
		return nil, errors.New("--gateway is required: the gateway's admin URL, e.g. http://gateway-host:8081")
	}
	if u, err := url.Parse(wf.gateway); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("--gateway %q: want a URL like http://gateway-host:8081", wf.gateway)
	}
	tok, err := clusterToken(wf.clusterToken, wf.clusterTokenFile)
	if err != nil {
		return nil, err
	}
	w.token = tok
	switch wf.engine {
	case "vllm":
		if wf.model == "" {
			return nil, errors.New("--model is required with --engine vllm")
		}
	case "sim":
		if wf.model == "" {
			wf.model = "tailgate-sim"
		}
	default:
		return nil, fmt.Errorf("--engine %q: want vllm or sim", wf.engine)
	}
	w.model = wf.model
	if wf.servedModelName != "" {
		w.model = wf.servedModelName
	}

	command := func(port int) ([]string, []string, error) {
		o := wf.vllm
		o.Model, o.ServedModelName, o.ExtraArgs = wf.model, wf.servedModelName, wf.vllmArgs
		return launcher.VLLMCommand(o, port)
	}
	if wf.engine == "sim" {
		self, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("find own executable: %w", err)
		}
		command = func(port int) ([]string, []string, error) {
			argv := append([]string{self, "sim", "--listen", "127.0.0.1:" + strconv.Itoa(port), "--model", w.model,
				"--sim-seed", strconv.FormatInt(wf.sim.seed, 10)}, wf.sim.args()...)
			return argv, nil, nil
		}
	}
	warmup := wf.warmup
	if warmup == 0 {
		warmup = -1 // the launcher's "none"
	}
	w.launch, err = launcher.New(launcher.Config{
		Command: command, Model: w.model, StartupTimeout: wf.startupTimeout, Warmup: warmup,
		Log: log.With("engine", wf.engine), OnState: w.engineState,
	})
	if err != nil {
		return nil, err
	}
	w.side, err = sidecar.New(sidecar.Config{EngineURL: w.launch.EngineURL, ClusterToken: tok, Log: log})
	if err != nil {
		return nil, err
	}

	if wf.mesh.enabled {
		// The sidecar listens on the tailnet only: no host port at all.
		_, port, err := net.SplitHostPort(wf.listen)
		if err != nil {
			return nil, fmt.Errorf("--listen %q: %w", wf.listen, err)
		}
		if port == "0" {
			port = "9000"
		}
		if wf.mesh.hostname == "" {
			host, _ := os.Hostname()
			wf.mesh.hostname = "tg-worker-" + host
			if wf.replicaID != "" {
				wf.mesh.hostname = "tg-" + wf.replicaID
			}
		}
		if w.node, err = wf.mesh.up(ctx, wf.dataDir, log); err != nil {
			return nil, err
		}
		if w.ln, err = w.node.Listen("tcp", ":"+port); err != nil {
			return nil, fmt.Errorf("sidecar listen on the tailnet :%s: %w", port, err)
		}
		ip, ok := w.node.Addr()
		if !ok {
			return nil, errors.New("mesh: the node has no tailnet address")
		}
		w.addr = wf.advertise
		if w.addr == "" {
			w.addr = "http://" + net.JoinHostPort(ip.String(), port)
		}
	} else {
		if w.ln, err = net.Listen("tcp", wf.listen); err != nil {
			return nil, fmt.Errorf("sidecar listen %s: %w", wf.listen, err)
		}
		w.addr = wf.advertise
		if w.addr == "" {
			w.addr = "http://" + w.ln.Addr().String()
			if host, _, _ := net.SplitHostPort(w.ln.Addr().String()); host == "0.0.0.0" || host == "::" {
				return nil, fmt.Errorf("--listen %s binds every interface: also pass --advertise http://<address the gateway can reach>:<port>", wf.listen)
			}
		}
	}
	w.id = wf.replicaID
	if w.id == "" {
		host, _ := os.Hostname()
		_, port, _ := net.SplitHostPort(w.ln.Addr().String())
		w.id = host + "-" + port
	}
	hc := sidecar.HeartbeatConfig{GatewayURL: strings.TrimSuffix(wf.gateway, "/"), ClusterToken: tok, Build: w.heartbeat, Log: log}
	if w.node != nil { // the gateway is reached by its tailnet name
		hc.Client = &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DialContext: w.node.Dial}}
	}
	if w.beats, err = sidecar.NewHeartbeater(hc); err != nil {
		return nil, err
	}
	return w, nil
}

// close releases the listener and the tailnet node.
func (w *worker) close() {
	if w.ln != nil {
		_ = w.ln.Close()
	}
	if w.node != nil {
		_ = w.node.Close()
	}
}

// clusterToken reads the token from the flag or the file.
func clusterToken(tok, file string) (string, error) {
	switch {
	case tok != "" && file != "":
		return "", errors.New("give --cluster-token or --cluster-token-file, not both")
	case tok != "":
		return tok, nil
	case file != "":
		raw, err := os.ReadFile(file)
		if err != nil {
			return "", fmt.Errorf("--cluster-token-file: %w", err)
		}
		if t := strings.TrimSpace(string(raw)); t != "" {
			return t, nil
		}
		return "", fmt.Errorf("--cluster-token-file %s is empty", file)
	}
	return "", errors.New("a cluster token is required: --cluster-token-file GATEWAY_DATA/cluster.token (copy it from the gateway box) or --cluster-token")
}

// engineState receives the launcher's state changes.
func (w *worker) engineState(state, reason string) {
	w.mu.Lock()
	if w.draining {
		w.mu.Unlock()
		return
	}
	w.state, w.reason = state, reason
	w.mu.Unlock()
	w.side.SetState(state, reason)
	w.log.Info("replica state", "state", state, "reason", reason)
	w.beats.Kick() // tell the gateway now rather than at the next beat
}

func (w *worker) heartbeat() serving.Heartbeat {
	w.mu.Lock()
	state, reason := w.state, w.reason
	w.mu.Unlock()
	return serving.Heartbeat{ReplicaID: w.id, Address: w.addr, Models: []string{w.model}, State: state,
		Reason: reason, Engine: w.flags.engine, Load: w.side.Load()}
}

func (w *worker) run(ctx context.Context) error {
	w.log.Info("worker starting", "replica", w.id, "engine", w.flags.engine, "model", w.model,
		"sidecar", w.addr, "gateway", w.flags.gateway)
	if w.flags.engine == "sim" {
		w.log.Info("engine is the SIMULATED engine: answers are filler text, not a model")
	}
	srv := &http.Server{Handler: w.side.Handler(), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 120 * time.Second,
		ErrorLog: slog.NewLogLogger(w.log.Handler(), slog.LevelWarn)}

	engineCtx, stopEngine := context.WithCancel(context.Background())
	defer stopEngine()
	bgCtx, stopBg := context.WithCancel(context.Background())
	defer stopBg()
	var g errgroup.Group
	engineDone := make(chan error, 1)
	go func() { engineDone <- w.launch.Run(engineCtx) }()
	g.Go(func() error { return w.side.Run(bgCtx) })
	g.Go(func() error { return w.beats.Run(bgCtx) })
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(w.ln) }()

	var runErr error
	select {
	case <-ctx.Done():
	case err := <-engineDone:
		engineDone <- err
		if err != nil {
			runErr = fmt.Errorf("engine: %w", err)
		}
	case err := <-serveErr:
		runErr = fmt.Errorf("sidecar: %w", err)
	}

	// Drain: say so (the gateway stops routing here), let in-flight
	// requests finish, then stop the engine's process group.
	w.mu.Lock()
	w.draining, w.state, w.reason = true, serving.StateDraining, "worker shutting down"
	w.mu.Unlock()
	w.side.SetState(serving.StateDraining, "worker shutting down")
	bctx, bcancel := context.WithTimeout(context.Background(), 2*time.Second)
	_ = w.beats.Beat(bctx)
	bcancel()
	w.log.Info("draining: waiting for in-flight requests", "inflight", w.side.Inflight(), "grace", w.flags.drainGrace)
	dctx, dcancel := context.WithTimeout(context.Background(), w.flags.drainGrace)
	if err := w.side.Drain(dctx); err != nil {
		w.log.Warn("drain grace over; cutting in-flight requests", "inflight", w.side.Inflight())
	}
	dcancel()
	stopEngine()
	if err := <-engineDone; err != nil && runErr == nil {
		runErr = fmt.Errorf("engine: %w", err)
	}
	sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
	_ = srv.Shutdown(sctx)
	scancel()
	stopBg()
	_ = g.Wait()
	w.log.Info("worker stopped")
	return runErr
}
