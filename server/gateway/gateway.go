// Package gateway is the gateway role, the process clients talk to: it
// assembles the store, the policy gate, the router, the server's handlers,
// the listeners (public, admin, and on the tailnet with --mesh), TLS, the
// ledger and the batch runner from one Config, and runs and stops them in
// order. `tailgate gateway` and `tailgate up` use it; it is the only
// importer of package server.
//
// # Overview
//
// A [Config] comes from flags ([Config.RegisterFlags], then [Config.Load]
// once they are parsed, which reads the --config file under them and checks
// the whole) or is filled in by a program. [Open] checks it, makes the data
// directory's secrets (admin.token, cluster.token), opens the database
// (SQLite in the data directory, or PostgreSQL) and its ledger, joins the
// tailnet with --mesh, and binds the listeners, so a bad address or a locked
// database is a start-up error. The [Gateway] it returns serves nothing yet:
// [Gateway.Run] serves until its context is done and then shuts down in
// order (stop accepting, let in-flight requests finish within the grace,
// drain the ledger); [Gateway.Close] releases what Open took and is safe
// twice.
package gateway

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"golang.org/x/sync/errgroup"

	"github.com/tailgate-dev/tailgate/data"
	"github.com/tailgate-dev/tailgate/mesh"
	"github.com/tailgate-dev/tailgate/policy"
	"github.com/tailgate-dev/tailgate/router"
	"github.com/tailgate-dev/tailgate/server"
	"github.com/tailgate-dev/tailgate/server/connlimit"
	"github.com/tailgate-dev/tailgate/serving/fleet"
	"github.com/tailgate-dev/tailgate/serving/hop"
	"github.com/tailgate-dev/tailgate/web"
)

// Gateway is an open gateway role: the listeners are bound, nothing is
// served until Run.
type Gateway struct {
	cfg       Config
	log       *slog.Logger
	store     *data.Store
	ledger    *data.LedgerWriter
	gate      *policy.Gate
	reg       *router.Registry
	health    *router.HealthChecker
	srv       *server.Server
	node      *mesh.Node
	meshCerts *mesh.Certs // --mesh-tls, --mesh-funnel: the node's HTTPS certificate
	// listeners are the HTTP servers and what they serve, in the order
	// bound: public, admin, and with --mesh the admin routes on the
	// tailnet, the public API there over HTTPS (--mesh-tls) and through
	// Funnel (--mesh-funnel). Run serves and stops them in loops.
	listeners  []*listener
	tls        *publicTLS // nil: plain HTTP on the public listener
	publicAddr string
	publicURL  string // the API's base URL, http(s)://…/v1
	adminAddr  string
	adminToken string                // for the dashboard link printed at start
	webhook    *server.BudgetWebhook // --budget-webhook; nil: none
	usageSink  *server.UsageSink     // --usage-webhook; nil: none

	// stopWorkers, when set, stops the workers this process started (up);
	// Run calls it once nothing is left for them to serve and before the
	// admin listener, which takes their heartbeats, closes.
	stopWorkers func()
	promReg     *prometheus.Registry
	fleet       *fleet.Controller // nil: no fleet controller (see UseFleet)
	sidecars    *fleet.Sidecars   // how the fleet controller reaches sidecars to sleep and wake them
	closeOnce   sync.Once

	tracer *sdktrace.TracerProvider // nil: tracing off
}

// listener is one of the gateway's HTTP servers and the listener it serves.
type listener struct {
	name string // for logs and errors: public, admin, mesh_admin, mesh_public, funnel
	ln   net.Listener
	srv  *http.Server
	// admin: it serves the admin routes, where workers heartbeat while
	// they drain, so it stops after them; the others stop before.
	admin bool
}

// bind adds a bound listener to the table, which Close closes; its server
// is set once made.
func (gw *Gateway) bind(name string, ln net.Listener, admin bool) *listener {
	l := &listener{name: name, ln: ln, admin: admin}
	gw.listeners = append(gw.listeners, l)
	return l
}

// httpServer is a server of h with the gateway's timeouts. No ReadTimeout
// or WriteTimeout: they would cut long streams. Headers have a deadline
// here; bodies get one per request in the handler.
func httpServer(h http.Handler) *http.Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 120 * time.Second}
}

