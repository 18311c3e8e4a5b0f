package load

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
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
