// Package server is tailgate's HTTP face: the OpenAI-compatible public API
// and the admin API, built on echo. It turns a client request into an
// admitted, routed, relayed and metered call, and maps every failure to
// OpenAI's error shape. It owns the routes, the handlers and middleware, the
// one request pipeline every endpoint goes through, the SSE relay, the
// assembly of a JSON answer from a stream, workers' registration and the
// admin API; it owns no listener, no database and no replica state.
//
// # Overview
//
// [New] wires the parts a gateway needs from a [Config] and its [Deps]:
// policy's Gate, router's Registry, data's Store and ledger writer, an
// outbound [http.RoundTripper] (made by [NewTransport]) and a Prometheus
// registry. [Server.Public] and [Server.Admin] return the two HTTP handlers;
// the caller owns the listeners. [Server.RunBatches] and [Server.RunHistory]
// are its background loops. Only the gateway role (package server/gateway)
// imports this package; it assembles all of the above.
//
// A request flows through one pipeline, whatever its endpoint:
//
//	handler (generate.go)             authenticate, read the body once (readBody)
//	  → read (endpoint.go, request.go) the endpoint's adapter: parse, check, rewrite the body
//	  → admit (serve.go)              the key's limits, the tenant's budget, the priority queue
//	  → serve (serve.go)              route through router's Call: attempts, retries, hedges
//	  → attempt (attempt.go, tries.go) one upstream call per replica tried, through the transport
//	  → upstream (upstream.go)        the one reader of an engine's answer, usagejson.go its usage
//	  → relay (stream.go, assemble.go) SSE to the client as it comes, or one JSON answer
//	  → settle (serve.go)             real usage to the Ticket, one ledger row (fail closed)
//
// An endpoint is an adapter onto that pipeline (read, reserve, meter,
// relay), never a second path: the Batch API (package server/batch) runs its
// lines through [Server.Generate]. Errors reach the client through one table
// (errors.go, package server/apierr). The admin API (admin*.go, cluster.go)
// serves keys, tenants, usage, replicas and recent requests ([KeyView],
// [TenantView], [UsageView] are its JSON shapes), workers' heartbeats behind
// the cluster token, and health probes of replicas ([Prober]).
package server

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/time/rate"

	"github.com/tailgate-dev/tailgate/data"
	"github.com/tailgate-dev/tailgate/policy"
	"github.com/tailgate-dev/tailgate/router"
	"github.com/tailgate-dev/tailgate/server/apierr"
	"github.com/tailgate-dev/tailgate/server/batch"
	"github.com/tailgate-dev/tailgate/server/connlimit"
	"github.com/tailgate-dev/tailgate/server/slo"
	"github.com/tailgate-dev/tailgate/server/strictjson"
	"github.com/tailgate-dev/tailgate/serving"
	"github.com/tailgate-dev/tailgate/serving/hop"
)

