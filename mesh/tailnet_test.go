package mesh

import (
	"context"
	"flag"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"tailscale.com/net/netns"
	"tailscale.com/tailcfg"
	"tailscale.com/tstest/integration"
	"tailscale.com/tstest/integration/testcontrol"
	"tailscale.com/types/logger"
)

var (
	verboseControl = flag.Bool("verbose-control", false, "log the test control, DERP and STUN servers")
	verboseNodes   = flag.Bool("verbose-nodes", false, "log the mesh nodes, tsnet's debug logs included")
)

// Tags the test control server lets nodes claim.
const (
	tagGateway = "tag:tailgate-gateway"
	tagWorker  = "tag:tailgate-worker"
)

// startControl runs tailscale's in-process control server and a DERP and
// STUN relay on loopback, as tailscale's own tsnet tests do, and returns the
// control server (its URL is control.HTTPTestServer.URL). configure, if not
// nil, adjusts the server before it starts.
func startControl(tb testing.TB, configure func(*testcontrol.Server)) *testcontrol.Server {
	tb.Helper()
	// Sockets must not be bound to a device or marked in tests (tailscale's
	// Corp#4520), and netns is process-wide: tests using it stay serial.
	netns.SetEnabled(false)
	tb.Cleanup(func() { netns.SetEnabled(true) })

	logf := logger.Discard
	if *verboseControl {
		logf = tb.Logf
	}
	control := &testcontrol.Server{
		DERPMap:        integration.RunDERPAndSTUN(tb, logf, "127.0.0.1"),
		DNSConfig:      &tailcfg.DNSConfig{Proxied: true},
		MagicDNSDomain: "tail-scale.ts.net",
		TagOwners:      map[string][]string{tagGateway: nil, tagWorker: nil},
		Logf:           logf,
	}
	if configure != nil {
		configure(control)
	}
	control.HTTPTestServer = httptest.NewUnstartedServer(control)
	control.HTTPTestServer.Start()
	tb.Cleanup(control.HTTPTestServer.Close)
	return control
}

// testConfig is a node configuration for the control server at url, its
// state in a fresh temporary directory.
func testConfig(tb testing.TB, url, hostname string) Config {
	return Config{
		Hostname:   hostname,
		Dir:        filepath.Join(tb.TempDir(), "mesh"),
		ControlURL: url,
		Ephemeral:  true,
		Log:        testLogger(tb),
	}
}

// startNode brings a node up on the test tailnet and closes it when the
// test ends. adjust, if not nil, changes its configuration first.
func startNode(tb testing.TB, ctx context.Context, url, hostname string, adjust func(*Config)) *Node {
	tb.Helper()
	cfg := testConfig(tb, url, hostname)
	if adjust != nil {
		adjust(&cfg)
	}
	n, err := Up(ctx, cfg)
	if err != nil {
		tb.Fatalf("up %s: %v", hostname, err)
	}
	tb.Cleanup(func() { n.Close() })
	return n
}

// serve serves h on every connection ln accepts until the test ends.
func serve(tb testing.TB, ln net.Listener, h http.Handler) {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		srv.Serve(ln)
	}()
	tb.Cleanup(func() {
		srv.Close()
		<-done
	})
}

// client returns an HTTP client whose connections go through n.
func client(tb testing.TB, n *Node) *http.Client {
	tr := &http.Transport{DialContext: n.Dial, DisableCompression: true}
	tb.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 30 * time.Second}
}

func testLogger(tb testing.TB) *slog.Logger {
	if !*verboseNodes {
		return slog.New(slog.DiscardHandler)
	}
	return slog.New(slog.NewTextHandler(tbWriter{tb}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type tbWriter struct{ tb testing.TB }

func (w tbWriter) Write(p []byte) (int, error) {
	w.tb.Log(string(p))
	return len(p), nil
}

// freeHostPort returns a TCP port nothing on the host listens on right now.
func freeHostPort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	return port
}
