package server_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"

	"github.com/tailgate-dev/tailgate/policy"
	"github.com/tailgate-dev/tailgate/server/internal/servertest"
	"github.com/tailgate-dev/tailgate/web"
)

// The dashboard's files load without the admin token (a browser opening the
// link sends none; the token is in the fragment) but hold no data: what the
// page shows comes from the API, which refuses a request without the token.
// Every file is served with a content security policy that allows only the
// page's own files and API, and never inside a frame.
func TestDashboardFilesAreStaticFramelessAndGuardedByCSP(t *testing.T) {
	h := servertest.Start(t, servertest.Options{Replicas: 1})
	h.Key(policy.KeyOptions{Tenant: "secret-tenant"})
	ui := httptest.NewServer(h.Srv.Admin(web.Handler()))
	t.Cleanup(ui.Close)

	get := func(path string) (*http.Response, string) {
		t.Helper()
		resp, err := http.Get(ui.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp, string(body)
	}
	for _, path := range []string{"/ui/", "/ui/app.js", "/ui/charts.js", "/ui/style.css"} {
		resp, body := get(path)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s without the token: %d, want the file", path, resp.StatusCode)
		}
		csp := resp.Header.Get("Content-Security-Policy")
		for _, want := range []string{"default-src 'none'", "script-src 'self'", "connect-src 'self'", "frame-ancestors 'none'"} {
			if !strings.Contains(csp, want) {
				t.Errorf("GET %s: Content-Security-Policy %q lacks %q", path, csp, want)
			}
		}
		if got := resp.Header.Get("X-Frame-Options"); got != "DENY" {
			t.Errorf("GET %s: X-Frame-Options %q, want DENY", path, got)
		}
		if strings.Contains(body, "secret-tenant") {
			t.Errorf("GET %s without the token shows a tenant", path)
		}
		if path == "/ui/" {
			// The policy allows no inline script or style: the page has none.
			if m := regexp.MustCompile(`<script(?:\s[^>]*)?>`).FindAllString(body, -1); len(m) == 0 {
				t.Error("the page has no script")
			} else {
				for _, tag := range m {
					if !strings.Contains(tag, "src=") {
						t.Errorf("inline script %s is blocked by the policy", tag)
					}
				}
			}
			if strings.Contains(body, "<style") || strings.Contains(body, " style=") || strings.Contains(body, " onclick=") {
				t.Error("the page has an inline style or handler, which the policy blocks")
			}
		}
	}
	for _, path := range []string{"/admin/v1/tenants", "/metrics"} {
		if resp, _ := get(path); resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("GET %s without the token: %d, want 401", path, resp.StatusCode)
		}
	}
}
