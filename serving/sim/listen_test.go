package sim

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestListenUnixServesOnAPrivateSocket: the engine answers on the socket,
// which only its user may open (0600), refuses a path that exists, and
// the socket is gone once the listener is closed.
func TestListenUnixServesOnAPrivateSocket(t *testing.T) {
	t.Parallel()
	sock := filepath.Join(t.TempDir(), "engine.sock")
	ln, err := ListenUnix(sock)
	if err != nil {
		t.Fatal(err)
	}
	e, err := New(Config{Model: "m"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	srv := e.NewServer(nil)
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ln) }()

	if fi, err := os.Lstat(sock); err != nil || fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket %s: %v, %v; want a socket of mode 0600", sock, fi.Mode(), err)
	}
	client := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}}
	resp, err := client.Get("http://engine/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"id":"m"`) {
		t.Errorf("GET /v1/models over the socket: %d %s", resp.StatusCode, body)
	}
	if _, err := ListenUnix(sock); err == nil || !strings.Contains(err.Error(), "the path exists") {
		t.Errorf("a second ListenUnix on the same path = %v, want it refused", err)
	}

	client.CloseIdleConnections()
	_ = srv.Close()
	<-done
	if _, err := os.Lstat(sock); !os.IsNotExist(err) {
		t.Errorf("socket still there after the listener closed: %v", err)
	}
}
