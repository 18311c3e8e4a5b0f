package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/tailgate-dev/tailgate/mesh"
	"github.com/tailgate-dev/tailgate/policy"
	"github.com/tailgate-dev/tailgate/serving/hop"
	"github.com/tailgate-dev/tailgate/serving/launcher"
	"github.com/tailgate-dev/tailgate/serving/sim"
	"github.com/tailgate-dev/tailgate/serving/tracing"
	"github.com/tailgate-dev/tailgate/serving/worker"
)

// workerFlags configure one GPU box: launcher + sidecar + registration.
type workerFlags struct {
	dataDir          string
	gateways         stringList
	clusterToken     string
	clusterTokenFile string
	joinToken        string
	joinTokenFile    string
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
	preemptFile      string
	preemptURL       string
	upstreamClient   string
	sleepMode        bool
	enginePriority   bool
	sim              sim.Flags
	mesh             mesh.Flags
	tracing          tracing.Config
	logArgs          []string // --log-level and --log-format, for the simulated engine
}

func (w *workerFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&w.dataDir, "data", "tailgate-worker", "worker data directory")
	fs.Var(&w.gateways, "gateway", "gateway admin URL to register with, e.g. http://gateway-host:8081 (required; repeatable: the worker registers with each gateway on its own, e.g. several gateways sharing one PostgreSQL, and one that is down does not stop the others)")
	fs.StringVar(&w.clusterToken, "cluster-token", "", "cluster token (the gateway's DIR/cluster.token; default: $TAILGATE_CLUSTER_TOKEN unless --cluster-token-file is given); prefer --cluster-token-file or the environment")
	fs.StringVar(&w.clusterTokenFile, "cluster-token-file", "", "file holding the cluster token")
	fs.StringVar(&w.joinToken, "join-token", "", "one-time join token for this --replica-id, from `tailgate workers invite` on the gateway's box (default: $TAILGATE_JOIN_TOKEN unless --join-token-file is given); without one a new replica id waits until the operator runs `tailgate workers approve`")
	fs.StringVar(&w.joinTokenFile, "join-token-file", "", "file holding the join token")
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
	fs.Var(&w.vllmArgs, "vllm-arg", "extra argument passed to vllm serve as is (repeatable), e.g. --vllm-arg=--enable-prefix-caching; not --host, --port, --uds, --served-model-name or --api-key, which tailgate sets")
	fs.DurationVar(&w.startupTimeout, "startup-timeout", 20*time.Minute, "how long the engine may take to become ready (model download and load)")
	fs.IntVar(&w.warmup, "warmup", 3, "short generations run before the replica is announced ready (0: none)")
	fs.DurationVar(&w.drainGrace, "drain-grace", 30*time.Second, "on SIGTERM, how long in-flight requests may finish (0: none)")
	fs.StringVar(&w.preemptFile, "preempt-file", "", "preemption notice: when this file appears (a spot VM's metadata watcher touches it; keep it on a tmpfs such as /run), drain as on SIGTERM and tell the gateway, which starts a replacement at once; SIGUSR1 does the same")
	fs.StringVar(&w.preemptURL, "preempt-url", "", "preemption notice polled every second: an answer 200 that is neither empty nor FALSE drains as --preempt-file does, e.g. http://metadata.google.internal/computeMetadata/v1/instance/preempted")
	fs.StringVar(&w.upstreamClient, "upstream-client", string(hop.Hop), "HTTP client of the sidecar to the engine: hop (tailgate's own HTTP/1.1 client, less CPU per request) or nethttp (Go's net/http, the way back)")
	fs.BoolVar(&w.sleepMode, "sleep-mode", false, "let the gateway's fleet controller put the engine to sleep when idle and wake it on demand: vllm gets --enable-sleep-mode and VLLM_SERVER_DEV_MODE=1 (on its private socket), sim gets --sim-sleep-mode")
	fs.BoolVar(&w.enginePriority, "engine-priority-scheduling", false, "the engine schedules by request priority: vllm gets --scheduling-policy priority, sim gets --sim-scheduling-policy priority, and the gateway sends each chat and completions request's priority from its key's class (interactive first, batch last) to this replica only")
	fs.String("config", "", "file of worker flags, one --name=value a line (# comments), as tailgate tune writes it; flags on the command line win over the file's")
	w.sim.Register(fs)
	w.mesh.Register(fs, "")
	w.tracing.RegisterFlags(fs)
}

