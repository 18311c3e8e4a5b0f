package server

import (
	"context"
	"math"
	"sort"
	"strconv"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/tailgate-dev/tailgate/router"
)

// The dashboard's last hour, kept in memory: every HistoryInterval the
// recorder samples the Prometheus registry the gateway already fills
// (requests, TTFT, tokens, hedges, ejections) and the replica registry
// (state, queue, KV use), and keeps the differences as one point in a ring.
// It adds nothing to the request path. Replica state is sampled more often
// than points are kept, so a state's changes are seen within a second; a
// flap shorter than that still shows in the ejection counts. At start the
// ring is seeded from the ledger (history_seed.go), so a restart keeps the
// hour's requests, errors, TTFT, tokens and spend.

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
	// is interpolated inside the bucket it falls in, as Prometheus'
	// histogram_quantile does.
	TTFT             map[string]Percentiles `json:"ttft_ms"`
	PromptTokens     float64                `json:"prompt_tokens"`
	CompletionTokens float64                `json:"completion_tokens"`
	// FromLedger marks a point rebuilt from the ledger at start: it has
	// no replica load, ejections or hedge outcomes.
	FromLedger     bool                   `json:"from_ledger,omitempty"`
	HedgesWon      float64                `json:"hedges_won"`
	HedgesLost     float64                `json:"hedges_lost"`
	HedgeOverhead  float64                `json:"hedge_overhead_tokens"`
	Ejections      map[string]float64     `json:"ejections"` // by reason
	Replicas       map[string]ReplicaLoad `json:"replicas"`
	TenantSpentUSD map[string]float64     `json:"tenant_spent"` // cumulative spend, by tenant

	// ttft holds the interval's TTFT buckets by answer (cumulative over
	// the buckets, counted over the interval), so a window of several
	// points has percentiles of its own.
	ttft map[string][]bucket
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
	prompt    float64
	output    float64
	errors    map[string]float64
	hedges    map[string]float64
	overhead  float64
	ejections map[string]float64
	ttft      map[string][]bucket // by answer
}

type bucket struct{ le, count float64 }

// RunHistory records the dashboard's time series until ctx is done:
// first the ledger's rows of the last hour, then a point every
// Config.HistoryInterval, replica state changes every second.
func (s *Server) RunHistory(ctx context.Context) error {
	now := time.Now()
	if err := s.seedHistory(ctx, now); err != nil {
		s.log.Warn("dashboard: the last hour could not be read from the ledger; it starts empty", "err", err)
	}
	s.sampleHistory(now)
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
	p.PromptTokens = math.Max(0, c.prompt-prev.prompt)
	p.CompletionTokens = math.Max(0, c.output-prev.output)
	p.TTFT, p.ttft = map[string]Percentiles{}, map[string][]bucket{}
	for answer, bs := range c.ttft {
		d := delta(bs, prev.ttft[answer])
		p.ttft[answer], p.TTFT[answer] = d, percentiles(d)
	}
	h.pushLocked(p)
}

