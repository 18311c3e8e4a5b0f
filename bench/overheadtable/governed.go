package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The governed report (--governed DIR) is scripts/bench-governed.sh's: the
// measurements of GetBusbar/benchmarking's method (README.md, "What it
// measures" and "Methodology"; engine/src/procsample.rs for CPU a request
// from the process tree) taken locally against each hop in one interleaved
// run. DIR holds
//
//	c1/PATH-rK.csv      round K at concurrency 1 (vegeta closed loop, one worker)
//	rate/PATH-rK.csv    round K, open loop at the fixed rate
//	big/PATH-rK.csv     round K at concurrency 1 with the large prompt
//	sweep/PATH-cC.csv   the concurrency sweep's rung C (closed loop, C workers)
//	cpu.txt             PHASE PATH RUN TICKS: CPU clock ticks of the hop's process tree over that run
//	streams.json        bench/streamgap --json: memory and CPU per open stream
//	meta.json           what the run was (command, machine, settings)
//
// and gets the table on stdout, DIR/report.md and DIR/report.json.

// governedMeta is what the script says about the run.
type governedMeta struct {
	Command     string   `json:"command"`
	Started     string   `json:"started"`
	Commit      string   `json:"commit"`
	CPUs        int      `json:"cpus"`
	Load        string   `json:"load_before"`
	Paths       []string `json:"paths"`
	Rounds      int      `json:"rounds"`
	Rate        int      `json:"rate"`
	Concurrency []int    `json:"sweep_concurrency"`
	BigBytes    int      `json:"big_prompt_bytes"`
	Durations   struct {
		C1, Rate, Big, Sweep string
	} `json:"durations"`
	Quick bool `json:"quick"`
	HZ    int  `json:"clk_tck"`
}

// latencyPoint is one hop in one phase: medians over the rounds.
type latencyPoint struct {
	P50US      float64 `json:"p50_us"`
	P99US      float64 `json:"p99_us"`
	AddedP50US float64 `json:"added_p50_us,omitempty"`
	AddedP99US float64 `json:"added_p99_us,omitempty"`
	OK         float64 `json:"ok_share"`
	CPUPerReq  float64 `json:"cpu_us_per_request,omitempty"`
	Requests   int     `json:"requests"`
}

// rung is one concurrency of the sweep.
type rung struct {
	Concurrency int     `json:"concurrency"`
	RPS         float64 `json:"ok_per_second"`
	P99US       float64 `json:"p99_us"`
	OK          float64 `json:"ok_share"`
	CPUPerReq   float64 `json:"cpu_us_per_request,omitempty"`
}

// frontier is the highest rate a hop carried with p99 under a bound.
type frontier struct {
	BoundMS     float64 `json:"p99_bound_ms"`
	RPS         float64 `json:"ok_per_second"`
	Concurrency int     `json:"at_concurrency,omitempty"`
	P99US       float64 `json:"p99_us,omitempty"`
	Floor       bool    `json:"floor,omitempty"` // the highest rung run still passed: at least this much
}

type streamRow struct {
	Target         string  `json:"target"`
	CPUPerStreamUS float64 `json:"cpu_us_per_stream"`
	IdleRSS        int64   `json:"idle_rss_bytes"`
	OpenRSS        int64   `json:"open_rss_bytes"`
	BytesPerStream float64 `json:"rss_bytes_per_stream"`
}

type streamsDoc struct {
	Streams int         `json:"streams"`
	Chunks  int         `json:"chunks"`
	Method  string      `json:"method"`
	Rows    []streamRow `json:"targets"`
}

type governedHop struct {
	Path     string        `json:"path"`
	C1       *latencyPoint `json:"concurrency_1,omitempty"`
	Rate     *latencyPoint `json:"fixed_rate,omitempty"`
	Big      *latencyPoint `json:"big_prompt_concurrency_1,omitempty"`
	Sweep    []rung        `json:"sweep,omitempty"`
	Frontier []frontier    `json:"frontier,omitempty"`
	Stream   *streamRow    `json:"per_open_stream,omitempty"`
}

