// Package meshtest runs tailscale's in-process control server and a DERP
// and STUN relay on loopback, for tests of programs that join a tailnet with
// package mesh (as separate processes too: pass ControlURL to them). It is
// test support only; it lives under mesh because only mesh imports
// tailscale.com.
package meshtest

import (
	"net/http/httptest"
	"testing"

	"tailscale.com/net/netns"
	"tailscale.com/tailcfg"
	"tailscale.com/tstest/integration"
	"tailscale.com/tstest/integration/testcontrol"
	"tailscale.com/types/logger"
)

// Tags the control server lets nodes claim.
const (
	TagGateway = "tag:tailgate-gateway"
	TagWorker  = "tag:tailgate-worker"
)

// Option changes how the control server behaves.
type Option func(*testcontrol.Server)

// RequireAuthKey makes the control server refuse every node that registers
// without key, as a control server refuses an expired or unknown key.
func RequireAuthKey(key string) Option {
	return func(s *testcontrol.Server) { s.RequireAuthKey = key }
}

// OnSetDNS has the control server hand each DNS record a node asks it to
// publish to set: the TXT record of an ACME DNS-01 challenge, the step of
// a node's HTTPS certificate (tsnet's ListenTLS, tailgate's --mesh-tls).
// A test feeds them to the DNS server its ACME CA resolves through.
func OnSetDNS(set func(name, value string)) Option {
	return func(s *testcontrol.Server) {
		s.OnSetDNS = func(req *tailcfg.SetDNSRequest) error {
			set(req.Name, req.Value)
			return nil
		}
	}
}

// NoHTTPS makes a tailnet that issues no HTTPS certificates, as a Tailscale
// tailnet with HTTPS off or a Headscale: the control server sends nodes no
// certificate name. Nodes keep their MagicDNS short names.
func NoHTTPS() Option {
	return func(s *testcontrol.Server) { s.MagicDNSDomain = "" }
}

// NoFunnel makes a tailnet that issues HTTPS certificates but does not
// allow Funnel: nodes get the HTTPS capability and not the "funnel" node
// attribute, as on a Tailscale tailnet whose policy file grants no one
// Funnel. By default the test control server grants both (and Funnel on
// ports 443 and 8080).
func NoFunnel() Option {
	return func(s *testcontrol.Server) {
		s.DefaultNodeCapabilities = &tailcfg.NodeCapMap{tailcfg.CapabilityHTTPS: nil}
	}
}

// StartControl starts the control server and relay for the test's duration
// and returns the control server's URL.
func StartControl(tb testing.TB, opts ...Option) string {
	tb.Helper()
	// Sockets must not be bound to a device or marked in tests, and netns is
	// process-wide (tailscale's own tests do the same).
	netns.SetEnabled(false)
	tb.Cleanup(func() { netns.SetEnabled(true) })
	control := &testcontrol.Server{
		DERPMap:        integration.RunDERPAndSTUN(tb, logger.Discard, "127.0.0.1"),
		DNSConfig:      &tailcfg.DNSConfig{Proxied: true},
		MagicDNSDomain: "tail-scale.ts.net",
		TagOwners:      map[string][]string{TagGateway: nil, TagWorker: nil},
		Logf:           logger.Discard,
	}
	for _, o := range opts {
		o(control)
	}
	control.HTTPTestServer = httptest.NewUnstartedServer(control)
	control.HTTPTestServer.Start()
	tb.Cleanup(control.HTTPTestServer.Close)
	return control.HTTPTestServer.URL
}
