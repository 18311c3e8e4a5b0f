package sim

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"testing"
	"time"
)

// startServer runs an engine for cfg behind the server [Engine.NewServer]
// makes, as `tailgate sim` serves it.
func startServer(t testing.TB, cfg Config) *httptest.Server {
	t.Helper()
	e, err := New(cfg, nil)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	srv := httptest.NewUnstartedServer(nil)
	srv.Config = e.NewServer(nil)
	srv.Start()
	t.Cleanup(srv.Close)
	return srv
}

// TestIdleKeepAliveConnectionsAreClosed: like uvicorn in front of vLLM, the
// engine closes a keep-alive connection that stays idle past KeepAlive, so
// a client pooling connections longer meets closed ones.
func TestIdleKeepAliveConnectionsAreClosed(t *testing.T) {
	srv := startServer(t, Config{KeepAlive: 200 * time.Millisecond})

	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, "GET /health HTTP/1.1\r\nHost: sim\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Close {
		t.Fatalf("first answer: %d, close=%v; want 200 on a kept-alive connection", resp.StatusCode, resp.Close)
	}
	// The deadline only bounds a hung test; the engine must close long before.
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := br.ReadByte(); !errors.Is(err, io.EOF) {
		t.Fatalf("idle connection: read gave %v, want EOF (the engine closes it)", err)
	}

	// A pooling client: its next request after the idle close goes out on
	// a new connection.
	client := &http.Client{Transport: &http.Transport{IdleConnTimeout: time.Minute}}
	defer client.CloseIdleConnections()
	reused := func() bool {
		var got bool
		ctx := httptrace.WithClientTrace(t.Context(), &httptrace.ClientTrace{
			GotConn: func(info httptrace.GotConnInfo) { got = info.Reused },
		})
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/health", nil)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return got
	}
	reused()
	// Each try waits idle longer than the last; a request refreshes the
	// connection's idle timer, so a try either reuses it or finds it gone.
	idle := 50 * time.Millisecond
	for tries := 0; reused(); tries++ {
		if tries == 8 {
			t.Fatalf("the client reused its pooled connection after %v idle; the engine should have closed it", idle)
		}
		idle *= 2
		time.Sleep(idle)
	}
}

func TestKeepAliveDefaultsToVLLMs(t *testing.T) {
	e, err := New(Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := e.NewServer(nil).IdleTimeout; got != 5*time.Second {
		t.Errorf("default idle timeout %v, want vLLM's 5s", got)
	}
	for _, c := range []struct {
		env  string
		want time.Duration
		err  bool
	}{{"", 0, false}, {"7", 7 * time.Second, false}, {" 2 ", 2 * time.Second, false}, {"0", 0, true}, {"1.5", 0, true}, {"x", 0, true}} {
		got, err := ParseKeepAlive(c.env)
		if got != c.want || (err != nil) != c.err {
			t.Errorf("ParseKeepAlive(%q) = %v, %v; want %v, error %v", c.env, got, err, c.want, c.err)
		}
	}
}
