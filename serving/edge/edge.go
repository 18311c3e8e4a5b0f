// Package edge is the edge role (`tailgate edge`): a plain reverse proxy in
// front of regional gateways that sends each request to the region with the
// best expected time to first token for its model.
//
// # Overview
//
// Every PollInterval the edge reads each region's public status
// ([serving.RegionStatusPath]) within PollTimeout; the poll's round trip
// feeds the region's RTT (an EWMA). A region whose poll fails, or to which
// a connection fails, is skipped until a poll succeeds again; a draining
// region gets no new requests. A request's expected first-token time in a
// region is RTT + the model's recent median TTFT there + one median per
// request queued ahead on each replica (QueueWeight); the preferred region
// (Prefer) wins near ties; a route moves only when another region has
// been better by more than SwitchMargin for SwitchPolls polls in a row, so
// routes do not flap.
//
// The edge forwards requests untouched (httputil.ReverseProxy, flushing at
// once for streams): it never reads a key or bills; authorization, quotas
// and metering stay in the gateways. It peeks at a JSON body's "model"
// (the first MaxPeek bytes, forwarded byte for byte). A request whose
// connection to a region fails before an answer (the dial failed, or the
// region died before its response headers) goes to the next region at
// once, when its body is held whole (at most MaxPeek bytes); so does one a
// region refused with a 503 (it ran nothing there). Answers carry
// X-Tailgate-Region; requests carry the client's address in
// X-Forwarded-For. A client holds what its limits allow (limits.go):
// connections, time per body, bytes held. It must not import package
// server (server/connlimit is a leaf it shares with the gateway): the wire
// contract is package serving's.
package edge

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/tidwall/gjson"
	"golang.org/x/sync/errgroup"

	"github.com/tailgate-dev/tailgate/server/connlimit"
)

// HeaderRegion names the region that answered.
const HeaderRegion = "X-Tailgate-Region"

// Region is one regional gateway.
type Region struct {
	Name string
	URL  string // its public listener, e.g. https://eu.example.com
}

// Config configures the edge. Zero values mean the defaults.
type Config struct {
	// Listen is where clients connect; AdminListen serves /metrics and
	// /edge/v1/regions ("" : no admin listener).
	Listen, AdminListen string
	// Regions are the regional gateways, in order of preference after
	// Prefer (the order breaks exact ties). Required.
	Regions []Region
	// Prefer names the region that wins near ties ("": none).
	Prefer string
	// PollInterval is how often each region's status is read; 0 means 1s.
	// PollTimeout bounds one poll; 0 means 800ms.
	PollInterval, PollTimeout time.Duration
	// RTTAlpha is the weight of a new round trip in the RTT's EWMA; 0 means 0.3.
	RTTAlpha float64
	// QueueWeight scales the queue penalty (medians per request queued
	// ahead on each replica); 0 means 1.
	QueueWeight float64
	// SwitchMargin is how much better (a fraction of the current region's
	// expected TTFT) another region must be to take a route; 0 means 0.2.
	// SwitchPolls is for how many polls in a row; 0 means 3.
	SwitchMargin float64
	SwitchPolls  int
	// TieMargin is the preferred region's discount when ranking; 0 means 0.05.
	TieMargin float64
	// MaxPeek is how many bytes of a body the edge holds to read its model
	// and to send it again to another region; 0 means 1 MiB.
	MaxPeek int64
	// MaxPeekInFlight bounds the body bytes held over all requests; past
	// it a request waits up to PeekWait for bytes to come back, then gets
	// 503 body_budget_exhausted. 0 means 256 MiB; PeekWait 0 means 2s.
	MaxPeekInFlight int64
	PeekWait        time.Duration
	// MaxConnections caps the client connections open at once and
	// MaxConnsPerIP one address's share (server/connlimit, as on a
	// gateway's public listener: idle keep-alive connections make room
	// first). 0 means connlimit.DefaultMax and MaxConnections/8.
	MaxConnections, MaxConnsPerIP int
	// IdleTimeout closes a kept-alive client connection idle this long;
	// 0 means 120s.
	IdleTimeout time.Duration
	// BodyTimeout and BodyMinRate bound how long a client may take to send
	// a body: BodyTimeout plus one second per BodyMinRate bytes received;
	// a slower client gets 408 request_timeout. 0 means 30s and 64 KiB/s.
	BodyTimeout time.Duration
	BodyMinRate int64
	// StatusToken is sent as a bearer token on the status polls: a region
	// serves its status to edges only (the gateway's DIR/edge.token).
	StatusToken string
	// H2C speaks HTTP/2 without TLS (prior knowledge) to http:// regions:
	// one multiplexed connection per region, kept warm by the status
	// polls, so traffic moving to a region opens no connection (a round
	// trip each). Tailgate gateways accept it; https regions negotiate
	// HTTP/2 anyway. Only with the default Transport.
	H2C bool
	// Transport carries requests to regions; nil means a tuned http.Transport.
	Transport http.RoundTripper
	// Registerer receives the edge's metrics and Gatherer serves them on
	// /metrics; nil means a registry of the edge's own.
	Registerer prometheus.Registerer
	Gatherer   prometheus.Gatherer
	Now        func() time.Time // nil: time.Now
}

