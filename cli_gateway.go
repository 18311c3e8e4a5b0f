package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"golang.org/x/sync/errgroup"
	"gopkg.in/yaml.v3"

	"tailgate/data"
	"tailgate/mesh"
	"tailgate/policy"
	"tailgate/router"
	"tailgate/server"
	"tailgate/server/batch"
	"tailgate/web"
)

// gatewayFlags configure the gateway role (also used by `up`).
type gatewayFlags struct {
	dataDir          string
	listen           string
	adminListen      string
	upstreams        stringList
	configFile       string
	defaultMaxTokens int64
	maxBody          int64
	keepAlive        time.Duration
	prices           stringList
	shutdownGrace    time.Duration

	policy          string
	affinity        bool
	slowStart       time.Duration
	ttftDeadline    time.Duration
	idleDeadline    time.Duration
	jsonDeadline    time.Duration
	hedge           bool
	hedgePercentile float64
	hedgeMin        time.Duration
	hedgeMax        time.Duration
	budgetRatio     float64

	mesh      meshFlags
	meshAllow string
	withMesh  bool // the mesh flags were registered (gateway, not up)
}

func (g *gatewayFlags) register(fs *flag.FlagSet, withUpstreams bool) {
	fs.StringVar(&g.dataDir, "data", "tailgate-data", "data directory: SQLite database, tokens, keys")
	fs.StringVar(&g.listen, "listen", "127.0.0.1:8080", "public (OpenAI-compatible) listen address")
	fs.StringVar(&g.adminListen, "admin-listen", "127.0.0.1:8081", "admin listen address (metrics, admin API, dashboard)")
	if withUpstreams {
		fs.Var(&g.upstreams, "upstream", "static OpenAI-compatible upstream base URL, e.g. http://10.0.0.5:8000 (repeatable)")
	}
	fs.StringVar(&g.configFile, "config", "", "YAML config file (upstreams, per-model max_tokens and prices); flags add to it")
	fs.Int64Var(&g.defaultMaxTokens, "default-max-tokens", 1024, "max_tokens applied when a request sets none")
	fs.Int64Var(&g.maxBody, "max-body", 4<<20, "largest request body in bytes (larger: 413)")
	fs.DurationVar(&g.keepAlive, "sse-keepalive", 10*time.Second, "send an SSE comment when a stream is silent this long")
	fs.Var(&g.prices, "price", "price of a model as MODEL=INPUT,OUTPUT per million tokens, e.g. llama=0.2,0.6 (repeatable)")
	fs.DurationVar(&g.shutdownGrace, "shutdown-grace", 30*time.Second, "on SIGTERM, how long in-flight requests may finish")
	fs.StringVar(&g.policy, "policy", "p2c", "replica selection: p2c (load and latency aware) or round-robin (baseline)")
	fs.BoolVar(&g.affinity, "affinity", false, "prefer the same replica for the same prompt prefix when load is comparable (reuses the engine's prefix cache)")
	fs.DurationVar(&g.slowStart, "slow-start", router.DefaultSlowStart, "how long a freshly ready replica ramps up to a full share; its load counts double at first (0: off)")
	fs.DurationVar(&g.ttftDeadline, "ttft-deadline", 30*time.Second, "an attempt with no first token by then is abandoned and its replica ejected")
	fs.DurationVar(&g.idleDeadline, "idle-deadline", 30*time.Second, "a stream silent this long between tokens is cut and its replica ejected")
	fs.DurationVar(&g.jsonDeadline, "json-deadline", 10*time.Minute, "how long a request that is not streamed may wait for its answer")
	fs.BoolVar(&g.hedge, "hedge", false, "hedge requests: a second attempt on another replica when the first has no token by the hedge delay")
	fs.Float64Var(&g.hedgePercentile, "hedge-percentile", 0.95, "hedge delay: this percentile of recent time to first token, per model")
	fs.DurationVar(&g.hedgeMin, "hedge-min", 20*time.Millisecond, "smallest hedge delay")
	fs.DurationVar(&g.hedgeMax, "hedge-max", 30*time.Second, "largest hedge delay")
	fs.Float64Var(&g.budgetRatio, "retry-budget", 0.05, "extra attempts (retries after a request reached a replica, and hedges) as a fraction of requests, between 0 and 1 (0: the default)")
}

