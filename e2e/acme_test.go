package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"

	"github.com/tailgate-dev/tailgate/e2e/testkit"
)

// The ACME test CA the TLS tests run (TestACMECertificateFromPebble,
// TestMeshTLSServesAPIWithTailnetCertificate): Let's Encrypt's pebble,
// built from the Go module proxy, and a loopback DNS server it resolves
// through.

// pebbleVersion is Let's Encrypt's test ACME server the ACME tests build
// from the Go module proxy (not a dependency of tailgate).
const pebbleVersion = "v2.10.3"

// pebbleCA is an ACME CA on loopback: newPebble builds it and picks its
// addresses, start runs it.
type pebbleCA struct {
	bin, moduleDir string
	addr, mgmtAddr string // ACME and management listeners
	dnsAddr        string // the DNS server it resolves through
	proxyAddr      string // with finalizeLocation: the proxy clients use

	// issuing holds the root pebble issues certificates under, once started.
	issuing *x509.CertPool
}

func newPebble(t *testing.T, dnsAddr string) *pebbleCA {
	t.Helper()
	bin, dir := buildPebble(t)
	return &pebbleCA{bin: bin, moduleDir: dir, addr: freeLoopbackAddr(t), mgmtAddr: freeLoopbackAddr(t), dnsAddr: dnsAddr}
}

// directory is the CA's ACME directory URL.
func (p *pebbleCA) directory() string {
	if p.proxyAddr != "" {
		return "https://" + p.proxyAddr + "/dir"
	}
	return "https://" + p.addr + "/dir"
}

// finalizeLocation puts a proxy in front of pebble's ACME listener, for
// the test's duration, that adds the order's URL as the Location header
// of finalize answers; directory() then names the proxy. Pebble finalizes
// asynchronously (the answer says "processing") and sends no Location
// there; tailscale's ACME client (tailscale.com/tempfork/acme,
// CreateOrderCert, v1.102.5) then polls the order at that header and
// fails with `Post "": unsupported protocol scheme`. golang.org/x/crypto's
// acme takes the order's URL from the order instead, so autocert needs no
// proxy.
func (p *pebbleCA) finalizeLocation(t *testing.T) {
	t.Helper()
	minica, err := os.ReadFile(p.caCert())
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(minica)
	cert, err := tls.LoadX509KeyPair(filepath.Join(p.moduleDir, "test/certs/localhost/cert.pem"),
		filepath.Join(p.moduleDir, "test/certs/localhost/key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	target := &url.URL{Scheme: "https", Host: p.addr}
	proxy := &httputil.ReverseProxy{
		// The Host stays the proxy's: pebble builds its URLs from it.
		Rewrite:   func(r *httputil.ProxyRequest) { r.SetURL(target); r.Out.Host = r.In.Host },
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}},
		ModifyResponse: func(resp *http.Response) error {
			if id, ok := strings.CutPrefix(resp.Request.URL.Path, "/finalize-order/"); ok && resp.Header.Get("Location") == "" {
				resp.Header.Set("Location", "https://"+resp.Request.Host+"/my-order/"+id)
			}
			return nil
		},
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}})
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: proxy, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	p.proxyAddr = ln.Addr().String()
}

// caCert is the PEM root pebble's own HTTPS (ACME and management) is
// signed with.
func (p *pebbleCA) caCert() string {
	return filepath.Join(p.moduleDir, "test/certs/pebble.minica.pem")
}

// start runs pebble until the test ends, validating TLS-ALPN-01 on
// tlsPort, and waits for the root it issues under. env is added to its
// environment (e.g. PEBBLE_VA_ALWAYS_VALID=1).
func (p *pebbleCA) start(t *testing.T, tlsPort int, env ...string) {
	t.Helper()
	cfg, err := json.Marshal(map[string]any{"pebble": map[string]any{
		"listenAddress": p.addr, "managementListenAddress": p.mgmtAddr,
		"certificate": filepath.Join(p.moduleDir, "test/certs/localhost/cert.pem"),
		"privateKey":  filepath.Join(p.moduleDir, "test/certs/localhost/key.pem"),
		"httpPort":    5002, "tlsPort": tlsPort,
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
	pebble := exec.Command(p.bin, "-config", cfgPath, "-dnsserver", p.dnsAddr)
	pebble.Env = append(append(os.Environ(), "PEBBLE_VA_NOSLEEP=1", "PEBBLE_WFE_NONCEREJECT=0"), env...)
	var out testkit.Buffer
	pebble.Stdout, pebble.Stderr = &out, &out
	if err := pebble.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = pebble.Process.Kill()
		_ = pebble.Wait()
		if t.Failed() {
			t.Logf("pebble output:\n%s", out.String())
		}
	})

	// Pebble's management API serves the root it issues under, over
	// HTTPS signed by its test CA.
	minica, err := os.ReadFile(p.caCert())
	if err != nil {
		t.Fatal(err)
	}
	minicaPool := x509.NewCertPool()
	minicaPool.AppendCertsFromPEM(minica)
	mgmt := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: minicaPool}}}
	var rootPEM []byte
	for deadline := time.Now().Add(20 * time.Second); ; {
		resp, err := mgmt.Get("https://" + p.mgmtAddr + "/roots/0")
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
	p.issuing = x509.NewCertPool()
	if !p.issuing.AppendCertsFromPEM(rootPEM) {
		t.Fatalf("pebble's /roots/0 is not PEM: %q", rootPEM)
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

// loopbackDNS is a DNS server on loopback for the test: A 127.0.0.1 for
// any name, TXT records as set (an ACME DNS-01 challenge), no other record.
type loopbackDNS struct {
	addr string // TCP and UDP, same port

	mu  sync.Mutex
	txt map[string][]string // lower-case name without the final dot → values
}

// setTXT publishes a TXT record, as a DNS provider does for DNS-01.
func (d *loopbackDNS) setTXT(name, value string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	name = strings.TrimSuffix(strings.ToLower(name), ".")
	d.txt[name] = append(d.txt[name], value)
}

func (d *loopbackDNS) txtOf(name string) []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.txt[strings.TrimSuffix(strings.ToLower(name), ".")]
}

// serveLoopbackDNS runs a loopbackDNS over TCP and UDP on one loopback
// port until the test ends. Pebble resolves the domains it validates
// through it.
func serveLoopbackDNS(t *testing.T) *loopbackDNS {
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
	d := &loopbackDNS{addr: ln.Addr().String(), txt: map[string][]string{}}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); pc.Close(); wg.Wait() })
	wg.Go(func() {
		buf := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			if out := d.answer(buf[:n]); out != nil {
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
					out := d.answer(q)
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
	return d
}

// answer answers a DNS query: A 127.0.0.1 for any name, the TXT records
// set for the name, no record of any other type; nil for a message that
// is not one question.
func (d *loopbackDNS) answer(query []byte) []byte {
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
	if q.Type == dnsmessage.TypeTXT {
		for _, v := range d.txtOf(q.Name.String()) {
			m.Answers = append(m.Answers, dnsmessage.Resource{
				Header: dnsmessage.ResourceHeader{Name: q.Name, Type: dnsmessage.TypeTXT, Class: dnsmessage.ClassINET, TTL: 0},
				Body:   &dnsmessage.TXTResource{TXT: []string{v}},
			})
		}
	}
	out, err := m.Pack()
	if err != nil {
		return nil
	}
	return out
}
