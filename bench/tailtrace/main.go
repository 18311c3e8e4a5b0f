// Command tailtrace reads a Go execution trace of the gateway and says where
// its slowest requests' time went: the p99 request by request, not an
// average.
//
// The gateway makes each public request a runtime/trace task
// (tailgate.request) while a trace is taken, so take one under load from the
// admin listener and read it:
//
//	curl -H "Authorization: Bearer $ADMIN_TOKEN" -o gw.trace \
//	    "http://127.0.0.1:8081/debug/pprof/trace?seconds=3"
//	go run ./bench/tailtrace gw.trace
//
// For the requests in the trace, all and the slowest 1%, it prints what the
// serving goroutine spent each request doing — running, runnable (waiting
// for a CPU), in a system call, blocked (on the network, a lock, a channel),
// each with the stack it blocked at — then what woke the slowest ones, what
// ran on the CPUs while they waited for one, how many overlapped a GC mark
// phase, and CPU time by goroutine. --show N prints the N slowest requests'
// timelines, state by state.
//
// Work a request hands to another goroutine shows as the request's wait for
// it (a channel, a select), not as that goroutine's own states.
package main

import (
	"cmp"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"golang.org/x/exp/trace"
)

func main() {
	taskType := flag.String("task", "tailgate.request", "the task type a request is")
	slow := flag.Float64("slowest", 0.01, "the share of requests, slowest first, looked at closely")
	show := flag.Int("show", 0, "print the timelines of this many slowest requests")
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: tailtrace [flags] TRACE_FILE")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() != 1 || *slow <= 0 || *slow > 1 {
		flag.Usage()
		os.Exit(2)
	}
	f, err := os.Open(flag.Arg(0))
	if err != nil {
		fmt.Fprintln(os.Stderr, "tailtrace:", err)
		os.Exit(1)
	}
	defer f.Close()
	a, err := read(f, *taskType)
	if err != nil {
		fmt.Fprintln(os.Stderr, "tailtrace:", err)
		os.Exit(1)
	}
	if len(a.done) == 0 {
		fmt.Fprintf(os.Stderr, "tailtrace: no %q task ended in the trace: was it taken from a gateway under load?\n", *taskType)
		os.Exit(1)
	}
	a.report(os.Stdout, *slow, *show)
}

// request is one task: the goroutine that began it, when, and where its
// time went by state.
type request struct {
	g          trace.GoID
	start, end trace.Time
	by         map[string]time.Duration // by state key
	steps      []step
	runnable   [][2]trace.Time // intervals spent waiting for a CPU
	wakes      map[string]int  // what made it runnable, by source
}

func (r *request) took() time.Duration { return r.end.Sub(r.start) }

type step struct {
	d   time.Duration
	key string
}

// gor is what is known of a goroutine as the trace is read.
type gor struct {
	state trace.GoState
	since trace.Time
	key   string // its state's key for a request's breakdown
	fn    string // the function it started in
}

type ran struct {
	from, to trace.Time
	fn       string
}

type analysis struct {
	first, last trace.Time
	done        []*request
	runs        []ran           // every interval a goroutine ran
	gcs         [][2]trace.Time // GC mark phases
	cpu         map[string]time.Duration
}