func (c *Config) setDefaults() {
	if c.PollInterval <= 0 {
		c.PollInterval = time.Second
	}
	if c.PollTimeout <= 0 {
		c.PollTimeout = 800 * time.Millisecond
	}
	if c.RTTAlpha <= 0 || c.RTTAlpha > 1 {
		c.RTTAlpha = 0.3
	}
	if c.QueueWeight <= 0 {
		c.QueueWeight = 1
	}
	if c.SwitchMargin <= 0 {
		c.SwitchMargin = 0.2
	}
	if c.SwitchPolls <= 0 {
		c.SwitchPolls = 3
	}
	if c.TieMargin <= 0 {
		c.TieMargin = 0.05
	}
	if c.MaxPeek <= 0 {
		c.MaxPeek = 1 << 20
	}
	if c.MaxPeekInFlight <= 0 {
		c.MaxPeekInFlight = 256 << 20
	}
	if c.PeekWait <= 0 {
		c.PeekWait = 2 * time.Second
	}
	if c.IdleTimeout <= 0 {
		c.IdleTimeout = 120 * time.Second
	}
	if c.BodyTimeout <= 0 {
		c.BodyTimeout = 30 * time.Second
	}
	if c.BodyMinRate <= 0 {
		c.BodyMinRate = 64 << 10
	}
	if c.Now == nil {
		c.Now = time.Now
	}
}

// Validate checks the regions: at least one, each NAME=URL with an http or
// https URL and a distinct name; Prefer names one of them.
func (c *Config) Validate() error {
	if len(c.Regions) == 0 {
		return errors.New("no region: add --region NAME=URL (once per regional gateway)")
	}
	seen := map[string]bool{}
	for _, r := range c.Regions {
		u, err := url.Parse(r.URL)
		if r.Name == "" || err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("--region %s=%s: want NAME=URL with an http(s) URL, e.g. eu=https://eu.example.com", r.Name, r.URL)
		}
		if seen[r.Name] {
			return fmt.Errorf("--region %s given twice: each region needs its own name", r.Name)
		}
		seen[r.Name] = true
	}
	if c.Prefer != "" && !seen[c.Prefer] {
		return fmt.Errorf("--prefer %s: no --region of that name", c.Prefer)
	}
	if err := (connlimit.Config{Max: c.MaxConnections, PerAddress: c.MaxConnsPerIP}).Validate(); err != nil {
		return fmt.Errorf("--max-connections: %w", err)
	}
	if c.SwitchMargin >= 1 || c.TieMargin >= 1 {
		return errors.New("--switch-margin and the tie margin are fractions below 1, e.g. 0.2")
	}
	return nil
}