type governedReport struct {
	Meta    governedMeta     `json:"run"`
	Streams *streamsDoc      `json:"streams,omitempty"`
	Hops    []*governedHop   `json:"hops"`
	Ratios  map[string]ratio `json:"ratios_to_goproxy,omitempty"`
}

// ratio is one hop's figures over the bare Go proxy's in the same run.
type ratio struct {
	CPUPerRequest    float64 `json:"cpu_per_request_at_rate,omitempty"`
	RSSPerStream     float64 `json:"rss_per_stream,omitempty"`
	Frontier20ms     float64 `json:"highest_rate_p99_20ms,omitempty"`
	AddedP99AtRate   float64 `json:"added_p99_at_rate,omitempty"`
	AddedP99C1       float64 `json:"added_p99_concurrency_1,omitempty"`
	CPUPerRequestBig float64 `json:"cpu_per_request_big_prompt,omitempty"`
}

// bounds are the p99 bounds of the frontier: the two, between
// Busbar's (1, 5, 10, 50, 100 ms).
var bounds = []time.Duration{time.Millisecond, 5 * time.Millisecond, 20 * time.Millisecond}

func governed(dir string, w io.Writer) error {
	var rep governedReport
	if err := readJSON(filepath.Join(dir, "meta.json"), &rep.Meta); err != nil {
		return err
	}
	m := rep.Meta
	if len(m.Paths) < 2 || m.Paths[0] != "direct" {
		return fmt.Errorf("meta.json: paths must start with direct, got %v", m.Paths)
	}
	hz := float64(max(m.HZ, 1))
	ticks, err := readTicks(filepath.Join(dir, "cpu.txt"))
	if err != nil {
		return err
	}
	var sd streamsDoc
	if err := readJSON(filepath.Join(dir, "streams.json"), &sd); err == nil {
		rep.Streams = &sd
	} else if !errors.Is(err, os.ErrNotExist) {
		return err
	}

	// rounds reads phase's rounds for every path; a path missing a round
	// is left out of that round's medians.
	rounds := func(phase string) (map[string]*latencyPoint, error) {
		out := map[string]*latencyPoint{}
		type acc struct{ p50, p99, a50, a99, ok, cpu []float64 }
		accs := map[string]*acc{}
		for k := 1; k <= m.Rounds; k++ {
			var base *summary
			for _, p := range m.Paths {
				s, err := load(filepath.Join(dir, phase, fmt.Sprintf("%s-r%d.csv", p, k)))
				if errors.Is(err, os.ErrNotExist) {
					continue
				}
				if err != nil {
					return nil, fmt.Errorf("%s %s round %d: %w", phase, p, k, err)
				}
				a := accs[p]
				if a == nil {
					a = &acc{}
					accs[p] = a
				}
				if p == "direct" {
					base = s
				}
				a.p50, a.p99, a.ok = append(a.p50, us(s.p50)), append(a.p99, us(s.p99)), append(a.ok, s.success)
				if base != nil && p != "direct" {
					a.a50, a.a99 = append(a.a50, us(s.p50-base.p50)), append(a.a99, us(s.p99-base.p99))
				}
				if t, ok := ticks[phase+" "+p+" r"+strconv.Itoa(k)]; ok && s.n > 0 {
					a.cpu = append(a.cpu, t*1e6/hz/float64(s.n))
				}
			}
		}
		for p, a := range accs {
			out[p] = &latencyPoint{P50US: med(a.p50), P99US: med(a.p99), AddedP50US: med(a.a50), AddedP99US: med(a.a99),
				OK: slices.Min(a.ok), CPUPerReq: med(a.cpu), Requests: len(a.p50)}
		}
		return out, nil
	}
	c1, err := rounds("c1")
	if err != nil {
		return err
	}
	rate, err := rounds("rate")
	if err != nil {
		return err
	}
	big, err := rounds("big")
	if err != nil {
		return err
	}
	for _, p := range m.Paths {
		h := &governedHop{Path: p, C1: c1[p], Rate: rate[p], Big: big[p]}
		for _, c := range m.Concurrency {
			s, err := load(filepath.Join(dir, "sweep", fmt.Sprintf("%s-c%d.csv", p, c)))
			if errors.Is(err, os.ErrNotExist) {
				continue
			}
			if err != nil {
				return fmt.Errorf("sweep %s c=%d: %w", p, c, err)
			}
			r := rung{Concurrency: c, RPS: s.sentRate * s.success, P99US: us(s.p99), OK: s.success}
			if t, ok := ticks["sweep "+p+" c"+strconv.Itoa(c)]; ok && s.n > 0 {
				r.CPUPerReq = t * 1e6 / hz / float64(s.n)
			}
			h.Sweep = append(h.Sweep, r)
		}
		for _, b := range bounds {
			h.Frontier = append(h.Frontier, frontierOf(h.Sweep, b))
		}
		if rep.Streams != nil {
			for i := range rep.Streams.Rows {
				if r := &rep.Streams.Rows[i]; r.Target == p || (p == "tailgate" && r.Target == "gateway") {
					h.Stream = r
				}
			}
		}
		rep.Hops = append(rep.Hops, h)
	}
	rep.Ratios = ratiosToGoproxy(rep.Hops)

	md := renderGoverned(&rep)
	fmt.Fprint(w, md)
	if err := os.WriteFile(filepath.Join(dir, "report.md"), []byte(md), 0o644); err != nil {
		return err
	}
	b, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "report.json"), append(b, '\n'), 0o644)
}