// fileConfig is the YAML config file.
type fileConfig struct {
	Upstreams []struct {
		ID  string `yaml:"id"`
		URL string `yaml:"url"`
	} `yaml:"upstreams"`
	DefaultMaxTokens int64 `yaml:"default_max_tokens"`
	Models           map[string]struct {
		MaxTokens    int64         `yaml:"max_tokens"`
		TTFTDeadline time.Duration `yaml:"ttft_deadline"`
		IdleDeadline time.Duration `yaml:"idle_deadline"`
		Price        *struct {
			Input  float64 `yaml:"input_per_million"`
			Output float64 `yaml:"output_per_million"`
		} `yaml:"price"`
		Hedge *struct {
			Enabled    *bool         `yaml:"enabled"`
			Percentile float64       `yaml:"percentile"`
			Min        time.Duration `yaml:"min"`
			Max        time.Duration `yaml:"max"`
		} `yaml:"hedge"`
	} `yaml:"models"`
}

// upstream is a static upstream: an id and a base URL.
type upstream struct{ id, url string }

// gatewaySetup is everything resolved from flags and the config file.
type gatewaySetup struct {
	upstreams []upstream
	srvCfg    server.Config
	prices    map[string]policy.Price
	routerCfg router.Config
}

func (g *gatewayFlags) resolve() (*gatewaySetup, error) {
	st := &gatewaySetup{prices: map[string]policy.Price{}}
	st.srvCfg = server.Config{DefaultMaxTokens: g.defaultMaxTokens, MaxBodyBytes: g.maxBody, KeepAlive: g.keepAlive,
		MaxTokensByModel: map[string]int64{}, TTFTDeadline: g.ttftDeadline, IdleDeadline: g.idleDeadline,
		JSONDeadline: g.jsonDeadline, TTFTDeadlineByModel: map[string]time.Duration{}, IdleDeadlineByModel: map[string]time.Duration{}}
	sel, err := router.ParsePolicy(g.policy)
	if err != nil {
		return nil, err
	}
	st.routerCfg = router.Config{Selector: sel, Affinity: g.affinity, SlowStart: g.slowStart,
		Budget: router.BudgetConfig{Ratio: g.budgetRatio},
		Hedge: router.HedgeConfig{Enabled: g.hedge, Percentile: g.hedgePercentile, Min: g.hedgeMin, Max: g.hedgeMax,
			Models: map[string]router.HedgeModel{}}}
	if g.configFile != "" {
		raw, err := os.ReadFile(g.configFile)
		if err != nil {
			return nil, fmt.Errorf("--config: %w", err)
		}
		var fc fileConfig
		dec := yaml.NewDecoder(strings.NewReader(string(raw)))
		dec.KnownFields(true)
		if err := dec.Decode(&fc); err != nil && !errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("--config %s: %w", g.configFile, err)
		}
		for _, u := range fc.Upstreams {
			st.upstreams = append(st.upstreams, upstream{id: u.ID, url: u.URL})
		}
		if fc.DefaultMaxTokens > 0 {
			st.srvCfg.DefaultMaxTokens = fc.DefaultMaxTokens
		}
		for name, m := range fc.Models {
			if m.MaxTokens > 0 {
				st.srvCfg.MaxTokensByModel[name] = m.MaxTokens
			}
			if m.Price != nil {
				st.prices[name] = policy.Price{InputMicrosPerM: toMicros(m.Price.Input), OutputMicrosPerM: toMicros(m.Price.Output)}
			}
			if m.TTFTDeadline > 0 {
				st.srvCfg.TTFTDeadlineByModel[name] = m.TTFTDeadline
			}
			if m.IdleDeadline > 0 {
				st.srvCfg.IdleDeadlineByModel[name] = m.IdleDeadline
			}
			if h := m.Hedge; h != nil {
				st.routerCfg.Hedge.Models[name] = router.HedgeModel{Enabled: h.Enabled, Percentile: h.Percentile, Min: h.Min, Max: h.Max}
			}
		}
	}
	for _, u := range g.upstreams {
		st.upstreams = append(st.upstreams, upstream{url: u})
	}
	for i := range st.upstreams {
		u := &st.upstreams[i]
		parsed, err := url.Parse(u.url)
		if err != nil || (parsed.Scheme != "http" && parsed.Scheme != "https") || parsed.Host == "" {
			return nil, fmt.Errorf("upstream %q: want a base URL like http://host:8000", u.url)
		}
		u.url = strings.TrimSuffix(strings.TrimSuffix(parsed.String(), "/"), "/v1")
		if u.id == "" {
			u.id = parsed.Host
		}
	}
	if err := st.routerCfg.Validate(); err != nil {
		return nil, err
	}
	for _, p := range g.prices {
		model, rest, ok := strings.Cut(p, "=")
		in, out, ok2 := strings.Cut(rest, ",")
		fin, err1 := strconv.ParseFloat(in, 64)
		fout, err2 := strconv.ParseFloat(out, 64)
		if !ok || !ok2 || model == "" || err1 != nil || err2 != nil || fin < 0 || fout < 0 {
			return nil, fmt.Errorf("--price %q: want MODEL=INPUT,OUTPUT per million tokens, e.g. llama=0.2,0.6", p)
		}
		st.prices[model] = policy.Price{InputMicrosPerM: toMicros(fin), OutputMicrosPerM: toMicros(fout)}
	}
	return st, nil
}

