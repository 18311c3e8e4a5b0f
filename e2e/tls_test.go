package e2e

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/e2e/testkit"
)

// testCert is a self-signed certificate for 127.0.0.1 and localhost.
type testCert struct {
	certPEM, keyPEM []byte
	leaf            *x509.Certificate
}

func newTestCert(t *testing.T, cn string) testCert {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true, IsCA: true,
		DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return testCert{
		certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		keyPEM:  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
		leaf:    leaf,
	}
}

// write puts the certificate and key where the gateway reads them, as a
// renewal tool that rewrites the files in place would.
func (c testCert) write(t *testing.T, certPath, keyPath string) {
	t.Helper()
	if err := os.WriteFile(certPath, c.certPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyPath, c.keyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
}

// servedCert makes a new TLS connection to addr, trusting roots, and
// returns the certificate the server presented.
func servedCert(addr, serverName string, roots *x509.CertPool, within time.Duration) (*x509.Certificate, error) {
	d := &tls.Dialer{NetDialer: &net.Dialer{Timeout: within},
		Config: &tls.Config{RootCAs: roots, ServerName: serverName}}
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	return c.(*tls.Conn).ConnectionState().PeerCertificates[0], nil
}

// waitServed waits until new connections to addr see want, at most within.
func waitServed(t *testing.T, addr string, roots *x509.CertPool, want testCert, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		got, err := servedCert(addr, "localhost", roots, 5*time.Second)
		if err == nil && got.Equal(want.leaf) {
			return
		}
		if time.Now().After(deadline) {
			name := "none"
			if got != nil {
				name = got.Subject.CommonName
			}
			t.Fatalf("after %v new connections still see %s (err %v), want %s", within, name, err, want.leaf.Subject.CommonName)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitLogLine waits until a stderr line of p holds every one of parts (at
// most within) and returns it.
func waitLogLine(t *testing.T, p *process, within time.Duration, parts ...string) string {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		for _, line := range strings.Split(p.stderr.String(), "\n") {
			all := true
			for _, part := range parts {
				all = all && strings.Contains(line, part)
			}
			if all {
				return line
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no log line with %q after %v", parts, within)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

var tlsAPILine = regexp.MustCompile(`API\s+(https://(\S+))/v1`)

// startTLSGateway starts `tailgate gateway` with args and returns it and
// its API's https base URL.
func startTLSGateway(t *testing.T, args ...string) (*process, string) {
	t.Helper()
	p := startProc(t, "tailgate gateway", true, append([]string{"gateway", "--data", t.TempDir(),
		"--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"}, args...)...)
	var api string
	bound := time.AfterFunc(60*time.Second, func() { _ = p.Stop(0) })
	defer bound.Stop()
	p.scanUntil(func(line string) bool {
		if m := tlsAPILine.FindStringSubmatch(line); m != nil {
			api = m[1]
		}
		return strings.HasPrefix(line, "tailgate gateway: API")
	})
	if api == "" {
		t.Fatalf("the gateway printed no https API address; stderr:\n%s", p.stderr.String())
	}
	return p, api
}

// TestTLSCertReloadedOnSIGHUP: the gateway serves its API over HTTPS with
// the files' certificate, logs it, takes a replaced certificate on SIGHUP
// (file checks are off: 1h), and keeps the one it has when the replacement
// is broken, saying why.
func TestTLSCertReloadedOnSIGHUP(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the tailgate binary")
	}
	dir := t.TempDir()
	certPath, keyPath := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	a, b := newTestCert(t, "tailgate-cert-a"), newTestCert(t, "tailgate-cert-b")
	roots := x509.NewCertPool()
	roots.AddCert(a.leaf)
	roots.AddCert(b.leaf)
	a.write(t, certPath, keyPath)

	p, api := startTLSGateway(t, "--tls-cert", certPath, "--tls-key", keyPath, "--tls-check-interval", "1h")
	addr := strings.TrimPrefix(api, "https://")
	waitLogLine(t, p, 10*time.Second, "TLS certificate loaded", "tailgate-cert-a", "expires=", a.leaf.NotAfter.UTC().Format(time.RFC3339))
	waitLogLine(t, p, 10*time.Second, "gateway serving", "api="+api+"/v1")
	got, err := servedCert(addr, "localhost", roots, 10*time.Second)
	if err != nil || !got.Equal(a.leaf) {
		t.Fatalf("first connection: %v, cert %v; want tailgate-cert-a", err, got)
	}
	// The API answers over it (no replica yet: 503, in OpenAI's shape or not,
	// an HTTP answer over TLS).
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}}
	resp, err := hc.Get(api + "/healthz")
	if err != nil {
		t.Fatalf("GET /healthz over HTTPS: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("GET /healthz over HTTPS: %d, want 503 (no replica)", resp.StatusCode)
	}

	b.write(t, certPath, keyPath)
	if err := p.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitServed(t, addr, roots, b, 10*time.Second)
	waitLogLine(t, p, 10*time.Second, "TLS certificate reloaded", "trigger=SIGHUP", "tailgate-cert-b")

	// A half-written replacement: the certificate cut short.
	c := newTestCert(t, "tailgate-cert-c")
	if err := os.WriteFile(certPath, c.certPEM[:len(c.certPEM)/2], 0o600); err != nil {
		t.Fatal(err)
	}
	if err := p.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	line := waitLogLine(t, p, 10*time.Second, "TLS certificate not reloaded; still serving the previous one", "trigger=SIGHUP")
	for _, w := range []string{"level=WARN", certPath, "tailgate-cert-b"} {
		if !strings.Contains(line, w) {
			t.Errorf("warning lacks %q: %s", w, line)
		}
	}
	if got, err := servedCert(addr, "localhost", roots, 10*time.Second); err != nil || !got.Equal(b.leaf) {
		t.Fatalf("after a broken replacement: %v, cert %v; want tailgate-cert-b still", err, got)
	}
}

// TestTLSCertReloadedWhenFilesChange: with no signal, a renewal tool that
// rewrites the files is picked up by the file check; a half-written state
// on the way is skipped with a warning and the finished files are taken.
func TestTLSCertReloadedWhenFilesChange(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the tailgate binary")
	}
	dir := t.TempDir()
	certPath, keyPath := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	a, b, c := newTestCert(t, "tailgate-cert-a"), newTestCert(t, "tailgate-cert-b"), newTestCert(t, "tailgate-cert-c")
	roots := x509.NewCertPool()
	for _, x := range []testCert{a, b, c} {
		roots.AddCert(x.leaf)
	}
	a.write(t, certPath, keyPath)
	p, api := startTLSGateway(t, "--tls-cert", certPath, "--tls-key", keyPath, "--tls-check-interval", "100ms")
	addr := strings.TrimPrefix(api, "https://")
	waitServed(t, addr, roots, a, 10*time.Second)

	b.write(t, certPath, keyPath)
	waitServed(t, addr, roots, b, 20*time.Second)
	waitLogLine(t, p, 10*time.Second, "TLS certificate reloaded", `trigger="files changed"`, "tailgate-cert-b")

	// The new certificate is written, its key not yet: they do not match.
	if err := os.WriteFile(certPath, c.certPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	line := waitLogLine(t, p, 20*time.Second, "TLS certificate not reloaded", `trigger="files changed"`)
	if !strings.Contains(line, "private key does not match public key") {
		t.Errorf("warning does not say why: %s", line)
	}
	if got, err := servedCert(addr, "localhost", roots, 10*time.Second); err != nil || !got.Equal(b.leaf) {
		t.Fatalf("with a mismatched pair: %v, cert %v; want tailgate-cert-b still", err, got)
	}
	if err := os.WriteFile(keyPath, c.keyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	waitServed(t, addr, roots, c, 20*time.Second)
}

// TestACMECertificateFromPebble: `up --acme-domain` obtains its certificate
// from a real ACME CA (pebble, on loopback) that validates the domain over
// TLS-ALPN-01 against the gateway's own public listener; clients trusting
// the CA's root then reach the API over HTTPS, and the certificate is kept
// in DIR/acme.
func TestACMECertificateFromPebble(t *testing.T) {
	if testing.Short() {
		t.Skip("builds pebble and starts the tailgate binary")
	}
	dns := serveLoopbackDNS(t)
	pebble := newPebble(t, dns.addr)

	// The gateway first, to learn its port; pebble validates on it.
	const domain = "tailgate.test"
	dir := t.TempDir()
	p := startProc(t, "tailgate up", true, "up", "--data", dir, "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
		"--replicas", "1", "--acme-domain", domain, "--acme-email", "ops@tailgate.test",
		"--acme-directory", pebble.directory(), "--acme-ca-cert", pebble.caCert())
	var api string
	bound := time.AfterFunc(60*time.Second, func() { _ = p.Stop(0) })
	p.scanUntil(func(line string) bool {
		if m := tlsAPILine.FindStringSubmatch(line); m != nil {
			api = m[1]
		}
		return api != ""
	})
	bound.Stop()
	if !strings.HasPrefix(api, "https://"+domain+":") {
		t.Fatalf("up printed API %q, want https://%s:PORT/v1; stderr:\n%s", api, domain, p.stderr.String())
	}
	_, port, _ := net.SplitHostPort(strings.TrimPrefix(api, "https://"))
	addr := net.JoinHostPort("127.0.0.1", port)
	pebble.start(t, mustAtoi(t, port))
	issuing := pebble.issuing

	// The first handshake for the domain has the certificate issued:
	// autocert orders it, pebble connects back for TLS-ALPN-01.
	got, err := servedCert(addr, domain, issuing, 45*time.Second)
	if err != nil {
		t.Fatalf("TLS handshake for %s trusting pebble's root: %v", domain, err)
	}
	if !strings.Contains(got.Issuer.CommonName, "Pebble") || !slicesContain(got.DNSNames, domain) {
		t.Errorf("served certificate: issuer %q names %v; want one pebble issued for %s", got.Issuer, got.DNSNames, domain)
	}
	waitLogLine(t, p, 10*time.Second, "TLS certificate from ACME", "domain="+domain, "expires=")

	// The API over it: /v1/models lists the model once the replica is up.
	key := readToken(t, filepath.Join(dir, "demo.key"))
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: issuing},
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, addr) // the domain is this loopback port
		},
	}}
	var body []byte
	for deadline := time.Now().Add(30 * time.Second); ; {
		req, _ := http.NewRequest("GET", api+"/v1/models", nil)
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := hc.Do(req)
		if err == nil {
			body, _ = io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == 200 && bytes.Contains(body, []byte(`"tailgate-sim"`)) {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET %s/v1/models over HTTPS: %v %s", api, err, body)
		}
		time.Sleep(100 * time.Millisecond)
	}

	cached, err := filepath.Glob(filepath.Join(dir, "acme", "*", domain))
	if err != nil || len(cached) != 1 {
		t.Errorf("certificate cache %s/acme/*/%s: %v %v; want the certificate kept there", dir, domain, cached, err)
	}
}

// TestTLSHandshakeErrorsAreCountedNotLogged: failed TLS handshakes, which
// anyone can cause, are counted in tailgate_tls_handshake_errors_total and
// logged once a minute, not once each.
func TestTLSHandshakeErrorsAreCountedNotLogged(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the tailgate binary")
	}
	dir, data := t.TempDir(), t.TempDir()
	certPath, keyPath := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	newTestCert(t, "tailgate-cert-a").write(t, certPath, keyPath)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	admin := ln.Addr().String()
	ln.Close()
	p, api := startTLSGateway(t, "--tls-cert", certPath, "--tls-key", keyPath, "--data", data, "--admin-listen", admin)
	waitLogLine(t, p, 10*time.Second, "gateway serving")
	const failed = 5
	for range failed {
		// A client that does not trust the certificate gives up the handshake.
		c, err := tls.Dial("tcp", strings.TrimPrefix(api, "https://"), &tls.Config{ServerName: "localhost"})
		if err == nil {
			c.Close()
			t.Fatal("handshake with an untrusted certificate succeeded")
		}
	}
	g := &gatewayProcess{process: p, t: t, admin: "http://" + admin, token: readToken(t, filepath.Join(data, "admin.token"))}
	testkit.WaitWithin(t, 10*time.Second, "the failed handshakes are counted", func() bool {
		return g.metric("tailgate_tls_handshake_errors_total", `listener="public"`) == failed
	})
	if n := strings.Count(p.stderr.String(), "TLS handshake failed"); n != 1 {
		t.Errorf("%d log lines for %d failed handshakes, want 1:\n%s", n, failed, p.stderr.String())
	}
	if strings.Contains(p.stderr.String(), `msg="http: TLS handshake error`) {
		t.Error("a handshake error was logged as is, beside the counted line")
	}
}