func (h *history) pushLocked(p HistoryPoint) {
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

// Window sums the points of the last d (up to the newest point): the
// dashboard's first line.
type Window struct {
	Seconds      float64 `json:"window_seconds"`
	Requests     float64 `json:"requests"`
	RequestsPerS float64 `json:"requests_per_s"`
	// ErrorRatio is the share of answers that were errors (4xx, 429 and
	// 5xx); nil without requests. Errors counts them by class.
	ErrorRatio *float64           `json:"error_ratio"`
	Errors     map[string]float64 `json:"errors"`
	// TTFTP95 is the streams' client-visible TTFT p95 (ms), interpolated
	// in the window's summed buckets; nil without streams.
	TTFTP95          *float64 `json:"ttft_p95_ms"`
	OutputTokensPerS float64  `json:"output_tokens_per_s"`
	TokensPerS       float64  `json:"tokens_per_s"`
}

// window sums the points whose interval ended within d of the newest.
func (h *history) window(d time.Duration) Window {
	pts, _ := h.snapshot()
	w := Window{Errors: map[string]float64{}}
	if len(pts) == 0 {
		return w
	}
	from := pts[len(pts)-1].Time.Add(-d)
	var stream []bucket
	var tokens, output float64
	for _, p := range pts {
		if !p.Time.After(from) {
			continue
		}
		w.Seconds += p.Seconds
		w.Requests += p.Requests
		for k, v := range p.Errors {
			w.Errors[k] += v
		}
		tokens += p.PromptTokens + p.CompletionTokens
		output += p.CompletionTokens
		stream = sumBuckets(stream, p.ttft["stream"])
	}
	if w.Seconds > 0 {
		w.RequestsPerS, w.TokensPerS, w.OutputTokensPerS = w.Requests/w.Seconds, tokens/w.Seconds, output/w.Seconds
	}
	if w.Requests > 0 {
		var bad float64
		for _, v := range w.Errors {
			bad += v
		}
		r := math.Min(1, bad/w.Requests)
		w.ErrorRatio = &r
	}
	w.TTFTP95 = percentiles(stream).P95
	return w
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
				switch label(m, "kind") {
				case "hedge_overhead":
					c.overhead += m.GetCounter().GetValue()
				case "prompt":
					c.prompt += m.GetCounter().GetValue()
				case "completion":
					c.output += m.GetCounter().GetValue()
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

// delta returns the observations between prev and cur (cumulative
// buckets of the same layout; prev nil or of another layout counts as
// none).
func delta(cur, prev []bucket) []bucket {
	d := make([]bucket, len(cur))
	for i := range cur {
		d[i] = cur[i]
		if len(prev) == len(cur) {
			d[i].count = math.Max(0, d[i].count-prev[i].count)
		}
	}
	return d
}

// sumBuckets adds b's counts to acc (the same layout, or acc empty).
func sumBuckets(acc, b []bucket) []bucket {
	if acc == nil {
		return append([]bucket(nil), b...)
	}
	if len(acc) != len(b) {
		return acc
	}
	for i := range b {
		acc[i].count += b[i].count
	}
	return acc
}

// percentiles computes p50/p95/p99 in milliseconds of cumulative buckets.
func percentiles(d []bucket) Percentiles {
	var p Percentiles
	if len(d) == 0 || d[len(d)-1].count <= 0 {
		return p
	}
	p.N = d[len(d)-1].count
	at := func(q float64) *float64 {
		v := bucketQuantile(q, d) * 1000
		if math.IsNaN(v) {
			return nil
		}
		return &v
	}
	p.P50, p.P95, p.P99 = at(.5), at(.95), at(.99)
	return p
}

// bucketQuantile returns the q-quantile (0 < q < 1) of cumulative buckets
// whose last is +Inf, as Prometheus' histogram_quantile computes it: the
// bucket the rank falls in is found and the value interpolated linearly
// between its lower and upper bound (the first bucket's lower bound is 0
// when its upper bound is positive). A rank in the +Inf bucket answers the
// highest finite bound: "at least that". NaN without observations.
func bucketQuantile(q float64, bs []bucket) float64 {
	if len(bs) == 0 || bs[len(bs)-1].count <= 0 {
		return math.NaN()
	}
	rank := q * bs[len(bs)-1].count
	i := sort.Search(len(bs), func(i int) bool { return bs[i].count >= rank })
	switch {
	case i == len(bs)-1 && math.IsInf(bs[i].le, 1):
		if i == 0 {
			return math.NaN()
		}
		return bs[i-1].le
	case i == 0 && bs[0].le <= 0:
		return bs[0].le
	}
	lower, below := 0.0, 0.0
	if i > 0 {
		lower, below = bs[i-1].le, bs[i-1].count
	}
	upper, in := bs[i].le, bs[i].count-below
	if in <= 0 {
		return upper
	}
	return lower + (upper-lower)*(rank-below)/in
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
