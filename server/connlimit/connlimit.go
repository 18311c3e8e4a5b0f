// Package connlimit keeps one client from holding a listener: it caps the
// connections a listener holds open, in total and per source address, and
// closes idle keep-alive connections first when a cap is reached, so a new
// request is never kept out while an idle connection could make room.
//
// It also turns an http.Server's error log into something clients cannot
// flood (see [Limiter.ErrorLog]). It knows nothing of requests or credentials: the
// deadlines and the closing of refused requests belong to the handlers.
//
// Use: wrap the listener with [Limiter.Listen] and let [Limiter.Apply] set
// the server's ConnState (which tells idle connections from busy ones) and
// ErrorLog.
package connlimit

import (
	"container/list"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// DefaultMax is the total cap when Config.Max is 0.
const DefaultMax = 4096

// Config is one listener's limits.
type Config struct {
	// Listener names the listener in metrics and log lines ("public",
	// "admin").
	Listener string
	// Max is the most connections open at once; past it the oldest idle
	// connection is closed, and with none idle a new connection waits to be
	// accepted until one ends or turns idle. 0: DefaultMax.
	Max int
	// PerAddress is the most one source IP address may hold open (loopback
	// counts like any address); one more is closed at once, unless an idle
	// one of the same address can make room. 0: Max/8, at least 1.
	PerAddress int
	// Trusted are the networks of proxies that forward many clients'
	// requests (an edge, a load balancer): their connections count
	// against Max only, and the clients they name are held to
	// PerAddress request by request instead ([Limiter.EnterForwarded]).
	Trusted []netip.Prefix
}

// Validate reports a limit that cannot work.
func (c Config) Validate() error {
	switch {
	case c.Max < 0:
		return errors.New("connection cap must not be negative (0: the default)")
	case c.PerAddress < 0:
		return errors.New("per-address connection cap must not be negative (0: 1/8 of the cap)")
	}
	return nil
}

func (c *Config) setDefaults() {
	if c.Max == 0 {
		c.Max = DefaultMax
	}
	if c.PerAddress == 0 {
		c.PerAddress = max(c.Max/8, 1)
	}
	c.PerAddress = min(c.PerAddress, c.Max)
}

// Limiter holds one listener's connections. Create it with [New].
type Limiter struct {
	cfg  Config
	m    *Metrics
	log  *slog.Logger
	logs *rateLog

	mu     sync.Mutex
	total  int
	byAddr map[string]int
	// states[s] is the connections gauge of state s on this listener,
	// looked up the first time it is needed (ConnState runs twice a
	// request; a label lookup hashes both labels each time).
	states [http.StateClosed + 1]prometheus.Gauge
	idle   list.List     // of *conn, longest idle first
	freed  chan struct{} // a slot freed or a connection turned idle
}

// New returns a Limiter with cfg's limits; m may be shared by the limiters
// of several listeners (nil: no metrics), log gets at most one line a
// minute per kind of event.
func New(cfg Config, m *Metrics, log *slog.Logger) (*Limiter, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if m == nil {
		m = NewMetrics(nil)
	}
	return &Limiter{cfg: cfg, m: m, log: log, logs: newRateLog(log, time.Minute), byAddr: make(map[string]int),
		freed: make(chan struct{}, 1)}, nil
}

// Limits returns the limits in force (defaults filled in).
func (l *Limiter) Limits() Config { return l.cfg }

// Listen returns ln with l's limits: Accept returns only connections l
// admits, each counted until it is closed.
func (l *Limiter) Listen(ln net.Listener) net.Listener {
	return &listener{Listener: ln, l: l, done: make(chan struct{})}
}

// Apply makes srv, which serves a listener from [Limiter.Listen], report
// its connections' states to l and write its error log through
// [Limiter.ErrorLog].
func (l *Limiter) Apply(srv *http.Server) {
	srv.ConnState = l.ConnState
	srv.ErrorLog = l.ErrorLog()
}

// ConnState is for http.Server.ConnState: it tracks which connections are
// idle. c may wrap the accepted connection (a *tls.Conn).
func (l *Limiter) ConnState(c net.Conn, s http.ConnState) {
	lc := unwrap(c)
	if lc == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if lc.closed {
		return
	}
	l.stateGauge(lc.state).Dec()
	if lc.idleAt != nil {
		l.idle.Remove(lc.idleAt)
		lc.idleAt = nil
	}
	switch s {
	case http.StateClosed:
		s = http.StateActive // counted as busy until Close releases it
	case http.StateIdle:
		lc.idleAt = l.idle.PushBack(lc)
		l.signal()
	}
	lc.state = s
	l.stateGauge(s).Inc()
}

// stateGauge is the connections gauge of state s on l's listener; l.mu
// must be held.
func (l *Limiter) stateGauge(s http.ConnState) prometheus.Gauge {
	if s < 0 || int(s) >= len(l.states) {
		return l.m.conns.WithLabelValues(l.cfg.Listener, s.String())
	}
	if l.states[s] == nil {
		l.states[s] = l.m.conns.WithLabelValues(l.cfg.Listener, s.String())
	}
	return l.states[s]
}

// unwrap finds the connection l accepted under wrappers that expose it
// (crypto/tls's NetConn).
func unwrap(c net.Conn) *conn {
	for range 4 {
		switch v := c.(type) {
		case *conn:
			return v
		case interface{ NetConn() net.Conn }:
			c = v.NetConn()
		default:
			return nil
		}
	}
	return nil
}

// signal wakes an Accept waiting for room; l.mu held.
func (l *Limiter) signal() {
	select {
	case l.freed <- struct{}{}:
	default:
	}
}

// admit counts nc in, making room by closing idle connections, or waits
// for room until done is closed. It returns nil when nc was refused (and
// closed) or the listener closed.
func (l *Limiter) admit(nc net.Conn, done <-chan struct{}) *conn {
	addr := hostOf(nc.RemoteAddr())
	waited := false
	for {
		l.mu.Lock()
		var victim *conn
		switch {
		case l.byAddr[addr] >= l.cfg.PerAddress && !l.Trusts(addr):
			if victim = l.oldestIdle(addr); victim == nil {
				l.mu.Unlock()
				_ = nc.Close()
				l.m.refused.WithLabelValues(l.cfg.Listener, "per_address").Inc()
				l.logs.warn(l.cfg.Listener+"/per_address", "connection refused: its address holds its share of the connection cap",
					"listener", l.cfg.Listener, "addr", addr, "per_address", l.cfg.PerAddress)
				return nil
			}
		case l.total >= l.cfg.Max:
			victim = l.oldestIdle("")
		default:
			l.total++
			l.byAddr[addr]++
			c := &conn{Conn: nc, l: l, addr: addr, state: http.StateNew}
			l.stateGauge(c.state).Inc()
			l.mu.Unlock()
			return c
		}
		if victim != nil {
			l.idle.Remove(victim.idleAt)
			victim.idleAt = nil
			l.mu.Unlock()
			l.m.idleClosed.WithLabelValues(l.cfg.Listener).Inc()
			_ = victim.Close() // frees its slot before the next round
			continue
		}
		l.mu.Unlock()
		if !waited {
			waited = true
			l.m.waits.WithLabelValues(l.cfg.Listener).Inc()
			l.logs.warn(l.cfg.Listener+"/full", "connection cap reached with no idle connection to close: new connections wait to be accepted",
				"listener", l.cfg.Listener, "max", l.cfg.Max)
		}
		select {
		case <-l.freed:
		case <-done:
			_ = nc.Close()
			return nil
		}
	}
}

// oldestIdle is the longest idle connection (of addr, unless addr is "");
// l.mu held.
func (l *Limiter) oldestIdle(addr string) *conn {
	for e := l.idle.Front(); e != nil; e = e.Next() {
		if c := e.Value.(*conn); addr == "" || c.addr == addr {
			return c
		}
	}
	return nil
}

// release gives c's slot back.
func (l *Limiter) release(c *conn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if c.idleAt != nil {
		l.idle.Remove(c.idleAt)
		c.idleAt = nil
	}
	c.closed = true
	l.stateGauge(c.state).Dec()
	l.total--
	if l.byAddr[c.addr]--; l.byAddr[c.addr] <= 0 {
		delete(l.byAddr, c.addr)
	}
	l.signal()
}

// hostOf is the IP of a remote address ("" when it has none).
func hostOf(a net.Addr) string {
	switch v := a.(type) {
	case *net.TCPAddr:
		return v.IP.String()
	case nil:
		return ""
	}
	host, _, err := net.SplitHostPort(a.String())
	if err != nil {
		return a.String()
	}
	return host
}

// listener is a net.Listener whose Accept admits through l.
type listener struct {
	net.Listener
	l         *Limiter
	done      chan struct{}
	closeOnce sync.Once
}

func (ln *listener) Accept() (net.Conn, error) {
	for {
		nc, err := ln.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if c := ln.l.admit(nc, ln.done); c != nil {
			return c, nil
		}
		select {
		case <-ln.done:
			return nil, net.ErrClosed
		default:
		}
	}
}

func (ln *listener) Close() error {
	ln.closeOnce.Do(func() { close(ln.done) })
	return ln.Listener.Close()
}

// conn is an admitted connection; its fields other than Conn are guarded
// by l.mu.
type conn struct {
	net.Conn
	l      *Limiter
	addr   string
	state  http.ConnState
	idleAt *list.Element // in l.idle while idle
	closed bool

	once sync.Once
}

func (c *conn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.l.release(c) })
	return err
}

