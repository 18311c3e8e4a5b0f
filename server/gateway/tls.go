package gateway

import (
	"context"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/crypto/acme"
	"golang.org/x/crypto/acme/autocert"
)

// TLSConfig is the public listener's TLS settings (`gateway` and `up`):
// a certificate from files, or certificates from an ACME CA. Neither: plain
// HTTP, as before.
type TLSConfig struct {
	CertFile      string        // --tls-cert
	KeyFile       string        // --tls-key
	CheckInterval time.Duration // --tls-check-interval; 0: 5s
	ACMEDomains   string        // --acme-domain, comma-separated
	ACMEEmail     string        // --acme-email; "": an account without contact
	ACMEDirectory string        // --acme-directory; Let's Encrypt by default
	ACMECACert    string        // --acme-ca-cert; "": the system's roots only
}

const defaultCertCheck = 5 * time.Second

func (f *TLSConfig) register(fs *flag.FlagSet) {
	fs.StringVar(&f.CertFile, "tls-cert", "", "serve the public API over HTTPS with this PEM certificate (and chain); needs --tls-key; reloaded on SIGHUP and when the files change")
	fs.StringVar(&f.KeyFile, "tls-key", "", "PEM private key of --tls-cert")
	fs.DurationVar(&f.CheckInterval, "tls-check-interval", defaultCertCheck, "how often --tls-cert and --tls-key are checked for a change")
	fs.StringVar(&f.ACMEDomains, "acme-domain", "", "serve the public API over HTTPS with certificates from an ACME CA (Let's Encrypt by default) for these domains, comma-separated; the CA checks TLS-ALPN-01 on port 443 of each")
	fs.StringVar(&f.ACMEEmail, "acme-email", "", "with --acme-domain: contact address of the ACME account (the CA's expiry notices)")
	fs.StringVar(&f.ACMEDirectory, "acme-directory", acme.LetsEncryptURL, "with --acme-domain: directory URL of the ACME CA")
	fs.StringVar(&f.ACMECACert, "acme-ca-cert", "", "with --acme-domain: PEM root certificate that signs the ACME directory's HTTPS (a private CA)")
}

// Validate reports the first TLS setting that cannot work; the files are
// read later, by openPublicTLS.
func (f *TLSConfig) Validate() error {
	acmeOn := f.ACMEDomains != ""
	switch {
	case f.CertFile != "" && f.KeyFile == "":
		return errors.New("--tls-cert needs --tls-key (the certificate's private key)")
	case f.KeyFile != "" && f.CertFile == "":
		return errors.New("--tls-key needs --tls-cert (the certificate of the key)")
	case f.CertFile != "" && acmeOn:
		return errors.New("--tls-cert and --acme-domain: give one, your own certificate or certificates from ACME")
	case f.CertFile == "" && f.CheckInterval != defaultCertCheck && f.CheckInterval != 0:
		return errors.New("--tls-check-interval needs --tls-cert")
	case f.CheckInterval < 0:
		return fmt.Errorf("--tls-check-interval %v: want a positive duration (0: %v)", f.CheckInterval, defaultCertCheck)
	case !acmeOn && f.ACMEEmail != "":
		return errors.New("--acme-email needs --acme-domain")
	case !acmeOn && f.ACMECACert != "":
		return errors.New("--acme-ca-cert needs --acme-domain")
	case !acmeOn && f.ACMEDirectory != acme.LetsEncryptURL:
		return errors.New("--acme-directory needs --acme-domain")
	}
	if !acmeOn {
		return nil
	}
	if _, err := f.domains(); err != nil {
		return err
	}
	if u, err := url.Parse(f.ACMEDirectory); err != nil || u.Scheme != "https" || u.Host == "" {
		return fmt.Errorf("--acme-directory %q: want the https URL of an ACME directory, e.g. %s", f.ACMEDirectory, acme.LetsEncryptURL)
	}
	return nil
}

