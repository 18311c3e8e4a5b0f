// Package servertest runs a real gateway for the tests of package server
// and its sub-packages: SQLite in a temporary directory, policy, the
// router, the server's public and admin APIs on loopback HTTP servers,
// simulated engines behind real HTTP servers, the Batch API's executor, and
// the official OpenAI Go SDK as the client.
//
// It is test code compiled into tests only: only _test.go files import it,
// and it must never be imported by the product.
package servertest

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/tailgate-dev/tailgate/data"
	"github.com/tailgate-dev/tailgate/policy"
	"github.com/tailgate-dev/tailgate/router"
	"github.com/tailgate-dev/tailgate/server"
	"github.com/tailgate-dev/tailgate/serving/sim"
)

const (
	// SimModel is the model the simulated engines serve by default.
	SimModel = "tailgate-sim"
	// ClusterToken is the gateway's cluster token unless Options.Server sets one.
	ClusterToken = "tgc-test-cluster"
	// EdgeToken is what edges send to read the regional status, unless
	// Options.Server sets one.
	EdgeToken = "tge-test-edge"
	// AdminToken guards the admin API.
	AdminToken = "tga-test-admin"
)

// Options shape a gateway. The zero value is a gateway on a new temporary
// directory in front of two simulated engines serving SimModel, with the
// Batch API off.
type Options struct {
	// Dir is the data directory (SQLite file, batch files); "" means a new
	// t.TempDir(). A gateway started again on the same Dir, after Close, is
	// a restart.
	Dir string
	// Replicas is how many simulated engines this gateway starts, as
	// replicas sim-a, sim-b, …; 0 means 2, or none when Fleet is set.
	Replicas int
	// Sim configures the engines; Sims overrides it per replica (by index),
	// e.g. one slow replica. Each engine's Seed is its index + 1.
	Sim  sim.Config
	Sims map[int]sim.Config
	// Fleet are engines already running (see [StartSims]), routed to as
	// replicas fleet-0, fleet-1, …: they outlive the gateway, so a
	// restarted gateway finds the same fleet.
	Fleet []Sim
	// DeadUpstreams adds static replicas whose port refuses connections.
	DeadUpstreams int
	// Health runs a health checker (probes, lease expiry) at this interval;
	// 0 runs none.
	Health time.Duration
	// Router configures the registry (hedging, policy, budget).
	Router router.Config
	// Server configures the server, Batch API included; AdminToken is
	// always AdminToken, and an empty ClusterToken means ClusterToken.
	Server server.Config
	// Prices are the policy's prices per model.
	Prices map[string]policy.Price
	// Log, when set, receives the gateway's log (else it is discarded, or
	// written to the test's log with -v).
	Log *slog.Logger
	// Production keeps the ledger batching and key polling of `tailgate
	// gateway` (benchmarks); tests flush faster.
	Production bool
	// Tracer, when set, receives the requests' spans (server.Deps.Tracer).
	Tracer trace.TracerProvider
}

// Gateway is a running gateway. Its parts are exported for tests to
// inspect and drive; Close (also run when the test ends) stops it.
type Gateway struct {
	T         testing.TB
	Dir       string
	Store     *data.Store
	Gate      *policy.Gate
	Reg       *router.Registry
	Ledger    *data.LedgerWriter
	Srv       *server.Server
	Public    *httptest.Server
	Admin     *httptest.Server
	Engines   []*sim.Engine      // the engines this gateway started
	Upstreams []*httptest.Server // their servers, by index
	Metrics   *prometheus.Registry

	cancel       context.CancelFunc // gate, ledger, health
	done         chan struct{}
	stopBatches  context.CancelFunc
	batchesDone  chan struct{}
	closeOnce    sync.Once
	stopExecOnce sync.Once
}

