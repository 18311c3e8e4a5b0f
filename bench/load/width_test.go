package load

import (
	"context"
	"fmt"
	"html"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestReportFitsALaptop: at 1280 and 1440 px wide no cell of the report's
// tables (the phase summary's last columns included) is cut off by the
// window or a box that clips it.
func TestReportFitsALaptop(t *testing.T) {
	path := writeHTML(t, Analyze(decodeResult(t, "decode"), 5*time.Second))
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// After the page's own scripts: every th and td whose right edge passes
	// the window or the nearest ancestor that clips overflow.
	const measure = `<script>addEventListener("load", () => setTimeout(() => {
		const out = [];
		const clips = (el) => { for (let p = el.parentElement; p; p = p.parentElement) {
			const s = getComputedStyle(p); if (s.overflowX !== "visible") return p; } return null; };
		for (const el of document.querySelectorAll("td, th")) {
			if (!el.offsetParent) continue;
			const r = el.getBoundingClientRect(), c = clips(el);
			const right = Math.min(document.documentElement.clientWidth, c && c !== document.documentElement && c !== document.body ? c.getBoundingClientRect().right : Infinity);
			if (r.right > right + 1) out.push(el.tagName + " " + JSON.stringify(el.textContent.slice(0, 20)) + " ends at " + Math.round(r.right) + " > " + Math.round(right));
		}
		document.body.dataset.clipped = JSON.stringify(out.slice(0, 10));
	}, 0));</script></body>`
	page := strings.Replace(string(raw), "</body>", measure, 1)
	if err := os.WriteFile(path, []byte(page), 0o644); err != nil {
		t.Fatal(err)
	}
	bin, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatal("chromium not found: scripts/test.sh installs Debian's chromium package")
	}
	for _, width := range []int{1280, 1440} {
		t.Run(fmt.Sprint(width), func(t *testing.T) {
			args := append(append([]string{}, chromiumFlags...), "--user-data-dir="+t.TempDir(), "--virtual-time-budget=5000",
				fmt.Sprintf("--window-size=%d,900", width), "--hide-scrollbars", "--dump-dom", "file://"+path)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			out, err := exec.CommandContext(ctx, bin, args...).Output()
			if err != nil {
				t.Fatalf("chromium: %v", err)
			}
			m := regexp.MustCompile(`data-clipped="([^"]*)"`).FindStringSubmatch(string(out))
			if m == nil {
				t.Fatal("the measuring script did not run")
			}
			if got := html.UnescapeString(m[1]); got != "[]" {
				t.Errorf("at %d px, cut off: %s", width, got)
			}
		})
	}
}
