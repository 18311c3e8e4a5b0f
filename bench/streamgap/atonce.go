package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The at-once mode (--target, repeated) measures what each hop costs per
// stream: C streams opened in the same instant on each target in turn, one
// stream each, every one held to its end. Besides what the client sees
// (time to first chunk, the largest gap between chunks, stalls) it reads the
// hop's own process tree from /proc (the processes named and their
// descendants, as nginx's workers): CPU time over the round, and resident
// memory the way an operator sizes a box for C streams — the tree's
// resident set at its highest while the streams were open, less its
// resident set before the first stream, divided by C.

// targetSpec is one --target NAME=URL[@PID[+PID...]].
type targetSpec struct {
	name, url string
	pids      []int  // the hop's processes (none: no cost is read)
	key       string // its --target-key, else --key
}

// keyFlags are the --target-key NAME=KEY flags: gateways with keys of their own.
type keyFlags map[string]string

func (f keyFlags) String() string { return fmt.Sprint(len(f)) }

func (f keyFlags) Set(v string) error {
	name, key, ok := strings.Cut(v, "=")
	if !ok || name == "" || key == "" {
		return fmt.Errorf("want NAME=KEY")
	}
	f[name] = key
	return nil
}

type targetFlags []targetSpec

func (f *targetFlags) String() string { return fmt.Sprint(len(*f)) }

func (f *targetFlags) Set(v string) error {
	name, rest, ok := strings.Cut(v, "=")
	if !ok || name == "" || rest == "" {
		return fmt.Errorf("want NAME=URL[@PID[+PID...]], got %q", v)
	}
	url, pids, _ := strings.Cut(rest, "@")
	t := targetSpec{name: name, url: strings.TrimSuffix(url, "/")}
	if pids != "" {
		for p := range strings.SplitSeq(pids, "+") {
			n, err := strconv.Atoi(p)
			if err != nil || n <= 0 {
				return fmt.Errorf("target %s: bad process id %q", name, p)
			}
			t.pids = append(t.pids, n)
		}
	}
	*f = append(*f, t)
	return nil
}

// atOnceResult is one round on one target.
type atOnceResult struct {
	ttft    []time.Duration
	maxGap  time.Duration
	stalls  int // streams with a gap over the stall limit
	failed  int
	errs    []string
	cpu     time.Duration // the hop's CPU time over the round
	peakRSS int64         // bytes, highest sample of the tree's VmRSS during the round
}

func runAtOnce(targets []targetSpec, body string, streams, tokens, rounds int, stall, timeout time.Duration, baseline, jsonOut string) {
	// The idle size is taken before the first stream: a Go process keeps
	// the memory its heap grew to for minutes, so a size taken after any
	// load would hide the streams' memory. The warm-up then opens the
	// connections the measured rounds reuse.
	clients := map[string]*http.Client{}
	idle := map[string]int64{}
	for i, t := range targets {
		targets[i].pids = processTree(t.pids)
		idle[t.name] = rss(targets[i].pids)
	}
	for _, t := range targets {
		clients[t.name] = newClient(streams)
		res := atOnce(t, clients[t.name], body, streams, timeout, stall)
		if res.failed > 0 {
			fmt.Fprintf(os.Stderr, "streamgap: warm-up on %s: %d of %d streams failed: %v\n", t.name, res.failed, streams, res.errs)
		}
	}
	time.Sleep(time.Second)
	all := map[string][]atOnceResult{}
	for r := range rounds {
		order := slices.Clone(targets)
		if r%2 == 1 {
			slices.Reverse(order)
		}
		for _, t := range order {
			time.Sleep(500 * time.Millisecond)
			res := atOnce(t, clients[t.name], body, streams, timeout, stall)
			all[t.name] = append(all[t.name], res)
			fmt.Fprintf(os.Stderr, "streamgap: round %d/%d %-8s %d streams, %d failed, %d stalled, cpu %s\n",
				r+1, rounds, t.name, streams, res.failed, res.stalls, res.cpu.Round(time.Millisecond))
		}
	}
	rows := printAtOnce(targets, all, idle, streams, tokens, rounds, stall, baseline)
	if jsonOut != "" {
		if err := writeRows(jsonOut, targets, rows, idle, streams, tokens, rounds); err != nil {
			fmt.Fprintln(os.Stderr, "streamgap:", err)
			os.Exit(1)
		}
	}
}

