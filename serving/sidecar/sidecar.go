// Package sidecar fronts one inference engine on a worker: it proxies the
// gateway's OpenAI calls to the engine, times the engine's share of each
// request, scrapes the engine's load, and reports all of it to the gateway.
//
// # Overview
//
// A [Sidecar] serves, behind the cluster token:
//
//   - POST /v1/chat/completions and POST /v1/completions, proxied to the
//     engine. JSON answers are relayed byte for byte with the timing headers
//     of the serving wire contract added; SSE answers are relayed event by
//     event, each flushed as soon as no further event is already at hand,
//     with one "tailgate-timing" comment event inserted right before the
//     first event that carries a token: generated output of any kind, or a
//     finish reason, as [tailgate/serving/sse.Classify] decides for the
//     gateway too. The engine request lives in the client's context: a
//     client that goes away aborts it.
//   - GET /v1/models, proxied.
//   - GET /health: 200 while the replica is ready and not draining.
//
// Only the "ready" state serves generation requests; after [Sidecar.Drain]
// new ones get 503 replica_draining while those in flight finish. Drain is
// final for the Sidecar's life.
//
// The state is the launcher's ([Sidecar.SetState]) with two additions of the
// sidecar's own: while the launcher says ready, [Sidecar.Run] asks the
// engine's GET /health every [Config.HealthInterval], and an engine that
// gives no 200 for [Config.UnhealthyAfter] — frozen, wedged, or dead behind
// a live process — makes the replica "failed" with the reason, until it
// answers again; and an engine that vLLM's sleep mode put to sleep (it
// still answers /health) makes the replica "sleeping", with reason "engine
// asleep (…)", until it wakes ("warming" while it wakes). With
// [Config.SleepMode] the gateway puts the engine to sleep and wakes it
// through the sidecar (sleep.go). [Sidecar.State] says what to
// report; [Config.OnStateChange] says when that changed.
//
// [Sidecar.Run] also scrapes the engine's /metrics for [Sidecar.Load];
// [Heartbeater] carries the state and the load to the gateway.
//
// The package owns no listener: callers mount [Sidecar.Handler] on a server
// they run, and run [Sidecar.Run] and [Heartbeater.Run] in goroutines they
// wait for.
package sidecar

import (
	"context"
	"crypto/sha256"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/tailgate-dev/tailgate/serving"
	"github.com/tailgate-dev/tailgate/serving/hop"
)

// Config describes a sidecar.
type Config struct {
	// EngineURL returns the engine's current base URL, e.g.
	// http://127.0.0.1:8000, or http://localhost for an engine on
	// EngineSocket; it is asked on every request and scrape, from many
	// goroutines at once, since the launcher may restart the engine
	// elsewhere. Required.
	EngineURL func() string
	// EngineSocket, when set, returns the Unix socket the engine listens
	// on: every connection to the engine (requests, health probes, metrics
	// scrapes) is dialed there, whatever host EngineURL names. It is asked
	// at each dial. Nil means EngineURL's host is dialed over TCP. Ignored
	// when Transport is set.
	EngineSocket func() string
	// EngineKey, when set, returns the current engine's API key, sent as
	// "Authorization: Bearer KEY" on every request to the engine (proxied,
	// probes and scrapes); it is asked as often as EngineURL. Nil or "" means
	// the engine wants none.
	EngineKey func() string
	// ClusterToken is the bearer token every request must carry. Required.
	ClusterToken string
	// ScrapeInterval is how often Run reads the engine's /metrics; 0 means
	// 250ms.
	ScrapeInterval time.Duration
	// HealthInterval is how often Run asks the engine's GET /health while
	// the replica is ready; 0 means 1s.
	HealthInterval time.Duration
	// UnhealthyAfter is how long the engine may go without a 200 from
	// /health before the replica reports failed and serves nothing; 0 means
	// 2s. A probe waits for its answer up to that point (at least
	// HealthInterval), so a frozen engine is out within about UnhealthyAfter
	// of its last answer.
	UnhealthyAfter time.Duration
	// SleepMode serves POST /sleep and POST /wake_up (sleep.go): the engine
	// runs with vLLM's sleep mode (--enable-sleep-mode and
	// VLLM_SERVER_DEV_MODE=1, or the simulator's --sim-sleep-mode). false:
	// they answer 409 sleep_mode_off.
	SleepMode bool
	// OnStateChange, when set, is called with what [Sidecar.State] reports
	// after the engine's health or sleep state changed it (not after
	// SetState, whose caller knows), from Run's goroutine; it must not block for long. A worker
	// sends a heartbeat from here.
	OnStateChange func(state, reason string)
	// Log receives the sidecar's few log lines; nil discards them.
	Log *slog.Logger
	// Transport carries requests to the engine; nil means a keep-alive
	// transport without compression tuned for one local engine, which
	// closes a connection idle for 4/5 of EngineKeepAlive.
	Transport http.RoundTripper
	// EngineKeepAlive is how long the engine keeps an idle connection open
	// (vLLM: VLLM_HTTP_TIMEOUT_KEEP_ALIVE); 0 means serving.EngineKeepAlive.
	EngineKeepAlive time.Duration
	// UpstreamClient carries requests to the engine: "" or hop.Hop, or
	// hop.NetHTTP (net/http's Transport, the way back).
	UpstreamClient hop.Client
	// Tracer, when set, makes a span of each generation request, a child
	// of the gateway's traceparent, and passes it on to the engine
	// (trace.go); nil: no spans, the gateway's traceparent passes as is.
	Tracer trace.TracerProvider
}