// Edge is a running edge.
type Edge struct {
	cfg     Config
	log     *slog.Logger
	regions []*region
	proxies []*httputil.ReverseProxy
	prefer  int
	m       *metrics
	peeks   *peekBudget

	routeMu sync.Mutex
	routes  map[string]*route
	table   atomic.Pointer[map[string][]int]

	publicLn, adminLn net.Listener
	public, admin     *http.Server
	closeOnce         sync.Once
}

// New returns an edge that serves but has not polled yet; [Edge.Run]
// polls, [Edge.Open] also binds the listeners.
func New(cfg Config, log *slog.Logger) (*Edge, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.Registerer == nil {
		reg := prometheus.NewRegistry()
		cfg.Registerer, cfg.Gatherer = reg, reg
	}
	var h2c, polls http.RoundTripper
	if cfg.Transport == nil {
		t := &http.Transport{
			Proxy:               nil,
			DialContext:         (&net.Dialer{Timeout: 3 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			ForceAttemptHTTP2:   true,
			MaxIdleConnsPerHost: 256,
			IdleConnTimeout:     90 * time.Second,
			TLSHandshakeTimeout: 5 * time.Second,
			DisableCompression:  true, // streams must flush per event
		}
		cfg.Transport = t
		// Over HTTP/1 every request in flight holds a connection; the
		// polls have one of their own, so a region's per-address share
		// filled by data (slow uploads) does not take them too. Over
		// HTTP/2 one multiplexed connection carries both.
		p := t.Clone()
		p.MaxConnsPerHost, p.MaxIdleConnsPerHost = 1, 1
		polls = p
		if cfg.H2C {
			t2 := t.Clone()
			t2.Protocols = new(http.Protocols)
			t2.Protocols.SetUnencryptedHTTP2(true)
			h2c = t2
		}
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	e := &Edge{cfg: cfg, log: log, prefer: -1, m: m, routes: map[string]*route{}, peeks: newPeekBudget(cfg.MaxPeekInFlight, cfg.PeekWait)}
	empty := map[string][]int{}
	e.table.Store(&empty)
	for i, rc := range cfg.Regions {
		r := &region{idx: i, name: rc.Name, base: strings.TrimRight(rc.URL, "/"), transport: cfg.Transport, polls: cfg.Transport}
		switch {
		case h2c != nil && strings.HasPrefix(r.base, "http://"):
			r.transport, r.polls = h2c, h2c
		case polls != nil && strings.HasPrefix(r.base, "http://"):
			r.polls = polls
		}
		e.regions = append(e.regions, r)
		e.proxies = append(e.proxies, e.newProxy(r))
		if rc.Name == cfg.Prefer {
			e.prefer = i
		}
		m.healthy.WithLabelValues(r.name).Set(0)
	}
	return e, nil
}

// Open returns an edge with its listeners bound (port 0 works: see
// [Edge.URL] and [Edge.AdminURL]).
func Open(cfg Config, log *slog.Logger) (*Edge, error) {
	e, err := New(cfg, log)
	if err != nil {
		return nil, err
	}
	conns := connlimit.NewMetrics(e.cfg.Registerer)
	pubLimit, err := connlimit.New(connlimit.Config{Listener: "public", Max: e.cfg.MaxConnections, PerAddress: e.cfg.MaxConnsPerIP}, conns, e.log)
	if err != nil {
		return nil, err
	}
	if e.publicLn, err = net.Listen("tcp", e.cfg.Listen); err != nil {
		return nil, fmt.Errorf("--listen %s: %w", e.cfg.Listen, err)
	}
	e.publicLn = pubLimit.Listen(e.publicLn)
	// No ReadTimeout/WriteTimeout: they would cut long streams. Headers
	// have a deadline here, bodies one that moves as they arrive (peek).
	e.public = &http.Server{Handler: e, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: e.cfg.IdleTimeout}
	pubLimit.Apply(e.public)
	if e.cfg.AdminListen != "" {
		adminLimit, _ := connlimit.New(connlimit.Config{Listener: "admin", Max: 256}, conns, e.log)
		if e.adminLn, err = net.Listen("tcp", e.cfg.AdminListen); err != nil {
			e.Close()
			return nil, fmt.Errorf("--admin-listen %s: %w", e.cfg.AdminListen, err)
		}
		e.adminLn = adminLimit.Listen(e.adminLn)
		e.admin = &http.Server{Handler: e.AdminHandler(), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: e.cfg.IdleTimeout}
		adminLimit.Apply(e.admin)
	}
	return e, nil
}

// URL is the public listener's URL.
func (e *Edge) URL() string { return "http://" + e.publicLn.Addr().String() }

// AdminURL is the admin listener's URL ("" without one).
func (e *Edge) AdminURL() string {
	if e.adminLn == nil {
		return ""
	}
	return "http://" + e.adminLn.Addr().String()
}

// Run polls the regions (the first round at once) and, when opened with
// [Open], serves until ctx is done; then it stops accepting and lets
// requests in flight finish for up to 10 s.
func (e *Edge) Run(ctx context.Context) error {
	e.pollAll(ctx)
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		t := time.NewTicker(e.cfg.PollInterval)
		defer t.Stop()
		for {
			select {
			case <-gctx.Done():
				return nil
			case <-t.C:
				e.pollAll(gctx)
			}
		}
	})
	serve := func(srv *http.Server, ln net.Listener) {
		if srv == nil {
			return
		}
		g.Go(func() error {
			if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
				return fmt.Errorf("serve %s: %w", ln.Addr(), err)
			}
			return nil
		})
		g.Go(func() error {
			<-gctx.Done()
			sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := srv.Shutdown(sctx); err != nil {
				_ = srv.Close()
			}
			return nil
		})
	}
	serve(e.public, e.publicLn)
	serve(e.admin, e.adminLn)
	err := g.Wait()
	// The connections to the regions end with the edge, not at their idle
	// timeout.
	for _, r := range e.regions {
		for _, t := range []http.RoundTripper{r.transport, r.polls} {
			if c, ok := t.(interface{ CloseIdleConnections() }); ok {
				c.CloseIdleConnections()
			}
		}
	}
	return err
}