func cmdWorker(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("worker", "worker --gateway URL (--cluster-token T | --cluster-token-file F) --engine vllm|sim [--model M] ...", stderr)
	var (
		wf workerFlags
		lf logFlags
	)
	wf.register(fs)
	args, err := withWorkerConfig(args) // --config FILE: its flags first (see cli_worker_tune.go)
	if err != nil {
		return err
	}
	log, err := lf.parse(fs, args, stderr)
	if err != nil {
		return err
	}
	// The engine logs as the worker does, so its lines read as the worker's
	// (the worker's log forwards them; see childlog).
	wf.logArgs = []string{"--log-level", lf.level, "--log-format", lf.format}
	warnSecretFlags(log, fs, "cluster-token", "join-token", "mesh-authkey")
	cfg, closeListener, err := wf.config(ctx, log)
	if err != nil {
		return err
	}
	defer closeListener()
	shutdownTracing, err := wf.openTracing(log, &cfg)
	if err != nil {
		return err
	}
	defer shutdownTracing()
	// SIGUSR1 announces a preemption (SIGTERM and SIGINT are a plain
	// shutdown): the same drain, with the reason the gateway replaces on.
	preempt := make(chan os.Signal, 1)
	signal.Notify(preempt, syscall.SIGUSR1)
	defer signal.Stop(preempt)
	cfg.Preempt = preempt
	w, err := worker.New(cfg)
	if err != nil {
		return err
	}
	return w.Run(ctx)
}

// config maps the flags to a worker.Config, its listener opened; the func
// it returns closes the listener (and the tailnet node with --mesh).
func (wf *workerFlags) config(ctx context.Context, log *slog.Logger) (worker.Config, func(), error) {
	var cfg worker.Config
	if len(wf.gateways) == 0 {
		return cfg, nil, errors.New("--gateway is required: the gateway's admin URL, e.g. http://gateway-host:8081")
	}
	hosts := map[string]bool{}
	for _, g := range wf.gateways {
		u, err := url.Parse(g)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return cfg, nil, fmt.Errorf("--gateway %q: want a URL like http://gateway-host:8081", g)
		}
		if hosts[u.Host] {
			return cfg, nil, fmt.Errorf("--gateway %s is given twice", u.Host)
		}
		hosts[u.Host] = true
	}
	tok, err := clusterToken(wf.clusterToken, wf.clusterTokenFile)
	if err != nil {
		return cfg, nil, err
	}
	join, err := secretFlag("join-token", wf.joinToken, wf.joinTokenFile)
	if err != nil {
		return cfg, nil, err
	}
	if join != "" && wf.replicaID == "" {
		return cfg, nil, errors.New("--join-token needs --replica-id: the token admits only the replica id it was made for (tailgate workers invite --replica-id ID)")
	}
	switch wf.engine {
	case "vllm":
		if wf.model == "" {
			return cfg, nil, errors.New("--model is required with --engine vllm")
		}
		// Bad engine flags are a start-up error, not an engine that fails
		// again at every start.
		o := wf.vllm
		o.Model, o.ServedModelName, o.ExtraArgs = wf.model, wf.servedModelName, wf.vllmArgs
		if err := o.Validate(); err != nil {
			return cfg, nil, err
		}
	case "sim":
		if wf.model == "" {
			wf.model = "tailgate-sim"
		}
		if err := wf.sim.Check(); err != nil {
			return cfg, nil, err
		}
	default:
		return cfg, nil, fmt.Errorf("--engine %q: want vllm or sim", wf.engine)
	}
	client, err := hop.ParseClient(wf.upstreamClient)
	if err != nil {
		return cfg, nil, fmt.Errorf("--upstream-client: %w", err)
	}
	if wf.warmup < 0 {
		return cfg, nil, fmt.Errorf("--warmup %d: want 0 (none) or more", wf.warmup)
	}
	if wf.drainGrace < 0 {
		return cfg, nil, fmt.Errorf("--drain-grace %s: want 0 (none) or more", wf.drainGrace)
	}
	if wf.preemptURL != "" {
		if u, err := url.Parse(wf.preemptURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return cfg, nil, fmt.Errorf("--preempt-url %q: want an http(s) URL, e.g. http://metadata.google.internal/computeMetadata/v1/instance/preempted", wf.preemptURL)
		}
	}
	cfg = worker.Config{
		Gateways: wf.gateways, ClusterToken: tok, JoinToken: join, Advertise: wf.advertise, ReplicaID: wf.replicaID, DataDir: wf.dataDir,
		Model: wf.model, Engine: wf.engine, StartupTimeout: wf.startupTimeout,
		Warmup: wf.warmup, NoWarmup: wf.warmup == 0, DrainGrace: wf.drainGrace, NoDrain: wf.drainGrace == 0,
		Log: log, UpstreamClient: client, PreemptFile: wf.preemptFile, PreemptURL: wf.preemptURL,
		SleepMode: wf.sleepMode, PriorityScheduling: wf.enginePriority,
	}
	if wf.servedModelName != "" {
		cfg.Model = wf.servedModelName
	}
	if cfg.Command, err = wf.engineCommand(cfg.Model); err != nil {
		return cfg, nil, err
	}
	closeListener, err := wf.openListener(ctx, log, &cfg)
	if err != nil {
		return cfg, nil, err
	}
	return cfg, closeListener, nil
}

