package server_test

import (
	"context"
	"net/http/httptest"
	"os/exec"
	"strings"
	"testing"
	"time"

	"tailgate/policy"
	"tailgate/server/internal/servertest"
	"tailgate/web"
)

// chromiumFlags are the flags that work headless on these machines: no
// sandbox as root, and no background networking (the network is closed).
var chromiumFlags = []string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
	"--disable-background-networking", "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"}

// renderPage loads url in headless Chromium, lets its scripts run, and
// returns the resulting DOM.
func renderPage(t *testing.T, url string, extra ...string) string {
	t.Helper()
	bin, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatal("chromium not found: scripts/test.sh installs Debian's chromium package")
	}
	args := append(append([]string{}, chromiumFlags...), "--user-data-dir="+t.TempDir(), "--virtual-time-budget=8000")
	args = append(append(args, extra...), url)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, args...).Output()
	if err != nil {
		t.Fatalf("chromium: %v", err)
	}
	return string(out)
}

func TestDashboardShowsReplicasRequestsAndUsage(t *testing.T) {
	h := servertest.Start(t, servertest.Options{Replicas: 2})
	ui := httptest.NewServer(h.Srv.Admin(web.Handler()))
	defer ui.Close()
	secret := h.Key(policy.KeyOptions{Tenant: "dashboard-tenant"})
	for range 3 {
		resp := h.Post("/v1/chat/completions", secret, hiBody)
		resp.Body.Close()
	}

	dom := renderPage(t, ui.URL+"/ui/#token="+servertest.AdminToken, "--dump-dom")
	for _, want := range []string{
		"2/2 replicas ready", // the status line, computed from /admin/v1/replicas
		">sim-a<", ">sim-b<", `class="state-ready">ready<`,
		">dashboard-tenant<", ">tailgate-sim<", // usage and requests rows
		"TTFT p50",
	} {
		if !strings.Contains(dom, want) {
			t.Errorf("dashboard lacks %q", want)
		}
	}
	if strings.Count(dom, ">dashboard-tenant<") < 4 { // 3 request rows + 1 usage row
		t.Errorf("dashboard shows %d rows for the tenant, want 3 requests and 1 usage row", strings.Count(dom, ">dashboard-tenant<"))
	}
	if t.Failed() {
		t.Logf("DOM:\n%s", dom)
	}

	// A wrong token says so instead of showing data.
	dom = renderPage(t, ui.URL+"/ui/#token=wrong", "--dump-dom")
	if !strings.Contains(dom, "admin token rejected") || strings.Contains(dom, ">sim-a<") {
		t.Errorf("with a wrong token the dashboard shows:\n%s", dom)
	}
}