// Close releases the listeners; it is safe twice and after Run.
func (e *Edge) Close() {
	e.closeOnce.Do(func() {
		for _, ln := range []net.Listener{e.publicLn, e.adminLn} {
			if ln != nil {
				_ = ln.Close()
			}
		}
	})
}

// Route returns the regions a request for model would try now, in order
// (for the admin view and tests).
func (e *Edge) Route(model string) []string {
	var out []string
	for _, i := range e.order(model) {
		out = append(out, e.regions[i].name)
	}
	return out
}

// attemptWriter is the client's writer during one region's attempt: a
// failure before any answer is recorded instead of written, so the next
// region may take the request.
type attemptWriter struct {
	http.ResponseWriter
	err error
}

func (w *attemptWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (e *Edge) newProxy(r *region) *httputil.ReverseProxy {
	target, _ := url.Parse(r.base) // checked by Validate
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			// X-Forwarded-For names the client (a client's own are
			// dropped), so a region trusting this edge (--trusted-proxy)
			// applies its per-address shares to the client, not the edge.
			pr.SetXForwarded()
			pr.Out.Host = pr.In.Host // the gateway sees the host the client asked for
			if target.Scheme == "https" {
				pr.Out.Host = target.Host // a TLS front (a tunnel, a CDN) routes by its own name
			}
		},
		Transport:     r.transport,
		FlushInterval: -1,
		ModifyResponse: func(resp *http.Response) error {
			resp.Header.Set(HeaderRegion, r.name)
			if resp.StatusCode == http.StatusServiceUnavailable {
				body, err := io.ReadAll(io.LimitReader(resp.Body, maxRefusal+1))
				if err == nil && len(body) <= maxRefusal {
					return &refusal{status: resp.StatusCode, header: resp.Header, body: body}
				}
				// Unreadable or too long to hold: relay what there is.
				resp.Body = struct {
					io.Reader
					io.Closer
				}{io.MultiReader(bytes.NewReader(body), resp.Body), resp.Body}
			}
			e.m.requests.WithLabelValues(r.name, strconv.Itoa(resp.StatusCode)).Inc()
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
			if aw, ok := w.(*attemptWriter); ok {
				aw.err = err
			}
		},
	}
}

