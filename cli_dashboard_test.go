package main

import (
	"net/url"
	"path/filepath"
	"strings"
	"testing"
)

// Both `up` and `gateway` print a dashboard link that logs the operator in:
// the admin token rides in the URL fragment, and no log line carries it.
func TestUpAndGatewayPrintDashboardLinkWithToken(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the tailgate binary")
	}
	up := startUp(t, "--replicas", "1", "--sim-ttft", "1ms", "--sim-tpot", "0s")
	gw := startGateway(t)
	for _, c := range []struct {
		name, printed, dir, logs string
	}{
		{"up", up.uiToken, up.dir, up.stderr.String()},
		{"gateway", gw.uiToken, gw.dir, gw.stderr.String()},
	} {
		token := readToken(t, filepath.Join(c.dir, "admin.token"))
		printed, err := url.QueryUnescape(c.printed)
		if err != nil || printed != token {
			t.Errorf("%s prints the dashboard link with #token=%q, want the admin token %q", c.name, c.printed, token)
		}
		if strings.Contains(c.logs, token) {
			t.Errorf("%s logs its admin token:\n%s", c.name, c.logs)
		}
	}
}