// domains returns --acme-domain's names, lower case.
func (f *TLSConfig) domains() ([]string, error) {
	var out []string
	for _, d := range strings.Split(f.ACMEDomains, ",") {
		d = strings.ToLower(strings.TrimSpace(d))
		var why string
		switch {
		case d == "":
			why = "an empty name in the list"
		case net.ParseIP(d) != nil:
			why = "want a domain name, not an IP address"
		case strings.ContainsAny(d, ":/"):
			why = "want a host name like api.example.com, without scheme, port or path"
		case strings.HasPrefix(d, "*."):
			why = "wildcard names cannot be validated over TLS-ALPN-01; list each name"
		case !strings.Contains(strings.Trim(d, "."), "."):
			why = "want a fully qualified name like api.example.com"
		}
		if why != "" && d != "" && d != f.ACMEDomains {
			why = fmt.Sprintf("%s: %s", d, why) // name the one at fault in a list
		}
		if why != "" {
			return nil, fmt.Errorf("--acme-domain %q: %s", f.ACMEDomains, why)
		}
		out = append(out, strings.TrimSuffix(d, "."))
	}
	return out, nil
}

// publicTLS is the public listener's TLS: one certificate from files,
// reloaded on SIGHUP and when the files change, or certificates an ACME CA
// issues (autocert), validated over TLS-ALPN-01 on the same listener.
//
// HTTP/2 is not offered: the listener's limits (--max-connections, the
// header and write deadlines) are per connection and made for HTTP/1.1.
type publicTLS struct {
	config  *tls.Config
	files   *certFiles // nil with ACME
	acme    *acmeCerts // nil with files
	domains []string   // with ACME
}

// openPublicTLS reads what f names (files, the ACME CA's root) and returns
// the listener's TLS, or nil when f asks for none. Errors name the flag.
func openPublicTLS(f TLSConfig, dataDir, listen string, log *slog.Logger) (*publicTLS, error) {
	switch {
	case f.CertFile != "":
		c, err := openCertFiles(f, log)
		if err != nil {
			return nil, err
		}
		return &publicTLS{files: c, config: &tls.Config{GetCertificate: c.getCertificate, NextProtos: []string{"http/1.1"}}}, nil
	case f.ACMEDomains != "":
		a, domains, err := openACME(f, dataDir, listen, log)
		if err != nil {
			return nil, err
		}
		return &publicTLS{acme: a, domains: domains,
			config: &tls.Config{GetCertificate: a.getCertificate, NextProtos: []string{"http/1.1", acme.ALPNProto}}}, nil
	}
	return nil, nil
}

// Run reloads the certificate files on SIGHUP and when they change, until
// ctx is done; with ACME, autocert renews by itself and Run has nothing to do.
func (p *publicTLS) Run(ctx context.Context) error {
	if p == nil || p.files == nil {
		return nil
	}
	return p.files.Run(ctx)
}

func (p *publicTLS) close() {
	if p != nil && p.files != nil {
		signal.Stop(p.files.hup)
	}
}

// url is the public API's base URL for a listener bound at addr: https
// with TLS, and with ACME the first domain (the only names the certificate
// is valid for; the port is left out when it is 443).
func (p *publicTLS) url(addr string) string {
	switch {
	case p == nil:
		return "http://" + addr + "/v1"
	case p.acme != nil:
		host := p.domains[0]
		if _, port, _ := net.SplitHostPort(addr); port != "443" {
			host = net.JoinHostPort(host, port)
		}
		return "https://" + host + "/v1"
	}
	return "https://" + addr + "/v1"
}

// certFiles serves the certificate of --tls-cert/--tls-key and swaps it when
// the files change; a replacement that does not load (a half-written file,
// a key of another certificate) leaves the previous one served.
type certFiles struct {
	certPath, keyPath string
	interval          time.Duration
	log               *slog.Logger
	hup               chan os.Signal
	cur               atomic.Pointer[tls.Certificate]
	seen              fileStamps // of the files last tried; Run's alone
}