// Start starts a gateway and its batch executor (which returns at once
// when the Batch API is off).
func Start(t testing.TB, o Options) *Gateway {
	t.Helper()
	if o.Replicas == 0 && len(o.Fleet) == 0 {
		o.Replicas = 2
	}
	if o.Dir == "" {
		o.Dir = t.TempDir()
	}
	g := &Gateway{T: t, Dir: o.Dir, done: make(chan struct{}, 4), batchesDone: make(chan struct{})}
	log := slog.New(slog.DiscardHandler)
	if testing.Verbose() {
		log = slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	if o.Log != nil {
		log = o.Log
	}
	var err error
	if g.Store, err = data.Open(filepath.Join(o.Dir, "tailgate.db")); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	g.cancel = cancel
	poll, flush := 50*time.Millisecond, 5*time.Millisecond
	if o.Production {
		poll, flush = 0, 0
	}
	if g.Gate, err = policy.New(ctx, policy.Config{PollInterval: poll, Prices: o.Prices}, g.Store, log); err != nil {
		t.Fatal(err)
	}
	g.Ledger = g.Store.NewLedgerWriter(data.LedgerConfig{FlushInterval: flush}, log)
	if _, err := g.Ledger.OpenCommitLog(ctx); err != nil {
		t.Fatal(err)
	}
	g.Metrics = prometheus.NewRegistry()
	rcfg := o.Router
	rcfg.Registerer = g.Metrics
	if g.Reg, err = router.New(rcfg, log); err != nil {
		t.Fatal(err)
	}

	for i, s := range StartSims(t, o.Replicas, o.Sim, o.Sims) {
		g.Engines = append(g.Engines, s.Engine)
		g.Upstreams = append(g.Upstreams, s.Server)
		g.AddReplica("sim-"+string(rune('a'+i)), s.Server.URL, s.Model)
	}
	for i, s := range o.Fleet {
		g.AddReplica("fleet-"+strconv.Itoa(i), s.Server.URL, s.Model)
	}
	for i := range o.DeadUpstreams {
		dead := httptest.NewServer(http.NotFoundHandler())
		url := dead.URL
		dead.Close()
		g.AddReplica("dead-"+string(rune('a'+i)), url, o.Sim.Model)
	}

	o.Server.AdminToken = AdminToken
	if o.Server.EdgeToken == "" {
		o.Server.EdgeToken = EdgeToken
	}
	if o.Server.ClusterToken == "" {
		o.Server.ClusterToken = ClusterToken
	}
	g.Srv, err = server.New(o.Server, server.Deps{
		Gate: g.Gate, Registry: g.Reg, Store: g.Store, Ledger: g.Ledger,
		Registerer: g.Metrics, Gatherer: g.Metrics, Log: log, Tracer: o.Tracer,
	})
	if err != nil {
		t.Fatal(err)
	}
	g.Public = httptest.NewServer(g.Srv.Public())
	g.Admin = httptest.NewServer(g.Srv.Admin(nil))

	go func() { _ = g.Gate.Run(ctx); g.done <- struct{}{} }()
	go func() { _ = g.Ledger.Run(ctx); g.done <- struct{}{} }()
	go func() { _ = g.Srv.RunIdempotency(ctx); g.done <- struct{}{} }()
	if o.Health > 0 {
		hc := router.NewHealthChecker(g.Reg, &server.Prober{Transport: http.DefaultTransport, ClusterToken: ClusterToken},
			router.HealthConfig{Interval: o.Health, Timeout: o.Health})
		go func() { _ = hc.Run(ctx); g.done <- struct{}{} }()
	} else {
		g.done <- struct{}{}
	}
	execCtx, stopExec := context.WithCancel(context.Background())
	g.stopBatches = stopExec
	go func() {
		defer close(g.batchesDone)
		if err := g.Srv.RunBatches(execCtx); err != nil {
			t.Errorf("RunBatches: %v", err)
		}
	}()
	t.Cleanup(g.Close)
	return g
}

// StopBatches stops the batch executor as the gateway does on SIGTERM (the
// lines in flight get Config.DrainTimeout) and waits for it to return.
func (g *Gateway) StopBatches() {
	g.stopExecOnce.Do(g.stopBatches)
	<-g.batchesDone
}

// Close stops the gateway as it stops on SIGTERM: the batch executor first,
// then the listeners, then the background loops, draining the ledger, and
// closes the database. The engines keep running until the test ends. It is
// safe to call twice.
func (g *Gateway) Close() {
	g.closeOnce.Do(func() {
		g.StopBatches()
		g.Public.Close()
		g.Admin.Close()
		g.cancel()
		for range cap(g.done) {
			<-g.done
		}
		_ = g.Ledger.Close()
		_ = g.Gate.Close()
		_ = g.Store.Close()
	})
}

// AddReplica routes model ("" means SimModel) to a ready static replica at url.
func (g *Gateway) AddReplica(id, url, model string) *router.Replica {
	if model == "" {
		model = SimModel
	}
	rep := router.NewReplica(id, url)
	rep.Static = true
	rep.SetModels([]string{model})
	rep.SetState(router.StateReady, "")
	return g.Reg.Add(rep)
}

// LearnWithout calls send n times with rep out of routing (draining), so
// that hedge delays and decode paces are learnt from the other replicas
// alone, and puts rep back. Meanwhile each other ready replica of rep's
// models has a twin (the same engine, replica id <id>-twin), so that the
// models keep more than one replica ready and JSON answers are assembled
// from streams, as they are once rep is back (with one replica ready, the
// engine's JSON is relayed and teaches neither).
func (g *Gateway) LearnWithout(rep *router.Replica, n int, send func()) {
	rep.SetState(router.StateDraining, "test")
	var twins []string
	for _, o := range g.Reg.Replicas() {
		if o == rep || o.State() != router.StateReady {
			continue
		}
		for _, m := range o.Models() {
			if rep.Serves(m) {
				g.AddReplica(o.ID+"-twin", o.URL, m)
				twins = append(twins, o.ID+"-twin")
				break
			}
		}
	}
	for range n {
		send()
	}
	for _, id := range twins {
		g.Reg.Remove(id)
	}
	rep.SetState(router.StateReady, "")
}

// Key creates an API key (of tenant "acme" unless o names one) and returns
// its secret.
func (g *Gateway) Key(o policy.KeyOptions) string {
	g.T.Helper()
	if o.Tenant == "" {
		o.Tenant = "acme"
	}
	secret, _, err := policy.CreateKey(context.Background(), g.Store, o)
	if err != nil {
		g.T.Fatal(err)
	}
	return secret
}

// Client returns an OpenAI SDK client of the public API that never retries.
func (g *Gateway) Client(secret string, opts ...option.RequestOption) openai.Client {
	return openai.NewClient(append([]option.RequestOption{
		option.WithBaseURL(g.Public.URL + "/v1"), option.WithAPIKey(secret), option.WithMaxRetries(0),
	}, opts...)...)
}

// Inflight reads the gateway's tailgate_inflight_requests gauge.
func (g *Gateway) Inflight() float64 {
	mfs, err := g.Metrics.Gather()
	if err != nil {
		g.T.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "tailgate_inflight_requests" && len(mf.GetMetric()) > 0 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	return 0
}

// LedgerRows waits until no request is in its handler (a client can have
// the whole answer a moment before the handler writes its ledger row),
// flushes the ledger and returns every row.
func (g *Gateway) LedgerRows() []data.LedgerRow {
	g.T.Helper()
	for deadline := time.Now().Add(5 * time.Second); g.Inflight() > 0 && time.Now().Before(deadline); {
		time.Sleep(2 * time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := g.Ledger.Flush(ctx); err != nil {
		g.T.Fatal(err)
	}
	rows, err := g.Store.LedgerRows(ctx, data.UsageFilter{})
	if err != nil {
		g.T.Fatal(err)
	}
	return rows
}

// Post sends a raw JSON request to the public API, with secret as the
// bearer key unless it is empty.
func (g *Gateway) Post(path, secret, body string) *http.Response {
	g.T.Helper()
	return g.Do(http.MethodPost, path, secret, "application/json", strings.NewReader(body))
}

// Do sends a raw request to the public API, with secret as the bearer key
// unless it is empty and ctype as its Content-Type unless it is empty. The
// caller closes the body.
func (g *Gateway) Do(method, path, secret, ctype string, body io.Reader) *http.Response {
	g.T.Helper()
	req, err := http.NewRequest(method, g.Public.URL+path, body)
	if err != nil {
		g.T.Fatal(err)
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	if secret != "" {
		req.Header.Set("Authorization", "Bearer "+secret)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		g.T.Fatal(err)
	}
	return resp
}

// Sim is a simulated engine behind a loopback HTTP server.
type Sim struct {
	Engine *sim.Engine
	Server *httptest.Server
	Model  string // as configured ("" is the engine's default, SimModel)
}

// StartSims starts n simulated engines configured by cfg, or by
// per[i] for engine i, each seeded with i + 1 (stalls are independent per
// engine). They run until the test ends.
func StartSims(t testing.TB, n int, cfg sim.Config, per map[int]sim.Config) []Sim {
	t.Helper()
	var out []Sim
	for i := range n {
		c := cfg
		if pc, ok := per[i]; ok {
			c = pc
		}
		c.Seed = int64(i + 1)
		eng, err := sim.New(c, nil)
		if err != nil {
			t.Fatal(err)
		}
		// The engine's own server: it closes idle keep-alive connections
		// after 5 s, as vLLM's uvicorn does.
		srv := httptest.NewUnstartedServer(nil)
		srv.Config = eng.NewServer(nil)
		srv.Start()
		t.Cleanup(srv.Close)
		out = append(out, Sim{Engine: eng, Server: srv, Model: c.Model})
	}
	return out
}

// testWriter sends log lines to the test's log (go test -v).
type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