const (
	defaultScrapeInterval = 250 * time.Millisecond
	defaultHealthInterval = time.Second
	defaultUnhealthyAfter = 2 * time.Second
)

// Validate reports whether c is usable.
func (c Config) Validate() error {
	switch {
	case c.EngineURL == nil:
		return errors.New("sidecar: engine URL is required")
	case c.ClusterToken == "":
		return errors.New("sidecar: cluster token is required")
	case c.ScrapeInterval < 0, c.HealthInterval < 0, c.UnhealthyAfter < 0, c.EngineKeepAlive < 0:
		return errors.New("sidecar: intervals must not be negative")
	}
	return nil
}

// Sidecar fronts one engine. It is safe for concurrent use.
type Sidecar struct {
	cfg       Config // defaults applied
	log       *slog.Logger
	transport http.RoundTripper
	tokenSum  [sha256.Size]byte // of "Bearer <token>", compared in constant time
	handler   http.Handler

	mu       sync.Mutex
	state    string // serving.State*, as the worker last said
	reason   string
	draining bool
	inflight int
	idle     chan struct{} // closed when inflight reaches 0 while draining
	eng      engineHealth
	sleep    sleepState

	scraped atomic.Pointer[engineLoad] // nil until the first good scrape
	ttft    ttftRing

	tracer trace.Tracer // nil: tracing off
}