// Config tunes the gateway's HTTP behaviour. Zero values mean the defaults.
type Config struct {
	// MaxBodyBytes bounds a request body; larger bodies get 413. 0 means 4 MiB.
	MaxBodyBytes int64
	// DefaultMaxTokens is the completion cap applied when a request sets no
	// max_tokens; 0 means 1024. MaxTokensByModel overrides it per model.
	DefaultMaxTokens int64
	MaxTokensByModel map[string]int64
	// KeepAlive is how long a stream may stay silent (e.g. waiting for a slow
	// first token) before an SSE comment is sent; 0 means 10s.
	KeepAlive time.Duration
	// AdminToken guards the admin listener. Required.
	AdminToken string
	// ClusterToken is what workers present to register, and what the gateway
	// presents to their sidecars. Empty disables worker registration.
	ClusterToken string
	// EdgeToken is what edges present (Authorization: Bearer) to read the
	// regional status (serving.RegionStatusPath); a poll without it is
	// refused with 401. Empty refuses every poll.
	EdgeToken string
	// Lease is how long a registered replica stays routable without a
	// heartbeat; 0 means 3.5s (about three missed one-second beats).
	Lease time.Duration
	// PeerCheck, when set, must accept a worker's heartbeat request besides
	// its cluster token (the mesh checks the tailnet peer's identity). A
	// peer it accepts counts as approved: its new replica ids register
	// without an invite or an approval (a revoked one stays out).
	PeerCheck func(*http.Request) error
	// OpenRegistration lets the cluster token alone register a new replica
	// id, as before invites and approvals (a revoked one stays out). False:
	// a new id needs a join token or an operator's approval.
	OpenRegistration bool
	// PeerIdentity, when set, names the tailnet peer a heartbeat came from
	// ("" if none); a worker's credential is bound to the peer that
	// registered it. Nil: credentials are not bound to a peer.
	PeerIdentity func(*http.Request) string
	// ConnectTimeout bounds dialing a replica; 0 means 2s.
	ConnectTimeout time.Duration
	// BodyTimeout bounds reading a request body, so a client that trickles
	// its body cannot hold a handler; 0 means 30s.
	BodyTimeout time.Duration
	// TTFTDeadline bounds one attempt's wait for its first streamed token;
	// past it the replica is taken out and the request retried elsewhere.
	// 0 means 30s. TTFTDeadlineByModel overrides it per model.
	TTFTDeadline        time.Duration
	TTFTDeadlineByModel map[string]time.Duration
	// IdleDeadline bounds the silence between two streamed tokens; past it
	// the replica is taken out and the stream ends with an error event.
	// 0 means 30s. IdleDeadlineByModel overrides it per model.
	IdleDeadline        time.Duration
	IdleDeadlineByModel map[string]time.Duration
	// MaxAudioBytes bounds a multipart audio upload (transcriptions,
	// translations); larger bodies get 413. 0 means 25 MiB, as OpenAI's.
	MaxAudioBytes int64
	// MaxBodyBytesInFlight bounds the request-body bytes held at once over
	// all requests (a body is held until its request ends); a request past
	// it waits up to BodyBudgetWait for others to finish, then gets 503 with
	// Retry-After. Every copy counts: a multipart form is held twice (as
	// read, and encoded again for the engine), a JSON body the gateway
	// adds fields to too. 0 means 256 MiB: five full-size audio uploads or
	// 32 full-size JSON bodies at once, while ordinary requests
	// (kilobytes) never come near it, and a flood of large uploads stays a
	// fraction of a small box's memory. It is at least twice the larger of
	// MaxBodyBytes and MaxAudioBytes, so any one allowed body fits with
	// its copy.
	MaxBodyBytesInFlight int64
	// MaxBodyBytesPerTenant is one tenant's share of MaxBodyBytesInFlight
	// (requests are refused with 429 past it); 0 means a quarter of it,
	// at least twice the larger of MaxBodyBytes and MaxAudioBytes (a
	// largest body and the copy the gateway forwards): with the defaults
	// 64 MiB, so no tenant — not one with a 1-token budget sending slow
	// uploads — holds more than a quarter, and three tenants at their
	// share still leave a quarter to everyone else.
	MaxBodyBytesPerTenant int64
	// BodyBudgetWait bounds a request's wait for MaxBodyBytesInFlight; 0
	// means 2s.
	BodyBudgetWait time.Duration
	// CacheSaltSecret derives each tenant's cache_salt (salt.go); empty
	// means a random secret for this process's life.
	CacheSaltSecret []byte
	// ClientWriteTimeout bounds how long one write to a client may block: a
	// client that stops reading its stream (or a large answer) for longer
	// is cut, and its concurrency slot, budget reservation and replica slot
	// are released. 0 means 30s.
	ClientWriteTimeout time.Duration
	// RejectedRows bounds the ledger rows written for requests the gateway
	// refused (bad input, limits), per second, with a burst of 5 seconds'
	// worth; past it rejections are counted in
	// tailgate_ledger_rows_skipped_total but not stored, so a flood of bad
	// requests cannot fill the disk. 0 means 20 per second.
	RejectedRows float64
	// MaxJSONDepth bounds the nesting of objects and arrays in a request
	// body; deeper bodies get 400. 0 means 64.
	MaxJSONDepth int
	// MediaPartTokens is the prompt tokens reserved against the budget for
	// each image, audio or video part of a chat message (the engine turns a
	// short URL into many tokens); 0 means 16384.
	MediaPartTokens int64
	// JSONDeadline bounds one attempt of a request that is not streamed (its
	// whole answer comes at once); 0 means 10m.
	JSONDeadline time.Duration
	// SLO holds the latency budgets the gateway evaluates (GET
	// /admin/v1/slo, tailgate_slo_* metrics); its zero value is
	// slo.DefaultBudgets for every model, no source labels.
	SLO slo.Config
	// HistoryInterval is the step of the dashboard's in-memory time series
	// (see [Server.RunHistory]), which keeps 360 of them; 0 means 10s.
	HistoryInterval time.Duration
	// AdmitCapacity is how many generation requests of one model run at
	// once before lower priority classes wait in the admission queue
	// (interactive requests go a headroom further; see
	// policy.AdmissionQueue). 0 means the sum of the engine slots learnt
	// from the model's ready replicas; until one is learnt (an engine seen
	// full), nothing waits. AdmitCapacityByModel overrides it per model.
	AdmitCapacity        int64
	AdmitCapacityByModel map[string]int64
	// Admission bounds the admission queue: its headroom, length per class
	// and wait (see policy.QueueConfig); its Capacity is ignored
	// (AdmitCapacity says it).
	Admission policy.QueueConfig
	// Batch configures the Batch API (/v1/files, /v1/batches) and its
	// executor; see [batch.Config]. Its zero value leaves the API off. Its
	// MaxBodyBytes, when 0, is this Config's.
	Batch batch.Config
	// Hold bounds how requests wait through a cold start (see hold.go);
	// its zero value is [DefaultHold].
	Hold HoldConfig
	// TrustedProxies are the networks of proxies whose X-Forwarded-For
	// names the client (client.go); none: the peer is the client.
	TrustedProxies []netip.Prefix
	// TraceFrom are the networks of clients whose traceparent the
	// gateway continues (trace.go); none: every request starts its own
	// trace, sampled as the operator set.
	TraceFrom []netip.Prefix
	// Idempotency-Key (idempotency.go): IdempotencyRetention is how long a
	// key's answer is kept for its retries (0: 24h); IdempotencyMaxBytes
	// the largest answer kept (0: 1 MiB; a larger one is answered, and its
	// retries get 409); IdempotencyMaxKeys the most records a tenant keeps
	// (0: 10,000; its oldest beyond are removed every minute);
	// IdempotencyAbandon how long a keyed request runs on with no client
	// reading its answer (0: 1m).
	IdempotencyRetention time.Duration
	IdempotencyMaxBytes  int64
	IdempotencyMaxKeys   int
	IdempotencyAbandon   time.Duration
}