// atOnce starts n streams on t at the same instant and waits for them all,
// sampling the hop's memory meanwhile.
func atOnce(t targetSpec, client *http.Client, body string, n int, timeout, stall time.Duration) atOnceResult {
	var (
		res  atOnceResult
		mu   sync.Mutex
		wg   sync.WaitGroup
		gate = make(chan struct{})
		stop = make(chan struct{})
		peak = make(chan int64)
	)
	go func() {
		var hi int64
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			hi = max(hi, rss(t.pids))
			select {
			case <-stop:
				peak <- max(hi, rss(t.pids))
				return
			case <-tick.C:
			}
		}
	}()
	tgt := &target{name: t.name, url: t.url, client: client}
	cfg := runConfig{key: t.key, body: body, timeout: timeout}
	cpu0 := cpuTime(t.pids)
	for range n {
		wg.Go(func() {
			<-gate
			ttft, gaps, err := cfg.stream(tgt)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				res.failed++
				if len(res.errs) < 5 && !slices.Contains(res.errs, err.Error()) {
					res.errs = append(res.errs, err.Error())
				}
				return
			}
			res.ttft = append(res.ttft, ttft)
			g := slices.Max(append(gaps, 0))
			res.maxGap = max(res.maxGap, g)
			if g > stall {
				res.stalls++
			}
		})
	}
	close(gate)
	wg.Wait()
	res.cpu = cpuTime(t.pids) - cpu0
	close(stop)
	res.peakRSS = <-peak
	slices.Sort(res.ttft)
	return res
}

// atOnceRow is one target's medians over the rounds.
type atOnceRow struct {
	cpuStream, cpuChunk, ttft50, ttft99, maxGap time.Duration
	memStream                                   float64 // bytes: (peakRSS − idle RSS) / streams
	peakRSS                                     int64   // bytes, the round whose memStream is the median
	stalls, failed                              int
	hasCost                                     bool
}

func printAtOnce(targets []targetSpec, all map[string][]atOnceResult, idle map[string]int64, streams, tokens, rounds int, stall time.Duration, baseline string) map[string]atOnceRow {
	type row = atOnceRow
	rows := map[string]row{}
	for _, t := range targets {
		var cpu, t50, t99, gap []time.Duration
		var peaks []int64
		r := row{hasCost: len(t.pids) > 0}
		for _, res := range all[t.name] {
			done := max(len(res.ttft), 1)
			cpu = append(cpu, res.cpu/time.Duration(done))
			peaks = append(peaks, res.peakRSS)
			t50 = append(t50, pct(res.ttft, 0.50))
			t99 = append(t99, pct(res.ttft, 0.99))
			gap = append(gap, res.maxGap)
			r.stalls += res.stalls
			r.failed += res.failed
		}
		r.cpuStream, r.ttft50, r.ttft99 = median(cpu), median(t50), median(t99)
		r.cpuChunk = r.cpuStream / time.Duration(tokens)
		r.maxGap = slices.Max(gap)
		slices.Sort(peaks)
		r.peakRSS = peaks[len(peaks)/2]
		r.memStream = float64(r.peakRSS-idle[t.name]) / float64(streams)
		rows[t.name] = r
	}
	fmt.Printf("streams: %d opened at once per target, %d chunks each, %d round(s), medians over rounds; stall = a gap over %s\n",
		streams, tokens, rounds, stall)
	fmt.Printf("mem/stream = (open RSS − idle RSS) ÷ %d streams: RSS is VmRSS summed over the hop's process tree; idle before\n"+
		"this run's first stream, open the highest sample (every 20 ms) while a round's %d streams were open (median round)\n", streams, streams)
	fmt.Printf("%-10s %12s %12s %10s %10s %12s %12s %12s %12s %12s %8s %8s\n", "target", "cpu/stream", "cpu/chunk", "idle RSS", "open RSS", "mem/stream",
		"ttfc p50", "ttfc p99", "+ttfc p50", "+ttfc p99", "max gap", "stalls")
	direct, hasDirect := rows["direct"]
	for _, t := range targets {
		r := rows[t.name]
		cpuS, cpuC, idleS, openS, mem := "-", "-", "-", "-", "-"
		if r.hasCost {
			cpuS, cpuC = ms(r.cpuStream), us(r.cpuChunk)
			idleS, openS = fmt.Sprintf("%.1f MB", float64(idle[t.name])/1e6), fmt.Sprintf("%.1f MB", float64(r.peakRSS)/1e6)
			mem = fmt.Sprintf("%.1f KB", r.memStream/1024)
		}
		add50, add99 := "-", "-"
		if hasDirect && t.name != "direct" {
			add50, add99 = ms(r.ttft50-direct.ttft50), ms(r.ttft99-direct.ttft99)
		}
		fmt.Printf("%-10s %12s %12s %10s %10s %12s %12s %12s %12s %12s %8s %8d\n", t.name, cpuS, cpuC, idleS, openS, mem,
			ms(r.ttft50), ms(r.ttft99), add50, add99, fmt.Sprintf("%.0f ms", float64(r.maxGap)/1e6), r.stalls+r.failed)
	}
	// What a box must hold, as an operator sizes one: the idle process and
	// each open stream's share, at this run's stream count and at 10,000.
	for _, t := range targets {
		if r := rows[t.name]; r.hasCost {
			fmt.Printf("sizing %-10s idle RSS + streams × mem/stream: %.0f MB at %d streams, %.0f MB at 10000\n", t.name,
				float64(idle[t.name])/1e6+float64(streams)*r.memStream/1e6, streams, float64(idle[t.name])/1e6+1e4*r.memStream/1e6)
		}
	}
	base, ok := rows[baseline]
	if !ok {
		return rows
	}
	fmt.Printf("\nratios vs %s (same run):\n", baseline)
	fmt.Printf("%-10s %12s %12s %12s %12s\n", "target", "cpu/stream", "mem/stream", "+ttfc p50", "+ttfc p99")
	ratio := func(a, b float64) string {
		if b <= 0 {
			return "-"
		}
		return fmt.Sprintf("%.2fx", a/b)
	}
	for _, t := range targets {
		r := rows[t.name]
		if t.name == "direct" || t.name == baseline {
			continue
		}
		cpu, mem := "-", "-"
		if r.hasCost && base.hasCost {
			cpu, mem = ratio(float64(r.cpuStream), float64(base.cpuStream)), ratio(r.memStream, base.memStream)
		}
		a50, a99 := "-", "-"
		if hasDirect {
			a50 = ratio(float64(r.ttft50-direct.ttft50), float64(base.ttft50-direct.ttft50))
			a99 = ratio(float64(r.ttft99-direct.ttft99), float64(base.ttft99-direct.ttft99))
		}
		fmt.Printf("%-10s %12s %12s %12s %12s\n", t.name, cpu, mem, a50, a99)
	}
	return rows
}

