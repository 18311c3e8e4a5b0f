package server_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/prometheus/client_golang/prometheus"

	"tailgate/data"
	"tailgate/policy"
	"tailgate/router"
	"tailgate/server"
	"tailgate/serving/sim"
)

const (
	simModel     = "tailgate-sim"
	clusterToken = "tgc-test-cluster"
)

// harness is a real gateway on loopback: SQLite in a temp dir, policy,
// router, the echo server, and sim engines behind real HTTP servers.
type harness struct {
	t          testing.TB
	dir        string
	store      *data.Store
	gate       *policy.Gate
	reg        *router.Registry
	ledger     *data.LedgerWriter
	srv        *server.Server
	public     *httptest.Server
	admin      *httptest.Server
	engines    []*sim.Engine
	upstreams  []*httptest.Server
	adminToken string
	promReg    *prometheus.Registry
}

type harnessOpts struct {
	replicas int
	sim      sim.Config
	cfg      server.Config
	prices   map[string]policy.Price
	// deadUpstreams adds static replicas whose port refuses connections.
	deadUpstreams int
	// health runs a health checker (probes, lease expiry) at this interval.
	health time.Duration
	// router configures the registry (hedging, policy, budget).
	router router.Config
	// sims overrides the sim config per replica (by index), e.g. one slow replica.
	sims map[int]sim.Config
	// production keeps the ledger batching and key polling of `tailgate
	// gateway` (benchmarks); tests flush faster.
	production bool
}

func newHarness(t testing.TB, o harnessOpts) *harness {
	t.Helper()
	if o.replicas == 0 {
		o.replicas = 2
	}
	h := &harness{t: t, dir: t.TempDir(), adminToken: "tga-test-admin"}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if testing.Verbose() {
		log = slog.New(slog.NewTextHandler(&testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	var err error
	h.store, err = data.Open(filepath.Join(h.dir, "tailgate.db"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	poll, flush := 50*time.Millisecond, 5*time.Millisecond
	if o.production {
		poll, flush = 0, 0
	}
	h.gate, err = policy.New(ctx, policy.Config{PollInterval: poll, Prices: o.prices}, h.store, log)
	if err != nil {
		t.Fatal(err)
	}
	h.ledger = h.store.NewLedgerWriter(data.LedgerConfig{FlushInterval: flush}, log)
	h.promReg = prometheus.NewRegistry()
	o.router.Registerer = h.promReg
	if h.reg, err = router.New(o.router, log); err != nil {
		t.Fatal(err)
	}

	for i := range o.replicas {
		cfg := o.sim
		if c, ok := o.sims[i]; ok {
			cfg = c
		}
		cfg.Seed = int64(i + 1)
		eng, err := sim.New(cfg, nil)
		if err != nil {
			t.Fatal(err)
		}
		up := httptest.NewServer(eng.Handler())
		h.engines = append(h.engines, eng)
		h.upstreams = append(h.upstreams, up)
		h.addReplica("sim-"+string(rune('a'+i)), up.URL, cfg.Model)
	}
	for i := range o.deadUpstreams {
		dead := httptest.NewServer(http.NotFoundHandler())
		url := dead.URL
		dead.Close()
		h.addReplica("dead-"+string(rune('a'+i)), url, o.sim.Model)
	}
	o.cfg.AdminToken = h.adminToken
	if o.cfg.ClusterToken == "" {
		o.cfg.ClusterToken = clusterToken
	}
	h.srv, err = server.New(o.cfg, server.Deps{
		Gate: h.gate, Registry: h.reg, Store: h.store, Ledger: h.ledger,
		Registerer: h.promReg, Gatherer: h.promReg, Log: log,
	})
	if err != nil {
		t.Fatal(err)
	}
	h.public = httptest.NewServer(h.srv.Public())
	h.admin = httptest.NewServer(h.srv.Admin(nil))

	done := make(chan struct{}, 3)
	go func() { _ = h.gate.Run(ctx); done <- struct{}{} }()
	go func() { _ = h.ledger.Run(ctx); done <- struct{}{} }()
	if o.health > 0 {
		hc := router.NewHealthChecker(h.reg, &server.Prober{Transport: http.DefaultTransport, ClusterToken: clusterToken},
			router.HealthConfig{Interval: o.health, Timeout: o.health})
		go func() { _ = hc.Run(ctx); done <- struct{}{} }()
	} else {
		done <- struct{}{}
	}
	t.Cleanup(func() {
		h.public.Close()
		h.admin.Close()
		for _, u := range h.upstreams {
			u.Close()
		}
		cancel()
		<-done
		<-done
		<-done
		_ = h.ledger.Close()
		_ = h.gate.Close()
		_ = h.store.Close()
	})
	return h
}

func (h *harness) addReplica(id, url, model string) *router.Replica {
	if model == "" {
		model = simModel
	}
	rep := router.NewReplica(id, url)
	rep.Static = true
	rep.SetModels([]string{model})
	rep.SetState(router.StateReady, "")
	return h.reg.Add(rep)
}

// key creates an API key and returns its secret.
func (h *harness) key(o policy.KeyOptions) string {
	h.t.Helper()
	if o.Tenant == "" {
		o.Tenant = "acme"
	}
	secret, _, err := policy.CreateKey(context.Background(), h.store, o)
	if err != nil {
		h.t.Fatal(err)
	}
	return secret
}

func (h *harness) client(secret string, opts ...option.RequestOption) openai.Client {
	return openai.NewClient(append([]option.RequestOption{
		option.WithBaseURL(h.public.URL + "/v1"), option.WithAPIKey(secret), option.WithMaxRetries(0),
	}, opts...)...)
}

// inflight reads the gateway's tailgate_inflight_requests gauge.
func (h *harness) inflight() float64 {
	mfs, err := h.promReg.Gather()
	if err != nil {
		h.t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "tailgate_inflight_requests" && len(mf.GetMetric()) > 0 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	return 0
}

// ledgerRows waits until no request is in its handler (a client can have
// the whole answer a moment before the handler writes its ledger row),
// flushes the ledger and returns every row.
func (h *harness) ledgerRows() []data.LedgerRow {
	h.t.Helper()
	for deadline := time.Now().Add(5 * time.Second); h.inflight() > 0 && time.Now().Before(deadline); {
		time.Sleep(2 * time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := h.ledger.Flush(ctx); err != nil {
		h.t.Fatal(err)
	}
	rows, err := h.store.LedgerRows(ctx, data.UsageFilter{})
	if err != nil {
		h.t.Fatal(err)
	}
	return rows
}

// post sends a raw request to the public API.
func (h *harness) post(path, secret, body string) *http.Response {
	h.t.Helper()
	req, _ := http.NewRequest(http.MethodPost, h.public.URL+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if secret != "" {
		req.Header.Set("Authorization", "Bearer "+secret)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	return resp
}

type testWriter struct{ t testing.TB }

func (w *testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func readAll(resp *http.Response) ([]byte, error) { return io.ReadAll(resp.Body) }
