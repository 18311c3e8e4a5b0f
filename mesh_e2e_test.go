package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"tailgate/mesh/meshtest"
)

// hostListens reports whether anything listens on TCP port on the host
// (any address, IPv4 or IPv6), from /proc/net/tcp{,6}.
func hostListens(t *testing.T, port int) bool {
	t.Helper()
	suffix := fmt.Sprintf(":%04X", port)
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		raw, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(raw), "\n")[1:] {
			fields := strings.Fields(line)
			// local_address is fields[1]; state 0A is LISTEN.
			if len(fields) > 3 && strings.HasSuffix(fields[1], suffix) && fields[3] == "0A" {
				return true
			}
		}
	}
	return false
}

func TestMeshGatewayToWorkersOverWireGuard(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the tailgate binary")
	}
	control := meshtest.StartControl(t)
	meshArgs := []string{"--mesh", "--mesh-control-url", control, "--mesh-ephemeral"}
	g := startGateway(t, append(meshArgs, "--mesh-hostname", "tg-gateway", "--mesh-allow-peers", "tg-w1,tg-w2",
		"--slow-start", "0")...) // both fresh replicas take requests at once
	u, _ := url.Parse(g.admin)
	gatewayOnTailnet := "http://tg-gateway:" + u.Port()

	w1 := g.startWorker("w1", append(meshArgs, "--gateway", gatewayOnTailnet, "--listen", "127.0.0.1:9411")...)
	g.startWorker("w2", append(meshArgs, "--gateway", gatewayOnTailnet, "--listen", "127.0.0.1:9411")...)
	g.waitReady("w1", "w2")
	for _, r := range g.replicas() {
		if !strings.HasPrefix(r.Address, "http://100.") || !strings.HasSuffix(r.Address, ":9411") {
			t.Fatalf("replica %s registered %q, want its tailnet address", r.ID, r.Address)
		}
	}
	// Each worker's credential is bound to the tailnet node it registered from.
	req, _ := http.NewRequest(http.MethodGet, g.admin+"/admin/v1/workers", nil)
	req.Header.Set("Authorization", "Bearer "+g.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, peer := range []string{`"peer":"tg-w1"`, `"peer":"tg-w2"`} {
		if !strings.Contains(string(raw), peer) {
			t.Fatalf("workers %s: want %s", raw, peer)
		}
	}
	// The sidecars listen on the tailnet only: nothing on the host.
	if hostListens(t, 9411) {
		t.Fatal("a sidecar port is open on the host in mesh mode")
	}
	if c, err := net.DialTimeout("tcp", "127.0.0.1:9411", time.Second); err == nil {
		c.Close()
		t.Fatal("the sidecar answered on the host's loopback")
	}

	seen := map[string]bool{}
	for i := range 12 {
		code, h, body, err := g.chat(context.Background(), i%2 == 0, 4)
		if err != nil || code != 200 {
			t.Fatalf("request %d over the mesh: %d %v %s", i, code, err, body)
		}
		if i%2 == 0 && !strings.HasSuffix(body, "data: [DONE]\n\n") {
			t.Fatalf("stream over the mesh did not finish: %s", body)
		}
		seen[h.Get("X-Tailgate-Replica")] = true
	}
	if !seen["w1"] || !seen["w2"] {
		t.Fatalf("requests went to %v, want both workers", seen)
	}

	// A worker node that stops is failed over like any replica.
	if err := w1.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "stopped mesh worker out of routing", func() bool { return g.state("w1") != "ready" })
	for i := range 6 {
		code, h, _, err := g.chat(context.Background(), i%2 == 0, 4)
		if err != nil || code != 200 || h.Get("X-Tailgate-Replica") != "w2" {
			t.Fatalf("after the worker stopped: %d %v via %q", code, err, h.Get("X-Tailgate-Replica"))
		}
	}
}

func TestMeshRefusesPeersNotAllowed(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the tailgate binary")
	}
	control := meshtest.StartControl(t)
	meshArgs := []string{"--mesh", "--mesh-control-url", control, "--mesh-ephemeral"}
	g := startGateway(t, append(meshArgs, "--mesh-hostname", "tg-gateway", "--mesh-allow-peers", "tg-trusted")...)
	u, _ := url.Parse(g.admin)
	w := g.startWorker("intruder", append(meshArgs, "--gateway", "http://tg-gateway:"+u.Port(), "--listen", "127.0.0.1:9412")...)
	waitFor(t, 20*time.Second, "worker told it is refused", func() bool {
		return strings.Contains(w.stderr.String(), "403") || strings.Contains(w.stderr.String(), "not in --mesh-allow-peers")
	})
	if st := g.state("intruder"); st != "gone" {
		t.Fatalf("a peer outside --mesh-allow-peers registered (state %s)", st)
	}
}
