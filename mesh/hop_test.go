package mesh

import (
	"context"
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"
)

// BenchmarkHop measures one keep-alive HTTP round trip to the same handler
// over plain loopback TCP and over the tailnet between two in-process nodes.
// mesh reports x-loopback, its time per request as a multiple of
// loopback-tcp's in the same run.
func BenchmarkHop(b *testing.B) {
	body := []byte(`{"status":"ok","model":"sim","running":0,"waiting":0}`)
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write(body) })
	var loopback time.Duration // per request

	b.Run("loopback-tcp", func(b *testing.B) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		cl := &countingListener{Listener: ln}
		serve(b, cl, handler)
		tr := &http.Transport{DisableCompression: true}
		b.Cleanup(tr.CloseIdleConnections)
		loopback = benchGet(b, tr, "http://"+ln.Addr().String()+"/")
		cl.checkKeepAlive(b)
	})

	b.Run("mesh", func(b *testing.B) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		url := startControl(b, nil).HTTPTestServer.URL
		sidecar := startNode(b, ctx, url, "sidecar", nil)
		gateway := startNode(b, ctx, url, "gateway", nil)
		ln, err := sidecar.Listen("tcp", ":9000")
		if err != nil {
			b.Fatal(err)
		}
		cl := &countingListener{Listener: ln}
		serve(b, cl, handler)
		tr := &http.Transport{DialContext: gateway.Dial, DisableCompression: true}
		b.Cleanup(tr.CloseIdleConnections)
		b.Logf("path to sidecar: %s", awaitDirect(b, ctx, gateway, tr, "http://sidecar:9000/"))
		perReq := benchGet(b, tr, "http://sidecar:9000/")
		cl.checkKeepAlive(b)
		if loopback > 0 {
			b.ReportMetric(float64(perReq)/float64(loopback), "x-loopback")
		}
	})
}

// benchGet runs GET url in the benchmark loop and returns the time per request.
func benchGet(b *testing.B, tr http.RoundTripper, url string) time.Duration {
	hc := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	roundTrip(b, hc, url) // the connection is open before timing starts
	for b.Loop() {
		roundTrip(b, hc, url)
	}
	return b.Elapsed() / time.Duration(b.N)
}

func roundTrip(b *testing.B, hc *http.Client, url string) {
	res, err := hc.Get(url)
	if err != nil {
		b.Fatal(err)
	}
	_, err = io.Copy(io.Discard, res.Body)
	res.Body.Close()
	if err != nil || res.StatusCode != http.StatusOK {
		b.Fatalf("GET %s: status %d, %v", url, res.StatusCode, err)
	}
}

// awaitDirect sends requests until from talks to the peer directly rather
// than through the DERP relay (what a benchmark of the hop should time),
// giving up after a few seconds, and says which path it got.
func awaitDirect(b *testing.B, ctx context.Context, from *Node, tr http.RoundTripper, url string) string {
	hc := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	deadline := time.Now().Add(10 * time.Second)
	for {
		roundTrip(b, hc, url)
		st, err := from.lc.Status(ctx)
		if err != nil {
			b.Fatal(err)
		}
		for _, p := range st.Peer {
			if p.CurAddr != "" {
				return "direct via " + p.CurAddr
			}
		}
		if time.Now().After(deadline) {
			return "relayed via DERP (no direct path found)"
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// countingListener counts the connections it accepts, so a benchmark can
// tell it timed requests on a warm connection, not connection setup.
type countingListener struct {
	net.Listener
	accepted atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.accepted.Add(1)
	}
	return c, err
}

func (l *countingListener) checkKeepAlive(b *testing.B) {
	if n := l.accepted.Load(); n > 2 {
		b.Fatalf("%d connections for %d requests; keep-alive is not working", n, b.N)
	}
}
