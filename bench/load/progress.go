package load

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// progress prints the live progress line.
type progress struct {
	w     io.Writer // nil: silent
	tty   bool
	plan  Plan
	start time.Time

	sentN, doneN, errN atomic.Int64

	mu sync.Mutex
	// recent TTFTs (ms) of streams and of whole answers; the line shows
	// streams' when there are any (see Report.TTFTStreamsOnly).
	recent   [2]ring
	queue    string // last replica summary
	lastSpan int
	lastLine time.Time
	dirty    bool // a line without newline is on screen
}

func newProgress(w io.Writer, tty bool, plan Plan, start time.Time) *progress {
	return &progress{w: w, tty: tty, plan: plan, start: start, lastSpan: -1}
}

func (p *progress) sent() { p.sentN.Add(1) }

func (p *progress) done(r *Record) {
	p.doneN.Add(1)
	if !r.OK() {
		p.errN.Add(1)
	}
	if r.TTFT >= 0 && r.OK() && p.w != nil {
		k := 1
		if r.Stream {
			k = 0
		}
		p.mu.Lock()
		p.recent[k].add(ms(r.TTFT))
		p.mu.Unlock()
	}
}

// ring keeps the last values added.
type ring struct {
	v [256]float64
	n int
}

func (r *ring) add(v float64) { r.v[r.n%len(r.v)] = v; r.n++ }

// sorted returns the values kept, sorted.
func (r *ring) sorted() []float64 {
	s := slices.Clone(r.v[:min(r.n, len(r.v))])
	slices.Sort(s)
	return s
}

func (p *progress) replicas(reps []ReplicaState) {
	if p.w == nil {
		return
	}
	parts := make([]string, 0, len(reps))
	for _, r := range reps {
		mark := ""
		if !r.Ready {
			mark = "!"
		}
		parts = append(parts, fmt.Sprintf("%s%s:%d/%g", mark, r.ID, r.Inflight, r.EngineWaiting))
	}
	p.mu.Lock()
	p.queue = strings.Join(parts, " ")
	p.mu.Unlock()
}

// event prints a fleet action on its own line.
func (p *progress) event(ev Event) {
	if p.w == nil {
		return
	}
	line := fmt.Sprintf("%s %d at %.1fs", ev.Kind, ev.Count, secs(ev.At))
	if len(ev.Replicas) > 0 {
		line += ": " + strings.Join(ev.Replicas, ", ")
	}
	for _, r := range ev.Replacements {
		line += fmt.Sprintf("; replacement %s started at %.1fs", r.ID, secs(r.At))
	}
	if ev.Err != "" {
		line += " — error: " + ev.Err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.clearLocked()
	fmt.Fprintf(p.w, "bench: %s\n", line)
}

func (p *progress) clearLocked() {
	if p.dirty {
		fmt.Fprint(p.w, "\r\033[K")
		p.dirty = false
	}
}

func (p *progress) run(ctx context.Context) {
	if p.w == nil {
		return
	}
	every := 250 * time.Millisecond
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		p.print()
	}
}

func (p *progress) print() {
	el := time.Since(p.start)
	span := p.plan.SpanAt(el)
	p.mu.Lock()
	defer p.mu.Unlock()
	rec := p.recent[0].sorted()
	if len(rec) == 0 {
		rec = p.recent[1].sorted()
	}
	ttft := "-"
	if len(rec) > 0 {
		ttft = fmt.Sprintf("p50 %.0fms p99 %.0fms", rank(rec, 50), rank(rec, 99))
	}
	sent, done, errs := p.sentN.Load(), p.doneN.Load(), p.errN.Load()
	phase := p.plan.Spans[span].Name
	if el >= p.plan.Length {
		phase = "draining"
	}
	line := fmt.Sprintf("[%5.1fs/%.0fs] %-12s sent %d  done %d  errors %d  in flight %d  ttft %s",
		el.Seconds(), p.plan.Length.Seconds(), phase, sent, done, errs, sent-done, ttft)
	if p.queue != "" {
		line += "  replicas(inflight/waiting) " + p.queue
	}
	if p.tty {
		fmt.Fprintf(p.w, "\r\033[K%s", line)
		p.dirty = true
		return
	}
	if span != p.lastSpan || time.Since(p.lastLine) >= 5*time.Second {
		fmt.Fprintf(p.w, "bench: %s\n", line)
		p.lastSpan, p.lastLine = span, time.Now()
	}
}

func (p *progress) finish() {
	if p.w == nil {
		return
	}
	p.print()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.dirty {
		fmt.Fprintln(p.w)
		p.dirty = false
	}
}