// ServeHTTP forwards the request to the best region for its model, and to
// the next one at once when nothing of it reached the client and its body
// is held whole: the connection could not be made, the region failed
// before answering (killed mid-request: the connection closed before the
// response headers), or it refused the request with a 503 (no ready
// replica, draining, ledger unavailable: the gateway answers 503 only for
// what it did not run). deploy/cloudflare/worker.js follows the same rule.
// The last region's refusal reaches the client as it was.
func (e *Edge) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var paced *pacedBody
	if r.Body != nil && r.Body != http.NoBody {
		paced = newPacedBody(r.Body, w, e.cfg.BodyTimeout, e.cfg.BodyMinRate)
		r.Body = paced
		defer paced.end()
	}
	body, whole, model, held, err := e.peek(r)
	defer e.peeks.release(held)
	if err != nil {
		switch {
		case errors.Is(err, errPeekBudget):
			w.Header().Set("Retry-After", "1")
			writeError(w, http.StatusServiceUnavailable, "server_error", "body_budget_exhausted",
				fmt.Sprintf("the edge holds as many request bodies as it may (%d MiB, --max-peek-in-flight); try again shortly", e.cfg.MaxPeekInFlight>>20))
		case paced != nil && paced.timedOut.Load():
			writeError(w, http.StatusRequestTimeout, "invalid_request_error", "request_timeout", e.slowBody())
		default:
			writeError(w, http.StatusBadRequest, "invalid_request_error", "edge_body_unreadable", "the request body could not be read: "+err.Error())
		}
		return
	}
	order := e.order(model)
	if len(order) == 0 {
		e.m.requests.WithLabelValues("none", "503").Inc()
		writeError(w, http.StatusServiceUnavailable, "server_error", "no_region", "no healthy region can take the request now; try again shortly")
		return
	}
	var lastErr error
	sent := false
	for n, i := range order {
		if sent && !whole {
			break // part of the body was sent to a region and is gone
		}
		reg := e.regions[i]
		reg.mu.Lock()
		ok := reg.healthy && !reg.draining
		reg.mu.Unlock()
		if !ok && n < len(order)-1 {
			continue // went down since the route was made
		}
		sent = true
		last := n == len(order)-1 || !whole // no other region may take it
		ar := r.Clone(r.Context())
		ar.Body = body()
		if whole {
			// The transport may then resend it itself on a kept-alive
			// connection that closed before the request was written.
			ar.GetBody = func() (io.ReadCloser, error) { return body(), nil }
		}
		aw := &attemptWriter{ResponseWriter: w}
		e.proxies[i].ServeHTTP(aw, ar)
		if aw.err == nil {
			return
		}
		lastErr = aw.err
		if r.Context().Err() != nil {
			e.m.requests.WithLabelValues(reg.name, "499").Inc()
			return
		}
		var ref *refusal
		if errors.As(aw.err, &ref) {
			if last {
				e.m.requests.WithLabelValues(reg.name, strconv.Itoa(ref.status)).Inc()
				ref.write(w)
				return
			}
			e.m.retries.WithLabelValues(reg.name, "refused").Inc()
			continue
		}
		reason := "connect"
		if !notSent(aw.err) {
			if !whole && paced != nil && paced.timedOut.Load() {
				e.m.requests.WithLabelValues(reg.name, "408").Inc()
				writeError(w, http.StatusRequestTimeout, "invalid_request_error", "request_timeout", e.slowBody())
				return
			}
			if !whole {
				e.m.requests.WithLabelValues(reg.name, "502").Inc()
				writeError(w, http.StatusBadGateway, "server_error", "region_failed", "region "+reg.name+" failed: "+aw.err.Error())
				return
			}
			// The region failed before answering (killed, connection
			// reset): nothing reached the client and the body is held, so
			// the next region takes it, as the Worker does.
			reason = "failed"
		}
		e.m.retries.WithLabelValues(reg.name, reason).Inc()
		e.markDown(reg, aw.err)
	}
	e.m.requests.WithLabelValues("none", "502").Inc()
	msg := "no region could be reached"
	if lastErr != nil {
		msg += ": " + lastErr.Error()
	}
	writeError(w, http.StatusBadGateway, "server_error", "no_region_reachable", msg)
}

