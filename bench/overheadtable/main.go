// Command overheadtable turns the results of scripts/bench-overhead.sh into
// its report: for each request rate, the latency of each path (the engine
// directly, the gateway, optionally a bare nginx hop), what each hop adds
// over the direct path, and the highest rate each path held.
//
// It reads vegeta results encoded as CSV (`vegeta encode --to csv`), one
// file per path and rate named PATH-RATE.csv in --dir, and computes exact
// percentiles from every request's latency.
package main

import (
	"encoding/csv"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

func main() {
	var (
		dir       = flag.String("dir", "", "directory holding PATH-RATE.csv files")
		rates     = flag.String("rates", "500 1000 2000 3000 4000 5000", "rates in the order they ran (space separated)")
		paths     = flag.String("paths", "direct gateway", "paths; the first is the baseline the others are compared with")
		holdP99   = flag.Duration("hold-p99", 20*time.Millisecond, "a rate is held when p99 stays under this")
		goalRate  = flag.Int("goal-rate", 1000, "rate at which the added-latency goal is checked")
		goalP50   = flag.Duration("goal-added-p50", 300*time.Microsecond, "goal: most added p50 at --goal-rate")
		goalP99   = flag.Duration("goal-added-p99", 2*time.Millisecond, "goal: most added p99 at --goal-rate")
		goalHeld  = flag.Int("goal-held", 2000, "goal: least rate the gateway holds")
		goalPath  = flag.String("goal-path", "gateway", "the path the goals are about")
		minOK     = flag.Float64("min-success", 0.999, "a rate is held only when at least this share of requests succeeded")
		minSentOf = flag.Float64("min-sent", 0.95, "a rate is held only when the load generator sent at least this share of it")
		collapsed = flag.String("collapsed", "", "only check this one CSV file: exit 0 (and say why) when the path broke down "+
			"there (under 99% success or p99 over --collapse-p99), so the script runs no higher rate on it; else exit 3")
		collapseP99 = flag.Duration("collapse-p99", time.Second, "with --collapsed: a p99 over this is a breakdown")
		governedDir = flag.String("governed", "", "scripts/bench-governed.sh's report from the results in this directory (governed.go): "+
			"the table on stdout, report.md and report.json beside the results")
		rounds = flag.Int("rounds", 0, "A/B mode (scripts/bench-ab.sh): read PATH-rK.csv for K = 1..rounds in --dir and "+
			"compare the paths round by round, each against the first path of the same round")
	)
	flag.Parse()
	if *governedDir != "" {
		if err := governed(*governedDir, os.Stdout); err != nil {
			fatalf("%v", err)
		}
		return
	}
	if *rounds > 0 {
		if *dir == "" || len(strings.Fields(*paths)) < 2 {
			fatalf("--rounds needs --dir and at least two --paths")
		}
		abTable(os.Stdout, *dir, strings.Fields(*paths), *rounds)
		return
	}
	if *collapsed != "" {
		s, err := load(*collapsed)
		switch {
		case err != nil:
			fmt.Printf("no results (%v)\n", err)
		case s.success < 0.99 || s.p99 > *collapseP99:
			fmt.Printf("ok %s, p99 %s ms\n", pctStr(s.success), ms(s.p99))
		default:
			os.Exit(3)
		}
		return
	}
	if *dir == "" {
		fmt.Fprintln(os.Stderr, "usage: overheadtable --dir DIR [--rates \"500 1000\"] [--paths \"direct gateway nginx\"]")
		os.Exit(2)
	}
	var rs []int
	for _, f := range strings.Fields(*rates) {
		r, err := strconv.Atoi(f)
		if err != nil || r <= 0 {
			fatalf("bad rate %q", f)
		}
		rs = append(rs, r)
	}
	ps := strings.Fields(*paths)
	if len(ps) < 2 {
		fatalf("want at least two paths")
	}

	// sums[path][i] is the summary of path at rs[i]; nil when missing.
	sums := map[string][]*summary{}
	for _, p := range ps {
		for _, r := range rs {
			s, err := load(filepath.Join(*dir, fmt.Sprintf("%s-%d.csv", p, r)))
			if err != nil && !errors.Is(err, os.ErrNotExist) {
				fatalf("%s at %d/s: %v", p, r, err)
			}
			sums[p] = append(sums[p], s)
		}
	}
	held := func(s *summary, rate int) bool {
		return s != nil && s.p99 < *holdP99 && s.success >= *minOK && s.sentRate >= *minSentOf*float64(rate)
	}

	base := ps[0]
	for _, p := range ps[1:] {
		fmt.Printf("\n%s vs %s: latency in ms; ok = share of 200s; sent = requests/s the load generator achieved\n", p, base)
		fmt.Printf("%6s | %-17s | %-17s | %-17s | %-17s | %s\n", "", base, p, "added by "+p, "ok", "sent")
		fmt.Printf("%6s | %8s %8s | %8s %8s | %8s %8s | %8s %8s | %7s %7s\n",
			"rate", "p50", "p99", "p50", "p99", "p50", "p99", base, p, base, p)
		for i, r := range rs {
			b, s := sums[base][i], sums[p][i]
			if b == nil || s == nil {
				fmt.Printf("%6d | (not run)\n", r)
				continue
			}
			fmt.Printf("%6d | %8s %8s | %8s %8s | %8s %8s | %8s %8s | %7.0f %7.0f\n", r,
				ms(b.p50), ms(b.p99), ms(s.p50), ms(s.p99), ms(s.p50-b.p50), ms(s.p99-b.p99),
				pctStr(b.success), pctStr(s.success), b.sentRate, s.sentRate)
		}
	}

	// A path holds a rate when it held every lower rate tried too: a rate
	// held only above a failed one is listed, not counted.
	fmt.Printf("\nhighest rate held with p99 < %s (ok >= %s, sent >= %.0f%% of the rate, every lower rate held too):\n",
		*holdP99, pctStr(*minOK), *minSentOf*100)
	heldBy := map[string]int{}
	order := slices.Sorted(slices.Values(rs))
	for _, p := range ps {
		best, broken := 0, 0
		var missed, heldAbove []string
		for _, r := range order {
			s := sums[p][slices.Index(rs, r)]
			switch {
			case s == nil:
			case held(s, r) && broken == 0:
				best = r
			case held(s, r):
				heldAbove = append(heldAbove, strconv.Itoa(r))
			default:
				if broken == 0 {
					broken = r
				}
				missed = append(missed, fmt.Sprintf("%d (p99 %s ms, ok %s)", r, ms(s.p99), pctStr(s.success)))
			}
		}
		heldBy[p] = best
		line := "none of the rates run"
		if best > 0 {
			line = fmt.Sprintf("%d req/s", best)
			if best == order[len(order)-1] {
				line += " (the highest rate tried)"
			}
		}
		if len(missed) > 0 {
			line += "; missed at " + strings.Join(missed, ", ")
		}
		if len(heldAbove) > 0 {
			line += "; held again at " + strings.Join(heldAbove, ", ")
		}
		fmt.Printf("  %-8s %s\n", p, line)
	}

	if gi := slices.Index(rs, *goalRate); gi >= 0 && sums[base][gi] != nil && sums[*goalPath] != nil && sums[*goalPath][gi] != nil {
		b, s := sums[base][gi], sums[*goalPath][gi]
		a50, a99 := s.p50-b.p50, s.p99-b.p99
		fmt.Printf("\ngoal at %d req/s: added p50 %s ms (<= %s ms): %s; added p99 %s ms (<= %s ms): %s\n", *goalRate,
			ms(a50), ms(*goalP50), verdict(a50 <= *goalP50), ms(a99), ms(*goalP99), verdict(a99 <= *goalP99))
	}
	if _, ok := heldBy[*goalPath]; ok {
		fmt.Printf("goal: %s holds >= %d req/s with p99 < %s: %s\n", *goalPath, *goalHeld, *holdP99, verdict(heldBy[*goalPath] >= *goalHeld))
	}
}

// summary is one path at one rate.
type summary struct {
	n        int
	success  float64 // share of requests answered 200 without error
	sentRate float64 // requests per second actually sent
	p50, p99 time.Duration
	max      time.Duration
}

// load reads a vegeta CSV file: timestamp (ns), code, latency (ns), bytes
// out, bytes in, error, body, attack, seq, method, url, headers.
func load(path string) (*summary, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	r := csv.NewReader(f)
	r.FieldsPerRecord = -1
	r.ReuseRecord = true
	var (
		lat         []time.Duration
		ok          int
		first, last int64
	)
	for {
		rec, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		if len(rec) < 6 {
			return nil, fmt.Errorf("short record: %d fields", len(rec))
		}
		ts, err1 := strconv.ParseInt(rec[0], 10, 64)
		l, err2 := strconv.ParseInt(rec[2], 10, 64)
		if err1 != nil || err2 != nil {
			return nil, fmt.Errorf("bad record %q", strings.Join(rec, ","))
		}
		if first == 0 || ts < first {
			first = ts
		}
		last = max(last, ts)
		lat = append(lat, time.Duration(l))
		if rec[1] == "200" && rec[5] == "" {
			ok++
		}
	}
	if len(lat) == 0 {
		return nil, fmt.Errorf("no results")
	}
	slices.Sort(lat)
	s := &summary{n: len(lat), success: float64(ok) / float64(len(lat)), p50: pct(lat, 0.50), p99: pct(lat, 0.99), max: lat[len(lat)-1]}
	if span := time.Duration(last - first); span > 0 {
		s.sentRate = float64(len(lat)-1) / span.Seconds()
	}
	return s, nil
}

// pct returns the q-quantile of sorted (nearest rank).
func pct(sorted []time.Duration, q float64) time.Duration {
	i := int(q*float64(len(sorted))+0.999999) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

func ms(d time.Duration) string {
	return strconv.FormatFloat(float64(d)/float64(time.Millisecond), 'f', 3, 64)
}

func pctStr(v float64) string { return strconv.FormatFloat(v*100, 'f', 2, 64) + "%" }

func verdict(ok bool) string {
	if ok {
		return "met"
	}
	return "MISSED"
}

func fatalf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "overheadtable: "+format+"\n", args...)
	os.Exit(1)
}

