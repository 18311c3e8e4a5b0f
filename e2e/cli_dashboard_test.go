package e2e

import (
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestDashboardTokenNotPrintedWhenStdoutIsNotATerminal: `up` and `gateway`
// whose stdout is a pipe (as under systemd, where it lands in the journal,
// or a container runtime) print the dashboard link without the admin token
// and name DIR/dashboard.url, a 0600 file holding the link with the token
// (in the URL fragment, which a browser never sends); no log line carries
// the token either.
func TestDashboardTokenNotPrintedWhenStdoutIsNotATerminal(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the tailgate binary")
	}
	up := startUp(t, "--replicas", "1", "--sim-ttft", "1ms", "--sim-tpot", "0s")
	gw := startGateway(t)
	for _, c := range []struct {
		name, printed, admin, dir, logs string
	}{
		{"up", up.uiToken, up.admin, up.dir, up.stderr.String()},
		{"gateway", gw.uiToken, gw.admin, gw.dir, gw.stderr.String()},
	} {
		token := readToken(t, filepath.Join(c.dir, "admin.token"))
		if c.printed != "" {
			t.Errorf("%s prints the admin token on a stdout that is not a terminal: #token=%s", c.name, c.printed)
		}
		path := filepath.Join(c.dir, "dashboard.url")
		if !strings.Contains(c.logs, "path="+path) {
			t.Errorf("%s does not say where the link with the token is (%s):\n%s", c.name, path, c.logs)
		}
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: %s has mode %04o, want 0600", c.name, path, fi.Mode().Perm())
		}
		link := readToken(t, path)
		if want := c.admin + "/ui/#token=" + url.QueryEscape(token); link != want {
			t.Errorf("%s: %s holds %q, want %q", c.name, path, link, want)
		}
		if strings.Contains(c.logs, token) {
			t.Errorf("%s logs its admin token:\n%s", c.name, c.logs)
		}
	}
}
