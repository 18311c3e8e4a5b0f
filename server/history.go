package server

import (
	"context"
	"math"
	"sort"
	"strconv"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"

	"tailgate/router"
)

// The dashboard's last hour, kept in memory: every HistoryInterval the
// recorder samples the Prometheus registry the gateway already fills
// (requests, TTFT, hedges, ejections) and the replica registry (state,
// queue, KV use), and keeps the differences as one point in a ring. It adds
// nothing to the request path. Replica state is sampled more often than
// points are kept, so a state's changes are seen within a second; a flap
// shorter than that still shows in the ejection counts.

const (
	historyPoints      = 360 // one hour of 10 s points
	historyTransitions = 20  // state changes kept per replica
	historyTenants     = 100 // tenants whose spend is followed
	historyReplicas    = 200 // replicas whose transitions are kept, removed ones included
	stateSampleEvery   = time.Second
)

// HistoryPoint is one interval of the dashboard's time series. Counts are
// what happened during the interval; gauges are their value at its end.
type HistoryPoint struct {
	Time     time.Time `json:"time"`
	Seconds  float64   `json:"seconds"` // the interval's length
	Requests float64   `json:"requests"`
	// Errors counts answers by class: "4xx" (429 apart), "429", "5xx".
	Errors map[string]float64 `json:"errors"`
	// TTFT holds client-visible TTFT percentiles (ms) of the interval from
	// tailgate_ttft_seconds, keyed by its answer label: "stream", and "json"
	// (a whole answer's time, never mixed into the streams'). A percentile
	// is the upper bound of the bucket it falls in.
	TTFT           map[string]Percentiles `json:"ttft_ms"`
	HedgesWon      float64                `json:"hedges_won"`
	HedgesLost     float64                `json:"hedges_lost"`
	HedgeOverhead  float64                `json:"hedge_overhead_tokens"`
	Ejections      map[string]float64     `json:"ejections"` // by reason
	Replicas       map[string]ReplicaLoad `json:"replicas"`
	TenantSpentUSD map[string]float64     `json:"tenant_spent"` // cumulative spend, by tenant
}

// Percentiles are p50, p95 and p99 in milliseconds; nil when no request
// fell in the interval.
type Percentiles struct {
	N   float64  `json:"n"`
	P50 *float64 `json:"p50"`
	P95 *float64 `json:"p95"`
	P99 *float64 `json:"p99"`
}

// ReplicaLoad is one replica's load at the end of an interval.
type ReplicaLoad struct {
	State    string  `json:"state"`
	Inflight int64   `json:"inflight"`
	Waiting  float64 `json:"engine_waiting"`
	KV       float64 `json:"kv_cache_usage"`
}

// Transition is one change of a replica's state.
type Transition struct {
	Time   time.Time `json:"time"`
	From   string    `json:"from"`
	To     string    `json:"to"`
	Reason string    `json:"reason"`
}

// history is the recorder's state; its methods are safe to call from any
// goroutine.
type history struct {
	mu     sync.Mutex
	points []HistoryPoint // ring, oldest first once full
	next   int
	full   bool
	last   counters // totals at the previous point
	lastAt time.Time
	states map[string]string       // replica → state at the last sample
	trans  map[string][]Transition // replica → its last changes, oldest first
}

func newHistory() *history {
	return &history{points: make([]HistoryPoint, historyPoints), states: map[string]string{}, trans: map[string][]Transition{}}
}

// counters are the cumulative values a point is the difference of.
type counters struct {
	requests  float64
	errors    map[string]float64
	hedges    map[string]float64
	overhead  float64
	ejections map[string]float64
	ttft      map[string][]bucket // by answer
}

type bucket struct{ le, count float64 }

// RunHistory records the dashboard's time series until ctx is done:
// a point every Config.HistoryInterval, replica state changes every second.
func (s *Server) RunHistory(ctx context.Context) error {
	s.sampleHistory(time.Now())
	points := time.NewTicker(s.cfg.HistoryInterval)
	defer points.Stop()
	states := time.NewTicker(min(stateSampleEvery, s.cfg.HistoryInterval))
	defer states.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case now := <-states.C:
			s.hist.sampleStates(s.reg.Replicas(), now)
		case now := <-points.C:
			s.sampleHistory(now)
		}
	}
}