// abTable prints what each path adds over paths[0] in every round and the
// medians over the rounds; with three paths or more, also each later path
// against paths[1], round by round. Rounds run the paths back to back, so a
// round's difference is measured under the same conditions, and the median
// of those differences is steadier than a difference of two long runs.
func abTable(w io.Writer, dir string, paths []string, rounds int) {
	base := paths[0]
	added := map[string][][2]time.Duration{} // path → per round {p50, p99} added over base
	fmt.Fprintf(w, "added over %s per round, p50 / p99 ms (ok share when under 100%%):\n%6s", base, "round")
	for _, p := range paths[1:] {
		fmt.Fprintf(w, " | %-17s", p)
	}
	fmt.Fprintln(w)
	for k := 1; k <= rounds; k++ {
		sums := make([]*summary, len(paths))
		for i, p := range paths {
			s, err := load(filepath.Join(dir, fmt.Sprintf("%s-r%d.csv", p, k)))
			if err != nil {
				fatalf("%s, round %d: %v", p, k, err)
			}
			sums[i] = s
		}
		fmt.Fprintf(w, "%6d", k)
		for i, p := range paths[1:] {
			s, b := sums[i+1], sums[0]
			a := [2]time.Duration{s.p50 - b.p50, s.p99 - b.p99}
			added[p] = append(added[p], a)
			cell := ms(a[0]) + " / " + ms(a[1])
			if s.success < 1 {
				cell += " ok " + pctStr(s.success)
			}
			fmt.Fprintf(w, " | %-17s", cell)
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "%6s", "median")
	for _, p := range paths[1:] {
		fmt.Fprintf(w, " | %-17s", ms(median(added[p], 0))+" / "+ms(median(added[p], 1)))
	}
	fmt.Fprintln(w)
	if len(paths) < 3 {
		return
	}
	ref := paths[1]
	fmt.Fprintf(w, "\nagainst %s, median of the differences in the same round (negative: faster than %s):\n", ref, ref)
	for _, p := range paths[2:] {
		d := make([][2]time.Duration, rounds)
		for k := range d {
			for j := range 2 {
				d[k][j] = added[p][k][j] - added[ref][k][j]
			}
		}
		fmt.Fprintf(w, "  %-12s p50 %s ms, p99 %s ms\n", p, ms(median(d, 0)), ms(median(d, 1)))
	}
}

// median returns the median of column j of v.
func median(v [][2]time.Duration, j int) time.Duration {
	c := make([]time.Duration, len(v))
	for i := range v {
		c[i] = v[i][j]
	}
	slices.Sort(c)
	if len(c)%2 == 1 {
		return c[len(c)/2]
	}
	return (c[len(c)/2-1] + c[len(c)/2]) / 2
}