// Open checks cfg, opens the gateway's database and binds its listeners;
// nothing is served until Run. Its errors name the flag or file at fault.
func Open(ctx context.Context, cfg Config, log *slog.Logger) (_ *Gateway, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	setup, err := cfg.setup()
	if err != nil {
		return nil, err
	}
	// gw is not the result: an error returns nil, and this still closes
	// what was opened before it.
	gw := &Gateway{cfg: cfg, log: log}
	defer func() {
		if err != nil {
			gw.Close()
		}
	}()
	if gw.tls, err = openPublicTLS(cfg.TLS, cfg.DataDir, cfg.Listen, log); err != nil {
		return nil, err
	}
	adminToken, clusterToken, err := ensureTokens(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	gw.adminToken = adminToken
	if setup.srvCfg.CacheSaltSecret, err = ensureCacheSaltKey(cfg.DataDir); err != nil {
		return nil, err
	}
	db, err := gatewayDatabase(cfg.DataDir, cfg.Database)
	if err != nil {
		return nil, err
	}
	if gw.store, err = data.Open(db); err != nil {
		return nil, err
	}
	if gw.store.Postgres() {
		log.Info("database: PostgreSQL", "url", gw.store.Path())
	}
	gw.ledger = gw.store.NewLedgerWriter(data.LedgerConfig{RefreshInterval: server.OpenRowWait}, log)
	// Answers' rows are made durable by an append to the commit log; rows a
	// previous run logged but had not written to the database are written
	// now.
	switch n, err := gw.ledger.OpenCommitLog(ctx); {
	case errors.Is(err, data.ErrCommitLogLocked):
		log.Warn("another process uses this database's commit log (two gateways on one SQLite file?); answers wait for their database transaction", "err", err)
	case err != nil:
		return nil, fmt.Errorf("ledger commit log: %w", err)
	case n > 0:
		log.Warn("ledger rows recovered from the commit log of a gateway that stopped without writing them", "rows", n)
	}
	// Streams a previous run was serving when it died have open rows:
	// settle them (billed at what their clients had received) before the
	// budgets are read.
	if n, err := gw.store.SettleOpen(ctx); err != nil {
		return nil, fmt.Errorf("settle interrupted requests: %w", err)
	} else if n > 0 {
		log.Warn("settled requests that were in flight when the gateway last stopped", "interrupted", n)
	}
	pcfg := policy.Config{Prices: setup.prices}
	if cfg.UsageWebhook != "" {
		secret, err := ensureSecretFile(filepath.Join(cfg.DataDir, "webhook.secret"), "tgh-")
		if err != nil {
			return nil, err
		}
		if gw.usageSink, err = server.NewUsageSink(server.UsageSinkConfig{URL: cfg.UsageWebhook, Secret: []byte(secret),
			Poll: cfg.UsageWebhookPoll, Backoff: cfg.UsageWebhookBackoff, Log: log}, gw.store); err != nil {
			return nil, err
		}
	}
	if cfg.BudgetWebhook != "" {
		// Its own secret: the receiver keeps it, and it opens nothing else.
		secret, err := ensureSecretFile(filepath.Join(cfg.DataDir, "webhook.secret"), "tgh-")
		if err != nil {
			return nil, err
		}
		if gw.webhook, err = server.NewBudgetWebhook(server.BudgetWebhookConfig{URL: cfg.BudgetWebhook, Secret: []byte(secret), Log: log}); err != nil {
			return nil, err
		}
		pcfg.OnBudgetAlert = gw.webhook.Notify
	}
	if gw.gate, err = policy.New(ctx, pcfg, gw.store, log); err != nil {
		return nil, err
	}
	if err := checkBudgets(ctx, gw.gate, log); err != nil {
		return nil, err
	}
	promReg := prometheus.NewRegistry()
	promReg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		gw.gate.Collector())
	if cfg.BuildInfo != nil {
		promReg.MustRegister(cfg.BuildInfo)
	}

	rcfg := setup.routerCfg
	rcfg.Registerer = promReg
	if gw.reg, err = router.New(rcfg, log); err != nil {
		return nil, err
	}
	promReg.MustRegister(kvCacheCollector{gw.reg})
	gw.promReg = promReg
	var dial func(ctx context.Context, network, addr string) (net.Conn, error)
	if cfg.Mesh.Enabled {
		if gw.node, err = cfg.Mesh.Up(ctx, cfg.DataDir, log); err != nil {
			return nil, err
		}
		dial = gw.node.Dial // tailnet names over WireGuard, anything else from the host
		setup.srvCfg.PeerCheck = peerCheck(gw.node, mesh.SplitList(cfg.MeshAllowPeers))
		setup.srvCfg.PeerIdentity = peerIdentity(gw.node)
	}
	client, _ := hop.ParseClient(cfg.UpstreamClient) // checked by Validate
	transport := server.NewTransport(2*time.Second, dial, client)
	gw.sidecars = &fleet.Sidecars{Transport: transport, ClusterToken: clusterToken}
	for _, u := range setup.upstreams {
		rep := router.NewReplica(u.id, u.url)
		rep.Static = true
		gw.reg.Add(rep)
	}
	gw.health = router.NewHealthChecker(gw.reg, &server.Prober{Transport: transport, ClusterToken: clusterToken}, router.HealthConfig{})

	setup.srvCfg.AdminToken = adminToken
	bcfg := cfg.Batch
	bcfg.FilesDir, bcfg.DrainTimeout = cfg.BatchFilesDir, min(cfg.ShutdownGrace, 10*time.Second)
	if bcfg.FilesDir == "" {
		bcfg.FilesDir = filepath.Join(cfg.DataDir, "files")
	}
	setup.srvCfg.Batch = bcfg
	setup.srvCfg.ClusterToken = clusterToken
	if setup.srvCfg.EdgeToken, err = ensureSecretFile(cmp.Or(cfg.EdgeTokenFile, filepath.Join(cfg.DataDir, "edge.token")), "tge-"); err != nil {
		return nil, err
	}
	deps := server.Deps{
		Gate: gw.gate, Registry: gw.reg, Store: gw.store, Ledger: gw.ledger,
		Registerer: promReg, Gatherer: promReg, Log: log, Transport: transport,
	}
	if err := gw.openTracing(&deps); err != nil {
		return nil, err
	}
	srv, err := server.New(setup.srvCfg, deps)
	if err != nil {
		return nil, err
	}
	gw.srv = srv
	srv.SetRegion(cfg.Region)

	if err := gw.listen(cfg, srv, promReg); err != nil {
		return nil, err
	}
	return gw, nil
}