func (c *Config) setDefaults() {
	if c.MaxBodyBytes <= 0 {
		c.MaxBodyBytes = 4 << 20
	}
	if c.DefaultMaxTokens <= 0 {
		c.DefaultMaxTokens = 1024
	}
	if c.KeepAlive <= 0 {
		c.KeepAlive = 10 * time.Second
	}
	if c.ConnectTimeout <= 0 {
		c.ConnectTimeout = 2 * time.Second
	}
	if c.Lease <= 0 {
		c.Lease = 3500 * time.Millisecond
	}
	if c.BodyTimeout <= 0 {
		c.BodyTimeout = 30 * time.Second
	}
	if c.TTFTDeadline <= 0 {
		c.TTFTDeadline = 30 * time.Second
	}
	if c.IdleDeadline <= 0 {
		c.IdleDeadline = 30 * time.Second
	}
	if c.MaxAudioBytes <= 0 {
		c.MaxAudioBytes = 25 << 20
	}
	if c.MaxBodyBytesInFlight <= 0 {
		c.MaxBodyBytesInFlight = 256 << 20
	}
	largest := 2 * max(c.MaxBodyBytes, c.MaxAudioBytes)
	c.MaxBodyBytesInFlight = max(c.MaxBodyBytesInFlight, largest)
	if c.MaxBodyBytesPerTenant <= 0 {
		c.MaxBodyBytesPerTenant = max(c.MaxBodyBytesInFlight/4, largest)
	}
	c.MaxBodyBytesPerTenant = min(max(c.MaxBodyBytesPerTenant, largest), c.MaxBodyBytesInFlight)
	if c.BodyBudgetWait <= 0 {
		c.BodyBudgetWait = 2 * time.Second
	}
	if c.ClientWriteTimeout <= 0 {
		c.ClientWriteTimeout = 30 * time.Second
	}
	if c.RejectedRows <= 0 {
		c.RejectedRows = 20
	}
	if c.MaxJSONDepth <= 0 {
		c.MaxJSONDepth = strictjson.DefaultMaxDepth
	}
	if c.MediaPartTokens <= 0 {
		c.MediaPartTokens = DefaultMediaPartTokens
	}
	if c.JSONDeadline <= 0 {
		c.JSONDeadline = 10 * time.Minute
	}
	if c.HistoryInterval <= 0 {
		c.HistoryInterval = 10 * time.Second
	}
	if c.IdempotencyRetention <= 0 {
		c.IdempotencyRetention = DefaultIdempotencyRetention
	}
	if c.IdempotencyMaxBytes <= 0 {
		c.IdempotencyMaxBytes = DefaultIdempotencyMaxBytes
	}
	if c.IdempotencyMaxKeys <= 0 {
		c.IdempotencyMaxKeys = DefaultIdempotencyMaxKeys
	}
	if c.IdempotencyAbandon <= 0 {
		c.IdempotencyAbandon = DefaultIdempotencyAbandon
	}
	c.Hold.setDefaults()
}

