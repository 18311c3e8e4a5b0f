package load

import (
	"context"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// chromiumFlags work headless on these machines: no sandbox as root, no
// background networking (the network is closed).
var chromiumFlags = []string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
	"--disable-background-networking", "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"}

// renderDOM opens an HTML file in headless Chromium, lets its scripts run and
// returns the resulting DOM.
func renderDOM(t *testing.T, path string) string {
	t.Helper()
	bin, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatal("chromium not found: scripts/test.sh installs Debian's chromium package")
	}
	args := append(append([]string{}, chromiumFlags...), "--user-data-dir="+t.TempDir(), "--virtual-time-budget=5000",
		"--dump-dom", "file://"+path)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, args...).Output()
	if err != nil {
		t.Fatalf("chromium: %v", err)
	}
	return string(out)
}

func writeHTML(t *testing.T, reports ...*Report) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "report.html")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := WriteHTML(f, reports...); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

// svgTag returns the opening tag of the plot's svg element.
func svgTag(t *testing.T, dom, plot, extra string) string {
	t.Helper()
	m := regexp.MustCompile(`<svg [^>]*data-plot="` + plot + `"[^>]*` + extra + `[^>]*>`).FindString(dom)
	if m == "" {
		t.Fatalf("no rendered %s plot %s", plot, extra)
	}
	return m
}

func TestHTMLReportRendersPlots(t *testing.T) {
	rep := Analyze(scriptedResult(t), 5*time.Second)
	path := writeHTML(t, rep)
	raw, _ := os.ReadFile(path)
	if regexp.MustCompile(`(src|href)="?https?:`).Match(raw) {
		t.Fatal("the report loads something from the network")
	}
	dom := renderDOM(t, path)
	if !strings.Contains(dom, `data-status="rendered"`) || !strings.Contains(dom, `<div id="errors"></div>`) {
		t.Fatalf("the page's script did not finish:\n%s", dom)
	}
	// 14 requests, 4 failed: 10 points, 4 error marks, the 2 phase
	// boundaries and the 2 fleet actions drawn.
	tl := svgTag(t, dom, "timeline", "")
	if !strings.Contains(tl, `data-points="10"`) || !strings.Contains(tl, `data-errors="4"`) {
		t.Errorf("timeline %s", tl)
	}
	for class, want := range map[string]int{`class="pt"`: 10, `class="err"`: 4, `class="phase-boundary"`: 4, `class="event"`: 4, `class="p99"`: 1} {
		// Boundaries and events are drawn on the timeline and the queue plot.
		if got := strings.Count(dom, class); got != want {
			t.Errorf("%d %s elements, want %d", got, class, want)
		}
	}
	if q := svgTag(t, dom, "queue", ""); !strings.Contains(q, `data-series="4"`) {
		t.Errorf("queue plot %s", q)
	}
	if got := strings.Count(dom, `class="inflight"`); got != 4 {
		t.Errorf("%d in-flight lines, want one per replica", got)
	}
	for _, metric := range []string{"ttft", "total"} {
		if c := svgTag(t, dom, "cdf", `data-metric="`+metric+`"`); !strings.Contains(c, `data-curves="3"`) {
			t.Errorf("%s CDF %s", metric, c)
		}
	}
	for _, want := range []string{"Failover: kill at 10.0s (a)", "replacement c", "new replica d", "3 steady"} {
		if !strings.Contains(dom, want) {
			t.Errorf("page lacks %q", want)
		}
	}
}

func TestHTMLComparisonOverlaysBothRuns(t *testing.T) {
	a := Analyze(scriptedResult(t), 5*time.Second)
	resB := scriptedResult(t)
	resB.Label = "B"
	b := Analyze(resB, 5*time.Second)
	dom := renderDOM(t, writeHTML(t, a, b))
	if !strings.Contains(dom, `data-status="rendered"`) {
		t.Fatalf("the page's script did not finish:\n%s", dom)
	}
	if got := len(regexp.MustCompile(`<svg [^>]*data-plot="timeline"`).FindAllString(dom, -1)); got != 2 {
		t.Errorf("%d timelines, want one per run", got)
	}
	if c := svgTag(t, dom, "cdf", `data-metric="ttft"`); !strings.Contains(c, `data-curves="6"`) {
		t.Errorf("compared CDF %s", c)
	}
	if !strings.Contains(dom, "== compare: A = scripted, B = B ==") {
		t.Error("the page lacks the side-by-side comparison")
	}
}

// decodeResult is a run of one phase whose streams' TTFTs and totals
// include values that fall on the CDF's axis ticks (20, 50, 100, 200 ms):
// where the axis says 50, the curve's 50 ms point must be.
func decodeResult(t *testing.T, label string) *Result {
	plan := mustPlan(t, "steady:10s")
	ttfts := []float64{12, 20, 31, 44, 50, 72, 100, 150, 200, 350}
	var recs []Record
	for i, v := range ttfts {
		r := rec(float64(i)*0.5, "a", v, 2*v)
		r.Index, r.Stream, r.Completion, r.LastToken = i, true, 11, msd(v+100)
		recs = append(recs, r)
	}
	return &Result{Label: label, BaseURL: "http://gw/v1", Rate: 1, Seed: 1, Plan: plan, Elapsed: 10 * time.Second, Records: recs}
}