// fileStamps tell a changed file: the cert's and the key's modification time
// and size (zero for a file that cannot be read).
type fileStamps [2]struct {
	mod  time.Time
	size int64
}

func openCertFiles(f TLSConfig, log *slog.Logger) (*certFiles, error) {
	c := &certFiles{certPath: f.CertFile, keyPath: f.KeyFile, interval: f.CheckInterval, log: log,
		hup: make(chan os.Signal, 1)}
	if c.interval == 0 {
		c.interval = defaultCertCheck
	}
	cert, stamps, err := c.load()
	if err != nil {
		return nil, err
	}
	c.cur.Store(cert)
	c.seen = stamps
	logCert(log, "TLS certificate loaded", cert.Leaf, "cert", c.certPath, "key", c.keyPath)
	// From here SIGHUP reloads instead of ending the process.
	signal.Notify(c.hup, syscall.SIGHUP)
	return c, nil
}

func (c *certFiles) stamps() fileStamps {
	var s fileStamps
	for i, p := range []string{c.certPath, c.keyPath} {
		if fi, err := os.Stat(p); err == nil {
			s[i].mod, s[i].size = fi.ModTime(), fi.Size()
		}
	}
	return s
}

// load reads both files. The stamps are taken first, so a write that lands
// after the read is seen as another change.
func (c *certFiles) load() (*tls.Certificate, fileStamps, error) {
	stamps := c.stamps()
	certPEM, err := os.ReadFile(c.certPath)
	if err != nil {
		return nil, stamps, fmt.Errorf("--tls-cert: %w", err)
	}
	keyPEM, err := os.ReadFile(c.keyPath)
	if err != nil {
		return nil, stamps, fmt.Errorf("--tls-key: %w", err)
	}
	if err := checkPrivate(c.keyPath, "anyone on this box could pose as this gateway"); err != nil {
		return nil, stamps, fmt.Errorf("--tls-key %w", err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, stamps, fmt.Errorf("--tls-cert %s, --tls-key %s: %w", c.certPath, c.keyPath, err)
	}
	return &cert, stamps, nil
}

func (c *certFiles) getCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return c.cur.Load(), nil
}

// Run reloads on SIGHUP and when the files' stamps change, until ctx is done.
func (c *certFiles) Run(ctx context.Context) error {
	t := time.NewTicker(c.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-c.hup:
			c.reload("SIGHUP")
		case <-t.C:
			if c.stamps() != c.seen {
				c.reload("files changed")
			}
		}
	}
}

func (c *certFiles) reload(trigger string) {
	cert, stamps, err := c.load()
	c.seen = stamps // a failed try is not repeated until the files change again
	if err != nil {
		old := c.cur.Load().Leaf
		c.log.Warn("TLS certificate not reloaded; still serving the previous one", "trigger", trigger, "err", err,
			"subject", old.Subject.String(), "expires", old.NotAfter.UTC().Format(time.RFC3339))
		return
	}
	c.cur.Store(cert)
	logCert(c.log, "TLS certificate reloaded", cert.Leaf, "trigger", trigger)
}

// logCert logs a certificate's subject, names and expiry; at WARN when it
// has already expired.
func logCert(log *slog.Logger, msg string, leaf *x509.Certificate, attrs ...any) {
	names := leaf.DNSNames
	for _, ip := range leaf.IPAddresses {
		names = append(names, ip.String())
	}
	attrs = append(attrs, "subject", leaf.Subject.String(), "names", strings.Join(names, ","),
		"issuer", leaf.Issuer.String(), "expires", leaf.NotAfter.UTC().Format(time.RFC3339))
	if time.Now().After(leaf.NotAfter) {
		log.Warn(msg+" — it has EXPIRED: clients will refuse it", attrs...)
		return
	}
	log.Info(msg, attrs...)
}