// writeRows writes each target's row as JSON for a report
// (scripts/bench-governed.sh): sizes in bytes, times in microseconds.
func writeRows(path string, targets []targetSpec, rows map[string]atOnceRow, idle map[string]int64, streams, tokens, rounds int) error {
	type out struct {
		Target         string  `json:"target"`
		CPUPerStreamUS float64 `json:"cpu_us_per_stream,omitempty"`
		IdleRSS        int64   `json:"idle_rss_bytes,omitempty"`
		OpenRSS        int64   `json:"open_rss_bytes,omitempty"`
		BytesPerStream float64 `json:"rss_bytes_per_stream,omitempty"`
		TTFCp50US      float64 `json:"ttfc_p50_us"`
		TTFCp99US      float64 `json:"ttfc_p99_us"`
		Stalls         int     `json:"stalls_and_failures"`
	}
	doc := struct {
		Streams int    `json:"streams"`
		Chunks  int    `json:"chunks"`
		Rounds  int    `json:"rounds"`
		Method  string `json:"method"`
		Rows    []out  `json:"targets"`
	}{Streams: streams, Chunks: tokens, Rounds: rounds,
		Method: "rss_bytes_per_stream = (open_rss_bytes - idle_rss_bytes) / streams; RSS = VmRSS summed over the hop's process tree, idle before the first stream, open the highest 20 ms sample while the streams were open (median round)"}
	for _, t := range targets {
		r := rows[t.name]
		o := out{Target: t.name, TTFCp50US: float64(r.ttft50) / 1e3, TTFCp99US: float64(r.ttft99) / 1e3, Stalls: r.stalls + r.failed}
		if r.hasCost {
			o.CPUPerStreamUS, o.IdleRSS, o.OpenRSS, o.BytesPerStream = float64(r.cpuStream)/1e3, idle[t.name], r.peakRSS, r.memStream
		}
		doc.Rows = append(doc.Rows, o)
	}
	b, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// statFields returns the fields of /proc/PID/stat after the command name
// (which is in parentheses and may hold spaces): f[0] is the state (field
// 3), f[1] the parent's pid; nil when the process is gone.
func statFields(pid int) []string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return nil
	}
	return strings.Fields(string(b[i+1:]))
}

// processTree returns pids and all their descendants (a hop that forks
// workers keeps its cost in them), read from /proc once.
func processTree(pids []int) []int {
	children := map[int][]int{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		f := statFields(pid)
		if len(f) < 2 {
			continue
		}
		if ppid, err := strconv.Atoi(f[1]); err == nil {
			children[ppid] = append(children[ppid], pid)
		}
	}
	var out []int
	seen := map[int]bool{}
	var walk func(int)
	walk = func(p int) {
		if seen[p] {
			return
		}
		seen[p] = true
		out = append(out, p)
		for _, c := range children[p] {
			walk(c)
		}
	}
	for _, p := range pids {
		walk(p)
	}
	return out
}

func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

func us(d time.Duration) string { return fmt.Sprintf("%.1f µs", float64(d)/float64(time.Microsecond)) }

// cpuTime is the user+system CPU time the processes used so far
// (/proc/PID/stat, in clock ticks of 10 ms on Linux).
func cpuTime(pids []int) time.Duration {
	var total time.Duration
	for _, pid := range pids {
		f := statFields(pid)
		if len(f) < 13 {
			continue
		}
		ut, _ := strconv.ParseInt(f[11], 10, 64) // utime: field 14
		st, _ := strconv.ParseInt(f[12], 10, 64) // stime: field 15
		total += time.Duration(ut+st) * 10 * time.Millisecond
	}
	return total
}

// rss is the processes' resident memory now (VmRSS), in bytes.
func rss(pids []int) int64 {
	var total int64
	for _, pid := range pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		if err != nil {
			continue
		}
		for line := range strings.SplitSeq(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
				kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
				total += kb << 10
			}
		}
	}
	return total
}