var (
	xtickRE = regexp.MustCompile(`<text [^>]*class="xtick"[^>]*>([^<]*)</text>`)
	attrXRE = regexp.MustCompile(` x="([-0-9.]+)"`)
	cdfRE   = regexp.MustCompile(`<path [^>]*class="cdf"[^>]*>`)
	pathDRE = regexp.MustCompile(` d="([^"]+)"`)
	vertRE  = regexp.MustCompile(`[ML]([-0-9.]+) ([-0-9.]+)`)
)

// cdfSVG returns the rendered CDF svg of metric (its whole element).
func cdfSVG(t *testing.T, dom, metric string) string {
	t.Helper()
	tag := svgTag(t, dom, "cdf", `data-metric="`+metric+`"`)
	i := strings.Index(dom, tag)
	end := strings.Index(dom[i:], "</svg>")
	return dom[i : i+end]
}

// tickValue reads an axis label as fmt wrote it: "50", "1s", "1.5s".
func tickValue(t *testing.T, label string) float64 {
	t.Helper()
	scale := 1.0
	if s, ok := strings.CutSuffix(label, "s"); ok {
		label, scale = s, 1000
	}
	v, err := strconv.ParseFloat(label, 64)
	if err != nil {
		t.Fatalf("tick label %q: %v", label, err)
	}
	return v * scale
}

// TestCDFTicksSitWhereTheCurveHasTheirValue reads the report's SVG as a
// reader does: for each x-axis tick label v at x, the curve's point for the
// request whose latency is v is at the same x — on a single report and on a
// comparison (--compare), for TTFT and total.
func TestCDFTicksSitWhereTheCurveHasTheirValue(t *testing.T) {
	for _, reports := range [][]*Report{
		{Analyze(decodeResult(t, "A"), 5*time.Second)},
		{Analyze(decodeResult(t, "A"), 5*time.Second), Analyze(decodeResult(t, "B"), 5*time.Second)},
	} {
		dom := renderDOM(t, writeHTML(t, reports...))
		if !strings.Contains(dom, `data-status="rendered"`) {
			t.Fatalf("the page's script did not finish:\n%s", dom)
		}
		for _, metric := range []string{"ttft", "total"} {
			svg := cdfSVG(t, dom, metric)
			// The curve's vertices, one per request in latency order (the
			// last repeats the largest at fraction 1).
			vals := []float64{12, 20, 31, 44, 50, 72, 100, 150, 200, 350}
			if metric == "total" {
				for i := range vals {
					vals[i] *= 2
				}
			}
			paths := cdfRE.FindAllString(svg, -1)
			if len(paths) != len(reports) {
				t.Fatalf("%s: %d curves, want %d", metric, len(paths), len(reports))
			}
			for _, p := range paths {
				verts := vertRE.FindAllStringSubmatch(pathDRE.FindStringSubmatch(p)[1], -1)
				if len(verts) != len(vals)+1 {
					t.Fatalf("%s curve has %d vertices, want %d: %s", metric, len(verts), len(vals)+1, p)
				}
				matched := 0
				for _, tk := range xtickRE.FindAllStringSubmatch(svg, -1) {
					v := tickValue(t, tk[1])
					tx, _ := strconv.ParseFloat(attrXRE.FindStringSubmatch(tk[0])[1], 64)
					for i, dv := range vals {
						if dv != v {
							continue
						}
						matched++
						cx, _ := strconv.ParseFloat(verts[i][1], 64)
						if math.Abs(cx-tx) > 0.6 {
							t.Errorf("%s (%d reports): the tick %q is at x=%.1f but the curve's %g ms point is at x=%.1f",
								metric, len(reports), tk[1], tx, dv, cx)
						}
					}
				}
				if matched < 2 {
					t.Errorf("%s: only %d ticks fall on data values; the test checks nothing:\n%s", metric, matched, svg)
				}
			}
		}
	}
}

// TestHTMLReportShowsOutputTokensAndTPOT: the HTML report's phase table
// has the output tokens/s, TPOT and ITL a team sizing GPUs compares, with
// the figures of the text and JSON reports (10 streams of 11 tokens over
// 10 s, 10 ms per token after the first).
func TestHTMLReportShowsOutputTokensAndTPOT(t *testing.T) {
	raw, err := os.ReadFile(writeHTML(t, Analyze(decodeResult(t, "decode"), 5*time.Second)))
	if err != nil {
		t.Fatal(err)
	}
	page := string(raw)
	head := regexp.MustCompile(`<tr><th>phase</th>.*?</tr>`).FindString(page)
	row := regexp.MustCompile(`<tr><td>1 steady</td>.*?</tr>`).FindString(page)
	if head == "" || row == "" {
		t.Fatalf("no phase table with a steady row:\n%s", page)
	}
	cells := func(tr, tag string) []string {
		var out []string
		for _, m := range regexp.MustCompile(`<`+tag+`[^>]*>([^<]*)</`+tag+`>`).FindAllStringSubmatch(tr, -1) {
			out = append(out, m[1])
		}
		return out
	}
	names, values := cells(head, "th"), cells(row, "td")
	got := map[string]string{}
	for i, n := range names {
		if i < len(values) {
			got[n] = values[i]
		}
	}
	for col, want := range map[string]string{"output tok/s": "11.0", "tpot p50": "10.0"} {
		if got[col] != want {
			t.Errorf("column %q is %q, want %q (header %q, row %q)", col, got[col], want, names, values)
		}
	}
	if _, ok := got["itl p99"]; !ok {
		t.Errorf("no itl p99 column: %q", names)
	}
}