func toMicros(v float64) int64 { return int64(math.Round(v * 1e6)) }

func cmdGateway(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("gateway", "gateway --data DIR --listen ADDR --admin-listen ADDR [--upstream URL]...", stderr)
	var (
		gf gatewayFlags
		lf logFlags
	)
	gf.register(fs, true)
	gf.withMesh = true
	gf.mesh.register(fs, "tg-gateway")
	fs.StringVar(&gf.meshAllow, "mesh-allow-peers", "", "with --mesh: only tailnet peers with one of these tags or host names may register as workers (comma-separated), besides the cluster token")
	lf.register(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	log, err := lf.logger(stderr)
	if err != nil {
		return err
	}
	setup, err := gf.resolve()
	if err != nil {
		return err
	}
	if len(setup.upstreams) == 0 {
		log.Warn("no upstream configured: add --upstream URL (or upstreams in --config); /healthz stays 503 until one is ready")
	}
	gw, err := openGateway(ctx, &gf, setup, log)
	if err != nil {
		return err
	}
	defer gw.close()
	fmt.Fprintf(stdout, "tailgate gateway: API http://%s/v1  admin http://%s/ui/  (admin token: %s)\n",
		gw.publicAddr, gw.adminAddr, filepath.Join(gf.dataDir, "admin.token"))
	return gw.run(ctx)
}

// gateway is a running gateway role: the listeners are bound, nothing is
// served until run.
type gateway struct {
	flags      *gatewayFlags
	log        *slog.Logger
	store      *data.Store
	ledger     *data.LedgerWriter
	gate       *policy.Gate
	reg        *router.Registry
	health     *router.HealthChecker
	public     *http.Server
	admin      *http.Server
	publicLn   net.Listener
	adminLn    net.Listener
	srv        *server.Server
	node       *mesh.Node
	meshAdmin  *http.Server // the admin routes on the tailnet
	meshLn     net.Listener
	publicAddr string
	adminAddr  string
}

func openGateway(ctx context.Context, gf *gatewayFlags, setup *gatewaySetup, log *slog.Logger) (_ *gateway, err error) {
	// gw is not the result: an error returns nil, and this still closes
	// what was opened before it.
	gw := &gateway{flags: gf, log: log}
	defer func() {
		if err != nil {
			gw.close()
		}
	}()
	adminToken, clusterToken, err := ensureTokens(gf.dataDir)
	if err != nil {
		return nil, err
	}
	if gw.store, err = data.Open(filepath.Join(gf.dataDir, "tailgate.db")); err != nil {
		return nil, err
	}
	gw.ledger = gw.store.NewLedgerWriter(data.LedgerConfig{}, log)
	if gw.gate, err = policy.New(ctx, policy.Config{Prices: setup.prices}, gw.store, log); err != nil {
		return nil, err
	}
	promReg := prometheus.NewRegistry()
	promReg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	rcfg := setup.routerCfg
	rcfg.Registerer = promReg
	if gw.reg, err = router.New(rcfg, log); err != nil {
		return nil, err
	}
	var dial func(ctx context.Context, network, addr string) (net.Conn, error)
	if gf.withMesh && gf.mesh.enabled {
		if gw.node, err = gf.mesh.up(ctx, gf.dataDir, log); err != nil {
			return nil, err
		}
		dial = gw.node.Dial // tailnet names over WireGuard, anything else from the host
		setup.srvCfg.PeerCheck = peerCheck(gw.node, splitList(gf.meshAllow))
	} else if gf.meshAllow != "" {
		return nil, errors.New("--mesh-allow-peers needs --mesh")
	}
	transport := server.NewTransport(2*time.Second, dial)
	for _, u := range setup.upstreams {
		rep := router.NewReplica(u.id, u.url)
		rep.Static = true
		gw.reg.Add(rep)
	}
	gw.health = router.NewHealthChecker(gw.reg, &server.Prober{Transport: transport, ClusterToken: clusterToken}, router.HealthConfig{})

	setup.srvCfg.AdminToken = adminToken
	setup.srvCfg.Batch = batch.Config{FilesDir: filepath.Join(gf.dataDir, "files"), DrainTimeout: min(gf.shutdownGrace, 10*time.Second)}
	setup.srvCfg.ClusterToken = clusterToken
	srv, err := server.New(setup.srvCfg, server.Deps{
		Gate: gw.gate, Registry: gw.reg, Store: gw.store, Ledger: gw.ledger,
		Registerer: promReg, Gatherer: promReg, Log: log, Transport: transport,
	})
	if err != nil {
		return nil, err
	}
	gw.srv = srv

	if gw.publicLn, err = net.Listen("tcp", gf.listen); err != nil {
		return nil, fmt.Errorf("--listen %s: %w", gf.listen, err)
	}
	if gw.adminLn, err = net.Listen("tcp", gf.adminListen); err != nil {
		return nil, fmt.Errorf("--admin-listen %s: %w", gf.adminListen, err)
	}
	gw.publicAddr, gw.adminAddr = gw.publicLn.Addr().String(), gw.adminLn.Addr().String()
	// No ReadTimeout/WriteTimeout: they would cut long streams. Headers have
	// a deadline here; bodies get one per request in the handler.
	gw.public = &http.Server{Handler: srv.Public(), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 120 * time.Second,
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	adminHandler := srv.Admin(web.Handler())
	gw.admin = &http.Server{Handler: adminHandler, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 120 * time.Second,
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	if gw.node != nil {
		// The same admin routes on the tailnet, at the same port number, so
		// workers register at http://<gateway tailnet name>:<admin port>.
		_, port, _ := net.SplitHostPort(gw.adminAddr)
		if gw.meshLn, err = gw.node.Listen("tcp", ":"+port); err != nil {
			return nil, fmt.Errorf("mesh listen :%s: %w", port, err)
		}
		gw.meshAdmin = &http.Server{Handler: adminHandler, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 120 * time.Second,
			ErrorLog:    slog.NewLogLogger(log.Handler(), slog.LevelWarn),
			ConnContext: func(ctx context.Context, _ net.Conn) context.Context { return context.WithValue(ctx, viaMesh{}, true) }}
		log.Info("admin routes on the tailnet", "url", fmt.Sprintf("http://%s:%s", gw.node.Hostname(), port))
	}
	return gw, nil
}

// viaMesh marks requests that arrived on the tailnet listener.
type viaMesh struct{}

// peerCheck returns the gateway's registration check in mesh mode: with an
// allow list, a worker must register over the tailnet from a peer whose
// host name or one of whose tags is listed.
func peerCheck(node *mesh.Node, allow []string) func(*http.Request) error {
	if len(allow) == 0 {
		return nil
	}
	return func(r *http.Request) error {
		if r.Context().Value(viaMesh{}) == nil {
			return errors.New("registration must come over the tailnet (--mesh-allow-peers is set)")
		}
		peer, err := node.WhoIs(r.Context(), r.RemoteAddr)
		if err != nil {
			return fmt.Errorf("unknown tailnet peer: %w", err)
		}
		for _, a := range allow {
			if a == peer.Hostname || slices.Contains(peer.Tags, a) {
				return nil
			}
		}
		return fmt.Errorf("tailnet peer %s (tags %v) is not in --mesh-allow-peers", peer.Hostname, peer.Tags)
	}
}

// run serves until ctx is done, then shuts down in order: stop accepting,
// let in-flight requests finish (up to the grace), drain the ledger.
func (gw *gateway) run(ctx context.Context) error {
	gctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	g, gctx := errgroup.WithContext(gctx)
	g.Go(func() error { return gw.gate.Run(gctx) })
	g.Go(func() error { return gw.ledger.Run(gctx) })
	g.Go(func() error { return gw.health.Run(gctx) })
	g.Go(func() error { return gw.srv.RunBatches(gctx) })
	serveErr := make(chan error, 2)
	go func() { serveErr <- gw.public.Serve(gw.publicLn) }()
	go func() { serveErr <- gw.admin.Serve(gw.adminLn) }()
	if gw.meshAdmin != nil {
		go func() { serveErr <- gw.meshAdmin.Serve(gw.meshLn) }()
	}
	gw.log.Info("gateway serving", "api", "http://"+gw.publicAddr+"/v1", "admin", "http://"+gw.adminAddr)

	var runErr error
	select {
	case <-ctx.Done():
		gw.log.Info("shutting down: finishing in-flight requests", "grace", gw.flags.shutdownGrace)
	case err := <-serveErr:
		runErr = fmt.Errorf("serve: %w", err)
	case <-gctx.Done():
	}
	sctx, scancel := context.WithTimeout(context.Background(), gw.flags.shutdownGrace)
	defer scancel()
	if err := gw.public.Shutdown(sctx); err != nil {
		gw.log.Warn("public listener: in-flight requests cut at the end of the grace period", "err", err)
		_ = gw.public.Close()
	}
	_ = gw.admin.Shutdown(sctx)
	if gw.meshAdmin != nil {
		_ = gw.meshAdmin.Shutdown(sctx)
	}
	cancel() // stop gate, health; the ledger writer drains what it holds
	if err := g.Wait(); err != nil && runErr == nil {
		runErr = err
	}
	if err := gw.ledger.Close(); err != nil && runErr == nil {
		runErr = fmt.Errorf("ledger: %w", err)
	}
	gw.log.Info("gateway stopped; ledger drained")
	return runErr
}

func (gw *gateway) close() {
	if gw.publicLn != nil {
		_ = gw.publicLn.Close()
	}
	if gw.adminLn != nil {
		_ = gw.adminLn.Close()
	}
	if gw.ledger != nil {
		_ = gw.ledger.Close()
	}
	if gw.store != nil {
		_ = gw.store.Close()
	}
	if gw.meshLn != nil {
		_ = gw.meshLn.Close()
	}
	if gw.node != nil {
		_ = gw.node.Close()
	}
}

// ensureTokens creates DIR/admin.token and DIR/cluster.token (mode 0600) on
// first start and returns their contents.
func ensureTokens(dir string) (admin, cluster string, err error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", "", fmt.Errorf("--data: %w", err)
	}
	if admin, err = ensureSecretFile(filepath.Join(dir, "admin.token"), "tga-"); err != nil {
		return "", "", err
	}
	if cluster, err = ensureSecretFile(filepath.Join(dir, "cluster.token"), "tgc-"); err != nil {
		return "", "", err
	}
	return admin, cluster, nil
}

func ensureSecretFile(path, prefix string) (string, error) {
	raw, err := os.ReadFile(path)
	if err == nil {
		tok := strings.TrimSpace(string(raw))
		if tok == "" {
			return "", fmt.Errorf("%s is empty; delete it to have a new token made", path)
		}
		return tok, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return "", err
	}
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	tok := prefix + hex.EncodeToString(b)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		if errors.Is(err, os.ErrExist) { // another process made it first
			return ensureSecretFile(path, prefix)
		}
		return "", err
	}
	if _, err := f.WriteString(tok + "\n"); err != nil {
		f.Close()
		return "", err
	}
	return tok, f.Close()
}
