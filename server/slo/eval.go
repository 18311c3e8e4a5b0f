package slo

import (
	"cmp"
	"fmt"
	"maps"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tailgate-dev/tailgate/data"
)

// Window is an evaluation window of the burn rate.
type Window struct {
	Name string
	Span time.Duration
}

// Windows are the burn-rate windows, short to long: the pairs (5m, 1h) and
// (30m, 6h) of the SRE workbook's multi-window alerts.
var Windows = []Window{{"5m", 5 * time.Minute}, {"30m", 30 * time.Minute}, {"1h", time.Hour}, {"6h", 6 * time.Hour}}

// Alert thresholds: a page when the 1h and 5m burn rates both exceed
// PageBurn (2 % of a 30-day budget in an hour), a ticket when the 6h and 30m
// rates both exceed TicketBurn (5 % in six hours).
const (
	PageBurn   = 14.4
	TicketBurn = 6
)

// Ring sizes: seconds for the shortest window, minutes for the longer ones,
// 30-second histograms for the percentiles of the shortest window.
const (
	secSlots  = 300
	minSlots  = 360
	histWidth = 30
	histSlots = 10
)

// maxGroups bounds the (model, source, kind) groups held; requests past it
// are not evaluated (and counted in Dropped). Models are bounded by the
// registry and sources by MaxSources, so only a misconfiguration reaches it.
const maxGroups = 512

// Request is what the evaluator learns of one finished request.
type Request struct {
	Model  string
	Source string // a label from [Sources.Label]
	Kind   Kind
	// Answered: output reached the client. A request that failed before
	// counts as over budget on its end-to-end stage (ttft for a stream,
	// total for JSON), whatever time that stage took to fail; its other
	// stages count where they were measured.
	Answered bool
	Stages   data.Stages
	// End is when it ended, as its caller's clock read it; zero: when it
	// is observed, by the evaluator's clock.
	End time.Time
}

// Evaluator holds the recent requests' stage times against their budgets.
// Observe is safe for concurrent use and cheap; evaluation is done when
// asked.
type Evaluator struct {
	cfg     Config
	sources *Sources
	now     func() time.Time

	// groups are read without a lock: the map is replaced whole, under
	// mu, when a group is added. (A sync.Map's load, hashing its key
	// through an interface, was 0.08 % of the gateway's CPU at 1000 req/s:
	// /work/wt/profile tg3.script, Evaluator.group.)
	groups  atomic.Pointer[map[groupKey]*group]
	mu      sync.Mutex
	dropped atomic.Uint64
}

type groupKey struct {
	model, source string
	kind          Kind
}

// group holds one (model, source, kind)'s series, one per stage that has a
// budget.
type group struct {
	key    groupKey
	stages [len(data.StageNames)]*stageSeries
	objs   []*objSeries // in Objectives order
}

type stageSeries struct {
	hist histRing
	objs []*objSeries
}

type objSeries struct {
	obj      Objective
	sec, min countRing
}

// New returns an evaluator of cfg (checked by [Config.Validate]); now nil
// means time.Now.
func New(cfg Config, now func() time.Time) (*Evaluator, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("slo: %w", err)
	}
	src, err := NewSources(cfg.Sources)
	if err != nil {
		return nil, fmt.Errorf("slo: %w", err)
	}
	if now == nil {
		now = time.Now
	}
	return &Evaluator{cfg: cfg, sources: src, now: now}, nil
}

// Sources returns the evaluator's source labeller.
func (e *Evaluator) Sources() *Sources { return e.sources }

// Objectives returns the objectives that hold for model.
func (e *Evaluator) Objectives(model string) []Objective { return e.cfg.Objectives(model) }

// Dropped is the number of requests not evaluated because maxGroups was
// reached.
func (e *Evaluator) Dropped() uint64 { return e.dropped.Load() }

