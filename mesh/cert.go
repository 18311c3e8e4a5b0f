package mesh

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
	"time"
)

// ErrNoHTTPS means the tailnet issues its nodes no HTTPS certificates: the
// control server sent no certificate name for the node. On Tailscale,
// MagicDNS and HTTPS certificates are off in the admin console; Headscale
// (through 0.29) never issues them.
var ErrNoHTTPS = errors.New("mesh: the tailnet issues no HTTPS certificates")

// Certificate retry bounds: a failed attempt is retried after certRetryMin,
// doubling up to certRetryMax. certRefresh is how often a certificate that
// was obtained is asked for again, which renews it when it is due.
const (
	certRetryMin = time.Second
	certRetryMax = 5 * time.Minute
	certRefresh  = 6 * time.Hour
)

// Certs keeps the node's HTTPS certificate for its MagicDNS name, issued
// through the control server (an ACME CA validating DNS-01 records the
// control server publishes). [Certs.Run] obtains it, retries a failure
// with backoff and a log line each time, and asks again periodically so it
// is renewed; [Certs.GetCertificate] serves the last one obtained.
type Certs struct {
	node   *Node
	domain string
	log    *slog.Logger
	cur    atomic.Pointer[tls.Certificate]
}

// Certs returns the keeper of the node's HTTPS certificate, or an error
// matching [ErrNoHTTPS] that says what to enable. Nothing is requested
// until [Certs.Run].
func (n *Node) Certs(log *slog.Logger) (*Certs, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := n.lc.StatusWithoutPeers(ctx)
	if err != nil {
		return nil, fmt.Errorf("mesh: status: %w", err)
	}
	if len(st.CertDomains) == 0 {
		magic := st.CurrentTailnet != nil && st.CurrentTailnet.MagicDNSEnabled
		why := "turn on HTTPS certificates"
		if !magic {
			why = "turn on MagicDNS and HTTPS certificates"
		}
		return nil, fmt.Errorf("%w for node %s: on Tailscale, %s in the admin console's DNS page (https://login.tailscale.com/admin/dns); "+
			"Headscale issues none (it sends nodes no certificate name and does not implement /machine/set-dns, the DNS-01 step)",
			ErrNoHTTPS, n.hostname, why)
	}
	return &Certs{node: n, domain: st.CertDomains[0], log: log}, nil
}

// Domain is the name the certificate is for, the node's MagicDNS name
// (e.g. tg-gateway.tail1234.ts.net). Clients must use it in their URLs.
func (c *Certs) Domain() string { return c.domain }

// GetCertificate serves the certificate last obtained; until there is one,
// handshakes fail with an error saying it is being obtained.
func (c *Certs) GetCertificate(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
	if cert := c.cur.Load(); cert != nil {
		return cert, nil
	}
	return nil, fmt.Errorf("mesh: no HTTPS certificate for %s yet (being obtained from the CA)", c.domain)
}

// Run obtains the certificate and keeps it fresh until ctx is done. A
// failure is logged and retried with backoff (1s doubling to 5m); it never
// ends Run.
func (c *Certs) Run(ctx context.Context) error {
	wait := certRetryMin
	failures := 0
	start := time.Now()
	for {
		cert, err := c.fetch(ctx)
		next := certRefresh
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			failures++
			msg := "mesh: no HTTPS certificate from the tailnet yet; the tailnet HTTPS listener refuses handshakes until there is one, retrying"
			if cur := c.cur.Load(); cur != nil {
				msg = "mesh: HTTPS certificate not refreshed; still serving the current one until it expires " +
					cur.Leaf.NotAfter.UTC().Format(time.RFC3339) + ", retrying"
			}
			c.log.Warn(msg, "domain", c.domain, "attempt", failures, "retry_in", wait, "elapsed", time.Since(start).Round(time.Second), "err", err)
			next, wait = wait, min(2*wait, certRetryMax)
		default:
			if old := c.cur.Swap(cert); old == nil || !old.Leaf.Equal(cert.Leaf) {
				msg := "mesh: HTTPS certificate obtained"
				if old != nil {
					msg = "mesh: HTTPS certificate renewed"
				}
				c.log.Info(msg, "domain", c.domain, "issuer", cert.Leaf.Issuer.String(),
					"expires", cert.Leaf.NotAfter.UTC().Format(time.RFC3339), "attempts", failures+1)
			}
			failures, wait = 0, certRetryMin
		}
		t := time.NewTimer(next)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// fetch asks the node for the certificate: from its cache, or from the CA
// when there is none or it is due for renewal. A first issuance takes a
// DNS round trip through the control server; it is bounded at 3 minutes.
func (c *Certs) fetch(ctx context.Context) (*tls.Certificate, error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	certPEM, keyPEM, err := c.node.lc.CertPair(ctx, c.domain)
	if err != nil {
		return nil, errors.New(strings.TrimSpace(err.Error()))
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("certificate from the node: %w", err)
	}
	return &cert, nil
}

// ListenTLS listens on the tailnet at addr (e.g. ":443") and serves TLS
// with c's certificate; like [Node.Listen], it opens no host socket.
func (c *Certs) ListenTLS(addr string, nextProtos ...string) (net.Listener, error) {
	ln, err := c.node.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	return tls.NewListener(ln, &tls.Config{GetCertificate: c.GetCertificate, NextProtos: nextProtos}), nil
}