// openListener opens the sidecar's listener into cfg: a TCP listener, or with
// --mesh one on the tailnet only (no host port at all), the advertised
// address and the gateway dialer with it. The func it returns closes what
// it opened.
func (wf *workerFlags) openListener(ctx context.Context, log *slog.Logger, cfg *worker.Config) (func(), error) {
	if !wf.mesh.Enabled {
		ln, err := net.Listen("tcp", wf.listen)
		if err != nil {
			return nil, fmt.Errorf("sidecar listen %s: %w", wf.listen, err)
		}
		if host, _, _ := net.SplitHostPort(ln.Addr().String()); wf.advertise == "" && (host == "0.0.0.0" || host == "::") {
			_ = ln.Close()
			return nil, fmt.Errorf("--listen %s binds every interface: also pass --advertise http://<address the gateway can reach>:<port>", wf.listen)
		}
		cfg.Listener = ln
		return func() { _ = ln.Close() }, nil
	}
	_, port, err := net.SplitHostPort(wf.listen)
	if err != nil {
		return nil, fmt.Errorf("--listen %q: %w", wf.listen, err)
	}
	if port == "0" {
		port = "9000"
	}
	if wf.mesh.Hostname == "" {
		host, _ := os.Hostname()
		wf.mesh.Hostname = "tg-worker-" + host
		if wf.replicaID != "" {
			wf.mesh.Hostname = "tg-" + wf.replicaID
		}
	}
	node, err := wf.mesh.Up(ctx, wf.dataDir, log)
	if err != nil {
		return nil, err
	}
	ln, err := node.Listen("tcp", ":"+port)
	if err != nil {
		_ = node.Close()
		return nil, fmt.Errorf("sidecar listen on the tailnet :%s: %w", port, err)
	}
	ip, ok := node.Addr()
	if !ok {
		_ = ln.Close()
		_ = node.Close()
		return nil, errors.New("mesh: the node has no tailnet address")
	}
	if cfg.Advertise == "" {
		cfg.Advertise = "http://" + net.JoinHostPort(ip.String(), port)
	}
	// The gateway is reached by its tailnet name.
	cfg.Listener, cfg.DialGateway = ln, node.Dial
	return func() {
		_ = ln.Close()
		_ = node.Close()
	}, nil
}

