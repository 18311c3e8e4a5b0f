package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestGovernedReport: the report of scripts/bench-governed.sh reads the
// frontier off the sweep as Busbar does (the most answered a second at a
// rung whose p99 is under the bound, a faster rung past the bound not
// counted), charges each hop's CPU to its own requests, and divides the
// gateway's figures by the bare Go proxy's of the same run.
func TestGovernedReport(t *testing.T) {
	dir := t.TempDir()
	for _, sub := range []string{"c1", "rate", "big", "sweep"} {
		if err := os.Mkdir(filepath.Join(dir, sub), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	us := func(v int) time.Duration { return time.Duration(v) * time.Microsecond }
	paths := []string{"direct", "tailgate", "goproxy"}
	// p50 and p99 per path at concurrency 1 and at the rate.
	c1 := map[string][2]int{"direct": {100, 300}, "tailgate": {300, 900}, "goproxy": {250, 800}}
	for _, p := range paths {
		writeRun(t, filepath.Join(dir, "c1", p+"-r1.csv"), 1000, us(c1[p][0]), us(c1[p][1]))
		writeRun(t, filepath.Join(dir, "rate", p+"-r1.csv"), 1000, us(c1[p][0]), us(c1[p][1]))
	}
	// The sweep: 1000 requests 1 ms apart (1000/s), 500 apart (2000/s), 250 (4000/s).
	sweep := func(p string, c, gapUS int, p99 time.Duration) {
		var b strings.Builder
		for i := range 1000 {
			l := time.Millisecond / 2
			if i >= 980 {
				l = p99
			}
			fmt.Fprintf(&b, "%d,200,%d,120,300,,,x,%d,POST,http://127.0.0.1/v1/chat/completions,\n", int64(i*gapUS)*1000, l.Nanoseconds(), i)
		}
		if err := os.WriteFile(filepath.Join(dir, "sweep", fmt.Sprintf("%s-c%d.csv", p, c)), []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range paths {
		sweep(p, 1, 1000, 800*time.Microsecond)
		sweep(p, 4, 500, 4*time.Millisecond)
	}
	sweep("tailgate", 16, 250, 30*time.Millisecond) // faster, but its p99 is past every bound
	sweep("goproxy", 16, 250, 15*time.Millisecond)
	// CPU: 100 ticks a second; tailgate 50 ticks over 1000 requests = 500 µs, goproxy 400 µs.
	cpu := "rate tailgate r1 50\nrate goproxy r1 40\n"
	meta := `{"command":"scripts/bench-governed.sh","paths":["direct","tailgate","goproxy"],"rounds":1,"rate":1000,
		"sweep_concurrency":[1,4,16],"big_prompt_bytes":262144,"clk_tck":100}`
	streams := `{"streams":100,"method":"m","targets":[{"target":"gateway","idle_rss_bytes":1000000,"open_rss_bytes":9000000,"rss_bytes_per_stream":80000},
		{"target":"goproxy","idle_rss_bytes":1000000,"open_rss_bytes":11000000,"rss_bytes_per_stream":100000}]}`
	for name, text := range map[string]string{"cpu.txt": cpu, "meta.json": meta, "streams.json": streams} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var out strings.Builder
	if err := governed(dir, &out); err != nil {
		t.Fatal(err)
	}
	var rep governedReport
	b, err := os.ReadFile(filepath.Join(dir, "report.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	hop := map[string]*governedHop{}
	for _, h := range rep.Hops {
		hop[h.Path] = h
	}
	tg, gp := hop["tailgate"], hop["goproxy"]
	if got := tg.C1.AddedP99US; got != 600 {
		t.Errorf("tailgate's added p99 at concurrency 1: %v µs, want 600 (900 − the engine's 300)", got)
	}
	if got := tg.Rate.CPUPerReq; got != 500 {
		t.Errorf("tailgate's CPU a request: %v µs, want 500", got)
	}
	// Under 1 ms only concurrency 1 qualifies (1000/s); under 20 ms the
	// goproxy's c=16 does (about 4000/s) but tailgate's does not (p99 30 ms).
	f := func(h *governedHop, i int) frontier { return h.Frontier[i] }
	if got := f(tg, 0); got.Concurrency != 1 {
		t.Errorf("tailgate under 1 ms: %+v, want the rung at concurrency 1", got)
	}
	if got := f(tg, 2); got.Concurrency != 4 || got.Floor {
		t.Errorf("tailgate under 20 ms: %+v, want the rung at concurrency 4, not a floor", got)
	}
	if got := f(gp, 2); got.Concurrency != 16 || !got.Floor {
		t.Errorf("goproxy under 20 ms: %+v, want the top rung, 16, as a floor", got)
	}
	r := rep.Ratios["tailgate"]
	if r.CPUPerRequest != 1.25 || r.RSSPerStream != 0.8 || r.Frontier20ms != 0.5 {
		t.Errorf("ratios to goproxy: %+v, want CPU 1.25, RSS a stream 0.8, rate under 20 ms 0.5", r)
	}
	for _, want := range []string{"| concurrency 1: **added p50 / p99** | – | +200 µs / +600 µs | +150 µs / +500 µs |",
		"| tailgate | 1.25× | 0.80× | 0.50× |", "≥ "} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "report.md")); err != nil {
		t.Error(err)
	}
}