// Deps are the parts the server works with.
type Deps struct {
	Gate     *policy.Gate
	Registry *router.Registry
	Store    *data.Store
	Ledger   *data.LedgerWriter
	// Registerer receives the request, stage, token and TTFT metrics and
	// Gatherer serves everything registered on /metrics (give the same
	// registry to router.Config.Registerer for the routing metrics); both
	// required.
	Registerer prometheus.Registerer
	Gatherer   prometheus.Gatherer
	Log        *slog.Logger
	// Transport carries requests to replicas; nil means a tuned
	// http.Transport on plain TCP.
	Transport http.RoundTripper
	// Tracer makes the requests' spans (trace.go); nil turns tracing off.
	Tracer trace.TracerProvider
}

// Server serves the public and the admin API.
type Server struct {
	cfg  Config
	gate *policy.Gate
	reg  *router.Registry
	// lim are the request-reading settings, made once: built per request,
	// its method values would escape through an endpoint's reader.
	lim       parseLimits
	hold      router.HoldOptions // a call's wait for capacity, but a stream's progress (holdOptions)
	store     *data.Store
	ledger    *data.LedgerWriter
	gatherer  prometheus.Gatherer
	log       *slog.Logger
	transport http.RoundTripper
	m         *metrics
	auth      *authFailures
	slo       *slo.Evaluator
	batches   *batch.Batches
	hist      *history   // the dashboard's last hour
	live      *liveCalls // requests being served, for the dashboard
	queue     *policy.AdmissionQueue
	bodies    *bodyBudget        // request-body bytes in flight
	salts     cacheSalts         // tenants' cache_salt (salt.go)
	clients   *connlimit.Limiter // the public listener's shares (client.go)

	idPrefix string
	idSeq    atomic.Uint64

	rejectedRows *rate.Limiter // ledger rows of refused requests
	refusedLog   *rate.Limiter // warnings of refused worker registrations
	refusedQuiet atomic.Int64  // refusals not logged since the last warning

	// publicRoutes are the public API's routes, to tell a path meant for
	// it; publicURL and adminURL where the listeners are (SetAddresses).
	publicRoutes        []routeKey
	publicURL, adminURL string

	hbMu sync.Mutex // one worker registration or revocation at a time
	// revokedWorkers holds the credentials revoked while a heartbeat that
	// looked them up may have been waiting for hbMu. Guarded by hbMu.
	revokedWorkers map[string]bool

	tracer trace.Tracer // the requests' spans (trace.go); nil: tracing off

	idem flights // keyed requests running here (idempotency.go)

	region regionState // what edges poll (region.go)
	fleet  fleetState  // the fleet controller, if any (admin_fleet.go)
}

