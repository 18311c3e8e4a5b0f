package mesh

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/e2e/testkit"

	"tailscale.com/tstest"
	"tailscale.com/tstest/integration/testcontrol"
)

// TestDialListenWhoIs runs the gateway→sidecar hop over a real tailnet: a
// plain request, an SSE stream that must arrive event by event, and WhoIs
// naming the caller on the listening side.
func TestDialListenWhoIs(t *testing.T) {
	tstest.ResourceCheck(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	url := startControl(t, nil).HTTPTestServer.URL

	var progress testkit.Buffer
	sidecar := startNode(t, ctx, url, "sidecar", func(c *Config) {
		c.Tags = []string{tagWorker}
		c.Log = slog.New(slog.NewTextHandler(&progress, nil))
	})
	gateway := startNode(t, ctx, url, "gateway", func(c *Config) { c.Tags = []string{tagGateway} })

	if sidecar.Hostname() != "sidecar" || gateway.Hostname() != "gateway" {
		t.Fatalf("hostnames = %q, %q; want sidecar, gateway", sidecar.Hostname(), gateway.Hostname())
	}
	gwAddr, ok := gateway.Addr()
	if !ok || !gwAddr.Is4() {
		t.Fatalf("gateway Addr() = %v, %v; want a tailnet IPv4 address", gwAddr, ok)
	}
	scAddr, _ := sidecar.Addr()
	for _, want := range []string{
		`msg="mesh: joining tailnet" hostname=sidecar control=` + url,
		`msg="mesh: up" hostname=sidecar addr=` + scAddr.String(),
	} {
		if !strings.Contains(progress.String(), want) {
			t.Errorf("progress log lacks %q:\n%s", want, progress.String())
		}
	}

	acks := make(chan struct{})
	mux := http.NewServeMux()
	mux.HandleFunc("GET /whoami", func(w http.ResponseWriter, r *http.Request) {
		p, err := sidecar.WhoIs(r.Context(), r.RemoteAddr)
		if err != nil {
			http.Error(w, err.Error(), http.StatusForbidden)
			return
		}
		json.NewEncoder(w).Encode(p)
	})
	mux.HandleFunc("GET /stream", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for i := range 5 {
			fmt.Fprintf(w, "data: %d\n\n", i)
			w.(http.Flusher).Flush()
			// The next event waits until the client has read this one, so a
			// buffered stream deadlocks instead of passing.
			select {
			case <-acks:
			case <-r.Context().Done():
				return
			}
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
	})
	ln, err := sidecar.Listen("tcp", ":9000")
	if err != nil {
		t.Fatal(err)
	}
	serve(t, ln, mux)
	hc := client(t, gateway)

	t.Run("whois names the caller", func(t *testing.T) {
		res := get(t, ctx, hc, "http://sidecar:9000/whoami")
		defer res.Body.Close()
		if res.StatusCode != http.StatusOK {
			body, _ := io.ReadAll(res.Body)
			t.Fatalf("status %d: %s", res.StatusCode, body)
		}
		var p Peer
		if err := json.NewDecoder(res.Body).Decode(&p); err != nil {
			t.Fatal(err)
		}
		if p.Hostname != "gateway" || !slices.Equal(p.Tags, []string{tagGateway}) || p.Addr != gwAddr {
			t.Errorf("WhoIs = %+v; want gateway with tags [%s] at %v", p, tagGateway, gwAddr)
		}
	})

	t.Run("stream arrives event by event", func(t *testing.T) {
		res := get(t, ctx, hc, "http://sidecar:9000/stream")
		defer res.Body.Close()
		br := bufio.NewReader(res.Body)
		for i := range 5 {
			if got, want := nextEvent(t, br), strconv.Itoa(i); got != want {
				t.Fatalf("event %d = %q; want %q", i, got, want)
			}
			acks <- struct{}{}
		}
		if got := nextEvent(t, br); got != "[DONE]" {
			t.Fatalf("last event = %q; want [DONE]", got)
		}
	})

	t.Run("whois rejects a non-tailnet address", func(t *testing.T) {
		_, err := sidecar.WhoIs(ctx, "127.0.0.1:1234")
		if !errors.Is(err, ErrUnknownPeer) {
			t.Fatalf("WhoIs(127.0.0.1:1234) = %v; want ErrUnknownPeer", err)
		}
	})

	t.Run("dial to a closed port is refused, not timed out", func(t *testing.T) {
		dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		c, err := gateway.Dial(dctx, "tcp", "sidecar:9001")
		if err == nil {
			c.Close()
			t.Fatal("dial to a port nobody listens on succeeded")
		}
		if op, ok := errors.AsType[*net.OpError](err); !ok || op.Op != "dial" || errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("dial error = %v; want a dial *net.OpError refusing before the deadline", err)
		}
	})

	// A worker that leaves the tailnet sends nothing on the way out: the
	// caller learns it only from its own deadlines, on a warm connection and
	// on a new dial alike.
	t.Run("a node that left fails requests and dials within their deadlines", func(t *testing.T) {
		if err := sidecar.Close(); err != nil {
			t.Fatal(err)
		}
		for _, attempt := range []struct {
			name    string
			dialErr bool // whether the error must be a dial *net.OpError
			do      func(ctx context.Context) error
		}{
			{"request on a warm connection", false, func(ctx context.Context) error {
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://sidecar:9000/whoami", nil)
				res, err := hc.Do(req)
				if err == nil {
					res.Body.Close()
				}
				return err
			}},
			{"new dial", true, func(ctx context.Context) error {
				c, err := gateway.Dial(ctx, "tcp", "sidecar:9000")
				if err == nil {
					c.Close()
				}
				return err
			}},
		} {
			actx, cancel := context.WithTimeout(ctx, 2*time.Second)
			start := time.Now()
			err := attempt.do(actx)
			cancel()
			if err == nil {
				t.Errorf("%s to the departed node succeeded", attempt.name)
			} else if op, ok := errors.AsType[*net.OpError](err); attempt.dialErr && (!ok || op.Op != "dial") {
				t.Errorf("%s: error %v is not a dial *net.OpError", attempt.name, err)
			} else if took := time.Since(start); took > 4*time.Second {
				t.Errorf("%s failed only after %v, past its 2s deadline: %v", attempt.name, took, err)
			} else {
				t.Logf("%s failed after %v: %v", attempt.name, took.Round(time.Millisecond), err)
			}
		}
	})
}

