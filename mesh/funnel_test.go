package mesh

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"tailscale.com/tailcfg"
	"tailscale.com/tstest"
	"tailscale.com/tstest/integration/testcontrol"

	"github.com/tailgate-dev/tailgate/mesh/meshtest"
)

// TestListenFunnelNeedsTheTailnetToAllowIt: a node without the funnel node
// attribute, or on a port its tailnet does not relay, gets ErrNoFunnel
// saying what to enable, and nothing is listened on.
func TestListenFunnelNeedsTheTailnetToAllowIt(t *testing.T) {
	tstest.ResourceCheck(t)
	ctx := t.Context()
	noFunnel := startControl(t, func(c *testcontrol.Server) {
		c.DefaultNodeCapabilities = &tailcfg.NodeCapMap{tailcfg.CapabilityHTTPS: nil}
	})
	n := startNode(t, ctx, noFunnel.HTTPTestServer.URL, "gw", nil)
	c, err := n.Certs(nil)
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.ListenFunnel(":443")
	if !errors.Is(err, ErrNoFunnel) || !strings.Contains(err.Error(), `"funnel" node attribute`) || !strings.Contains(err.Error(), "nodeAttrs") {
		t.Fatalf("ListenFunnel without the funnel attribute = %v; want ErrNoFunnel naming the attribute", err)
	}

	// The test control server relays ports 443 and 8080 only.
	on := startControl(t, nil)
	n = startNode(t, ctx, on.HTTPTestServer.URL, "gw", nil)
	if c, err = n.Certs(nil); err != nil {
		t.Fatal(err)
	}
	if _, err = c.ListenFunnel(":8443"); !errors.Is(err, ErrNoFunnel) || !strings.Contains(err.Error(), "port 8443") {
		t.Fatalf("ListenFunnel on a port the tailnet does not relay = %v; want ErrNoFunnel naming the port", err)
	}
}

// TestListenFunnelAcceptsOnlyFunnelConnections: a connection the Funnel
// relay hands over arrives on the listener; a tailnet peer dialing the
// same port does not (it has Certs.ListenTLS for that). Closing the
// listener lets it be opened again.
func TestListenFunnelAcceptsOnlyFunnelConnections(t *testing.T) {
	tstest.ResourceCheck(t)
	ctx := t.Context()
	control := startControl(t, nil)
	url := control.HTTPTestServer.URL
	gw := startNode(t, ctx, url, "gw", nil)
	peer := startNode(t, ctx, url, "peer", nil)
	c, err := gw.Certs(nil)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := c.ListenFunnel(":443")
	if err != nil {
		t.Fatal(err)
	}
	accepted := make(chan net.Conn, 1)
	go func() {
		conn, err := ln.Accept()
		if err == nil {
			accepted <- conn
		}
	}()

	// The peer reaches the node on the tailnet, but not at the Funnel port.
	tailnetLn, err := gw.Listen("tcp", ":80")
	if err != nil {
		t.Fatal(err)
	}
	defer tailnetLn.Close()
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if conn, err := peer.Dial(dctx, "tcp", "gw:80"); err != nil {
		t.Fatalf("the peer cannot reach the node on the tailnet: %v", err)
	} else {
		conn.Close()
	}
	if conn, err := peer.Dial(dctx, "tcp", "gw:443"); err == nil {
		conn.Close()
		t.Fatal("a tailnet peer reached the Funnel-only listener")
	}

	relay := meshtest.StartFunnelIngress(t, url)
	rctx, rcancel := context.WithTimeout(ctx, 30*time.Second)
	defer rcancel()
	conn, err := relay.DialContext(rctx, "tcp", c.Domain()+":443")
	if err != nil {
		t.Fatalf("through the Funnel relay: %v", err)
	}
	defer conn.Close()
	select {
	case got := <-accepted:
		got.Close()
	case <-time.After(10 * time.Second):
		t.Fatal("the connection the Funnel relay handed over was not accepted")
	}

	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	ln, err = c.ListenFunnel(":443")
	if err != nil {
		t.Fatalf("ListenFunnel after Close: %v", err)
	}
	ln.Close()
}
