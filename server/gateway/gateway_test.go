package gateway

import (
	"context"
	"flag"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestGatewayServesItsListenersAndStopsThemAll: the listeners Open binds
// serve once Run runs (the public API and the admin routes, each on its
// own address), and when Run returns every one of them is closed.
func TestGatewayServesItsListenersAndStopsThemAll(t *testing.T) {
	fs := flag.NewFlagSet("gateway", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var cfg Config
	cfg.RegisterFlags(fs)
	cfg.RegisterMeshFlags(fs)
	if err := fs.Parse([]string{"--data", t.TempDir(), "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--shutdown-grace", "2s"}); err != nil {
		t.Fatal(err)
	}
	if err := cfg.Load(fs); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	gw, err := Open(context.Background(), cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	defer gw.Close()
	ctx, stop := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- gw.Run(ctx) }()

	public := strings.TrimSuffix(gw.PublicURL(), "/v1")
	for url, want := range map[string]int{
		public + "/healthz":                     http.StatusServiceUnavailable, // no replica yet
		"http://" + gw.AdminAddr() + "/metrics": http.StatusUnauthorized,       // no admin token
	} {
		resp, err := http.Get(url)
		if err != nil {
			t.Fatalf("GET %s: %v", url, err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("GET %s: %d, want %d", url, resp.StatusCode, want)
		}
	}

	stop()
	select {
	case err := <-ran:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
	for _, addr := range []string{strings.TrimPrefix(public, "http://"), gw.AdminAddr()} {
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			c.Close()
			t.Errorf("%s still accepts connections after Run returned", addr)
		}
	}
}