// frontierOf is Busbar's reading of a sweep at one bound: the most requests
// a second answered at a rung whose p99 stayed under the bound with every
// request answered. Rungs only add to the set a maximum is taken over, so
// a looser bound never reads lower.
func frontierOf(sweep []rung, bound time.Duration) frontier {
	f := frontier{BoundMS: float64(bound) / float64(time.Millisecond)}
	for i, r := range sweep {
		if r.OK < 1 || r.P99US >= us(bound) || r.RPS <= f.RPS {
			continue
		}
		f.RPS, f.Concurrency, f.P99US = r.RPS, r.Concurrency, r.P99US
		f.Floor = i == len(sweep)-1
	}
	return f
}

func ratiosToGoproxy(hops []*governedHop) map[string]ratio {
	var gp *governedHop
	for _, h := range hops {
		if h.Path == "goproxy" {
			gp = h
		}
	}
	if gp == nil {
		return nil
	}
	// A ratio is only given of two positive figures: an added latency
	// under the noise can come out negative, and its ratio means nothing.
	div := func(a, b float64) float64 {
		if a <= 0 || b <= 0 {
			return 0
		}
		return math.Round(a/b*100) / 100
	}
	out := map[string]ratio{}
	for _, h := range hops {
		if h.Path == "direct" || h.Path == "goproxy" {
			continue
		}
		var r ratio
		if h.Rate != nil && gp.Rate != nil {
			r.CPUPerRequest, r.AddedP99AtRate = div(h.Rate.CPUPerReq, gp.Rate.CPUPerReq), div(h.Rate.AddedP99US, gp.Rate.AddedP99US)
		}
		if h.C1 != nil && gp.C1 != nil {
			r.AddedP99C1 = div(h.C1.AddedP99US, gp.C1.AddedP99US)
		}
		if h.Big != nil && gp.Big != nil {
			r.CPUPerRequestBig = div(h.Big.CPUPerReq, gp.Big.CPUPerReq)
		}
		if h.Stream != nil && gp.Stream != nil {
			r.RSSPerStream = div(h.Stream.BytesPerStream, gp.Stream.BytesPerStream)
		}
		if len(h.Frontier) == len(bounds) && len(gp.Frontier) == len(bounds) {
			r.Frontier20ms = div(h.Frontier[len(bounds)-1].RPS, gp.Frontier[len(bounds)-1].RPS)
		}
		out[h.Path] = r
	}
	return out
}