// listen binds the gateway's listeners and makes their servers: public and
// admin, each with its cap on connections, and with --mesh the admin routes
// on the tailnet, --mesh-tls and --mesh-funnel.
func (gw *Gateway) listen(cfg Config, srv *server.Server, promReg prometheus.Registerer) error {
	log := gw.log
	publicLn, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("--listen %s: %w", cfg.Listen, err)
	}
	// Caps on open client connections, in total and per address; idle
	// keep-alive ones make room first (connlimit). Connections that send no
	// request are closed after the header timeout.
	conns := connlimit.NewMetrics(promReg)
	limit := func(name string, most, perIP int) *connlimit.Limiter {
		l, _ := connlimit.New(connlimit.Config{Listener: name, Max: most, PerAddress: perIP}, conns, log) // validated with the flags
		return l
	}
	pubLimit, _ := connlimit.New(connlimit.Config{Listener: "public", Max: cfg.MaxConnections, PerAddress: cfg.MaxConnsPerIP, Trusted: cfg.TrustedProxies}, conns, log) // validated with the flags
	adminLimit := limit("admin", cmp.Or(cfg.AdminMaxConns, 256), 0)
	srv.SetClients(pubLimit)
	publicLn = pubLimit.Listen(publicLn)
	if gw.tls != nil {
		publicLn = tls.NewListener(publicLn, gw.tls.config)
	}
	public := gw.bind("public", publicLn, false)
	adminLn, err := net.Listen("tcp", cfg.AdminListen)
	if err != nil {
		return fmt.Errorf("--admin-listen %s: %w", cfg.AdminListen, err)
	}
	admin := gw.bind("admin", adminLimit.Listen(adminLn), true)
	gw.publicAddr, gw.adminAddr = public.ln.Addr().String(), admin.ln.Addr().String()
	gw.publicURL = gw.tls.url(gw.publicAddr)
	srv.SetAddresses(gw.publicURL, "http://"+gw.adminAddr) // for the hints of a request on the wrong listener
	public.srv = httpServer(srv.Public())
	// HTTP/2 without TLS too (prior knowledge, `tailgate edge --h2c`): an
	// edge then holds one multiplexed connection its polls keep warm, so
	// moving traffic here opens none (bench --scenario geo).
	public.srv.Protocols = new(http.Protocols)
	public.srv.Protocols.SetHTTP1(true)
	public.srv.Protocols.SetHTTP2(true)
	public.srv.Protocols.SetUnencryptedHTTP2(true)
	pubLimit.Apply(public.srv)
	if gw.tls != nil {
		public.srv.TLSConfig = gw.tls.config
	}
	adminHandler := srv.Admin(web.Handler())
	admin.srv = httpServer(adminHandler)
	adminLimit.Apply(admin.srv)
	if gw.node != nil {
		// The same admin routes on the tailnet, at the same port number, so
		// workers register at http://<gateway tailnet name>:<admin port>.
		_, port, _ := net.SplitHostPort(gw.adminAddr)
		meshLn, err := gw.node.Listen("tcp", ":"+port)
		if err != nil {
			return fmt.Errorf("mesh listen :%s: %w", port, err)
		}
		meshLimit := limit("mesh_admin", cmp.Or(cfg.AdminMaxConns, 256), 0)
		meshAdmin := gw.bind("mesh_admin", meshLimit.Listen(meshLn), true)
		meshAdmin.srv = httpServer(adminHandler)
		meshAdmin.srv.ConnContext = func(ctx context.Context, _ net.Conn) context.Context { return context.WithValue(ctx, viaMesh{}, true) }
		meshLimit.Apply(meshAdmin.srv)
		log.Info("admin routes on the tailnet", "url", fmt.Sprintf("http://%s:%s", gw.node.Hostname(), port))
	}
	if cfg.MeshTLS {
		if err := gw.listenMeshTLS(srv.Public()); err != nil {
			return err
		}
	}
	if cfg.MeshFunnel {
		// Funnel connections all come from Tailscale's relays, so a cap per
		// address would cap the internet as one client: the total only.
		most := cmp.Or(cfg.MaxConnections, connlimit.DefaultMax)
		if err := gw.listenFunnel(srv.Public(), limit("funnel", most, most)); err != nil {
			return err
		}
	}
	return nil
}