// New returns a sidecar for cfg, in state "starting".
func New(cfg Config) (*Sidecar, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.ScrapeInterval == 0 {
		cfg.ScrapeInterval = defaultScrapeInterval
	}
	if cfg.HealthInterval == 0 {
		cfg.HealthInterval = defaultHealthInterval
	}
	if cfg.UnhealthyAfter == 0 {
		cfg.UnhealthyAfter = defaultUnhealthyAfter
	}
	if cfg.EngineKeepAlive == 0 {
		cfg.EngineKeepAlive = serving.EngineKeepAlive
	}
	s := &Sidecar{
		cfg:       cfg,
		log:       cfg.Log,
		transport: cfg.Transport,
		tokenSum:  sha256.Sum256([]byte("Bearer " + cfg.ClusterToken)),
		state:     serving.StateStarting,
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if cfg.Tracer != nil {
		s.tracer = cfg.Tracer.Tracer("github.com/tailgate-dev/tailgate/serving/sidecar")
	}
	if s.transport == nil {
		s.transport = newTransport(cfg.EngineKeepAlive*4/5, cfg.EngineSocket, cfg.UpstreamClient)
	}
	s.handler = s.routes()
	return s, nil
}

// newTransport returns a transport for a local engine: many warm keep-alive
// connections (every concurrent stream holds one), each closed after idle
// (before the engine closes it: see [Config.EngineKeepAlive]), no gzip (SSE
// must arrive as the engine flushed it), and a bounded dial, to socket()
// when socket is set. Requests are written and answers read on the handler's
// goroutine ([hop.Transport], or net/http's with client nethttp); an https
// engine URL goes through net/http's Transport.
func newTransport(idle time.Duration, socket func() string, client hop.Client) http.RoundTripper {
	const dialTimeout = 5 * time.Second
	dial := (&net.Dialer{Timeout: dialTimeout, KeepAlive: 30 * time.Second}).DialContext
	if socket != nil {
		dial = hop.DialUnix(socket, dialTimeout)
	}
	t := &hop.Transport{Dial: dial, IdleTimeout: idle, MaxIdlePerHost: 1024, BufferSize: 16 << 10}
	return t.RoundTripper(client, 1024)
}

// Handler returns the sidecar's HTTP API.
func (s *Sidecar) Handler() http.Handler { return s.handler }

// SetState records the launcher's state for the engine (one of the
// serving.State* names) and why it is not ready; only "ready" serves. The
// launcher has just checked an engine it calls ready, so the sidecar's own
// verdict starts afresh.
func (s *Sidecar) SetState(state, reason string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.state, s.reason = state, reason
	s.eng = engineHealth{gen: s.eng.gen + 1, lastGood: time.Now()}
	s.sleep = sleepState{gen: s.sleep.gen + 1} // a (re)started engine is awake
}

// State returns the replica's state to report and why it is not ready:
// draining once Drain was called, else the launcher's state, except that a
// ready engine that stopped answering /health is failed, and one that vLLM's
// sleep mode put to sleep (by the sidecar, or as its /metrics say) is
// sleeping, with reason "engine asleep (…)", until it wakes (warming while
// it wakes).
func (s *Sidecar) State() (state, reason string) {
	state, reason, _ = s.health()
	return state, reason
}

// Inflight returns the number of generation requests being served.
func (s *Sidecar) Inflight() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.inflight
}

// Drain stops admitting generation requests and waits until those in
// flight are done or ctx ends, returning ctx.Err() then.
func (s *Sidecar) Drain(ctx context.Context) error {
	s.mu.Lock()
	s.draining = true
	if s.inflight == 0 {
		s.mu.Unlock()
		return nil
	}
	if s.idle == nil {
		s.idle = make(chan struct{})
	}
	idle := s.idle
	s.mu.Unlock()
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// admit counts a generation request in, or returns the error that refuses it.
// Admission and Drain share the lock, so a request admitted is one Drain
// waits for.
func (s *Sidecar) admit() *apiError {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.draining || s.state == serving.StateDraining:
		return errDraining
	case s.state != serving.StateReady:
		return notReady(s.state, s.reason)
	case s.eng.down:
		return notReady(serving.StateFailed, s.eng.reason)
	}
	if st, why := s.sleepStateLocked(); st != "" {
		return notReady(st, why)
	}
	s.inflight++
	return nil
}

// done counts a generation request out.
func (s *Sidecar) done() {
	s.mu.Lock()
	s.inflight--
	if s.inflight == 0 && s.idle != nil {
		close(s.idle)
		s.idle = nil
	}
	s.mu.Unlock()
}

// health returns the state /health reports and whether it is ready.
func (s *Sidecar) health() (state, reason string, ready bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.healthLocked()
}

// healthLocked is health with mu held.
func (s *Sidecar) healthLocked() (state, reason string, ready bool) {
	switch {
	case s.state == serving.StateDraining:
		return serving.StateDraining, s.reason, false
	case s.draining:
		return serving.StateDraining, "", false
	case s.state == serving.StateReady && s.eng.down:
		return serving.StateFailed, s.eng.reason, false
	}
	if s.state == serving.StateReady {
		if st, why := s.sleepStateLocked(); st != "" {
			return st, why, false
		}
	}
	return s.state, s.reason, s.state == serving.StateReady
}

// sleepStateLocked says whether a ready engine sleeps ("sleeping") or
// wakes ("warming"), and why; "" while it is awake. The caller holds mu.
func (s *Sidecar) sleepStateLocked() (state, reason string) {
	switch {
	case s.sleep.waking:
		return serving.StateWarming, "engine waking from sleep"
	case s.sleep.level != 0:
		return serving.StateSleeping, s.ownSleepReason()
	}
	if why := s.sleepReason(); why != "" {
		return serving.StateSleeping, why
	}
	return "", ""
}
