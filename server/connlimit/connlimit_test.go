package connlimit

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// serve starts an HTTP server on loopback behind a Limiter with cfg and
// returns its address and metrics.
func serve(t *testing.T, cfg Config) (string, *Metrics) {
	t.Helper()
	m := NewMetrics(prometheus.NewRegistry())
	l, err := New(cfg, m, nil)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }),
		IdleTimeout: time.Minute, ReadHeaderTimeout: time.Minute}
	l.Apply(srv)
	go srv.Serve(l.Listen(ln))
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String(), m
}

// dialFrom opens a TCP connection to addr from the loopback address from.
func dialFrom(t *testing.T, from, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// get sends one keep-alive GET on c and reads its answer; false when the
// connection was closed instead.
func get(t *testing.T, c net.Conn, br *bufio.Reader) bool {
	t.Helper()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		return false
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return false
	}
	_, err = io.ReadAll(resp.Body)
	resp.Body.Close()
	return err == nil && resp.StatusCode == 200
}

// closedByServer reports whether the server closed c (a read ends in EOF
// or a reset within 5 s).
func closedByServer(c net.Conn) bool {
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err := c.Read(make([]byte, 1))
	var ne net.Error
	if err == nil || (errors.As(err, &ne) && ne.Timeout()) {
		return false
	}
	return true
}

// value is a counter's or gauge's current value.
func value(m prometheus.Metric) float64 {
	var d dto.Metric
	_ = m.Write(&d)
	if d.Counter != nil {
		return d.Counter.GetValue()
	}
	return d.Gauge.GetValue()
}

// waitIdle waits (bounded) until the server has marked n connections idle:
// a client reads its answer a moment before the server's ConnState does.
func waitIdle(t *testing.T, m *Metrics, listener string, n float64) {
	t.Helper()
	g := m.conns.WithLabelValues(listener, "idle")
	for i := 0; i < 500 && value(g) != n; i++ {
		time.Sleep(10 * time.Millisecond)
	}
	if value(g) != n {
		t.Fatalf("%v connections idle, want %v", value(g), n)
	}
}

func TestIdleConnectionMakesRoomForANewOne(t *testing.T) {
	addr, m := serve(t, Config{Listener: "public", Max: 2, PerAddress: 2})
	var idle []net.Conn
	for i, from := range []string{"127.0.0.2", "127.0.0.3"} {
		c := dialFrom(t, from, addr)
		if !get(t, c, bufio.NewReader(c)) {
			t.Fatalf("request from %s not served", from)
		}
		waitIdle(t, m, "public", float64(i+1))
		idle = append(idle, c)
	}
	// The cap is full of idle connections: a third client is still served.
	c := dialFrom(t, "127.0.0.4", addr)
	if !get(t, c, bufio.NewReader(c)) {
		t.Fatal("a new client was not served while the cap was full of idle connections")
	}
	if !closedByServer(idle[0]) {
		t.Error("the longest idle connection was not closed")
	}
	if got := value(m.idleClosed.WithLabelValues("public")); got != 1 {
		t.Errorf("tailgate_connections_idle_closed_total = %v, want 1", got)
	}
}

func TestOneAddressHoldsOnlyItsShare(t *testing.T) {
	addr, m := serve(t, Config{Listener: "admin", Max: 8, PerAddress: 2})
	// Two silent connections (no request yet) from one address are its share.
	for range 2 {
		dialFrom(t, "127.0.0.2", addr)
	}
	third := dialFrom(t, "127.0.0.2", addr)
	if !closedByServer(third) {
		t.Fatal("a third connection from one address was kept with a share of 2")
	}
	other := dialFrom(t, "127.0.0.3", addr)
	if !get(t, other, bufio.NewReader(other)) {
		t.Fatal("another address was not served")
	}
	if got := value(m.refused.WithLabelValues("admin", "per_address")); got != 1 {
		t.Errorf("refused{per_address} = %v, want 1", got)
	}
}