// read reads a whole trace.
func read(in io.Reader, taskType string) (*analysis, error) {
	tr, err := trace.NewReader(in)
	if err != nil {
		return nil, fmt.Errorf("not a Go execution trace: %w", err)
	}
	a := &analysis{cpu: map[string]time.Duration{}}
	gs := map[trace.GoID]*gor{}
	open := map[trace.GoID]*request{}
	byID := map[trace.TaskID]*request{}
	var gcFrom trace.Time
	// account adds g's time in its state up to now to the request it serves.
	account := func(id trace.GoID, g *gor, now trace.Time) {
		r := open[id]
		if r == nil {
			return
		}
		from := max(g.since, r.start)
		if now > from {
			d := now.Sub(from)
			r.by[g.key] += d
			r.steps = append(r.steps, step{d, g.key})
			if g.state == trace.GoRunnable {
				r.runnable = append(r.runnable, [2]trace.Time{from, now})
			}
		}
	}
	for {
		ev, err := tr.ReadEvent()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("reading the trace: %w", err)
		}
		now := ev.Time()
		if a.first == 0 {
			a.first = now
		}
		a.last = now
		switch ev.Kind() {
		case trace.EventTaskBegin:
			if t := ev.Task(); t.Type == taskType {
				r := &request{g: ev.Goroutine(), start: now, by: map[string]time.Duration{}, wakes: map[string]int{}}
				byID[t.ID], open[r.g] = r, r
			}
		case trace.EventTaskEnd:
			r := byID[ev.Task().ID]
			if r == nil {
				continue
			}
			delete(byID, ev.Task().ID)
			if g := gs[r.g]; g != nil {
				account(r.g, g, now)
			}
			r.end = now
			delete(open, r.g)
			a.done = append(a.done, r)
		case trace.EventRangeBegin:
			if strings.HasPrefix(ev.Range().Name, "GC concurrent mark") {
				gcFrom = now
			}
		case trace.EventRangeEnd:
			if strings.HasPrefix(ev.Range().Name, "GC concurrent mark") && gcFrom != 0 {
				a.gcs = append(a.gcs, [2]trace.Time{gcFrom, now})
				gcFrom = 0
			}
		case trace.EventStateTransition:
			st := ev.StateTransition()
			if st.Resource.Kind != trace.ResourceGoroutine {
				continue
			}
			id := st.Resource.Goroutine()
			from, to := st.Goroutine()
			g := gs[id]
			if g == nil {
				g = &gor{state: from, since: now, key: from.String()}
				gs[id] = g
			}
			account(id, g, now)
			if g.fn == "" {
				g.fn = startFunc(st.Stack)
			}
			if g.state == trace.GoRunning {
				fn := cmp.Or(g.fn, "(not known: no stack of it in the trace)")
				a.cpu[fn] += now.Sub(g.since)
				a.runs = append(a.runs, ran{g.since, now, fn})
			}
			if r := open[id]; r != nil && to == trace.GoRunnable {
				r.wakes[wakeSource(ev, from, st, gs)]++
			}
			g.state, g.since, g.key = to, now, stateKey(from, to, st)
			if to == trace.GoNotExist {
				delete(gs, id)
			}
		}
	}
	slices.SortFunc(a.done, func(x, y *request) int { return cmp.Compare(x.took(), y.took()) })
	return a, nil
}

// startFunc names a goroutine by the function it started in, the outermost
// frame of a stack of its; "" for an empty stack (it is asked again at the
// goroutine's next transition).
func startFunc(s trace.Stack) string {
	var outer string
	for f := range s.Frames() {
		outer = f.Func
	}
	return outer
}

// stateKey is how a request's breakdown names the state a goroutine entered.
func stateKey(from, to trace.GoState, st trace.StateTransition) string {
	switch to {
	case trace.GoRunning:
		return "running"
	case trace.GoRunnable:
		if from == trace.GoRunning {
			return "runnable, after " + st.Reason
		}
		return "runnable"
	case trace.GoSyscall:
		return "syscall " + frames(st.Stack, 6)
	case trace.GoWaiting:
		return "blocked (" + st.Reason + ") " + frames(st.Stack, 6)
	}
	return to.String()
}

// wakeSource says what made a request's goroutine runnable.
func wakeSource(ev trace.Event, from trace.GoState, st trace.StateTransition, gs map[trace.GoID]*gor) string {
	switch {
	case from == trace.GoRunning:
		return "itself: " + st.Reason
	case from == trace.GoSyscall:
		return "its system call's return"
	case ev.Goroutine() == trace.NoGoroutine:
		return "the network poller or a timer"
	}
	by := "a goroutine"
	if g := gs[ev.Goroutine()]; g != nil && g.fn != "" {
		by = g.fn
	}
	return by + " at " + frames(ev.Stack(), 2)
}

// frames is a stack's innermost n frames outside the runtime and sync
// packages (the first such frame kept when it is the leaf).
func frames(s trace.Stack, n int) string {
	var fs []string
	for f := range s.Frames() {
		internal := strings.HasPrefix(f.Func, "runtime.") || strings.HasPrefix(f.Func, "sync.") || strings.HasPrefix(f.Func, "internal/")
		if internal && len(fs) > 0 {
			continue
		}
		fs = append(fs, f.Func)
		if len(fs) == n {
			break
		}
	}
	return strings.Join(fs, " < ")
}