// New returns a Server.
func New(cfg Config, d Deps) (*Server, error) {
	cfg.setDefaults()
	switch {
	case cfg.AdminToken == "":
		return nil, errors.New("server: admin token is required")
	case d.Gate == nil || d.Registry == nil || d.Store == nil || d.Ledger == nil:
		return nil, errors.New("server: gate, registry, store and ledger are required")
	case d.Registerer == nil || d.Gatherer == nil:
		return nil, errors.New("server: a prometheus registerer and gatherer are required")
	}
	if d.Log == nil {
		d.Log = slog.New(slog.DiscardHandler)
	}
	if d.Transport == nil {
		d.Transport = NewTransport(cfg.ConnectTimeout, nil, hop.Hop)
	}
	s := &Server{
		cfg: cfg, gate: d.Gate, reg: d.Registry, store: d.Store, ledger: d.Ledger,
		gatherer: d.Gatherer, log: d.Log, transport: d.Transport, hist: newHistory(), live: newLiveCalls(),
		idPrefix: "req_" + strconv.FormatInt(time.Now().UnixNano()%(1<<40), 36) + "_",

		rejectedRows: rate.NewLimiter(rate.Limit(cfg.RejectedRows), int(max(5*cfg.RejectedRows, 1))),
		refusedLog:   rate.NewLimiter(rate.Every(10*time.Second), 3),
	}
	if d.Tracer != nil {
		s.tracer = d.Tracer.Tracer(instrumentation)
	}
	qcfg := cfg.Admission
	qcfg.Capacity = s.capacity
	s.queue = policy.NewQueue(qcfg)
	m, err := newMetrics(d.Registerer, d.Ledger, s.queue)
	if err != nil {
		return nil, err
	}
	s.m = m
	s.bodies = newBodyBudget(s.cfg.MaxBodyBytesInFlight, s.cfg.MaxBodyBytesPerTenant, s.cfg.BodyBudgetWait, m.bodyBytes)
	s.salts.secret = cfg.CacheSaltSecret
	if len(s.salts.secret) == 0 {
		s.salts.secret = make([]byte, 32)
		_, _ = rand.Read(s.salts.secret)
	}
	if s.auth, err = newAuthFailures(d.Registerer, d.Log); err != nil {
		return nil, err
	}
	if s.slo, err = newSLO(cfg.SLO, d.Registerer); err != nil {
		return nil, err
	}
	bcfg := cfg.Batch
	if bcfg.MaxBodyBytes == 0 {
		bcfg.MaxBodyBytes = cfg.MaxBodyBytes
	}
	if bcfg.BodyTimeout == 0 {
		bcfg.BodyTimeout = cfg.BodyTimeout
	}
	if bcfg.IdempotencyRetention == 0 {
		bcfg.IdempotencyRetention = cfg.IdempotencyRetention
	}
	s.batches, err = batch.New(bcfg, batch.Deps{
		Store: d.Store, Gate: d.Gate, Generator: s, Authenticate: s.authenticate,
		APIError: func(err error) *apierr.Error { return toAPIError(err, "") }, Log: d.Log,
	})
	if err != nil {
		return nil, fmt.Errorf("server: %w", err)
	}
	for _, r := range s.Public().(*echo.Echo).Routes() {
		s.publicRoutes = append(s.publicRoutes, routeKey{r.Method, r.Path})
	}
	s.hold = router.HoldOptions{Queue: s.cfg.Hold.Queue, Timeout: s.cfg.Hold.Timeout, PerTenant: s.cfg.Hold.PerTenant, Then: s.ledger.Healthy}
	s.keepLostReplicas()
	s.lim = parseLimits{maxDepth: s.cfg.MaxJSONDepth, mediaPart: s.cfg.MediaPartTokens, defaultMax: s.maxTokensFor, contextLen: s.reg.ContextLen, alternatives: s.reg.Alternatives}
	return s, nil
}