// nodeCerts returns the keeper of the node's HTTPS certificate, shared by
// --mesh-tls and --mesh-funnel; flag and other name them in the error of a
// tailnet that issues no certificates.
func (gw *Gateway) nodeCerts(flag, other string) (*mesh.Certs, error) {
	if gw.meshCerts != nil {
		return gw.meshCerts, nil
	}
	certs, err := gw.node.Certs(gw.log)
	if err != nil {
		return nil, fmt.Errorf("%s: %w; or leave %s off and %s", flag, err, flag, other)
	}
	gw.meshCerts = certs
	return certs, nil
}

// listenMeshTLS serves the public API on the tailnet at port 443 over HTTPS
// with the node's certificate (--mesh-tls). A tailnet that issues no
// certificates is a start-up error; a certificate not obtained yet is
// retried in run, and handshakes fail until it is there.
func (gw *Gateway) listenMeshTLS(public http.Handler) error {
	certs, err := gw.nodeCerts("--mesh-tls", "give the public listener its own certificate (--tls-cert or --acme-domain)")
	if err != nil {
		return err
	}
	ln, err := certs.ListenTLS(":443", "http/1.1")
	if err != nil {
		return fmt.Errorf("--mesh-tls: %w", err)
	}
	l := gw.bind("mesh_public", ln, false)
	l.srv = httpServer(public)
	l.srv.ErrorLog = slog.NewLogLogger(gw.log.Handler(), slog.LevelWarn)
	gw.log.Info("public API on the tailnet over HTTPS; its certificate is obtained in the background (the first can take a minute)",
		"url", gw.MeshURL())
	return nil
}