// Trusts reports whether addr (an IP address) is in a Trusted network.
func (l *Limiter) Trusts(addr string) bool {
	return Contains(l.cfg.Trusted, addr)
}

// Contains reports whether the IP address addr is in one of nets.
func Contains(nets []netip.Prefix, addr string) bool {
	if len(nets) == 0 {
		return false
	}
	ip, err := netip.ParseAddr(addr)
	if err != nil {
		return false
	}
	ip = ip.Unmap()
	for _, n := range nets {
		if n.Contains(ip) {
			return true
		}
	}
	return false
}

// EnterForwarded counts one request that a trusted proxy forwarded for the
// client at addr against addr's share (PerAddress, with the connections
// addr holds itself): false when addr holds its share already, and the
// request must be refused. leave gives the place back when the request
// ends. Behind an edge every client is one connection's address; this is
// how each still gets a share of its own.
func (l *Limiter) EnterForwarded(addr string) (leave func(), ok bool) {
	l.mu.Lock()
	if l.byAddr[addr] >= l.cfg.PerAddress {
		l.mu.Unlock()
		l.m.refused.WithLabelValues(l.cfg.Listener, "per_address_forwarded").Inc()
		l.logs.warn(l.cfg.Listener+"/per_address_forwarded", "forwarded request refused: its client address holds its share of the connection cap",
			"listener", l.cfg.Listener, "addr", addr, "per_address", l.cfg.PerAddress)
		return nil, false
	}
	l.byAddr[addr]++
	l.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			l.mu.Lock()
			if l.byAddr[addr]--; l.byAddr[addr] <= 0 {
				delete(l.byAddr, addr)
			}
			l.mu.Unlock()
		})
	}, true
}
