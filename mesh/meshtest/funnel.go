package meshtest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"tailscale.com/envknob"
	"tailscale.com/tsnet"
)

// FunnelClientAddr is the internet address a [FunnelIngress] says its
// connections come from (TEST-NET-3, never routed).
const FunnelClientAddr = "203.0.113.7:41641"

// FunnelIngress stands in for Tailscale's Funnel relays: a node of the test
// tailnet that hands a TCP connection to a node's Funnel listener the way
// the relays do, through the node's peer API (POST /v0/ingress, then the
// raw connection). Everything on the node's side is tailscale's real
// Funnel path; only the relay's internet side is the test's dial. The test
// control server grants every node the ingress capability.
type FunnelIngress struct {
	srv *tsnet.Server
}

// StartFunnelIngress joins the tailnet of controlURL as the relay node.
func StartFunnelIngress(tb testing.TB, controlURL string) *FunnelIngress {
	tb.Helper()
	envknob.SetNoLogsNoSupport() // no log uploads from tests
	srv := &tsnet.Server{
		Dir:        filepath.Join(tb.TempDir(), "funnel-ingress"),
		Hostname:   "funnel-ingress",
		ControlURL: controlURL,
		Ephemeral:  true,
		Logf:       func(string, ...any) {},
		UserLogf:   func(string, ...any) {},
	}
	tb.Cleanup(func() { srv.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := srv.Up(ctx); err != nil {
		tb.Fatalf("funnel ingress node: %v", err)
	}
	return &FunnelIngress{srv: srv}
}

// DialContext connects to addr ("NODE.TAILNET.ts.net:443") as an internet
// client of Funnel would, from [FunnelClientAddr]; use it as an
// http.Transport's DialContext with the https:// URL of the node. It
// retries until the node is in the relay's network map, within ctx.
func (f *FunnelIngress) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	var last error
	for attempt := 0; attempt < 60; attempt++ {
		c, err := f.dial(ctx, host, addr)
		if err == nil {
			return c, nil
		}
		last = err
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("funnel ingress to %s: %w (last: %v)", addr, ctx.Err(), last)
		case <-time.After(500 * time.Millisecond):
		}
	}
	return nil, fmt.Errorf("funnel ingress to %s: %w", addr, last)
}

func (f *FunnelIngress) dial(ctx context.Context, host, target string) (net.Conn, error) {
	lc, err := f.srv.LocalClient()
	if err != nil {
		return nil, err
	}
	st, err := lc.Status(ctx)
	if err != nil {
		return nil, err
	}
	var peerAPI string
	for _, p := range st.Peer {
		if strings.EqualFold(strings.TrimSuffix(p.DNSName, "."), host) && len(p.PeerAPIURL) > 0 {
			peerAPI = strings.TrimPrefix(p.PeerAPIURL[0], "http://")
		}
	}
	if peerAPI == "" {
		return nil, fmt.Errorf("no peer named %s with a peer API in the relay's network map", host)
	}
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := f.srv.Dial(dctx, "tcp", peerAPI)
	if err != nil {
		return nil, err
	}
	req, _ := http.NewRequest(http.MethodPost, "/v0/ingress", nil)
	req.Host = peerAPI
	req.Header.Set("Tailscale-Ingress-Src", FunnelClientAddr)
	req.Header.Set("Tailscale-Ingress-Target", target)
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(conn)
	if err := req.Write(conn); err != nil {
		conn.Close()
		return nil, err
	}
	res, err := http.ReadResponse(br, req)
	if err != nil {
		conn.Close()
		return nil, err
	}
	res.Body.Close()
	if res.StatusCode != http.StatusSwitchingProtocols {
		conn.Close()
		return nil, errors.New("peer API ingress: " + res.Status)
	}
	_ = conn.SetDeadline(time.Time{})
	return &bufferedConn{Conn: conn, r: br}, nil
}

// bufferedConn reads what the response reader may already have buffered.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufferedConn) Read(b []byte) (int, error) { return c.r.Read(b) }