// maxRefusal bounds the body of a 503 the edge holds to relay it when no
// other region takes the request (a gateway's is a short JSON error).
const maxRefusal = 64 << 10

// refusal is a region's 503, held until the next region answers.
type refusal struct {
	status int
	header http.Header
	body   []byte
}

func (f *refusal) Error() string { return "refused with " + strconv.Itoa(f.status) }

// write relays the refusal to the client as the region sent it.
func (f *refusal) write(w http.ResponseWriter) {
	h := w.Header()
	for k, v := range f.header {
		h[k] = v
	}
	h.Del("Content-Length")
	h.Del("Transfer-Encoding")
	w.WriteHeader(f.status)
	_, _ = w.Write(f.body)
}

// notSent reports whether err means nothing of the request reached the
// region: the connection could not be made.
func notSent(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// slowBody is the message of a body that arrived too slowly.
func (e *Edge) slowBody() string {
	return fmt.Sprintf("the request body arrived too slowly: the edge gives a body %s plus one second per %d KiB", e.cfg.BodyTimeout, e.cfg.BodyMinRate>>10)
}

// peekStep is how much of a body is reserved from the peek budget at a
// time, so what is reserved ahead of what arrived stays small.
const peekStep = 64 << 10

// peek returns the request's body for each attempt, whether it is held
// whole (so it may be sent again), and the model a JSON body names. The
// bytes forwarded are the bytes received. held is what it reserved of the
// peek budget, to give back when the request ends.
func (e *Edge) peek(r *http.Request) (body func() io.ReadCloser, whole bool, model string, held int64, err error) {
	if r.Body == nil || r.Body == http.NoBody {
		return func() io.ReadCloser { return http.NoBody }, true, "", 0, nil
	}
	limit := e.cfg.MaxPeek + 1
	if r.ContentLength >= 0 && r.ContentLength < limit {
		limit = r.ContentLength + 1 // +1 sees the end
	}
	var buf []byte
	for int64(len(buf)) < limit {
		step := min(limit-int64(len(buf)), peekStep)
		if err := e.peeks.reserve(r.Context(), step); err != nil {
			return nil, false, "", held, err
		}
		held += step
		buf = slices.Grow(buf, int(step))
		n, rerr := io.ReadFull(r.Body, buf[len(buf):len(buf)+int(step)])
		buf = buf[:len(buf)+n]
		if rerr == io.EOF || rerr == io.ErrUnexpectedEOF {
			break
		}
		if rerr != nil {
			return nil, false, "", held, rerr
		}
	}
	e.peeks.release(held - int64(len(buf)))
	held = int64(len(buf))
	if ct, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); ct == "application/json" || ct == "" {
		model = gjson.GetBytes(buf, "model").String()
	}
	if int64(len(buf)) <= e.cfg.MaxPeek {
		_ = r.Body.Close()
		return func() io.ReadCloser { return io.NopCloser(bytes.NewReader(buf)) }, true, model, held, nil
	}
	rest := r.Body
	return func() io.ReadCloser {
		return struct {
			io.Reader
			io.Closer
		}{io.MultiReader(bytes.NewReader(buf), rest), rest}
	}, false, model, held, nil
}

// writeError answers in OpenAI's error shape, as the gateways do.
func writeError(w http.ResponseWriter, status int, typ, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	type apiError struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    string  `json:"code"`
	}
	_ = json.NewEncoder(w).Encode(map[string]apiError{"error": {Message: msg, Type: typ, Code: code}})
}

// AdminHandler serves /metrics and /edge/v1/regions (each region's health,
// draining state, RTT and the routes), unauthenticated: bind it to
// loopback or a private network.
func (e *Edge) AdminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(e.cfg.Gatherer, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /edge/v1/regions", e.handleGetRegions)
	return mux
}