func TestAddressAtItsShareClosesItsOwnIdleConnection(t *testing.T) {
	addr, m := serve(t, Config{Max: 8, PerAddress: 1})
	first := dialFrom(t, "127.0.0.2", addr)
	if !get(t, first, bufio.NewReader(first)) {
		t.Fatal("first request not served")
	}
	waitIdle(t, m, "", 1)
	second := dialFrom(t, "127.0.0.2", addr)
	if !get(t, second, bufio.NewReader(second)) {
		t.Fatal("a new connection was refused while its address had an idle one to close")
	}
	if !closedByServer(first) {
		t.Error("the idle connection of the address was not closed")
	}
}

func TestFullCapWaitsUntilAConnectionTurnsIdle(t *testing.T) {
	addr, m := serve(t, Config{Max: 1, PerAddress: 1})
	busy := dialFrom(t, "127.0.0.2", addr) // admitted, no request yet: not idle
	waiting := dialFrom(t, "127.0.0.3", addr)
	_ = waiting.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(waiting, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	// Bounded wait for the second connection to be parked at the cap.
	for i := 0; i < 500 && value(m.waits.WithLabelValues("")) == 0; i++ {
		time.Sleep(10 * time.Millisecond)
	}
	if value(m.waits.WithLabelValues("")) != 1 {
		t.Fatal("the second connection did not wait for room")
	}
	// The first finishes a request and turns idle: the waiting one gets in.
	if !get(t, busy, bufio.NewReader(busy)) {
		t.Fatal("first request not served")
	}
	resp, err := http.ReadResponse(bufio.NewReader(waiting), nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("waiting connection: %v", err)
	}
	resp.Body.Close()
}

func TestHandshakeErrorsAreCountedAndLoggedOnceAMinute(t *testing.T) {
	var buf bytes.Buffer
	m := NewMetrics(prometheus.NewRegistry())
	l, err := New(Config{Listener: "public"}, m, slog.New(slog.NewTextHandler(&buf, nil)))
	if err != nil {
		t.Fatal(err)
	}
	el := l.ErrorLog()
	for range 5 {
		el.Printf("http: TLS handshake error from 127.0.0.1:5555: EOF")
	}
	el.Printf("http: Accept error: too many open files; retrying in 5ms")
	if got := value(m.handshakes.WithLabelValues("public")); got != 5 {
		t.Errorf("tailgate_tls_handshake_errors_total = %v, want 5", got)
	}
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 || !strings.Contains(lines[0], "TLS handshake failed") || !strings.Contains(lines[1], "Accept error") {
		t.Errorf("log lines:\n%s\nwant one handshake line and the accept error", buf.String())
	}
}

// TestTrustedProxyHoldsMoreThanAShare: a trusted proxy's connections count
// against the cap only (it carries many clients, and its health polls
// must not be refused for its address's share); each client it forwards
// is held to the share request by request.
func TestTrustedProxyHoldsMoreThanAShare(t *testing.T) {
	cfg := Config{Listener: "public", Max: 8, PerAddress: 2, Trusted: []netip.Prefix{netip.MustParsePrefix("127.0.0.2/32")}}
	addr, _ := serve(t, cfg)
	var conns []net.Conn
	for range 4 {
		conns = append(conns, dialFrom(t, "127.0.0.2", addr))
	}
	for i, c := range conns {
		if !get(t, c, bufio.NewReader(c)) {
			t.Fatalf("the trusted proxy's connection %d was closed with a share of 2", i+1)
		}
	}
	l, err := New(cfg, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	var leaves []func()
	for range 2 {
		leave, ok := l.EnterForwarded("203.0.113.7")
		if !ok {
			t.Fatal("a forwarded client refused within its share")
		}
		leaves = append(leaves, leave)
	}
	if _, ok := l.EnterForwarded("203.0.113.7"); ok {
		t.Fatal("a forwarded client's third request admitted with a share of 2")
	}
	if leave, ok := l.EnterForwarded("198.51.100.9"); !ok {
		t.Fatal("another forwarded client refused")
	} else {
		leave()
	}
	leaves[0]()
	leaves[0]() // twice is once
	if _, ok := l.EnterForwarded("203.0.113.7"); !ok {
		t.Fatal("a forwarded client refused after one of its requests ended")
	}
}
