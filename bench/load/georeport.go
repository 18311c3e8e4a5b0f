package load

import (
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// GeoReport is the geo scenario's figures by geography: each source's
// latencies and the regions that served it, before and after the kill,
// each region's, and what the kill cost.
type GeoReport struct {
	// Links says how the network paths were made.
	Links   string      `json:"links"`
	Regions []string    `json:"regions"`
	Sources []GeoSource `json:"sources"`
	Served  []GeoRegion `json:"served"`
	Kill    *GeoKill    `json:"kill,omitempty"`
}

// GeoSource is one source: its link round trips and its requests, before
// the kill (the whole run when there is none) and after it.
type GeoSource struct {
	Name   string             `json:"name"`
	Near   string             `json:"near"`
	RTTMS  map[string]float64 `json:"rtt_ms"` // nominal, edge to region
	Before GeoSlice           `json:"before"`
	After  *GeoSlice          `json:"after,omitempty"`
}

// GeoSlice is a set of one source's requests.
type GeoSlice struct {
	Requests int            `json:"requests"`
	Errors   int            `json:"errors"`
	Served   map[string]int `json:"served_by"` // region: answers
	TTFT     Summary        `json:"ttft_ms"`
}

// GeoRegion is what one region served over the run.
type GeoRegion struct {
	Name   string  `json:"name"`
	Served int     `json:"served"`
	TTFT   Summary `json:"ttft_ms"`
	Killed bool    `json:"killed,omitempty"`
}

// GeoKill is what killing a region cost.
type GeoKill struct {
	Region string  `json:"region"`
	AtS    float64 `json:"at_s"`
	// MovedMS is, per source, when its edge's route stopped listing the
	// region (polled every 20 ms); nil if it never did.
	MovedMS    map[string]*float64 `json:"moved_after_ms"`
	MovedMaxMS *float64            `json:"moved_all_after_ms"`
	// Retried is, per source, the requests its edge sent to the killed
	// region and moved on to another (the edge's own count).
	Retried map[string]int `json:"retried_by_edge"`
	// NotStartedErrors are requests sent after the kill that failed
	// (target 0); InFlightErrors those sent before that it cut.
	NotStartedErrors int `json:"errors_not_started"`
	InFlightErrors   int `json:"errors_in_flight"`
	// Moves are the sources the killed region served.
	WindowS float64   `json:"window_s"`
	Moves   []GeoMove `json:"moves"`
}

// GeoMove is one source's move off the killed region: its TTFT p99 in
// the window before the kill and in the window after it, and the budget
// for what the move adds, one round trip from the source to the region
// that took over (with the link's jitter).
type GeoMove struct {
	Source    string  `json:"source"`
	To        string  `json:"to"`
	P99Before float64 `json:"p99_before_ms"`
	P99During float64 `json:"p99_during_ms"`
	AddedMS   float64 `json:"added_p99_ms"`
	BudgetMS  float64 `json:"budget_ms"`
	// NewConns are the connections the source's edge opened to the new
	// region after the kill, each a round trip before its request moved.
	NewConns int64 `json:"new_connections"`
	Pass     bool  `json:"pass"`
}

// regionOf is the region that answered r: its replica ids are the
// region's name, a dash and a number.
func regionOf(r *Record) string {
	name, _, _ := strings.Cut(r.Replica, "-")
	return name
}

func (f *geoFleet) analyze(ctx context.Context, res *Result, window time.Duration) *GeoReport {
	g := &GeoReport{Regions: geoRegions,
		Links: fmt.Sprintf("delay proxy on loopback: each link holds every chunk its one-way delay ±%.0f%% (uniform, in order), a new connection costs one round trip; clients reach their edge over %v one way",
			100*geoJitter, geoLocal)}
	var kill time.Duration = -1
	for _, ev := range res.Events {
		if ev.Kind == Kill && ev.Err == "" {
			kill = ev.At
		}
	}
	slice := func(src string, from, to time.Duration) GeoSlice {
		s := GeoSlice{Served: map[string]int{}}
		var ttft []float64
		for i := range res.Records {
			r := &res.Records[i]
			if r.Source != src || r.Intended < from || r.Intended >= to {
				continue
			}
			s.Requests++
			if !r.OK() {
				s.Errors++
				continue
			}
			s.Served[regionOf(r)]++
			if r.TTFT >= 0 {
				ttft = append(ttft, ms(r.TTFT))
			}
		}
		s.TTFT = Summarize(ttft)
		return s
	}
	end := res.Elapsed + time.Hour
	for _, s := range geoSources {
		gs := GeoSource{Name: s.name, Near: s.near, RTTMS: map[string]float64{}}
		for ri, name := range geoRegions {
			gs.RTTMS[name] = ms(geoRTT(s, ri))
		}
		if kill < 0 {
			gs.Before = slice(s.name, 0, end)
		} else {
			gs.Before = slice(s.name, 0, kill)
			a := slice(s.name, kill, end)
			gs.After = &a
		}
		g.Sources = append(g.Sources, gs)
	}
	for _, name := range geoRegions {
		gr := GeoRegion{Name: name, Killed: kill >= 0 && name == geoKill}
		var ttft []float64
		for i := range res.Records {
			if r := &res.Records[i]; r.OK() && regionOf(r) == name {
				gr.Served++
				if r.TTFT >= 0 {
					ttft = append(ttft, ms(r.TTFT))
				}
			}
		}
		gr.TTFT = Summarize(ttft)
		g.Served = append(g.Served, gr)
	}
	if kill >= 0 {
		g.Kill = f.killReport(ctx, res, kill, window)
	}
	return g
}

func (f *geoFleet) killReport(ctx context.Context, res *Result, kill, window time.Duration) *GeoKill {
	k := &GeoKill{Region: geoKill, AtS: secs(kill), MovedMS: map[string]*float64{}, Retried: map[string]int{}, WindowS: secs(window)}
	f.mu.Lock()
	all := true
	var most float64
	for si, s := range geoSources {
		m := f.movedMS[si]
		k.MovedMS[s.name] = m
		if m == nil {
			all = false
		} else {
			most = max(most, *m)
		}
	}
	f.mu.Unlock()
	if all {
		k.MovedMaxMS = &most
	}
	for si, s := range geoSources {
		k.Retried[s.name] = f.edgeRetries(ctx, si, geoKill)
	}
	for i := range res.Records {
		r := &res.Records[i]
		switch {
		case r.OK():
		case r.Intended >= kill:
			k.NotStartedErrors++
		case r.End() >= kill:
			k.InFlightErrors++
		}
	}
	p99 := func(src string, from, to time.Duration, served func(string) bool) (float64, map[string]int) {
		by := map[string]int{}
		var ttft []float64
		for i := range res.Records {
			r := &res.Records[i]
			if r.Source != src || r.Intended < from || r.Intended >= to || !r.OK() || r.TTFT < 0 {
				continue
			}
			by[regionOf(r)]++
			if served == nil || served(regionOf(r)) {
				ttft = append(ttft, ms(r.TTFT))
			}
		}
		return Summarize(ttft).P99, by
	}
	for _, s := range geoSources {
		before, by := p99(s.name, max(kill-window, 0), kill, nil)
		if top(by) != geoKill {
			continue // the killed region did not serve this source
		}
		during, byAfter := p99(s.name, kill, kill+window, nil)
		to := top(byAfter)
		m := GeoMove{Source: s.name, To: to, P99Before: before, P99During: during, AddedMS: during - before}
		if ri := slices.Index(geoRegions, to); ri >= 0 {
			m.BudgetMS = ms(geoRTT(s, ri)) * (1 + geoJitter)
			si := slices.IndexFunc(geoSources, func(g geoSource) bool { return g.name == s.name })
			f.mu.Lock()
			if f.openedAt != nil {
				m.NewConns = f.edgeLinks[si][ri].opened.Load() - f.openedAt[si][ri]
			}
			f.mu.Unlock()
		}
		m.Pass = m.BudgetMS > 0 && m.AddedMS <= m.BudgetMS
		k.Moves = append(k.Moves, m)
	}
	return k
}

// top is the key with the highest count ("" for none).
func top(by map[string]int) string {
	best, n := "", 0
	for _, k := range slices.Sorted(maps.Keys(by)) {
		if by[k] > n {
			best, n = k, by[k]
		}
	}
	return best
}

// failures lists what misses the scenario's aim: an error among requests
// sent after the kill, or a move that added more than its budget to p99.
func (g *GeoReport) failures() []string {
	var out []string
	if g == nil || g.Kill == nil {
		return nil
	}
	if n := g.Kill.NotStartedErrors; n > 0 {
		out = append(out, fmt.Sprintf("%s sent after the kill failed (target 0)", plural(n, "request")))
	}
	for _, m := range g.Kill.Moves {
		if !m.Pass {
			out = append(out, fmt.Sprintf("%s's p99 rose %.0f ms moving to %s, over one round trip (%.0f ms)", m.Source, m.AddedMS, m.To, m.BudgetMS))
		}
	}
	return out
}

// WriteText writes the figures by geography.
func (g *GeoReport) WriteText(w io.Writer) error {
	fmt.Fprintf(w, "\nBY GEOGRAPHY (links: %s)\n", g.Links)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "RTT ms, edge→region\t%s\n", strings.Join(g.Regions, "\t"))
	for _, s := range g.Sources {
		row := []string{s.Name}
		for _, r := range g.Regions {
			row = append(row, fmt.Sprintf("%.0f", s.RTTMS[r]))
		}
		fmt.Fprintln(tw, strings.Join(row, "\t"))
	}
	_ = tw.Flush()
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SOURCE\tWHEN\tREQUESTS\tERRORS\tSERVED BY\tTTFT p50\tp95\tp99")
	row := func(name, when string, s GeoSlice) {
		var by []string
		for _, k := range slices.Sorted(maps.Keys(s.Served)) {
			by = append(by, fmt.Sprintf("%s %d", k, s.Served[k]))
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%s\t%s\t%s\n", name, when, s.Requests, s.Errors, strings.Join(by, ", "),
			s.TTFT.Show("p50"), s.TTFT.Show("p95"), s.TTFT.Show("p99"))
	}
	for _, s := range g.Sources {
		if s.After == nil {
			row(s.Name, "whole run", s.Before)
			continue
		}
		row(s.Name, "before kill", s.Before)
		row(s.Name, "after kill", *s.After)
	}
	_ = tw.Flush()
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "REGION\tSERVED\tTTFT p50\tp95\tp99\t")
	for _, r := range g.Served {
		note := ""
		if r.Killed {
			note = "killed mid-run"
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\n", r.Name, r.Served, r.TTFT.Show("p50"), r.TTFT.Show("p95"), r.TTFT.Show("p99"), note)
	}
	_ = tw.Flush()
	k := g.Kill
	if k == nil {
		return nil
	}
	fmt.Fprintf(w, "\nKILL %s at %.1fs (gateway and workers SIGKILLed, links cut)\n", k.Region, k.AtS)
	var moved []string
	for _, s := range g.Sources {
		m := "never"
		if v := k.MovedMS[s.Name]; v != nil {
			m = fmtMS(*v)
		}
		moved = append(moved, fmt.Sprintf("%s %s (%d moved by its edge)", s.Name, m, k.Retried[s.Name]))
	}
	fmt.Fprintf(w, "  no new request to %s after: %s; all edges: %s\n", k.Region, strings.Join(moved, ", "), fmtOpt(k.MovedMaxMS))
	fmt.Fprintf(w, "  errors: %d among requests sent after the kill (target 0), %d among requests in flight at the kill\n", k.NotStartedErrors, k.InFlightErrors)
	for _, m := range k.Moves {
		verdict := "PASS"
		if !m.Pass {
			verdict = "FAIL"
		}
		fmt.Fprintf(w, "  %s → %s: TTFT p99 %s in the %.0fs before, %s in the %.0fs after: %+.0f ms; budget one round trip %s→%s %.0f ms: %s (its edge opened %d connections to %s)\n",
			m.Source, m.To, fmtMS(m.P99Before), k.WindowS, fmtMS(m.P99During), k.WindowS, m.AddedMS, m.Source, m.To, m.BudgetMS, verdict, m.NewConns, m.To)
	}
	return nil
}

// Text is WriteText's output, for the HTML page.
func (g *GeoReport) Text() string {
	var b strings.Builder
	_ = g.WriteText(&b)
	return strings.TrimLeft(b.String(), "\n")
}