// RunBatches runs the Batch API's batches until ctx is done; see
// [batch.Batches.Run]. With the Batch API off it returns at once.
func (s *Server) RunBatches(ctx context.Context) error { return s.batches.Run(ctx) }

// NewTransport returns the transport the gateway uses to reach replicas:
// plain-http replicas through [hop.Transport] (the request written and its
// answer read on the attempt's own goroutine, keep-alive connections reused
// aggressively), anything else (an https upstream) through net/http's
// Transport; no compression (streams must flush per event), a bounded dial.
// dial, when non-nil, replaces the TCP dialer (the mesh uses it); client
// [hop.NetHTTP] sends everything through net/http's Transport instead.
func NewTransport(connectTimeout time.Duration, dial func(ctx context.Context, network, addr string) (net.Conn, error), client hop.Client) http.RoundTripper {
	if dial == nil {
		d := &net.Dialer{Timeout: connectTimeout, KeepAlive: 30 * time.Second}
		dial = d.DialContext
	}
	// Below the engine's own keep-alive (vLLM closes idle connections after
	// 5 s), so a request is rarely written on a connection the engine is
	// closing; one that is, is sent again (idempotencyKey).
	// No response-header timeout on either path: engines may hold headers
	// until the answer; deadlines live per attempt.
	// 2 KiB: an open stream holds one read buffer for its whole life, and
	// its events (a few hundred bytes each) go on through the stream's own
	// 2 KiB reader (readerPool); a larger read goes past the buffer, so a
	// long answer costs no more reads. Against 4 KiB (net/http's own) it
	// saved 2.3 KiB of heap per open stream (TestOpenStreamMemoryIsBounded,
	// three runs each: 66.6-68.7 KB against 69.3-70.7 KB through the
	// gateway), twice that in resident memory once the GC's headroom
	// is counted, at the same CPU per relayed event (BenchmarkStreamRelay,
	// -count 4: 3.39-4.15 against 3.21-3.90 µs); 8 KiB cost 4 KiB more.
	// Pooled request writers are the same size: a larger body is written
	// past the buffer.
	t := &hop.Transport{Dial: dial, IdleTimeout: serving.EngineKeepAlive * 4 / 5, MaxIdlePerHost: 1024, BufferSize: 2 << 10}
	return t.RoundTripper(client, 4096)
}

// Public returns the handler of the OpenAI-compatible API.
func (s *Server) Public() http.Handler {
	e := s.newEcho(publicSide)
	e.Use(s.forwardedClient)
	e.GET("/healthz", s.handleGetHealthz)
	e.GET(serving.RegionStatusPath, s.handleGetRegionStatus)
	v1 := e.Group("/v1")
	v1.GET("/models", s.handleGetModels)
	v1.GET("/models/:id", s.handleGetModel)
	for _, ep := range endpoints {
		h := s.handleGenerate(ep)
		if isMessagesPath(ep.path) {
			h = anthropicErrors(h)
		}
		e.POST(ep.path, h)
	}
	s.batches.Routes(v1)
	return e
}

// Admin returns the handler of the admin API (metrics, keys, usage,
// replicas, recent requests, dashboard), guarded by the admin token.
func (s *Server) Admin(ui http.Handler) http.Handler {
	e := s.newEcho(adminSide)
	s.adminRoutes(e, ui)
	return e
}

func (s *Server) newEcho(on side) *echo.Echo {
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	e.HTTPErrorHandler = func(err error, c echo.Context) { s.errorHandler(on, err, c) }
	e.Use(middleware.RecoverWithConfig(middleware.RecoverConfig{
		DisablePrintStack: true,
		LogErrorFunc: func(c echo.Context, err error, _ []byte) error {
			s.log.Error("handler panic", "path", c.Path(), "err", err)
			return errInternal
		},
	}))
	return e
}

func (s *Server) newRequestID() string {
	return s.idPrefix + strconv.FormatUint(s.idSeq.Add(1), 36)
}

// bearer returns the token of an "Authorization: Bearer" header.
func bearer(r *http.Request) string {
	h := headerValue(r.Header, "Authorization")
	if len(h) > 7 && strings.EqualFold(h[:7], "bearer ") {
		return strings.TrimSpace(h[7:])
	}
	return ""
}

