package server

import (
	"net"
	"net/http"
	"net/netip"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/tailgate-dev/tailgate/server/apierr"
	"github.com/tailgate-dev/tailgate/server/connlimit"
)

// The client behind a proxy.
//
// A request that comes through a proxy the operator trusts
// (Config.TrustedProxies: an edge, a load balancer) names its client in
// X-Forwarded-For, which the proxy appends to. The gateway reads the
// header from the right, past the addresses of trusted proxies, and takes
// the first other address as the client's: whatever a client wrote into
// the header itself stands to the left of what its proxies appended, so it
// is never read. From any other peer the header is ignored and the peer is
// the client. The request's RemoteAddr becomes the client's (port 0), so
// logs, per-address shares and the trace rules see the client; a forwarded
// request counts against its client's connection share
// (connlimit.Limiter.EnterForwarded) for as long as it runs.

// forwardedFor returns the client address r's trusted proxies name, and
// true; false when r's peer is not a trusted proxy or names no client.
func forwardedFor(r *http.Request, trusted []netip.Prefix) (string, bool) {
	if len(trusted) == 0 {
		return "", false
	}
	peer := remoteIP(r.RemoteAddr)
	if !connlimit.Contains(trusted, peer) {
		return "", false
	}
	vals := r.Header.Values("X-Forwarded-For")
	for i := len(vals) - 1; i >= 0; i-- {
		v := vals[i]
		for v != "" {
			j := strings.LastIndexByte(v, ',')
			hop := strings.TrimSpace(v[j+1:])
			v = v[:max(j, 0)]
			ip, err := netip.ParseAddr(hop)
			if err != nil {
				return "", false // not an address: nothing to the left can be believed
			}
			if a := ip.Unmap().String(); !connlimit.Contains(trusted, a) {
				return a, true
			}
			if j < 0 {
				break
			}
		}
	}
	return "", false
}

// remoteIP is the IP of a RemoteAddr ("host:port").
func remoteIP(addr string) string {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	return host
}

// errAddressShare refuses a forwarded request whose client address holds
// its share of the connection cap already.
var errAddressShare = &apierr.Error{Status: http.StatusTooManyRequests, Type: "requests", Code: "rate_limit_exceeded",
	Message:    "this client address holds its share of the gateway's connections (--max-connections-per-address) through its proxy; retry when a request ends",
	RetryAfter: time.Second}

// SetClients gives the server the public listener's connection shares: a
// request a trusted proxy forwarded counts against its client's for as long
// as it runs. Call it before traffic arrives; without it forwarded requests
// are not counted.
func (s *Server) SetClients(l *connlimit.Limiter) { s.clients = l }

// forwardedClient is the public API's middleware that applies the rules
// above.
func (s *Server) forwardedClient(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		r := c.Request()
		addr, ok := forwardedFor(r, s.cfg.TrustedProxies)
		if !ok {
			return next(c)
		}
		r.RemoteAddr = net.JoinHostPort(addr, "0")
		if s.clients != nil {
			leave, ok := s.clients.EnterForwarded(addr)
			if !ok {
				return apierr.Reply(c, errAddressShare)
			}
			defer leave()
		}
		return next(c)
	}
}

// trustsTrace reports whether r's client may continue its own trace: its
// address (the forwarded client's) is in Config.TraceFrom.
func (s *Server) trustsTrace(r *http.Request) bool {
	return connlimit.Contains(s.cfg.TraceFrom, remoteIP(r.RemoteAddr))
}