// engineCommand returns how the launcher starts the engine serving model
// on a Unix socket: vllm serve, or this binary's simulated engine.
func (wf *workerFlags) engineCommand(model string) (func(socket string) ([]string, []string, error), error) {
	if wf.sleepMode {
		wf.vllm.SleepMode = true
		wf.sim.EnableSleepMode()
	}
	if wf.enginePriority {
		wf.vllm.PriorityScheduling = true
		wf.sim.EnablePriorityScheduling()
	}
	if wf.engine == "sim" {
		self, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("find own executable: %w", err)
		}
		return func(socket string) ([]string, []string, error) {
			argv := append([]string{self, "sim", "--uds", socket, "--model", model,
				"--sim-seed", strconv.FormatInt(wf.sim.Seed(), 10)}, wf.sim.Args()...)
			argv = append(argv, wf.logArgs...)
			// The launcher adds the engine's API key to the environment
			// (VLLM_API_KEY), which `sim` reads as vLLM does.
			return argv, nil, nil
		}, nil
	}
	traces := ""
	if wf.tracing.Endpoint != "" {
		var err error
		if traces, err = tracing.TracesURL(wf.tracing.Endpoint); err != nil {
			return nil, err
		}
	}
	return func(socket string) ([]string, []string, error) {
		o := wf.vllm
		o.Model, o.ServedModelName, o.ExtraArgs = wf.model, wf.servedModelName, wf.vllmArgs
		o.OTLPTracesEndpoint = traces // vLLM continues the sidecar's spans
		return launcher.VLLMCommand(o, socket)
	}, nil
}

// clusterToken reads the token from the flag (or the environment) or the
// file; a token too short to be safe is refused.
func clusterToken(tok, file string) (string, error) {
	got, err := secretFlag("cluster-token", tok, file)
	switch {
	case err != nil:
		return "", err
	case got == "":
		return "", errors.New("a cluster token is required: --cluster-token-file GATEWAY_DATA/cluster.token (copy it from the gateway box) or --cluster-token")
	case file != "":
		return got, policy.CheckToken(got, "--cluster-token-file "+file)
	}
	return got, policy.CheckToken(got, "the cluster token (--cluster-token or TAILGATE_CLUSTER_TOKEN)")
}

// secretFlag reads the secret of --name or --name-file (the file's text,
// trimmed); "" if neither is given.
func secretFlag(name, tok, file string) (string, error) {
	switch {
	case tok != "" && file != "":
		return "", fmt.Errorf("give --%s or --%s-file, not both", name, name)
	case file != "":
		raw, err := os.ReadFile(file)
		if err != nil {
			return "", fmt.Errorf("--%s-file: %w", name, err)
		}
		if t := strings.TrimSpace(string(raw)); t != "" {
			return t, nil
		}
		return "", fmt.Errorf("--%s-file %s is empty", name, file)
	}
	return tok, nil
}

// openTracing starts the OTLP exporter of --otlp-endpoint for the sidecar's
// spans; the func it returns sends what is still queued (at most 5 s).
// With no endpoint it does nothing.
func (wf *workerFlags) openTracing(log *slog.Logger, cfg *worker.Config) (func(), error) {
	c := wf.tracing
	c.Service = "tailgate-worker"
	tp, err := tracing.New(c)
	if err != nil || tp == nil {
		return func() {}, err
	}
	cfg.Tracer = tp
	log.Info("tracing: OpenTelemetry spans to the collector", "endpoint", tracing.Redacted(c.Endpoint), "sample_ratio", c.SampleRatio)
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := tp.Shutdown(ctx); err != nil {
			log.Warn("tracing: spans not sent to the collector at shutdown", "err", err)
		}
	}, nil
}
