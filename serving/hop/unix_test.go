package hop

import (
	"errors"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

// TestDialUnixReachesTheSocketWhateverTheHost: requests to a made-up host
// reach the server on the socket the hook names at each dial, and before
// there is one they fail as a dial error.
func TestDialUnixReachesTheSocketWhateverTheHost(t *testing.T) {
	t.Parallel()
	sock := filepath.Join(t.TempDir(), "engine.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "host "+r.Host)
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })

	var path atomic.Pointer[string]
	empty := ""
	path.Store(&empty)
	tr := &Transport{Dial: DialUnix(func() string { return *path.Load() }, 2*time.Second)}
	t.Cleanup(tr.CloseIdleConnections)
	get := func() (string, error) {
		req, _ := http.NewRequest(http.MethodGet, "http://engine.invalid/x", nil)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return string(b), err
	}
	if _, err := get(); err == nil {
		t.Fatal("a request before there is a socket succeeded")
	} else if op, ok := errors.AsType[*net.OpError](err); !ok || op.Op != "dial" {
		t.Fatalf("error before there is a socket = %v, want a dial error", err)
	}
	path.Store(&sock)
	for range 2 {
		if got, err := get(); err != nil || got != "host engine.invalid" {
			t.Fatalf("GET over the socket = %q, %v", got, err)
		}
	}
}
