package e2e

import (
	"context"
	"crypto/tls"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/mesh"
	"github.com/tailgate-dev/tailgate/mesh/meshtest"
)

// TestMeshFunnelServesAPIOnTheInternet: `gateway --mesh --mesh-funnel`
// serves the public API through Tailscale Funnel at
// https://NODE.TAILNET-DOMAIN/ with the node's certificate (from pebble
// through DNS-01, as in TestMeshTLSServesAPIWithTailnetCertificate). A
// node of the test tailnet stands in for Tailscale's Funnel relay: it hands
// the connection to the gateway node's peer API as the relays do, and from
// there on it is tailscale's real Funnel path into the gateway. A client
// trusting only pebble's root gets a chat answer that way; the admin
// routes are not served there even with the admin token.
func TestMeshFunnelServesAPIOnTheInternet(t *testing.T) {
	if testing.Short() {
		t.Skip("builds pebble and starts the tailgate binary")
	}
	dns := serveLoopbackDNS(t)
	pebble := newPebble(t, dns.addr)
	pebble.start(t, 5001)
	pebble.finalizeLocation(t)
	var published atomic.Int32
	control := meshtest.StartControl(t, meshtest.OnSetDNS(func(name, value string) {
		dns.setTXT(name, value)
		published.Add(1)
	}))
	t.Setenv("TS_DEBUG_ACME_DIRECTORY_URL", pebble.directory())
	t.Setenv("SSL_CERT_FILE", pebble.caCert())

	// With --mesh-tls too: both serve port 443 of the node, one on the
	// tailnet, one through Funnel, with one certificate.
	g := startGateway(t, "--mesh", "--mesh-control-url", control, "--mesh-ephemeral", "--mesh-hostname", "tg-gateway", "--mesh-funnel", "--mesh-tls")
	const domain = "tg-gateway.tail-scale.ts.net"
	waitLogLine(t, g.process, 20*time.Second, "public API on the internet through Tailscale Funnel", "url=https://"+domain+"/v1")
	g.startWorker("w1")
	g.waitReady("w1")
	waitLogLine(t, g.process, 120*time.Second, "mesh: HTTPS certificate obtained", "domain="+domain, "Pebble")
	if published.Load() == 0 {
		t.Fatal("the certificate came without a DNS-01 record published through the control server")
	}
	if hostListens(t, 443) {
		t.Fatal("something listens on port 443 on the host; Funnel needs no inbound port")
	}

	relay := meshtest.StartFunnelIngress(t, control)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	hc := &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{
		DialContext:     relay.DialContext,
		TLSClientConfig: &tls.Config{RootCAs: pebble.issuing},
	}}
	do := func(method, path, auth, body string) (*http.Response, string) {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, method, "https://"+domain+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+auth)
		req.Header.Set("Content-Type", "application/json")
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatalf("%s https://%s%s through Funnel: %v", method, domain, path, err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp, string(raw)
	}
	resp, body := do(http.MethodPost, "/v1/chat/completions", g.key,
		`{"model":"tailgate-sim","max_tokens":4,"messages":[{"role":"user","content":"hello there"}]}`)
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, `"choices"`) || resp.Header.Get("X-Tailgate-Replica") != "w1" {
		t.Fatalf("chat through Funnel: %d %s", resp.StatusCode, body)
	}
	leaf := resp.TLS.PeerCertificates[0]
	if len(resp.TLS.VerifiedChains) == 0 || !slicesContain(leaf.DNSNames, domain) || !strings.Contains(leaf.Issuer.CommonName, "Pebble") {
		t.Fatalf("served certificate: names %v issuer %q; want pebble's for %s", leaf.DNSNames, leaf.Issuer, domain)
	}
	// A streamed answer comes through whole.
	resp, body = do(http.MethodPost, "/v1/chat/completions", g.key,
		`{"model":"tailgate-sim","max_tokens":4,"stream":true,"messages":[{"role":"user","content":"hello there"}]}`)
	if resp.StatusCode != http.StatusOK || !strings.HasSuffix(body, "data: [DONE]\n\n") {
		t.Fatalf("stream through Funnel: %d %s", resp.StatusCode, body)
	}
	// What an edge polls is there too.
	if resp, body = do(http.MethodGet, "/edge/v1/status", readToken(t, filepath.Join(g.dir, "edge.token")), ""); resp.StatusCode != http.StatusOK || !strings.Contains(body, "tailgate-sim") {
		t.Fatalf("the region status through Funnel: %d %s", resp.StatusCode, body)
	}
	// Keys are checked there as anywhere.
	if resp, body = do(http.MethodGet, "/v1/models", "sk-not-a-key", ""); resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("a bad key through Funnel: %d %s", resp.StatusCode, body)
	}
	// A tailnet client still reaches the API at the same name and port.
	peer, err := mesh.Up(ctx, mesh.Config{Hostname: "tg-client", Dir: filepath.Join(t.TempDir(), "mesh"), ControlURL: control, Ephemeral: true})
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	onTailnet := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		DialContext: peer.Dial, TLSClientConfig: &tls.Config{RootCAs: pebble.issuing}}}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+domain+"/v1/models", nil)
	req.Header.Set("Authorization", "Bearer "+g.key)
	if resp, err := onTailnet.Do(req); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /v1/models on the tailnet beside Funnel: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	// The admin routes are never on the internet, even with the admin token.
	for _, path := range []string{"/metrics", "/admin/v1/replicas", "/ui/"} {
		if resp, body = do(http.MethodGet, path, g.token, ""); resp.StatusCode != http.StatusNotFound {
			t.Errorf("GET %s through Funnel with the admin token: %d, want 404; %.200s", path, resp.StatusCode, body)
		}
	}
}

// TestMeshFunnelNeedsTheTailnetToAllowIt: --mesh-funnel on a tailnet that
// issues certificates but does not grant the node the funnel attribute
// stops the gateway at start with one line naming what the tailnet
// administrator must enable; without --mesh it is a flag error.
func TestMeshFunnelNeedsTheTailnetToAllowIt(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the tailgate binary")
	}
	control := meshtest.StartControl(t, meshtest.NoFunnel())
	code, stderr := runToExit(t, 90*time.Second, "gateway", "--data", t.TempDir(), "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
		"--mesh", "--mesh-control-url", control, "--mesh-ephemeral", "--mesh-funnel")
	if code != 1 || strings.Contains(stderr, "panic") {
		t.Fatalf("exit status %d; stderr:\n%s", code, stderr)
	}
	line := errorLine(t, stderr)
	t.Logf("error line: %s", line)
	for _, w := range []string{"--mesh-funnel", "does not allow Funnel", `"funnel" node attribute`, "nodeAttrs", "HTTPS certificates", "cloudflared"} {
		if !strings.Contains(line, w) {
			t.Errorf("error line lacks %q: %s", w, line)
		}
	}

	code, stderr = runToExit(t, 30*time.Second, "gateway", "--data", t.TempDir(), "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--mesh-funnel")
	if line := errorLine(t, stderr); code != 2 && code != 1 || !strings.Contains(line, "--mesh-funnel needs --mesh") {
		t.Errorf("--mesh-funnel without --mesh: exit %d, %s", code, line)
	}
}
