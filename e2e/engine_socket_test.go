package e2e

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"tailgate/e2e/testkit"
)

// TestWorkerEngineListensOnNoTCPPort: `tailgate worker --engine sim` serves
// chat end to end through the gateway while its engine process (`tailgate
// sim --uds`) listens on no TCP port: vLLM's API key guards only /v1, so a
// port would let anyone on the box call /invocations, /tokenize, /rerank …
// unmetered. Its one listening socket is a Unix socket of mode 0600 in a
// directory of mode 0700, both the worker's user's.
func TestWorkerEngineListensOnNoTCPPort(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the tailgate binary")
	}
	g := startGateway(t)
	w := g.startWorker("w1")
	g.waitReady("w1")
	for _, stream := range []bool{false, true} {
		if status, _, body, err := g.chat(context.Background(), stream, 4); err != nil || status != http.StatusOK {
			t.Fatalf("chat (stream %v) through the gateway: %d %s %v", stream, status, body, err)
		}
	}

	engine := enginePID(t, w.PID()) // its child running `tailgate sim --uds`
	tcp, unix := testkit.Listening(t, engine)
	if len(tcp) != 0 {
		t.Errorf("engine (pid %d) listens on %d TCP sockets, want none", engine, len(tcp))
	}
	if len(unix) != 1 {
		t.Fatalf("engine listens on Unix sockets %q, want one", unix)
	}
	for _, c := range []struct {
		path string
		mode os.FileMode
	}{{unix[0], os.ModeSocket | 0o600}, {filepath.Dir(unix[0]), os.ModeDir | 0o700}} {
		fi, err := os.Lstat(c.path)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode() != c.mode || int(fi.Sys().(*syscall.Stat_t).Uid) != os.Getuid() {
			t.Errorf("%s: mode %v, want %v owned by the worker's user", c.path, fi.Mode(), c.mode)
		}
	}
	// The same check sees a TCP listener where there is one: the worker's
	// sidecar.
	if tcp, _ := testkit.Listening(t, w.PID()); len(tcp) == 0 {
		t.Error("the check finds no TCP listener in the worker, whose sidecar listens on one")
	}
}
