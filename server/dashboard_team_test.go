package server_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/policy"
	"github.com/tailgate-dev/tailgate/server/internal/servertest"
	"github.com/tailgate-dev/tailgate/serving/sim"
)

// TestDashboardKeysBudgetPeriodsAndUsageByDay: a team's daily job in the
// dashboard — a named key's owner, requests, tokens and last use in the key
// table; the tenant's monthly budget, its reset and its use past the alert
// percent in the tenant table; usage over a date range, grouped by day, with
// a per-day chart; a bad range said beside the form; a key rotated in the
// UI shows its new secret once, and both secrets answer during the grace.
func TestDashboardKeysBudgetPeriodsAndUsageByDay(t *testing.T) {
	d := startDashboard(t, sim.Config{Model: servertest.SimModel})
	monthly, budget, alert := "monthly", int64(200), int64(10)
	secret := d.h.Key(policy.KeyOptions{Tenant: "team", Name: "bob-laptop", Owner: "bob@example.com",
		BudgetTokens: &budget, BudgetPeriod: &monthly, BudgetAlertPercent: &alert})
	for range 2 {
		if code := d.status(t, secret, hiBody); code != http.StatusOK {
			t.Fatalf("request: %d", code)
		}
	}

	b := startBrowser(t, 1400, 900)
	b.navigate(d.ui.URL + "/ui/#token=" + servertest.AdminToken)
	keyRow := `[...document.querySelectorAll("#keys tbody tr")].find(r => r.textContent.includes("bob-laptop"))`
	b.waitFor("the named key with its two requests", keyRow+` && `+keyRow+`.children[8].textContent === "2"`)

	var key []string
	b.eval(`[...`+keyRow+`.children].map(td => td.textContent)`, &key)
	if len(key) < 14 || key[1] != "bob-laptop" || key[2] != "bob@example.com" || key[3] != "team" || key[9] == "0" || key[11] == "never" {
		t.Errorf("key row %q: want name bob-laptop, owner bob@example.com, tenant team, its tokens and a last use", key)
	}

	tenantRow := `[...document.querySelectorAll("#tenants tbody tr")].find(r => r.textContent.includes("team"))`
	var tenant struct {
		Cells []string
		Class string
	}
	b.eval(`({cells: [...`+tenantRow+`.children].map(td => td.textContent), class: `+tenantRow+`.children[6].className})`, &tenant)
	resets := time.Now().UTC().AddDate(0, 1, 0).Format("2006-01") + "-01 00:00 UTC"
	if len(tenant.Cells) < 7 || tenant.Cells[5] != "monthly, resets "+resets || !strings.Contains(tenant.Cells[6], "(alert at 10 %)") ||
		!strings.Contains(tenant.Class, "budget-alert") {
		t.Errorf("tenant row %q (use cell class %q): want the monthly period resetting %s and its use marked past the 10 %% alert",
			tenant.Cells, tenant.Class, resets)
	}

	// The per-day chart (the last 30 days by default) has today's bar.
	today := time.Now().UTC().Format(time.DateOnly)
	b.waitFor("the per-day chart", `document.querySelector('#usage-chart svg[data-bars="1"] rect[data-series="requests"][data-label="`+today+`"][data-value="2"]')`)

	// A date range grouped by day: one row, today's.
	b.eval(`(() => { const f = document.querySelector("#usage-form"); f.since.value = "`+today+`"; f.by.value = "day";
		f.querySelector("button[type=submit]").click(); })()`, nil)
	b.waitFor("usage by day", `[...document.querySelectorAll("#usage tbody tr")].length === 1 &&
		document.querySelector("#usage tbody tr").children[0].textContent === "`+today+`"`)
	var usage []string
	b.eval(`[...document.querySelector("#usage tbody tr").children].map(td => td.textContent)`, &usage)
	if len(usage) < 5 || usage[4] != "2" {
		t.Errorf("usage by day %q: want today's 2 requests", usage)
	}
	// A range that ends before it begins is refused, and said.
	b.eval(`(() => { const f = document.querySelector("#usage-form"); f.until.value = "2020-01-01";
		f.querySelector("button[type=submit]").click(); })()`, nil)
	b.waitFor("the refused range said", `document.querySelector("#usage-form .msg").textContent.includes("must be after since")`)
	b.screenshot("dashboard-team.png")

	// Rotated in the UI: a new secret shown once; the old one still
	// answers during the day's grace.
	b.eval(keyRow+`.querySelector("button.rotate").click()`, nil)
	b.waitFor("the rotated key's secret", `document.querySelector("#secret-value").textContent.startsWith("tg-") &&
		document.querySelector("#secret-what").textContent.includes("bob-laptop")`)
	var rotated string
	b.eval(`document.querySelector("#secret-value").textContent`, &rotated)
	if rotated == secret {
		t.Fatal("rotation showed the old secret")
	}
	ok := false
	for range 30 {
		if d.status(t, rotated, hiBody) == http.StatusOK {
			ok = true
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !ok {
		t.Errorf("the secret shown after rotating in the UI is not accepted")
	}
	if code := d.status(t, secret, hiBody); code != http.StatusOK {
		t.Errorf("the old secret during its grace: %d", code)
	}
}
