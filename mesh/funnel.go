package mesh

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	"tailscale.com/ipn"
	"tailscale.com/tsnet"
)

// ErrNoFunnel means the tailnet does not let the node serve on the internet
// through Tailscale Funnel: the node lacks the "funnel" node attribute or
// the HTTPS capability, or the port is not among its Funnel ports.
var ErrNoFunnel = errors.New("mesh: the tailnet does not allow Funnel for this node")

// ListenFunnel listens on the public internet through Tailscale Funnel at
// addr (":443", ":8443" or ":10000", the ports Funnel relays) and serves
// TLS with c's certificate. Tailscale's Funnel relays accept connections
// for the node's MagicDNS name (c.Domain) and pass them to the node over
// its own outbound tailnet connection, so no inbound port is opened on the
// host. Only connections that come through Funnel are accepted; tailnet
// peers reach the node with [Certs.ListenTLS]. The remote address of an
// accepted connection is the relay's, not the client's.
//
// It fails with an error matching [ErrNoFunnel] that says what the tailnet
// administrator must enable.
func (c *Certs) ListenFunnel(addr string, nextProtos ...string) (net.Listener, error) {
	_, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("mesh: funnel %s: %w", addr, err)
	}
	port, err := strconv.ParseUint(portStr, 10, 16)
	if err != nil {
		return nil, fmt.Errorf("mesh: funnel %s: bad port", addr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := c.node.lc.StatusWithoutPeers(ctx)
	if err != nil {
		return nil, fmt.Errorf("mesh: status: %w", err)
	}
	// tsnet checks the same, but with a message meant for tailscale's CLI;
	// checking first gives a typed error with what to change.
	if err := ipn.CheckFunnelAccess(uint16(port), st.Self); err != nil {
		return nil, fmt.Errorf("%w (node %s, port %d: %v): on Tailscale, grant the node the \"funnel\" node attribute in the tailnet policy file "+
			"(e.g. \"nodeAttrs\": [{\"target\": [\"tag:tailgate-gateway\"], \"attr\": [\"funnel\"]}]) and turn on HTTPS certificates "+
			"in the admin console's DNS page (https://login.tailscale.com/admin/dns); Headscale has no Funnel",
			ErrNoFunnel, c.node.hostname, port, err)
	}
	ln, err := c.node.srv.ListenFunnel("tcp", addr, tsnet.FunnelOnly(),
		tsnet.FunnelTLSConfig(&tls.Config{GetCertificate: c.GetCertificate, NextProtos: nextProtos}))
	if err != nil {
		return nil, fmt.Errorf("mesh: funnel %s: %w", addr, err)
	}
	return ln, nil
}