// acmeCerts obtains and renews certificates from an ACME CA (autocert) and
// logs each certificate the first time it is served.
type acmeCerts struct {
	m       *autocert.Manager
	domains map[string]bool
	log     *slog.Logger

	mu      sync.Mutex
	served  map[string]string // domain (+rsa) → serial of the leaf last logged
	lastErr map[string]string // domain → the failure last logged
}

func openACME(f TLSConfig, dataDir, listen string, log *slog.Logger) (*acmeCerts, []string, error) {
	domains, err := f.domains()
	if err != nil {
		return nil, nil, err
	}
	dir, err := url.Parse(f.ACMEDirectory)
	if err != nil {
		return nil, nil, fmt.Errorf("--acme-directory: %w", err)
	}
	hc := &http.Client{Timeout: 30 * time.Second}
	if f.ACMECACert != "" {
		raw, err := os.ReadFile(f.ACMECACert)
		if err != nil {
			return nil, nil, fmt.Errorf("--acme-ca-cert: %w", err)
		}
		pool, err := x509.SystemCertPool()
		if err != nil {
			pool = x509.NewCertPool()
		}
		if !pool.AppendCertsFromPEM(raw) {
			return nil, nil, fmt.Errorf("--acme-ca-cert %s: no PEM certificate in it", f.ACMECACert)
		}
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.TLSClientConfig = &tls.Config{RootCAs: pool}
		hc.Transport = tr
	}
	// One cache per CA: certificates of a staging or private CA are never
	// served once the directory changes.
	cache := filepath.Join(dataDir, "acme", dir.Host)
	a := &acmeCerts{
		m: &autocert.Manager{
			Prompt:     autocert.AcceptTOS,
			Cache:      autocert.DirCache(cache),
			HostPolicy: autocert.HostWhitelist(domains...),
			Email:      f.ACMEEmail,
			Client:     &acme.Client{DirectoryURL: f.ACMEDirectory, HTTPClient: hc, UserAgent: "tailgate"},
		},
		domains: map[string]bool{}, log: log, served: map[string]string{}, lastErr: map[string]string{},
	}
	for _, d := range domains {
		a.domains[d] = true
	}
	log.Info("TLS certificates from ACME: each is obtained at the first connection for its name, then renewed before it expires",
		"domains", strings.Join(domains, ","), "directory", f.ACMEDirectory, "cache", cache)
	if _, port, _ := net.SplitHostPort(listen); port != "443" {
		log.Warn("the ACME CA validates each domain over TLS-ALPN-01 on its port 443: make port 443 reach --listen (e.g. a port forward), or no certificate is issued",
			"listen", listen)
	}
	return a, domains, nil
}

func (a *acmeCerts) getCertificate(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
	cert, err := a.m.GetCertificate(hello)
	// The CA's own validation handshakes (acme-tls/1) are autocert's business.
	if challenge := len(hello.SupportedProtos) == 1 && hello.SupportedProtos[0] == acme.ALPNProto; challenge {
		return cert, err
	}
	name := strings.TrimSuffix(strings.ToLower(hello.ServerName), ".")
	if !a.domains[name] {
		return cert, err // a name not ours: refused, not worth a log line
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if err != nil {
		if a.lastErr[name] != err.Error() {
			a.lastErr[name] = err.Error()
			a.log.Warn("no TLS certificate from ACME; handshakes for the name fail until one is issued", "domain", name, "err", err)
		}
		return nil, err
	}
	delete(a.lastErr, name)
	key := name
	if _, ok := cert.PrivateKey.(*rsa.PrivateKey); ok { // autocert keeps one of each kind
		key += "+rsa"
	}
	if cert.Leaf != nil && a.served[key] != cert.Leaf.SerialNumber.String() {
		msg := "TLS certificate from ACME"
		if a.served[key] != "" {
			msg = "TLS certificate from ACME renewed"
		}
		a.served[key] = cert.Leaf.SerialNumber.String()
		logCert(a.log, msg, cert.Leaf, "domain", name)
	}
	return cert, nil
}