// listenFunnel serves the public API on the internet through Tailscale
// Funnel at port 443 of the node's MagicDNS name (--mesh-funnel), with the
// node's certificate; the admin routes are never served there. A tailnet
// that does not allow Funnel is a start-up error naming what to enable.
func (gw *Gateway) listenFunnel(public http.Handler, limit *connlimit.Limiter) error {
	certs, err := gw.nodeCerts("--mesh-funnel", "put cloudflared in front of the public listener (docs/edge.md)")
	if err != nil {
		return err
	}
	ln, err := certs.ListenFunnel(":443", "http/1.1")
	if err != nil {
		return fmt.Errorf("--mesh-funnel: %w; or leave --mesh-funnel off and put cloudflared in front of the public listener (docs/edge.md)", err)
	}
	l := gw.bind("funnel", limit.Listen(ln), false)
	l.srv = httpServer(public)
	l.srv.ErrorLog = slog.NewLogLogger(gw.log.Handler(), slog.LevelWarn)
	limit.Apply(l.srv)
	gw.log.Info("public API on the internet through Tailscale Funnel; its certificate is obtained in the background (the first can take a minute)",
		"url", gw.FunnelURL())
	return nil
}

// PublicURL is the API's base URL, http(s)://HOST:PORT/v1, with the port
// the public listener was bound to.
func (gw *Gateway) PublicURL() string { return gw.publicURL }

// AdminAddr is the address the admin listener was bound to.
func (gw *Gateway) AdminAddr() string { return gw.adminAddr }

// MeshURL is the public API's base URL on the tailnet (--mesh-tls), "" without.
func (gw *Gateway) MeshURL() string {
	if gw.meshCerts == nil {
		return ""
	}
	return "https://" + gw.meshCerts.Domain() + "/v1"
}

// FunnelURL is the public API's base URL on the internet through Tailscale
// Funnel (--mesh-funnel), "" without.
func (gw *Gateway) FunnelURL() string {
	if !slices.ContainsFunc(gw.listeners, func(l *listener) bool { return l.name == "funnel" }) {
		return ""
	}
	return "https://" + gw.meshCerts.Domain() + "/v1"
}

// checkBudgets refuses to start with a money budget that the prices make
// unreachable (no model its tenant may use has a price) — it would never be
// enforced, silently — and warns about one that leaves some model a
// tenant's keys name free.
func checkBudgets(ctx context.Context, gate *policy.Gate, log *slog.Logger) error {
	found, err := gate.UnpricedBudgets(ctx)
	if err != nil {
		return err
	}
	var never []string
	for _, u := range found {
		if u.Never {
			never = append(never, u.Error())
		} else {
			log.Warn("money budget not enforced on every model: " + u.Error())
		}
	}
	if len(never) > 0 {
		return errors.New(strings.Join(never, "; "))
	}
	return nil
}

