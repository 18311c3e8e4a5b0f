package server_test

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/policy"
	"github.com/tailgate-dev/tailgate/server/internal/servertest"
	"github.com/tailgate-dev/tailgate/serving/sim"
)

// TestDashboardFitsALaptop: at 1280 and 1440 px wide, with a request's
// detail open beside the list, no button, field or table cell of the
// dashboard is cut off by its panel or the window — the keys table's
// rotate and revoke buttons and the attempt table included.
func TestDashboardFitsALaptop(t *testing.T) {
	d := startDashboard(t, sim.Config{Model: servertest.SimModel, TTFT: 5 * time.Millisecond, TTFTSigma: -1})
	secret := d.h.Key(policy.KeyOptions{Tenant: "a-tenant-with-a-long-name", Name: "a-laptop-key-named-at-length", Owner: "someone@example.com"})
	for _, body := range []string{hiBody, hiStreamBody} {
		if code := d.status(t, secret, body); code != http.StatusOK {
			t.Fatalf("request: %d", code)
		}
	}
	for _, width := range []int{1280, 1440} {
		t.Run(fmt.Sprint(width), func(t *testing.T) {
			b := startBrowser(t, width, 900)
			b.navigate(d.ui.URL + "/ui/#token=" + servertest.AdminToken)
			b.waitFor("its data", `document.body.dataset.loaded && document.querySelectorAll("#requests tbody tr.clickable").length >= 2 &&
				document.querySelectorAll("#keys tbody tr button").length >= 2`)
			b.eval(`document.querySelector("#requests tbody tr.clickable").click()`, nil)
			b.waitFor("the side panel", `!document.querySelector("#request-detail").hidden`)
			var clipped []string
			b.eval(`(() => {
				const out = [];
				const clips = (el) => { for (let p = el.parentElement; p; p = p.parentElement) {
					const s = getComputedStyle(p); if (s.overflowX !== "visible" || s.overflow !== "visible") return p; } return null; };
				for (const el of document.querySelectorAll("main button, main input, main select, main td, main th")) {
					if (!el.offsetParent) continue; // hidden
					const r = el.getBoundingClientRect(), c = clips(el);
					const right = Math.min(window.innerWidth, c ? c.getBoundingClientRect().right : Infinity);
					if (r.right > right + 1) out.push((el.closest("[id]") || {}).id + " " + el.tagName + " " + JSON.stringify(el.textContent.slice(0, 30)) + " ends at " + Math.round(r.right) + " > " + Math.round(right));
				}
				return out.slice(0, 15);
			})()`, &clipped)
			if len(clipped) > 0 {
				b.shot(fmt.Sprintf("dashboard-%d.png", width), true)
				t.Errorf("at %d px, cut off:\n%s", width, clipped)
			}
		})
	}
}
