package main

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/binary"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"
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

// pebbleVersion is Let's Encrypt's test ACME server the ACME test builds
// from the Go module proxy (not a dependency of tailgate).
const pebbleVersion = "v2.10.3"

// TestACMECertificateFromPebble: `up --acme-domain` obtains its certificate
// from a real ACME CA (pebble, on loopback) that validates the domain over
// TLS-ALPN-01 against the gateway's own public listener; clients trusting
// the CA's root then reach the API over HTTPS, and the certificate is kept
// in DIR/acme.
func TestACMECertificateFromPebble(t *testing.T) {
	if testing.Short() {
		t.Skip("builds pebble and starts the tailgate binary")
	}
	pebbleBin, pebbleDir := buildPebble(t)
	dnsAddr := serveLoopbackDNS(t)

	// The gateway first, to learn its port; pebble validates on it.
	const domain = "tailgate.test"
	pebbleAddr, mgmtAddr := freeLoopbackAddr(t), freeLoopbackAddr(t)
	dir := t.TempDir()
	p := startProc(t, "tailgate up", true, "up", "--data", dir, "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
		"--replicas", "1", "--acme-domain", domain, "--acme-email", "ops@tailgate.test",
		"--acme-directory", "https://"+pebbleAddr+"/dir",
		"--acme-ca-cert", filepath.Join(pebbleDir, "test/certs/pebble.minica.pem"))
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

	cfg, err := json.Marshal(map[string]any{"pebble": map[string]any{
		"listenAddress": pebbleAddr, "managementListenAddress": mgmtAddr,
		"certificate": filepath.Join(pebbleDir, "test/certs/localhost/cert.pem"),
		"privateKey":  filepath.Join(pebbleDir, "test/certs/localhost/key.pem"),
		"httpPort":    5002, "tlsPort": mustAtoi(t, port),
		"ocspResponderURL": "", "externalAccountBindingRequired": false,
		"retryAfter": map[string]int{"authz": 1, "order": 1},
		"profiles":   map[string]any{"default": map[string]any{"description": "test", "validityPeriod": 7776000}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	cfgPath := filepath.Join(t.TempDir(), "pebble.json")
	if err := os.WriteFile(cfgPath, cfg, 0o600); err != nil {
		t.Fatal(err)
	}
	pebble := exec.Command(pebbleBin, "-config", cfgPath, "-dnsserver", dnsAddr)
	pebble.Env = append(os.Environ(), "PEBBLE_VA_NOSLEEP=1", "PEBBLE_WFE_NONCEREJECT=0")
	var pebbleOut syncBuffer
	pebble.Stdout, pebble.Stderr = &pebbleOut, &pebbleOut
	if err := pebble.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = pebble.Process.Kill()
		_ = pebble.Wait()
		if t.Failed() {
			t.Logf("pebble output:\n%s", pebbleOut.String())
		}
	})

	// Pebble's management API serves the root it issues under, over
	// HTTPS signed by its test CA.
	minica, err := os.ReadFile(filepath.Join(pebbleDir, "test/certs/pebble.minica.pem"))
	if err != nil {
		t.Fatal(err)
	}
	minicaPool := x509.NewCertPool()
	minicaPool.AppendCertsFromPEM(minica)
	mgmt := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: minicaPool}}}
	var rootPEM []byte
	for deadline := time.Now().Add(20 * time.Second); ; {
		resp, err := mgmt.Get("https://" + mgmtAddr + "/roots/0")
		if err == nil {
			rootPEM, err = io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK && err == nil {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("pebble's management API did not answer /roots/0 in 20s: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	issuing := x509.NewCertPool()
	if !issuing.AppendCertsFromPEM(rootPEM) {
		t.Fatalf("pebble's /roots/0 is not PEM: %q", rootPEM)
	}

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

func slicesContain(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

func mustAtoi(t *testing.T, s string) int {
	t.Helper()
	var n int
	if _, err := fmt.Sscan(s, &n); err != nil {
		t.Fatal(err)
	}
	return n
}

// buildPebble returns the pebble binary (TAILGATE_PEBBLE, or built from the
// Go module proxy) and pebble's module directory (its test certificates).
func buildPebble(t *testing.T) (bin, moduleDir string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	work := t.TempDir() // outside tailgate's module: nothing is added to go.mod
	mod := "github.com/letsencrypt/pebble/v2@" + pebbleVersion
	goCmd := func(args ...string) *exec.Cmd {
		cmd := exec.CommandContext(ctx, "go", args...)
		cmd.Dir = work
		cmd.Env = append(os.Environ(), "GOBIN="+work, "GOFLAGS=-mod=mod")
		return cmd
	}
	out, err := goCmd("mod", "download", "-json", mod).Output()
	var info struct{ Dir, Error string }
	if err == nil {
		err = json.Unmarshal(out, &info)
	}
	if err != nil || info.Dir == "" {
		t.Fatalf("go mod download %s: %v %s %s", mod, err, info.Error, stderrOf(err))
	}
	if bin = os.Getenv("TAILGATE_PEBBLE"); bin != "" {
		return bin, info.Dir
	}
	if out, err := goCmd("install", "github.com/letsencrypt/pebble/v2/cmd/pebble@"+pebbleVersion).CombinedOutput(); err != nil {
		t.Fatalf("go install pebble %s: %v\n%s", pebbleVersion, err, out)
	}
	return filepath.Join(work, "pebble"), info.Dir
}

func stderrOf(err error) string {
	if ee, ok := errors.AsType[*exec.ExitError](err); ok {
		return string(ee.Stderr)
	}
	return ""
}

// freeLoopbackAddr returns a loopback address with a port free a moment ago.
func freeLoopbackAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// serveLoopbackDNS answers every A question with 127.0.0.1 and any other
// with no record, over TCP and UDP on one loopback port, until the test
// ends; it returns its address. Pebble resolves the domain it validates
// through it (over TCP).
func serveLoopbackDNS(t *testing.T) string {
	t.Helper()
	var (
		ln  net.Listener
		pc  net.PacketConn
		err error
	)
	for range 10 { // the UDP port of the same number may be taken
		if ln, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
		if pc, err = net.ListenPacket("udp", ln.Addr().String()); err == nil {
			break
		}
		ln.Close()
	}
	if err != nil {
		t.Fatalf("no loopback port free for both TCP and UDP: %v", err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); pc.Close(); wg.Wait() })
	wg.Go(func() {
		buf := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			if out := dnsAnswer(buf[:n]); out != nil {
				_, _ = pc.WriteTo(out, from)
			}
		}
	})
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(10 * time.Second))
				for { // messages framed by a two-byte length (RFC 1035 4.2.2)
					var size [2]byte
					if _, err := io.ReadFull(c, size[:]); err != nil {
						return
					}
					q := make([]byte, binary.BigEndian.Uint16(size[:]))
					if _, err := io.ReadFull(c, q); err != nil {
						return
					}
					out := dnsAnswer(q)
					if out == nil {
						return
					}
					if _, err := c.Write(append(binary.BigEndian.AppendUint16(nil, uint16(len(out))), out...)); err != nil {
						return
					}
				}
			})
		}
	})
	return ln.Addr().String()
}

// dnsAnswer answers a DNS query: A 127.0.0.1 for any name, no record of
// any other type; nil for a message that is not one question.
func dnsAnswer(query []byte) []byte {
	var m dnsmessage.Message
	if err := m.Unpack(query); err != nil || len(m.Questions) != 1 {
		return nil
	}
	q := m.Questions[0]
	m.Header.Response, m.Header.Authoritative, m.Header.RCode = true, true, dnsmessage.RCodeSuccess
	m.Answers, m.Authorities, m.Additionals = nil, nil, nil
	if q.Type == dnsmessage.TypeA {
		m.Answers = []dnsmessage.Resource{{
			Header: dnsmessage.ResourceHeader{Name: q.Name, Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET, TTL: 60},
			Body:   &dnsmessage.AResource{A: [4]byte{127, 0, 0, 1}},
		}}
	}
	out, err := m.Pack()
	if err != nil {
		return nil
	}
	return out
}
