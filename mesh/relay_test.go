package mesh

import (
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"tailscale.com/tailcfg"
	"tailscale.com/tstest"
	"tailscale.com/tstest/integration/testcontrol"

	"github.com/tailgate-dev/tailgate/e2e/testkit"
)

// TestNoRelayWarnsWhatToChange: behind an http:// control server whose
// only relay speaks plain HTTP (an http:// Headscale with its embedded DERP
// server), the node comes up within the relay wait, not the whole
// UpTimeout, and warns that it has no relay, naming the relay it tried and
// what to change.
func TestNoRelayWarnsWhatToChange(t *testing.T) {
	tstest.ResourceCheck(t)
	plain := httptest.NewServer(http.NotFoundHandler()) // a DERP address that answers plain HTTP
	defer plain.Close()
	_, port, _ := net.SplitHostPort(plain.Listener.Addr().String())
	control := startControl(t, func(c *testcontrol.Server) {
		c.DERPMap = &tailcfg.DERPMap{Regions: map[int]*tailcfg.DERPRegion{999: {
			RegionID: 999, RegionCode: "headscale", Nodes: []*tailcfg.DERPNode{{
				Name: "999a", RegionID: 999, HostName: "127.0.0.1", IPv4: "127.0.0.1", IPv6: "none",
				DERPPort: mustPort(t, port), STUNPort: -1, InsecureForTests: true,
			}},
		}}}
	})
	logs := &testkit.Buffer{}
	n := startNode(t, t.Context(), control.HTTPTestServer.URL, "worker", func(cfg *Config) {
		cfg.Log = slog.New(slog.NewTextHandler(logs, nil))
		cfg.UpTimeout = 40 * time.Second
	})
	if _, ok := n.Addr(); !ok {
		t.Fatal("the node has no tailnet address")
	}
	var warn string
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(line, "no relay (DERP) server reached") {
			warn = line
		}
	}
	for _, w := range []string{"level=WARN", "plain http://", "server_url", "derp.urls", "relays=127.0.0.1:" + port} {
		if !strings.Contains(warn, w) {
			t.Errorf("warning lacks %q: %q\nlogs:\n%s", w, warn, logs.String())
		}
	}
}

func mustPort(t *testing.T, s string) int {
	t.Helper()
	p, err := net.LookupPort("tcp", s)
	if err != nil {
		t.Fatal(err)
	}
	return p
}
