package server_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/policy"
	"github.com/tailgate-dev/tailgate/server"
	"github.com/tailgate-dev/tailgate/server/internal/servertest"
	"github.com/tailgate-dev/tailgate/serving"
	"github.com/tailgate-dev/tailgate/serving/sim"
	"github.com/tailgate-dev/tailgate/web"
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

const hiStreamBody = `{"model":"tailgate-sim","max_tokens":4,"stream":true,"messages":[{"role":"user","content":"hi"}]}`

// dashboard is a gateway with its admin listener and the dashboard, its
// history sampled fast, and a record of every URL the admin listener was
// asked for.
type dashboard struct {
	h    *servertest.Gateway
	ui   *httptest.Server
	mu   sync.Mutex
	urls []string
}

// startDashboard starts it; slo, when not nil, stands in for GET
// /admin/v1/slo (the SLO evaluator is built apart).
// startDashboard starts a gateway of two simulated replicas (configured
// by engine) and the dashboard's admin listener, recording every URL it is
// asked for.
func startDashboard(t *testing.T, engine sim.Config) *dashboard {
	d := &dashboard{h: servertest.Start(t, servertest.Options{Replicas: 2, Sim: engine, Server: server.Config{HistoryInterval: 200 * time.Millisecond}})}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = d.h.Srv.RunHistory(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	admin := d.h.Srv.Admin(web.Handler())
	d.ui = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		d.mu.Lock()
		d.urls = append(d.urls, r.URL.String())
		d.mu.Unlock()
		admin.ServeHTTP(w, r)
	}))
	t.Cleanup(d.ui.Close)
	return d
}