// sampleHistory adds the point ending at now (the first call only sets the
// baseline).
func (s *Server) sampleHistory(now time.Time) {
	reps := s.reg.Replicas()
	s.hist.sampleStates(reps, now)
	c := s.gatherCounters()
	p := HistoryPoint{Time: now, Replicas: map[string]ReplicaLoad{}, TenantSpentUSD: map[string]float64{}}
	for _, r := range reps {
		l := r.Load()
		p.Replicas[r.ID] = ReplicaLoad{State: r.State().String(), Inflight: r.Inflight(), Waiting: l.Waiting, KV: l.KVCacheUsage}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if ts, err := s.store.Tenants(ctx); err == nil {
		totals, err := s.gate.TenantTotals(ctx)
		for i, t := range ts {
			if i == historyTenants || err != nil {
				break
			}
			p.TenantSpentUSD[t.Name] = float64(totals[t.ID].Spent.Micros) / 1e6
		}
	}
	s.hist.add(p, c)
}

func (h *history) add(p HistoryPoint, c counters) {
	h.mu.Lock()
	defer h.mu.Unlock()
	first := h.lastAt.IsZero()
	prev := h.last
	h.last, p.Seconds = c, p.Time.Sub(h.lastAt).Seconds()
	h.lastAt = p.Time
	if first {
		return
	}
	p.Requests = math.Max(0, c.requests-prev.requests)
	p.Errors = diff(c.errors, prev.errors)
	p.Ejections = diff(c.ejections, prev.ejections)
	p.HedgesWon = math.Max(0, c.hedges["won"]-prev.hedges["won"])
	p.HedgesLost = math.Max(0, c.hedges["lost"]-prev.hedges["lost"])
	p.HedgeOverhead = math.Max(0, c.overhead-prev.overhead)
	p.TTFT = map[string]Percentiles{}
	for answer, bs := range c.ttft {
		p.TTFT[answer] = percentiles(bs, prev.ttft[answer])
	}
	h.points[h.next] = p
	h.next = (h.next + 1) % len(h.points)
	h.full = h.full || h.next == 0
}

// sampleStates notes every replica whose state changed since the last
// sample.
func (h *history) sampleStates(reps []*router.Replica, now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	seen := make(map[string]bool, len(reps))
	for _, r := range reps {
		seen[r.ID] = true
		st := r.State().String()
		prev, known := h.states[r.ID]
		if known && prev == st {
			continue
		}
		h.states[r.ID] = st
		if !known {
			prev = "" // first seen
		}
		t := append(h.trans[r.ID], Transition{Time: now, From: prev, To: st, Reason: r.Reason()})
		if len(t) > historyTransitions {
			t = t[len(t)-historyTransitions:]
		}
		h.trans[r.ID] = t
	}
	for id := range h.states {
		if !seen[id] {
			h.trans[id] = append(h.trans[id], Transition{Time: now, From: h.states[id], To: "removed"})
			delete(h.states, id)
		}
	}
	for id := range h.trans {
		if _, ok := h.states[id]; !ok && len(h.trans) > historyReplicas {
			delete(h.trans, id) // forget removed replicas past the bound
		}
	}
}

// snapshot returns the points oldest first and each replica's transitions.
func (h *history) snapshot() ([]HistoryPoint, map[string][]Transition) {
	h.mu.Lock()
	defer h.mu.Unlock()
	var pts []HistoryPoint
	if h.full {
		pts = append(pts, h.points[h.next:]...)
	}
	pts = append(pts, h.points[:h.next]...)
	trans := make(map[string][]Transition, len(h.trans))
	for id, t := range h.trans {
		trans[id] = append([]Transition(nil), t...)
	}
	return pts, trans
}

// gatherCounters reads the cumulative totals a point is made of from the
// gateway's Prometheus registry.
func (s *Server) gatherCounters() counters {
	c := counters{errors: map[string]float64{}, hedges: map[string]float64{}, ejections: map[string]float64{}, ttft: map[string][]bucket{}}
	mfs, err := s.gatherer.Gather()
	if err != nil && len(mfs) == 0 {
		return c
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			switch mf.GetName() {
			case "tailgate_requests_total":
				v := m.GetCounter().GetValue()
				c.requests += v
				if class := errorClass(label(m, "code")); class != "" {
					c.errors[class] += v
				}
			case "tailgate_hedges_total":
				c.hedges[label(m, "outcome")] += m.GetCounter().GetValue()
			case "tailgate_tokens_total":
				if label(m, "kind") == "hedge_overhead" {
					c.overhead += m.GetCounter().GetValue()
				}
			case "tailgate_ejections_total":
				c.ejections[label(m, "reason")] += m.GetCounter().GetValue()
			case "tailgate_ttft_seconds":
				answer := label(m, "answer")
				c.ttft[answer] = addBuckets(c.ttft[answer], m.GetHistogram())
			}
		}
	}
	return c
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// errorClass names an HTTP status's error class for the time series; "" for
// a success.
func errorClass(code string) string {
	n, err := strconv.Atoi(code)
	switch {
	case err != nil || n < 400:
		return ""
	case n == 429:
		return "429"
	case n < 500:
		return "4xx"
	}
	return "5xx"
}

// addBuckets adds h's cumulative buckets (and its +Inf count) to acc.
func addBuckets(acc []bucket, h *dto.Histogram) []bucket {
	bs := h.GetBucket()
	if acc == nil {
		acc = make([]bucket, len(bs)+1)
		for i, b := range bs {
			acc[i].le = b.GetUpperBound()
		}
		acc[len(bs)].le = math.Inf(1)
	}
	if len(acc) != len(bs)+1 {
		return acc // another bucket layout: not comparable
	}
	for i, b := range bs {
		acc[i].count += float64(b.GetCumulativeCount())
	}
	acc[len(bs)].count += float64(h.GetSampleCount())
	return acc
}

// percentiles computes p50/p95/p99 of the observations between prev and
// cur (cumulative buckets), as bucket upper bounds in milliseconds.
func percentiles(cur, prev []bucket) Percentiles {
	d := make([]bucket, len(cur))
	for i := range cur {
		d[i] = cur[i]
		if len(prev) == len(cur) {
			d[i].count -= prev[i].count
		}
	}
	var p Percentiles
	if len(d) == 0 {
		return p
	}
	p.N = d[len(d)-1].count
	if p.N <= 0 {
		p.N = 0
		return p
	}
	at := func(q float64) *float64 {
		rank := q * p.N
		i := sort.Search(len(d), func(i int) bool { return d[i].count >= rank })
		if i == len(d) {
			i = len(d) - 1
		}
		le := d[i].le
		if math.IsInf(le, 1) && i > 0 {
			le = d[i-1].le // past the last bound: say at least that
		}
		v := le * 1000
		return &v
	}
	p.P50, p.P95, p.P99 = at(.5), at(.95), at(.99)
	return p
}

// diff returns cur minus prev per key, leaving out zeros.
func diff(cur, prev map[string]float64) map[string]float64 {
	out := map[string]float64{}
	for k, v := range cur {
		if d := v - prev[k]; d > 0 {
			out[k] = d
		}
	}
	return out
}