// Run serves until ctx is done, then shuts down in order: stop accepting,
// let in-flight requests finish (up to the grace), drain the ledger.
func (gw *Gateway) Run(ctx context.Context) error {
	gctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	g, gctx := errgroup.WithContext(gctx)
	g.Go(func() error { return gw.gate.Run(gctx) })
	if gw.webhook != nil {
		g.Go(func() error { return gw.webhook.Run(gctx) })
	}
	if gw.usageSink != nil {
		g.Go(func() error { return gw.usageSink.Run(gctx) })
	}
	g.Go(func() error { return gw.ledger.Run(gctx) })
	g.Go(func() error { return gw.health.Run(gctx) })
	g.Go(func() error { return gw.srv.RunBatches(gctx) })
	g.Go(func() error { return gw.srv.RunHistory(gctx) })
	g.Go(func() error { return gw.srv.RunIdempotency(gctx) })
	g.Go(func() error { return gw.tls.Run(gctx) })
	if gw.meshCerts != nil {
		g.Go(func() error { return gw.meshCerts.Run(gctx) })
	}
	if gw.fleet != nil {
		g.Go(func() error { return gw.fleet.Run(gctx) })
	}
	// Every server's Serve is awaited before Run returns; the first to
	// fail stops the gateway.
	serveErr := make(chan error, len(gw.listeners))
	var serving sync.WaitGroup
	defer serving.Wait()
	for _, l := range gw.listeners {
		serving.Go(func() { serveErr <- fmt.Errorf("%s: %w", l.name, l.srv.Serve(l.ln)) })
	}
	gw.log.Info("gateway serving", "api", gw.publicURL, "admin", "http://"+gw.adminAddr)

	var runErr error
	select {
	case <-ctx.Done():
		gw.srv.SetDraining(true)
		if gw.cfg.DrainNotice > 0 {
			gw.log.Info("draining: telling edges before shutting down", "notice", gw.cfg.DrainNotice)
			time.Sleep(gw.cfg.DrainNotice)
		}
		gw.log.Info("shutting down: finishing in-flight requests", "grace", gw.cfg.ShutdownGrace)
	case err := <-serveErr:
		runErr = fmt.Errorf("serve: %w", err)
	case <-gctx.Done():
	}
	sctx, scancel := context.WithTimeout(context.Background(), gw.cfg.ShutdownGrace)
	defer scancel()
	for _, l := range gw.listeners {
		if l.admin {
			continue
		}
		if err := l.srv.Shutdown(sctx); err != nil {
			gw.log.Warn(l.name+" listener: in-flight requests cut at the end of the grace period", "err", err)
			_ = l.srv.Close()
		}
	}
	cancel() // stop gate, health, batches; the ledger writer drains what it holds
	if err := g.Wait(); err != nil && runErr == nil {
		runErr = err
	}
	// Workers still heartbeat (draining) while they stop; then the admin
	// listeners close.
	if gw.stopWorkers != nil {
		gw.stopWorkers()
	}
	actx, acancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer acancel()
	for _, l := range gw.listeners {
		if l.admin {
			_ = l.srv.Shutdown(actx)
		}
	}
	if err := gw.ledger.Close(); err != nil && runErr == nil {
		runErr = fmt.Errorf("ledger: %w", err)
	}
	gw.closeTracing()
	gw.log.Info("gateway stopped; ledger drained")
	return runErr
}

// Close releases what Open took (listeners, the database, the tailnet
// node); it is safe to call twice and after Run.
func (gw *Gateway) Close() { gw.closeOnce.Do(gw.close) }

func (gw *Gateway) close() {
	gw.tls.close()
	gw.closeTracing()
	for _, l := range gw.listeners {
		_ = l.ln.Close()
	}
	if gw.ledger != nil {
		_ = gw.ledger.Close()
	}
	if gw.store != nil {
		_ = gw.store.Close()
	}
	if gw.node != nil {
		_ = gw.node.Close()
	}
}

// dashboardURL is the dashboard's address with the admin token in its
// fragment, which a browser never sends to a server: the page moves it to
// the tab's storage and out of the address bar, so it reaches no access log.
func (gw *Gateway) dashboardURL() string {
	return "http://" + gw.adminAddr + "/ui/#token=" + url.QueryEscape(gw.adminToken)
}

// DashboardLink is the dashboard link to print on stdout, terminal telling
// whether stdout is a terminal. Only a terminal gets the token in it: stdout
// under systemd (the journal), a container runtime or a pipe ends up in logs
// that others read and keep. Otherwise the link is printed bare and the one
// with the token is written to DIR/dashboard.url (mode 0600), which the
// printed line and a log line name.
func (gw *Gateway) DashboardLink(terminal bool) string {
	path := filepath.Join(gw.cfg.DataDir, "dashboard.url")
	if err := writeSecretFile(path, gw.dashboardURL()+"\n"); err != nil {
		gw.log.Warn("dashboard link not written", "path", path, "err", err)
	}
	if terminal {
		return gw.dashboardURL()
	}
	gw.log.Info("dashboard link with the admin token written (stdout is not a terminal, so it is not printed)", "path", path)
	return "http://" + gw.adminAddr + "/ui/ (sign-in link with the admin token: " + path + ")"
}