func (d *dashboard) status(t *testing.T, secret, body string) int {
	t.Helper()
	resp := d.h.Post("/v1/chat/completions", secret, body)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

func TestDashboardShowsReplicasRequestsAndUsage(t *testing.T) {
	d := startDashboard(t, sim.Config{Model: servertest.SimModel})
	secret := d.h.Key(policy.KeyOptions{Tenant: "dashboard-tenant"})
	for range 3 {
		if code := d.status(t, secret, hiBody); code != http.StatusOK {
			t.Fatalf("request: %d", code)
		}
	}

	dom := renderPage(t, d.ui.URL+"/ui/#token="+servertest.AdminToken, "--dump-dom")
	for _, want := range []string{
		"2/2 replicas ready", // the status line, computed from /admin/v1/replicas
		">sim-a<", ">sim-b<", `class="state-ready">ready<`,
		">dashboard-tenant<", ">tailgate-sim<", // usage and requests rows
		"JSON answers, whole answer (3)", // not mixed into a TTFT
		"json</td><td>total<",            // a budget row of the real evaluator
	} {
		if !strings.Contains(dom, want) {
			t.Errorf("dashboard lacks %q", want)
		}
	}
	if strings.Contains(dom, "streams TTFT") {
		t.Errorf("three JSON answers are shown as streams' TTFT")
	}
	// 3 request rows, 1 usage row, 1 tenant row, 1 key row.
	if n := strings.Count(dom, ">dashboard-tenant<"); n < 6 {
		t.Errorf("dashboard shows %d cells of the tenant, want 3 requests, a usage, a tenant and a key row", n)
	}
	if t.Failed() {
		t.Logf("DOM:\n%s", dom)
	}

	// A wrong token says so instead of showing data.
	dom = renderPage(t, d.ui.URL+"/ui/#token=wrong", "--dump-dom")
	if !strings.Contains(dom, "admin token rejected") || strings.Contains(dom, ">sim-a<") {
		t.Errorf("with a wrong token the dashboard shows:\n%s", dom)
	}
}

func TestDashboardPanelsLiveAndDrivesKeysAndBudgets(t *testing.T) {
	// An engine whose first token takes 450 ms: streams' time to first
	// token is over its 400 ms budget (p95), as the real evaluator says.
	d := startDashboard(t, sim.Config{Model: servertest.SimModel, TTFT: 450 * time.Millisecond, TTFTSigma: -1})
	seed := d.h.Key(policy.KeyOptions{Tenant: "seed-tenant"})
	for _, body := range []string{hiBody, hiStreamBody, hiBody, hiStreamBody} {
		if code := d.status(t, seed, body); code != http.StatusOK {
			t.Fatalf("seed request: %d", code)
		}
	}

	b := startBrowser(t, 1400, 900)
	b.navigate(d.ui.URL + "/ui/#token=" + servertest.AdminToken)
	b.waitFor("its data", `document.body.dataset.loaded && document.querySelectorAll("#requests tbody tr.clickable").length >= 4`)
	b.waitFor("the last hour's charts", `document.querySelectorAll("#charts svg path").length >= 3`)
	// Streams and JSON answers in TTFT charts of their own, each with data.
	ttftLines := func(title string) string {
		return `[...document.querySelectorAll("#charts figure")].filter(f => f.querySelector("figcaption").textContent === "` + title +
			`").map(f => f.querySelectorAll("svg path").length).join(",")`
	}
	b.waitFor("both TTFT charts with data", ttftLines("time to first token, streams")+` === "3" && `+ttftLines("JSON answers, whole answer")+` === "3"`)

	// The token left the address bar for this tab's storage.
	var where struct{ Href, Stored string }
	b.eval(`({href: location.href, stored: sessionStorage.getItem("tailgate.adminToken")})`, &where)
	if strings.Contains(where.Href, servertest.AdminToken) || where.Stored != servertest.AdminToken {
		t.Errorf("after loading, the address is %q and the tab stores %q", where.Href, where.Stored)
	}

	// Every panel shows live data.
	var panels map[string]int
	b.eval(`({
		budgetOver: document.querySelectorAll("#budget tbody tr.over").length,
		budgetRows: document.querySelectorAll("#budget tbody tr").length,
		panelRed: document.querySelector("#budget-panel").classList.contains("over") ? 1 : 0,
		charts: document.querySelectorAll("#charts figure").length,
		replicas: [...document.querySelectorAll("#replicas tbody tr")].filter(r => /sim-[ab]/.test(r.textContent)).length,
		streams: [...document.querySelectorAll("#requests tbody tr")].filter(r => r.textContent.includes("stream")).length,
		jsons: [...document.querySelectorAll("#requests tbody tr")].filter(r => r.textContent.includes("JSON")).length,
		tenants: [...document.querySelectorAll("#tenants tbody tr")].filter(r => r.textContent.includes("seed-tenant")).length,
		keys: [...document.querySelectorAll("#keys tbody tr")].filter(r => r.textContent.includes("seed-tenant")).length,
		usage: [...document.querySelectorAll("#usage tbody tr")].filter(r => r.textContent.includes("seed-tenant")).length,
		replicaOverflow: document.querySelector("#replicas").scrollWidth - document.querySelector("#replicas-panel").clientWidth,
		pageOverflow: document.documentElement.scrollWidth - window.innerWidth,
	})`, &panels)
	if panels["budgetOver"] < 1 || panels["budgetRows"] <= panels["budgetOver"] {
		t.Errorf("budget rows: %d over of %d, want some over and some not", panels["budgetOver"], panels["budgetRows"])
	}
	delete(panels, "budgetOver")
	delete(panels, "budgetRows")
	want := map[string]int{"panelRed": 1, "charts": 8, "replicas": 2, "streams": 2, "jsons": 2,
		"tenants": 1, "keys": 1, "usage": 1}
	for k, v := range want {
		if panels[k] != v {
			t.Errorf("panel count %s = %d, want %d (all: %v)", k, panels[k], v, panels)
		}
	}
	if panels["replicaOverflow"] > 0 || panels["pageOverflow"] > 0 {
		t.Errorf("at 1400 px the replica table overflows its panel by %d px, the page by %d px", panels["replicaOverflow"], panels["pageOverflow"])
	}
	var budgetText string
	b.eval(`document.querySelector("#budget-status").textContent`, &budgetText)
	if !strings.Contains(budgetText, "ttft (stream)") {
		t.Errorf("budget status says %q, want the stage over budget named", budgetText)
	}
	// A request's detail shows its stages and attempts.
	b.eval(`document.querySelector("#requests tbody tr.clickable").click()`, nil)
	var detail, prefix string
	b.eval(`document.querySelector("#request-detail").innerText`, &detail)
	b.eval(`document.querySelector("#keys tbody tr td").textContent`, &prefix) // the seed key's, the only one
	if !strings.HasPrefix(prefix, "tg-") {
		t.Fatalf("the keys table's first cell is %q, want the seed key's prefix", prefix)
	}
	for _, w := range []string{"attempts: 1", "engine_ttft", "upstream_ttft", "total", "key " + prefix, time.Now().Format("2006")} {
		if !strings.Contains(detail, w) {
			t.Errorf("request detail lacks %q (its time and key among them):\n%s", w, detail)
		}
	}
	// A replica's detail shows its state history.
	b.eval(`document.querySelector("#replicas tbody tr.clickable").click()`, nil)
	b.eval(`document.querySelector("#replica-detail").innerText`, &detail)
	if !strings.Contains(detail, "(first seen)") || !strings.Contains(detail, "engine's last error") {
		t.Errorf("replica detail:\n%s", detail)
	}
	b.screenshot("dashboard.png")

	// A key created in the UI answers a request; its secret is shown once.
	b.eval(`(() => { const f = document.querySelector("#key-form"); f.tenant.value = "ui-tenant"; f.rpm.value = "100";
		f.querySelector("button[type=submit]").click(); })()`, nil)
	b.waitFor("the new key's secret", `document.querySelector("#secret-value").textContent.startsWith("tg-")`)
	var secret string
	b.eval(`document.querySelector("#secret-value").textContent`, &secret)
	if code := d.status(t, secret, hiBody); code != http.StatusOK {
		t.Fatalf("the key created in the UI: status %d", code)
	}
	// Copy puts it on the clipboard, or selects it where the page may not.
	var copied string
	b.eval(`(async () => { document.querySelector("#secret-copy").click(); await new Promise(r => setTimeout(r, 200));
		let c = ""; try { c = await navigator.clipboard.readText() } catch {}
		return c || getSelection().toString() })()`, &copied)
	if strings.TrimSpace(copied) != secret {
		t.Errorf("after Copy the clipboard or selection holds %q, want the secret", copied)
	}
	b.eval(`document.querySelector("#secret-done").click()`, nil)
	var shown string
	b.eval(`document.body.innerText`, &shown)
	if strings.Contains(shown, secret) {
		t.Errorf("the secret is still on the page after Done")
	}

	// Revoked in the UI, it is refused.
	b.waitFor("the new key's row", `[...document.querySelectorAll("#keys tbody tr")].some(r => r.textContent.includes("ui-tenant"))`)
	b.eval(`[...document.querySelectorAll("#keys tbody tr")].find(r => r.textContent.includes("ui-tenant")).querySelector("button.danger").click()`, nil)
	b.waitFor("the key revoked", `[...document.querySelectorAll("#keys tbody tr")].find(r => r.textContent.includes("ui-tenant")).textContent.includes("revoked")`)
	refused := false
	for range 30 {
		if d.status(t, secret, hiBody) == http.StatusUnauthorized {
			refused = true
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !refused {
		t.Errorf("a key revoked in the UI still answers")
	}

	// A budget set in the UI is enforced: the seed tenant has spent tokens,
	// a budget below that refuses its next request.
	if code := d.status(t, seed, hiBody); code != http.StatusOK {
		t.Fatalf("before the budget: %d", code)
	}
	b.eval(`(() => { const f = document.querySelector("#budget-form"); f.tenant.value = "seed-tenant"; f.budget_tokens.value = "5";
		f.querySelector("button[type=submit]").click(); })()`, nil)
	b.waitFor("the budget saved", `document.querySelector("#budget-form .msg").textContent.includes("budget of seed-tenant: 5 tokens")`)
	// A budget change takes effect within the key cache's poll interval
	// (policy.DefaultPollInterval), as a revocation does.
	var (
		status int
		e      struct {
			Error struct{ Code string } `json:"error"`
		}
	)
	for range 30 {
		resp := d.h.Post("/v1/chat/completions", seed, hiBody)
		_ = json.NewDecoder(resp.Body).Decode(&e)
		resp.Body.Close()
		if status = resp.StatusCode; status != http.StatusOK {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if status != http.StatusTooManyRequests || e.Error.Code != "insufficient_quota" {
		t.Errorf("over the budget set in the UI: %d %q, want 429 insufficient_quota", status, e.Error.Code)
	}

	// The token travelled in headers only, never in a URL a log could keep.
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, u := range d.urls {
		if strings.Contains(u, servertest.AdminToken) {
			t.Errorf("the admin token was sent in a URL: %s", u)
		}
	}
}

// TestDashboardShowsAnOutageOnItsFirstScreen: when no ready replica serves
// a model, a red banner says so above everything else, naming each of its
// replicas' state and why; a worker that died stays in the replica table,
// marked lost, with why; the failed requests turn the budgets red.
func TestDashboardShowsAnOutageOnItsFirstScreen(t *testing.T) {
	d := startDashboard(t, sim.Config{Model: servertest.SimModel, TTFT: 5 * time.Millisecond, TTFTSigma: -1})
	secret := d.h.Key(policy.KeyOptions{Tenant: "outage"})
	for range 2 {
		if code := d.status(t, secret, hiBody); code != http.StatusOK {
			t.Fatalf("before the outage: %d", code)
		}
	}
	// The only replicas: a registered worker, which then dies (its lease
	// ends), and a static one that is ejected.
	if _, _, err := d.h.Store.ApproveWorker(t.Context(), "w1", serving.ApprovalCode(testWorkerKey)); err != nil {
		t.Fatal(err)
	}
	engine := tokenCheckingEngine(t)
	if resp := heartbeat(d.h, servertest.ClusterToken, serving.Heartbeat{ReplicaID: "w1", Address: engine.URL,
		Models: []string{servertest.SimModel}, State: "ready", Engine: "sim"}); resp.StatusCode != http.StatusOK {
		t.Fatalf("heartbeat: %d", resp.StatusCode)
	}
	d.h.Reg.Remove("sim-a")
	d.h.Reg.Eject(d.h.Reg.Get("sim-b"), "connect")
	d.h.Reg.ExpireLeases(time.Now().Add(time.Minute))
	for range 3 {
		if code := d.status(t, secret, hiBody); code != http.StatusServiceUnavailable {
			t.Fatalf("during the outage: %d, want 503", code)
		}
	}

	b := startBrowser(t, 1280, 800)
	b.navigate(d.ui.URL + "/ui/#token=" + servertest.AdminToken)
	b.waitFor("the outage banner", `!document.querySelector("#outage").hidden`)
	b.waitFor("the budgets", `document.querySelectorAll("#budget tbody tr").length > 0`)
	b.waitFor("the first line red", `document.querySelector("#kpis").classList.contains("red")`)
	var got struct {
		Text, Background string
		Top, Height      float64
		Lost, Over       bool
		LostRow          string
		KPIBackground    string
		KPITop           float64
		SLO, Replicas    string
	}
	b.eval(`(() => {
		const o = document.querySelector("#outage"), r = o.getBoundingClientRect(), k = document.querySelector("#kpis");
		const kpi = (id) => document.querySelector(id + " .value").textContent;
		const row = [...document.querySelectorAll("#replicas tbody tr")].find(tr => tr.cells[0].textContent === "w1");
		return {text: o.textContent, background: getComputedStyle(o).backgroundColor, top: r.top, height: window.innerHeight,
			lost: !!row && row.cells[1].classList.contains("state-lost"), lostRow: row ? row.textContent : "",
			over: document.querySelector("#budget-panel").classList.contains("over"),
			kpiBackground: getComputedStyle(k).backgroundColor, kpiTop: k.getBoundingClientRect().top,
			slo: kpi("#kpi-slo"), replicas: kpi("#kpi-replicas")};
	})()`, &got)
	b.screenshot("dashboard-outage.png")
	b.shot("dashboard-outage-first-screen.png", false)
	if got.KPIBackground != "rgb(192, 54, 44)" || got.KPITop < 0 || got.KPITop > got.Height/2 || got.SLO != "outage" || got.Replicas != "0/2" {
		t.Errorf("in the outage the first line is %s at %v px, SLO %q, replicas %q; want red on the first screen, outage, 0/2",
			got.KPIBackground, got.KPITop, got.SLO, got.Replicas)
	}
	if got.Top < 0 || got.Top > got.Height/3 {
		t.Errorf("the outage banner is at %v px of a %v px screen: not on the first screen's top", got.Top, got.Height)
	}
	if got.Background != "rgb(192, 54, 44)" {
		t.Errorf("the outage banner's background is %s, want the dashboard's red", got.Background)
	}
	for _, want := range []string{"no ready replica for " + servertest.SimModel, "w1: lost", "no heartbeat", "sim-b: ejected"} {
		if !strings.Contains(got.Text, want) {
			t.Errorf("the outage banner %q does not say %q", got.Text, want)
		}
	}
	if !got.Lost || !strings.Contains(got.LostRow, "no heartbeat") {
		t.Errorf("the replica table's w1 row %q: want it marked lost, with why", got.LostRow)
	}
	if !got.Over {
		t.Error("the budget panel is not red with every request failing")
	}

	// A replica ready again: the banner goes.
	d.h.AddReplica("sim-a", d.h.Upstreams[0].URL, "")
	b.waitFor("the banner to go", `document.querySelector("#outage").hidden`)
	b.waitFor("the first line no longer red", `!document.querySelector("#kpis").classList.contains("red") && document.querySelector("#kpi-slo .value").textContent !== "outage"`)
}

// TestDashboardFirstScreenKPIsSidePanelAndTooltips: after some requests the
// first line shows live values of the last minute; a request's detail opens
// in a side panel beside the list, in view, even for a row far down the
// page; a chart shows values under the pointer; unpriced money shows "—".
func TestDashboardFirstScreenKPIsSidePanelAndTooltips(t *testing.T) {
	d := startDashboard(t, sim.Config{Model: servertest.SimModel, TTFT: 20 * time.Millisecond, TTFTSigma: -1})
	secret := d.h.Key(policy.KeyOptions{Tenant: "kpi"})
	for i := range 12 {
		body := hiBody
		if i%2 == 0 {
			body = hiStreamBody
		}
		if code := d.status(t, secret, body); code != http.StatusOK {
			t.Fatalf("request: %d", code)
		}
	}
	if code := d.status(t, secret, `{"model":"nope","messages":[{"role":"user","content":"hi"}]}`); code != http.StatusNotFound {
		t.Fatalf("unknown model: %d", code)
	}

	b := startBrowser(t, 1400, 900)
	b.navigate(d.ui.URL + "/ui/#token=" + servertest.AdminToken)
	b.waitFor("the first line's live values", `parseFloat(document.querySelector("#kpi-rps .value").textContent) > 0 &&
		document.querySelector("#kpi-ttft .value").textContent.endsWith("ms") &&
		parseFloat(document.querySelector("#kpi-tokens .value").textContent) > 0 &&
		document.querySelector("#kpi-slo .value").textContent !== "–"`)
	var kpi map[string]string
	b.eval(`Object.fromEntries([...document.querySelectorAll("#kpis .kpi")].map(k => [k.id, k.querySelector(".value").textContent]))`, &kpi)
	var top float64
	b.eval(`document.querySelector("#kpis").getBoundingClientRect().top`, &top)
	b.shot("dashboard-kpis.png", false)
	if top < 0 || top > 300 {
		t.Errorf("the first line is at %v px: not on the first screen", top)
	}
	if kpi["kpi-replicas"] != "2/2" || kpi["kpi-spend"] != "—" || !strings.HasSuffix(kpi["kpi-errors"], "%") || kpi["kpi-errors"] == "0.0 %" {
		t.Errorf("first line %v: want 2/2 replicas, no money without a price, the 404 among the errors", kpi)
	}
	var unpriced struct {
		Zero bool
		Cost string
	}
	b.eval(`({zero: document.body.innerText.includes("0.000000"),
		cost: [...document.querySelectorAll("#usage tbody tr")].find(r => r.textContent.includes("tailgate-sim")).cells[7].textContent})`, &unpriced)
	if unpriced.Zero || unpriced.Cost != "—" {
		t.Errorf("an unpriced model's cost shows %q (0.000000 on the page: %v), want —", unpriced.Cost, unpriced.Zero)
	}

	// The oldest request's row, scrolled to as a user would, opens its
	// detail beside the list and in view.
	b.eval(`(() => { const rows = document.querySelectorAll("#requests tbody tr.clickable"); const r = rows[rows.length - 1];
		r.scrollIntoView({block: "center"}); r.click(); })()`, nil)
	b.waitFor("the side panel", `!document.querySelector("#request-detail").hidden`)
	var panel struct {
		Top, Bottom, Left, ListRight, TableRight, RowTop, Height, Scroll float64
		Text                                                             string
	}
	b.eval(`(() => { const p = document.querySelector("#request-detail").getBoundingClientRect();
		const l = document.querySelector("#requests-panel .split .list").getBoundingClientRect();
		const row = document.querySelector("#requests tbody tr.open").getBoundingClientRect();
		const table = document.querySelector("#requests").getBoundingClientRect();
		return {top: p.top, bottom: p.bottom, left: p.left, listRight: l.right, tableRight: table.right, rowTop: row.top, height: window.innerHeight,
			scroll: window.scrollY, text: document.querySelector("#request-detail").innerText}; })()`, &panel)
	b.shot("dashboard-side-panel.png", false)
	if panel.Top < 0 || panel.Top >= panel.Height || panel.Bottom <= 0 {
		t.Errorf("the side panel spans %v–%v px of a %v px viewport (page scrolled %v px): not in view", panel.Top, panel.Bottom, panel.Height, panel.Scroll)
	}
	if panel.Left < panel.ListRight || panel.TableRight > panel.ListRight+1 {
		t.Errorf("the side panel starts at x=%v; the list ends at %v, its table at %v: want the panel beside the whole list", panel.Left, panel.ListRight, panel.TableRight)
	}
	if panel.Scroll < 200 || panel.RowTop < 0 || panel.RowTop > panel.Height {
		t.Errorf("the clicked row is at %v px (page scrolled %v px): the test did not open a row far down", panel.RowTop, panel.Scroll)
	}
	for _, w := range []string{"attempts: 1", "engine_ttft", "total"} {
		if !strings.Contains(panel.Text, w) {
			t.Errorf("the side panel lacks %q:\n%s", w, panel.Text)
		}
	}

	// Hovering a chart reads its values out.
	b.eval(`document.querySelector("#charts").scrollIntoView()`, nil)
	b.waitFor("a chart with points", `document.querySelectorAll("#charts svg path").length > 0`)
	var tip string
	b.eval(`(() => { const o = document.querySelector("#charts figure rect.hover"), r = o.getBoundingClientRect();
		o.dispatchEvent(new MouseEvent("mousemove", {clientX: r.right - 8, clientY: r.top + 20, bubbles: true}));
		const t = document.querySelector("#charts figure .tooltip"); return t.hidden ? "" : t.innerText; })()`, &tip)
	if !strings.Contains(tip, "requests") || !strings.Contains(tip, "/s") {
		t.Errorf("hovering the request-rate chart shows %q, want the requests per second at that time", tip)
	}
	b.shot("dashboard-tooltip.png", false)
	// The 2 s refresh redraws the charts; the tooltip under the resting
	// pointer stays.
	var loaded string
	b.eval(`document.body.dataset.loaded`, &loaded)
	b.waitFor("a refresh", `document.body.dataset.loaded !== "`+loaded+`"`)
	b.waitFor("the tooltip after the refresh", `(() => { const f = [...document.querySelectorAll("#charts figure")].find(f => f.querySelector("rect.hover"));
		const t = f.querySelector(".tooltip"); return !t.hidden && t.innerText.includes("requests"); })()`)
}

// TestDashboardSignInScreen: without a token the dashboard shows a sign-in
// screen, not empty tables; the pasted token opens it; a wrong one brings
// the sign-in back saying so.
func TestDashboardSignInScreen(t *testing.T) {
	d := startDashboard(t, sim.Config{Model: servertest.SimModel})
	b := startBrowser(t, 1280, 800)
	b.navigate(d.ui.URL + "/ui/")
	b.waitFor("the sign-in screen", `!document.querySelector("#signin").hidden`)
	var first struct {
		App     bool
		Text    string
		Loading bool
	}
	b.eval(`({app: !document.querySelector("#app").hidden, text: document.body.innerText, loading: document.body.innerText.includes("loading")})`, &first)
	b.shot("dashboard-signin.png", false)
	if first.App || first.Loading || !strings.Contains(first.Text, "admin.token") {
		t.Errorf("without a token: dashboard shown %v, %q", first.App, first.Text)
	}

	b.eval(`(() => { document.querySelector("#token").value = "wrong"; document.querySelector("#login button").click(); })()`, nil)
	b.waitFor("the token refused", `document.querySelector("#signin-why").textContent.includes("admin token rejected") && !document.querySelector("#signin").hidden`)

	b.eval(`(() => { document.querySelector("#token").value = "`+servertest.AdminToken+`"; document.querySelector("#login button").click(); })()`, nil)
	b.waitFor("the dashboard after signing in", `document.querySelector("#signin").hidden && document.querySelector("#status").textContent.includes("2/2 replicas ready")`)
	var stored string
	b.eval(`sessionStorage.getItem("tailgate.adminToken")`, &stored)
	if stored != servertest.AdminToken {
		t.Errorf("the tab stores %q after signing in", stored)
	}
	b.eval(`document.querySelector("#signout").click()`, nil)
	b.waitFor("the sign-in screen after signing out", `!document.querySelector("#signin").hidden && sessionStorage.getItem("tailgate.adminToken") === null`)
}