func (a *analysis) report(w io.Writer, share float64, show int) {
	n := len(a.done)
	k := max(1, int(float64(n)*share))
	slowest := a.done[n-k:]
	at := func(p float64) time.Duration { return a.done[min(n-1, int(p*float64(n)))].took() }
	fmt.Fprintf(w, "%d requests in %v of trace: p50 %v, p90 %v, p99 %v, max %v (handler, task begin to end)\n",
		n, a.last.Sub(a.first).Round(time.Millisecond), at(0.5), at(0.9), at(0.99), a.done[n-1].took())

	breakdown(w, "all requests", a.done)
	breakdown(w, fmt.Sprintf("the slowest %d (%.3g%%)", k, 100*share), slowest)

	wakes := map[string]int{}
	for _, r := range slowest {
		for src, c := range r.wakes {
			wakes[src] += c
		}
	}
	fmt.Fprintf(w, "\nwhat made the slowest runnable, per request:\n")
	for _, e := range sorted(wakes) {
		fmt.Fprintf(w, "  %6.2f  %s\n", float64(e.v)/float64(k), e.k)
	}

	// What ran while the slowest waited for a CPU.
	on := map[string]time.Duration{}
	var waited time.Duration
	for _, r := range slowest {
		for _, iv := range r.runnable {
			waited += iv[1].Sub(iv[0])
			for _, x := range a.runs {
				if d := overlap(x.from, x.to, iv[0], iv[1]); d > 0 {
					on[x.fn] += d
				}
			}
		}
	}
	fmt.Fprintf(w, "\nwhile the slowest waited for a CPU (%v each), what ran in this process, CPU time per request\n"+
		"(of the wait, what this process did not run went to other processes):\n", waited/time.Duration(k))
	for i, e := range sorted(on) {
		if i == 10 {
			break
		}
		fmt.Fprintf(w, "  %10v  %s\n", e.v/time.Duration(k), e.k)
	}

	inGC := func(r *request) bool {
		return slices.ContainsFunc(a.gcs, func(g [2]trace.Time) bool { return overlap(g[0], g[1], r.start, r.end) > 0 })
	}
	var with, without []time.Duration
	for _, r := range a.done {
		if inGC(r) {
			with = append(with, r.took())
		} else {
			without = append(without, r.took())
		}
	}
	slow := 0
	for _, r := range slowest {
		if inGC(r) {
			slow++
		}
	}
	fmt.Fprintf(w, "\nGC: %d mark phases; %d requests overlapped one (p99 %v), %d did not (p99 %v); %d of the slowest %d did\n",
		len(a.gcs), len(with), p99(with), len(without), p99(without), slow, k)

	fmt.Fprintf(w, "\nCPU time by goroutine (the function it started in), whole trace:\n")
	for i, e := range sorted(a.cpu) {
		if i == 12 {
			break
		}
		fmt.Fprintf(w, "  %12v  %s\n", e.v, e.k)
	}

	for i := n - 1; i >= max(0, n-show); i-- {
		r := a.done[i]
		fmt.Fprintf(w, "\nrequest at +%v took %v:\n", r.start.Sub(a.first).Round(time.Microsecond), r.took())
		for _, s := range r.steps {
			fmt.Fprintf(w, "  %10v  %s\n", s.d, s.key)
		}
	}
}

// breakdown prints the mean time a request of rs spent in each state.
func breakdown(w io.Writer, title string, rs []*request) {
	by := map[string]time.Duration{}
	var total time.Duration
	for _, r := range rs {
		total += r.took()
		for key, d := range r.by {
			by[key] += d
		}
	}
	n := time.Duration(len(rs))
	fmt.Fprintf(w, "\n%s: %v each on average, of which:\n", title, total/n)
	for i, e := range sorted(by) {
		if i == 12 || e.v/n == 0 {
			break
		}
		fmt.Fprintf(w, "  %10v  %s\n", e.v/n, e.k)
	}
}

type entry[V cmp.Ordered] struct {
	k string
	v V
}

// sorted returns m's entries, largest value first.
func sorted[V cmp.Ordered](m map[string]V) []entry[V] {
	es := make([]entry[V], 0, len(m))
	for k, v := range m {
		es = append(es, entry[V]{k, v})
	}
	slices.SortFunc(es, func(x, y entry[V]) int { return cmp.Or(cmp.Compare(y.v, x.v), strings.Compare(x.k, y.k)) })
	return es
}

func overlap(a0, a1, b0, b1 trace.Time) time.Duration {
	lo, hi := max(a0, b0), min(a1, b1)
	if hi <= lo {
		return 0
	}
	return hi.Sub(lo)
}

func p99(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	return ds[min(len(ds)-1, int(0.99*float64(len(ds))))]
}