// authenticate resolves the request's API key (see apiKey); a refused one
// is counted and logged (see authFailures).
func (s *Server) authenticate(c echo.Context) (*policy.Principal, error) {
	secret := apiKey(c)
	if secret == "" {
		s.auth.refused(authMissing, "", "remote", c.Request().RemoteAddr, "path", c.Path())
		if isMessagesPath(c.Path()) {
			return nil, errMissingMessagesKey
		}
		return nil, errMissingKey
	}
	p, err := s.gate.Authenticate(c.Request().Context(), secret)
	if err != nil {
		if errors.Is(err, policy.ErrInvalidKey) {
			s.auth.refused(authReason(err), policy.DisplayPrefix(secret), "remote", c.Request().RemoteAddr, "path", c.Path())
			return nil, toAPIError(err, "")
		}
		// The key store could not be asked (the database is down): the
		// same database as the ledger, so the same 503 and Retry-After as
		// a request it could not bill, never a 500.
		return nil, fmt.Errorf("authenticate: %w: %w", data.ErrLedgerUnavailable, err)
	}
	return p, nil
}

func (s *Server) checkAdmin(c echo.Context) bool {
	tok := bearer(c.Request())
	return tok != "" && subtle.ConstantTimeCompare([]byte(tok), []byte(s.cfg.AdminToken)) == 1
}

func (s *Server) handleGetHealthz(c echo.Context) error {
	ready := 0
	for _, r := range s.reg.Replicas() {
		if r.State() == router.StateReady {
			ready++
		}
	}
	status := http.StatusOK
	word := "ok"
	out := map[string]any{"ready_replicas": ready, "ledger": "ok"}
	if err := s.ledger.Healthy(); err != nil {
		status, word = http.StatusServiceUnavailable, "ledger unavailable"
		out["ledger"] = err.Error()
	}
	if ready == 0 {
		// The contract (DESIGN.md): 503 until a replica is ready. A fleet
		// scaled to zero says why, and where a load balancer in front
		// should look instead: a probe on /healthz would keep out the
		// very request that starts a replica.
		status, word = http.StatusServiceUnavailable, "no ready replica"
		if managed := s.reg.ManagedModels(); len(managed) > 0 {
			out["reason"] = fmt.Sprintf("scaled to zero: the fleet controller starts a replica of %s when a request comes (requests are held meanwhile); probe the admin listener's /readyz to route to this gateway anyway", strings.Join(managed, ", "))
		}
	}
	out["status"] = word
	return c.JSON(status, out)
}

// servedModels are the models a request may name now: those a ready
// replica serves and those the fleet controller starts on demand.
func (s *Server) servedModels() []string {
	out := s.reg.ReadyModels()
	for _, m := range s.reg.ManagedModels() {
		if !slices.Contains(out, m) {
			out = append(out, m)
		}
	}
	slices.Sort(out)
	return out
}

func (s *Server) handleGetModels(c echo.Context) error {
	p, err := s.authenticate(c)
	if err != nil {
		return apierr.Reply(c, toAPIError(err, ""))
	}
	out := []modelJSON{}
	for _, m := range s.servedModels() {
		if p.Allows(m) {
			out = append(out, modelJSON{ID: m, Object: "model", OwnedBy: "tailgate"})
		}
	}
	return c.JSON(http.StatusOK, map[string]any{"object": "list", "data": out})
}

type modelJSON struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
}

// handleGetModel serves GET /v1/models/{id}: a model a ready replica
// serves (or the fleet controller starts on demand) and the key may use,
// else 404 as OpenAI answers.
func (s *Server) handleGetModel(c echo.Context) error {
	p, err := s.authenticate(c)
	if err != nil {
		return apierr.Reply(c, toAPIError(err, ""))
	}
	id := c.Param("id")
	if p.Allows(id) {
		for _, m := range s.servedModels() {
			if m == id {
				return c.JSON(http.StatusOK, modelJSON{ID: m, Object: "model", OwnedBy: "tailgate"})
			}
		}
	}
	return apierr.Reply(c, errUnknownModel(boundString(id), s.usableModels(p)))
}