// Observe counts one finished request.
func (e *Evaluator) Observe(r Request) {
	g := e.group(groupKey{r.Model, r.Source, r.Kind})
	if g == nil {
		e.dropped.Add(1)
		return
	}
	at := r.End
	if at.IsZero() {
		at = e.now()
	}
	sec := at.Unix()
	end := endStage(r.Kind)
	r.Stages.Each(func(i int, name string, d time.Duration) {
		s := g.stages[i]
		if s == nil {
			return
		}
		if !r.Answered && name == end {
			// Failed before its answer began (no replica, 502, 504, an
			// engine's 429): over budget however fast the error came, and
			// kept out of the stage's times, which are answers'.
			for _, o := range s.objs {
				o.sec.add(sec, false)
				o.min.add(sec, false)
			}
			return
		}
		if d < 0 {
			return // not measured: says nothing of the budget
		}
		s.hist.add(sec, d.Microseconds())
		for _, o := range s.objs {
			in := d <= o.obj.Budget
			o.sec.add(sec, in)
			o.min.add(sec, in)
		}
	})
}

// endStage is the end-to-end stage of an answer of kind k: what the client
// waited for before the answer began.
func endStage(k Kind) string {
	if k == Stream {
		return data.StageTTFT
	}
	return data.StageTotal
}