func TestUpErrors(t *testing.T) {
	t.Setenv("TS_AUTHKEY", "")
	t.Setenv("TS_AUTH_KEY", "")
	t.Setenv("TS_CONTROL_URL", "")

	t.Run("bad auth key is refused", func(t *testing.T) {
		tstest.ResourceCheck(t)
		control := startControl(t, func(c *testcontrol.Server) { c.RequireAuthKey = "tskey-auth-good" })
		cfg := testConfig(t, control.HTTPTestServer.URL, "worker")
		cfg.AuthKey = "tskey-auth-bad"
		cfg.UpTimeout = 30 * time.Second
		n, err := Up(t.Context(), cfg)
		if err == nil {
			n.Close()
		}
		if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "invalid authkey") {
			t.Fatalf("Up = %v; want ErrRefused saying invalid authkey", err)
		}

		cfg = testConfig(t, control.HTTPTestServer.URL, "worker")
		cfg.AuthKey = "tskey-auth-good"
		n, err = Up(t.Context(), cfg)
		if err != nil {
			t.Fatalf("Up with the good key = %v", err)
		}
		n.Close()
	})

	t.Run("no auth key needs login", func(t *testing.T) {
		tstest.ResourceCheck(t)
		control := startControl(t, func(c *testcontrol.Server) { c.RequireAuth = true })
		cfg := testConfig(t, control.HTTPTestServer.URL, "worker")
		cfg.UpTimeout = 30 * time.Second
		n, err := Up(t.Context(), cfg)
		if err == nil {
			n.Close()
		}
		var le *LoginError
		if !errors.Is(err, ErrNeedsLogin) || !errors.As(err, &le) ||
			!strings.HasPrefix(le.URL, control.HTTPTestServer.URL+"/auth/") || !strings.Contains(err.Error(), le.URL) {
			t.Fatalf("Up = %v; want ErrNeedsLogin with a %s/auth/ URL", err, control.HTTPTestServer.URL)
		}
	})

	t.Run("unreachable control server times out naming it", func(t *testing.T) {
		tstest.ResourceCheck(t)
		url := "http://127.0.0.1:" + freeHostPort(t)
		cfg := testConfig(t, url, "worker")
		cfg.UpTimeout = 3 * time.Second
		n, err := Up(t.Context(), cfg)
		if err == nil {
			n.Close()
		}
		if !errors.Is(err, ErrTimeout) || !strings.Contains(err.Error(), url) {
			t.Fatalf("Up = %v; want ErrTimeout naming %s", err, url)
		}
		t.Logf("error: %v", err)
	})

	t.Run("cancelled context", func(t *testing.T) {
		tstest.ResourceCheck(t)
		url := "http://127.0.0.1:" + freeHostPort(t)
		ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
		defer cancel()
		n, err := Up(ctx, testConfig(t, url, "worker"))
		if err == nil {
			n.Close()
		}
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Up = %v; want context.DeadlineExceeded", err)
		}
	})

	t.Run("invalid config", func(t *testing.T) {
		for _, cfg := range []Config{{Dir: t.TempDir()}, {Hostname: "w"}, {Hostname: "w", Dir: t.TempDir(), UpTimeout: -1}} {
			if _, err := Up(t.Context(), cfg); err == nil {
				t.Errorf("Up(%+v) succeeded; want an error", cfg)
			}
		}
	})
}

func TestCloseIsSafeTwice(t *testing.T) {
	tstest.ResourceCheck(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	url := startControl(t, nil).HTTPTestServer.URL
	n := startNode(t, ctx, url, "worker", nil)
	if err := n.Close(); err != nil {
		t.Fatalf("first Close = %v", err)
	}
	if err := n.Close(); err != nil {
		t.Fatalf("second Close = %v", err)
	}
	if _, err := n.Listen("tcp", ":9000"); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Listen after Close = %v; want net.ErrClosed", err)
	}
	if _, err := n.Dial(ctx, "tcp", "worker:9000"); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Dial after Close = %v; want net.ErrClosed", err)
	}
}

func get(t *testing.T, ctx context.Context, hc *http.Client, url string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	res, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// nextEvent returns the data of the next SSE event.
func nextEvent(t *testing.T, br *bufio.Reader) string {
	t.Helper()
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("read event: %v", err)
		}
		if data, ok := strings.CutPrefix(strings.TrimRight(line, "\r\n"), "data: "); ok {
			return data
		}
	}
}
