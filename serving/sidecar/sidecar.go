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
// Only the "ready" state ([Sidecar.SetState]) serves generation requests; after
// [Sidecar.Drain] new ones get 503 replica_draining while those in flight
// finish. Drain is final for the Sidecar's life.
//
// [Sidecar.Run] scrapes the engine's /metrics for [Sidecar.Load];
// [Heartbeater] carries that load to the gateway.
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

	"tailgate/serving"
)

// Config describes a sidecar.
type Config struct {
	// EngineURL returns the engine's current base URL, e.g.
	// http://127.0.0.1:8000; it is asked on every request and scrape, from
	// many goroutines at once, since the launcher may restart the engine
	// elsewhere. Required.
	EngineURL func() string
	// ClusterToken is the bearer token every request must carry. Required.
	ClusterToken string
	// ScrapeInterval is how often Run reads the engine's /metrics; 0 means
	// 250ms.
	ScrapeInterval time.Duration
	// Log receives the sidecar's few log lines; nil discards them.
	Log *slog.Logger
	// Transport carries requests to the engine; nil means a keep-alive
	// transport without compression tuned for one local engine.
	Transport http.RoundTripper
}

const defaultScrapeInterval = 250 * time.Millisecond

// Validate reports whether c is usable.
func (c Config) Validate() error {
	switch {
	case c.EngineURL == nil:
		return errors.New("sidecar: engine URL is required")
	case c.ClusterToken == "":
		return errors.New("sidecar: cluster token is required")
	case c.ScrapeInterval < 0:
		return errors.New("sidecar: scrape interval must not be negative")
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

	scraped atomic.Pointer[engineLoad] // nil until the first good scrape
	ttft    ttftRing
}

// New returns a sidecar for cfg, in state "starting".
func New(cfg Config) (*Sidecar, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.ScrapeInterval == 0 {
		cfg.ScrapeInterval = defaultScrapeInterval
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
	if s.transport == nil {
		s.transport = newTransport()
	}
	s.handler = s.routes()
	return s, nil
}

// newTransport returns a transport for a local engine: many warm keep-alive
// connections (every concurrent stream holds one), no gzip (SSE must arrive
// as the engine flushed it), and a bounded dial.
func newTransport() *http.Transport {
	return &http.Transport{
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        1024,
		MaxIdleConnsPerHost: 1024,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
		WriteBufferSize:     16 << 10,
		ReadBufferSize:      16 << 10,
	}
}

// Handler returns the sidecar's HTTP API.
func (s *Sidecar) Handler() http.Handler { return s.handler }

// SetState records the launcher's state for the engine (one of the
// serving.State* names) and why it is not ready; only "ready" serves.
func (s *Sidecar) SetState(state, reason string) {
	s.mu.Lock()
	s.state, s.reason = state, reason
	s.mu.Unlock()
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
	if s.draining {
		return serving.StateDraining, "", false
	}
	return s.state, s.reason, s.state == serving.StateReady
}