func (e *Evaluator) group(k groupKey) *group {
	if g := e.groupMap()[k]; g != nil {
		return g
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	old := e.groupMap()
	if g := old[k]; g != nil {
		return g
	}
	if len(old) >= maxGroups {
		return nil
	}
	g := &group{key: k}
	for _, o := range e.cfg.Objectives(k.model) {
		if o.Kind != k.kind {
			continue
		}
		i := stageIndex(o.Stage)
		if g.stages[i] == nil {
			g.stages[i] = &stageSeries{hist: newHistRing(histWidth, histSlots)}
		}
		os := &objSeries{obj: o, sec: newCountRing(1, secSlots), min: newCountRing(60, minSlots)}
		g.stages[i].objs = append(g.stages[i].objs, os)
		g.objs = append(g.objs, os)
	}
	groups := make(map[groupKey]*group, len(old)+1)
	maps.Copy(groups, old)
	groups[k] = g
	e.groups.Store(&groups)
	return g
}

// groupMap returns the groups made so far (nil before the first).
func (e *Evaluator) groupMap() map[groupKey]*group {
	if m := e.groups.Load(); m != nil {
		return *m
	}
	return nil
}

// Row is the evaluation of one objective of one model and kind (and source,
// when asked by source), as the admin API serves it. Percentiles, Requests
// and WithinRatio cover the shortest window (5m); nil when it had no
// request.
type Row struct {
	Model     string  `json:"model"`
	Source    string  `json:"source,omitempty"`
	Stage     string  `json:"stage"`
	Kind      Kind    `json:"kind"`
	Objective string  `json:"objective"`
	BudgetMS  float64 `json:"budget_ms"`
	Target    float64 `json:"target"`

	Requests    uint64   `json:"requests"`
	P50MS       *float64 `json:"p50_ms"`
	P95MS       *float64 `json:"p95_ms"`
	P99MS       *float64 `json:"p99_ms"`
	WithinRatio *float64 `json:"within_ratio"`
	// Burn is the error budget's burn rate per window: the share of
	// requests over budget divided by the share allowed (1 − target); 1
	// spends the budget exactly, 0 when the window had no request.
	Burn map[string]float64 `json:"burn"`
	// Alert is "page" or "ticket" when the multi-window rule fires.
	Alert string `json:"alert,omitempty"`
	// OK: within target over the shortest window (or no request) and no
	// alert.
	OK bool `json:"ok"`

	within map[string]*float64 // by window, for the metrics
}

// Evaluate returns the rows of every model and kind that had requests in
// the longest window, summed over sources, or per source when bySource.
func (e *Evaluator) Evaluate(bySource bool) []Row {
	sec := e.now().Unix()
	type aggKey struct {
		model, source string
		kind          Kind
	}
	agg := map[aggKey][]*group{}
	for _, g := range e.groupMap() {
		k := aggKey{g.key.model, "", g.key.kind}
		if bySource {
			k.source = g.key.source
		}
		agg[k] = append(agg[k], g)
	}
	var rows []Row
	for k, gs := range agg {
		for oi, o := range gs[0].objs {
			row := Row{Model: k.model, Source: k.source, Stage: o.obj.Stage, Kind: k.kind, Objective: o.obj.Name,
				BudgetMS: ms(o.obj.Budget), Target: o.obj.Target, Burn: map[string]float64{}, within: map[string]*float64{}}
			var any6h bool
			for _, w := range Windows {
				var total, within uint64
				for _, g := range gs {
					s := g.objs[oi]
					r := &s.min
					if w.Span <= time.Duration(secSlots)*time.Second {
						r = &s.sec
					}
					t, in := r.sum(sec, int64(w.Span/time.Second))
					total, within = total+t, within+in
				}
				if w == Windows[0] {
					row.Requests = total
				}
				if total == 0 {
					row.Burn[w.Name] = 0
					continue
				}
				any6h = true
				ratio := float64(within) / float64(total)
				row.within[w.Name] = &ratio
				row.Burn[w.Name] = round((1 - ratio) / (1 - o.obj.Target))
			}
			if !any6h {
				continue
			}
			row.WithinRatio = row.within[Windows[0].Name]
			var bins [histBins]uint64
			si := stageIndex(o.obj.Stage)
			for _, g := range gs {
				g.stages[si].hist.addTo(&bins, sec, int64(Windows[0].Span/time.Second))
			}
			for _, p := range []struct {
				q  float64
				to **float64
			}{{.5, &row.P50MS}, {.95, &row.P95MS}, {.99, &row.P99MS}} {
				if us, ok := quantile(&bins, p.q); ok {
					v := round(us / 1000)
					*p.to = &v
				}
			}
			switch b := row.Burn; {
			case b["1h"] > PageBurn && b["5m"] > PageBurn:
				row.Alert = "page"
			case b["6h"] > TicketBurn && b["30m"] > TicketBurn:
				row.Alert = "ticket"
			}
			row.OK = row.Alert == "" && (row.WithinRatio == nil || *row.WithinRatio >= o.obj.Target)
			rows = append(rows, row)
		}
	}
	slices.SortFunc(rows, func(a, b Row) int {
		return cmp.Or(cmp.Compare(a.Model, b.Model), cmp.Compare(a.Source, b.Source),
			slices.Index(Kinds, a.Kind)-slices.Index(Kinds, b.Kind), stageIndex(a.Stage)-stageIndex(b.Stage),
			cmp.Compare(a.Target, b.Target))
	})
	return rows
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// round keeps three decimals, enough for milliseconds and ratios.
func round(v float64) float64 { return math.Round(v*1000) / 1000 }

// ObjectiveDoc is an objective as the admin API lists it.
type ObjectiveDoc struct {
	Kind      Kind    `json:"kind"`
	Stage     string  `json:"stage"`
	Objective string  `json:"objective"`
	Target    float64 `json:"target"`
	BudgetMS  float64 `json:"budget_ms"`
}

// Docs returns objectives as the admin API lists them.
func Docs(objs []Objective) []ObjectiveDoc {
	out := make([]ObjectiveDoc, len(objs))
	for i, o := range objs {
		out[i] = ObjectiveDoc{Kind: o.Kind, Stage: o.Stage, Objective: o.Name, Target: o.Target, BudgetMS: ms(o.Budget)}
	}
	return out
}

// Snapshot is the admin API's answer: the evaluation's rows and the
// objectives in force (the default's, and each configured model's), which
// `tailgate bench --slo-from-gateway` reads.
type Snapshot struct {
	Data       []Row                     `json:"data"`
	Windows    []string                  `json:"windows"`
	Default    []ObjectiveDoc            `json:"default_objectives"`
	Models     map[string][]ObjectiveDoc `json:"model_objectives"`
	Sources    []string                  `json:"sources"`
	NotCounted uint64                    `json:"not_evaluated,omitempty"`
}

// Snapshot evaluates now (per source when bySource).
func (e *Evaluator) Snapshot(bySource bool) Snapshot {
	s := Snapshot{Data: e.Evaluate(bySource), Default: Docs(e.cfg.Objectives("")), Models: map[string][]ObjectiveDoc{},
		Sources: append(slices.Clone(e.sources.labels), SourceDefault, SourceOther), NotCounted: e.Dropped()}
	if s.Data == nil {
		s.Data = []Row{}
	}
	for _, w := range Windows {
		s.Windows = append(s.Windows, w.Name)
	}
	for name := range e.cfg.Models {
		s.Models[name] = Docs(e.cfg.Objectives(name))
	}
	return s
}