// renderGoverned is the report as markdown: one table, hops as columns.
func renderGoverned(rep *governedReport) string {
	var b strings.Builder
	m := rep.Meta
	fmt.Fprintf(&b, "`%s` — %s, commit %s, %d CPUs shared (load before: %s)", m.Command, m.Started, m.Commit, m.CPUs, m.Load)
	if m.Quick {
		b.WriteString(", QUICK smoke")
	}
	b.WriteString("\n\n")
	cols := make([]string, len(rep.Hops))
	for i, h := range rep.Hops {
		cols[i] = h.Path
	}
	fmt.Fprintf(&b, "| measurement | %s |\n|---|%s\n", strings.Join(cols, " | "), strings.Repeat("---|", len(cols)))
	row := func(name string, cell func(h *governedHop) string) {
		cells := make([]string, len(rep.Hops))
		for i, h := range rep.Hops {
			if cells[i] = cell(h); cells[i] == "" {
				cells[i] = "–"
			}
		}
		fmt.Fprintf(&b, "| %s | %s |\n", name, strings.Join(cells, " | "))
	}
	lat := func(get func(h *governedHop) *latencyPoint, f func(p *latencyPoint) string) func(h *governedHop) string {
		return func(h *governedHop) string {
			if p := get(h); p != nil {
				return f(p)
			}
			return ""
		}
	}
	added := func(p *latencyPoint) string {
		return signed(p.AddedP50US) + " / " + signed(p.AddedP99US)
	}
	abs := func(p *latencyPoint) string { return fmtUS(p.P50US) + " / " + fmtUS(p.P99US) + okNote(p.OK) }
	cpu := func(p *latencyPoint) string {
		if p.CPUPerReq == 0 {
			return ""
		}
		return fmt.Sprintf("%.0f µs", p.CPUPerReq)
	}
	c1 := func(h *governedHop) *latencyPoint { return h.C1 }
	rt := func(h *governedHop) *latencyPoint { return h.Rate }
	bg := func(h *governedHop) *latencyPoint { return h.Big }
	notDirect := func(f func(p *latencyPoint) string) func(p *latencyPoint) string {
		return func(p *latencyPoint) string {
			if p.AddedP50US == 0 && p.AddedP99US == 0 {
				return ""
			}
			return f(p)
		}
	}
	row("concurrency 1: p50 / p99", lat(c1, abs))
	row("concurrency 1: **added p50 / p99**", lat(c1, notDirect(added)))
	row(fmt.Sprintf("%d req/s open loop: p50 / p99", m.Rate), lat(rt, abs))
	row(fmt.Sprintf("%d req/s: **added p50 / p99**", m.Rate), lat(rt, notDirect(added)))
	row(fmt.Sprintf("%d req/s: **CPU a request** (process tree)", m.Rate), lat(rt, cpu))
	for i, bd := range bounds {
		row(fmt.Sprintf("**highest rate, p99 < %s** (concurrency sweep)", bd), func(h *governedHop) string {
			if len(h.Frontier) <= i {
				return ""
			}
			f := h.Frontier[i]
			if f.RPS == 0 {
				if len(h.Sweep) == 0 {
					return ""
				}
				return "none"
			}
			s := fmt.Sprintf("%.0f/s (c=%d, p99 %s)", f.RPS, f.Concurrency, fmtUS(f.P99US))
			if f.Floor {
				s = "≥ " + s
			}
			return s
		})
	}
	row("CPU a request at the sweep's top rung", func(h *governedHop) string {
		if len(h.Sweep) == 0 || h.Sweep[len(h.Sweep)-1].CPUPerReq == 0 {
			return ""
		}
		r := h.Sweep[len(h.Sweep)-1]
		return fmt.Sprintf("%.0f µs (c=%d)", r.CPUPerReq, r.Concurrency)
	})
	kb := m.BigBytes >> 10
	row(fmt.Sprintf("%d KB prompt, concurrency 1: p50 / p99", kb), lat(bg, abs))
	row(fmt.Sprintf("%d KB prompt: **added p50 / p99**", kb), lat(bg, notDirect(added)))
	row(fmt.Sprintf("%d KB prompt: CPU a request", kb), lat(bg, cpu))
	if rep.Streams != nil {
		n := rep.Streams.Streams
		row(fmt.Sprintf("%d open streams: idle → open RSS", n), func(h *governedHop) string {
			if h.Stream == nil || h.Stream.OpenRSS == 0 {
				return ""
			}
			return fmt.Sprintf("%.1f → %.1f MB", float64(h.Stream.IdleRSS)/1e6, float64(h.Stream.OpenRSS)/1e6)
		})
		row(fmt.Sprintf("**RSS per open stream** ((open − idle) ÷ %d)", n), func(h *governedHop) string {
			if h.Stream == nil || h.Stream.OpenRSS == 0 {
				return ""
			}
			return fmt.Sprintf("%.1f KB", h.Stream.BytesPerStream/1024)
		})
		row("CPU a stream", func(h *governedHop) string {
			if h.Stream == nil || h.Stream.CPUPerStreamUS == 0 {
				return ""
			}
			return fmt.Sprintf("%.0f µs", h.Stream.CPUPerStreamUS)
		})
	}
	if len(rep.Ratios) > 0 {
		b.WriteString("\nAgainst the bare Go proxy in the same run (the issue's bars in brackets):\n\n")
		b.WriteString("| hop | CPU a request at the rate (≤ 1.0) | RSS per open stream (≤ 1.0) | highest rate, p99 < 20ms (≥ 1.0) | added p99 at the rate (≤ 1.2) | added p99, concurrency 1 | CPU a request, large prompt |\n|---|---|---|---|---|---|---|\n")
		for _, h := range rep.Hops {
			r, ok := rep.Ratios[h.Path]
			if !ok {
				continue
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s |\n", h.Path, x(r.CPUPerRequest), x(r.RSSPerStream), x(r.Frontier20ms),
				x(r.AddedP99AtRate), x(r.AddedP99C1), x(r.CPUPerRequestBig))
		}
	}
	fmt.Fprintf(&b, "\nSweep (closed loop, %s a rung; answered a second / p99; the frontier reads these):\n\n", m.Durations.Sweep)
	fmt.Fprintf(&b, "| concurrency | %s |\n|---|%s\n", strings.Join(cols, " | "), strings.Repeat("---|", len(cols)))
	for _, c := range m.Concurrency {
		cells := make([]string, len(rep.Hops))
		for i, h := range rep.Hops {
			cells[i] = "–"
			for _, r := range h.Sweep {
				if r.Concurrency == c {
					cells[i] = fmt.Sprintf("%.0f/s, %s%s", r.RPS, fmtUS(r.P99US), okNote(r.OK))
				}
			}
		}
		fmt.Fprintf(&b, "| %d | %s |\n", c, strings.Join(cells, " | "))
	}
	fmt.Fprintf(&b, "\nLatencies are medians over %d round(s), each hop's \"added\" taken against the engine directly in the same round; "+
		"CPU is user+system of the hop's process tree (/proc/PID/stat of it and its children) over the run and the second after it, "+
		"divided by the requests of the run.", m.Rounds)
	if rep.Streams != nil {
		fmt.Fprintf(&b, " RSS per open stream: %s.", rep.Streams.Method)
	}
	b.WriteString("\n")
	return b.String()
}

func okNote(ok float64) string {
	if ok >= 1 {
		return ""
	}
	return fmt.Sprintf(" (ok %s)", pctStr(ok))
}

func x(v float64) string {
	if v == 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f×", v)
}

// signed is fmtUS with a sign: a hop can measure faster than the engine
// directly when the run's noise is larger than what it adds.
func signed(v float64) string {
	if v < 0 {
		return "−" + fmtUS(-v)
	}
	return "+" + fmtUS(v)
}

func fmtUS(v float64) string {
	if math.Abs(v) >= 1000 {
		return fmt.Sprintf("%.2f ms", v/1000)
	}
	return fmt.Sprintf("%.0f µs", v)
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// med is the median of v; 0 when v is empty.
func med(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func readJSON(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// readTicks reads cpu.txt: "PHASE PATH RUN TICKS" a line.
func readTicks(path string) (map[string]float64, error) {
	out := map[string]float64{}
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return out, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) != 4 {
			continue
		}
		v, err := strconv.ParseFloat(fs[3], 64)
		if err != nil {
			return nil, fmt.Errorf("%s: bad line %q", path, sc.Text())
		}
		out[fs[0]+" "+fs[1]+" "+fs[2]] = v
	}
	return out, sc.Err()
}
