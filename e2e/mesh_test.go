package e2e

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/e2e/testkit"
	"github.com/tailgate-dev/tailgate/mesh"
	"github.com/tailgate-dev/tailgate/mesh/meshtest"
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
		code, h, body, err := g.chatDistinct(context.Background(), i%2 == 0, 4, i)
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
	testkit.WaitWithin(t, 10*time.Second, "stopped mesh worker out of routing", func() bool { return g.state("w1") != "ready" })
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
	testkit.WaitWithin(t, 20*time.Second, "worker told it is refused", func() bool {
		return strings.Contains(w.stderr.String(), "403") || strings.Contains(w.stderr.String(), "not in --mesh-allow-peers")
	})
	if st := g.state("intruder"); st != "gone" {
		t.Fatalf("a peer outside --mesh-allow-peers registered (state %s)", st)
	}
}

// TestMeshTLSServesAPIWithTailnetCertificate: `gateway --mesh --mesh-tls`
// serves the public API on the tailnet at https://NODE.TAILNET-DOMAIN/ with
// a certificate from the tailnet's ACME CA. The CA is pebble, pointed at by
// tailscale's TS_DEBUG_ACME_DIRECTORY_URL (its HTTPS trusted through
// SSL_CERT_FILE); it validates DNS-01: the gateway's node asks the control
// server to publish the TXT record, the test control server hands it to
// the DNS server pebble resolves through. A second node of the tailnet,
// trusting only pebble's root, then gets a chat answer over HTTPS.
func TestMeshTLSServesAPIWithTailnetCertificate(t *testing.T) {
	if testing.Short() {
		t.Skip("builds pebble and starts the tailgate binary")
	}
	dns := serveLoopbackDNS(t)
	pebble := newPebble(t, dns.addr)
	pebble.start(t, 5001) // TLS-ALPN-01 is not used: nothing listens there
	pebble.finalizeLocation(t)
	var published atomic.Int32
	control := meshtest.StartControl(t, meshtest.OnSetDNS(func(name, value string) {
		dns.setTXT(name, value)
		published.Add(1)
	}))
	t.Setenv("TS_DEBUG_ACME_DIRECTORY_URL", pebble.directory()) // the gateway inherits both
	t.Setenv("SSL_CERT_FILE", pebble.caCert())

	g := startGateway(t, "--mesh", "--mesh-control-url", control, "--mesh-ephemeral", "--mesh-hostname", "tg-gateway", "--mesh-tls")
	const domain = "tg-gateway.tail-scale.ts.net"
	waitLogLine(t, g.process, 20*time.Second, "public API on the tailnet over HTTPS", "url=https://"+domain+"/v1")
	g.startWorker("w1")
	g.waitReady("w1")
	waitLogLine(t, g.process, 120*time.Second, "mesh: HTTPS certificate obtained", "domain="+domain, "Pebble")
	if published.Load() == 0 {
		t.Fatal("the certificate came without a DNS-01 record published through the control server")
	}

	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	client, err := mesh.Up(ctx, mesh.Config{Hostname: "tg-client", Dir: filepath.Join(t.TempDir(), "mesh"), ControlURL: control, Ephemeral: true})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		DialContext:     client.Dial,
		TLSClientConfig: &tls.Config{RootCAs: pebble.issuing},
	}}
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "https://"+domain+"/v1/chat/completions",
		strings.NewReader(`{"model":"tailgate-sim","max_tokens":4,"messages":[{"role":"user","content":"hello there"}]}`))
	req.Header.Set("Authorization", "Bearer "+g.key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("POST https://%s/v1/chat/completions over the tailnet, trusting pebble's root: %v", domain, err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"choices"`) || resp.Header.Get("X-Tailgate-Replica") != "w1" {
		t.Fatalf("chat over the tailnet: %d %s", resp.StatusCode, body)
	}
	leaf := resp.TLS.PeerCertificates[0]
	if len(resp.TLS.VerifiedChains) == 0 || !slicesContain(leaf.DNSNames, domain) || !strings.Contains(leaf.Issuer.CommonName, "Pebble") {
		t.Fatalf("served certificate: names %v issuer %q, %d verified chains; want pebble's for %s", leaf.DNSNames, leaf.Issuer, len(resp.TLS.VerifiedChains), domain)
	}
}

// TestMeshTLSNeedsTailnetCertificates: --mesh-tls on a tailnet that issues
// no HTTPS certificates (Tailscale with HTTPS off, any Headscale) stops the
// gateway at start with one line saying so and what to do; without --mesh
// it is refused as a flag error.
func TestMeshTLSNeedsTailnetCertificates(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the tailgate binary")
	}
	control := meshtest.StartControl(t, meshtest.NoHTTPS())
	code, stderr := runToExit(t, 90*time.Second, "gateway", "--data", t.TempDir(), "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
		"--mesh", "--mesh-control-url", control, "--mesh-ephemeral", "--mesh-tls")
	if code != 1 || strings.Contains(stderr, "panic") {
		t.Fatalf("exit status %d; stderr:\n%s", code, stderr)
	}
	line := errorLine(t, stderr)
	for _, w := range []string{"--mesh-tls", "issues no HTTPS certificates", "admin console", "Headscale", "--tls-cert"} {
		if !strings.Contains(line, w) {
			t.Errorf("error line lacks %q: %s", w, line)
		}
	}

	code, stderr = runToExit(t, 30*time.Second, "gateway", "--data", t.TempDir(), "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--mesh-tls")
	if line := errorLine(t, stderr); code != 2 && code != 1 || !strings.Contains(line, "--mesh-tls needs --mesh") {
		t.Errorf("--mesh-tls without --mesh: exit %d, %s", code, line)
	}
}
