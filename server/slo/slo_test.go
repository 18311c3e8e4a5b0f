package slo

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tailgate-dev/tailgate/data"
)

// clock is a settable time source.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func newEval(t *testing.T, cfg Config) (*Evaluator, *clock) {
	t.Helper()
	c := &clock{t: time.Unix(1_700_000_000, 0)}
	e, err := New(cfg, c.now)
	if err != nil {
		t.Fatal(err)
	}
	return e, c
}

func stream(model string, engineTTFT, ttft time.Duration) Request {
	st := data.UnknownStages()
	st.Gateway, st.EngineTTFT, st.TTFT, st.Total = time.Millisecond, engineTTFT, ttft, ttft+time.Second
	return Request{Model: model, Source: SourceDefault, Kind: Stream, Answered: true, Stages: st}
}

func find(rows []Row, model, source string, kind Kind, stage, obj string) *Row {
	for i := range rows {
		r := &rows[i]
		if r.Model == model && r.Source == source && r.Kind == kind && r.Stage == stage && r.Objective == obj {
			return r
		}
	}
	return nil
}

func TestWithinRatioBurnRateAndPercentiles(t *testing.T) {
	e, _ := newEval(t, Config{})
	for range 90 {
		e.Observe(stream("m", 100*time.Millisecond, 120*time.Millisecond))
	}
	for range 10 {
		e.Observe(stream("m", 500*time.Millisecond, 520*time.Millisecond))
	}
	rows := e.Evaluate(false)
	r := find(rows, "m", "", Stream, data.StageEngineTTFT, "p95")
	if r == nil {
		t.Fatalf("no engine_ttft p95 row in %+v", rows)
	}
	if r.Requests != 100 || r.WithinRatio == nil || *r.WithinRatio != 0.9 || r.BudgetMS != 350 || r.Target != 0.95 {
		t.Fatalf("row %+v within %v", r, r.WithinRatio)
	}
	// 10 % over budget against 5 % allowed: the budget burns twice as fast.
	if r.Burn["5m"] != 2 || r.Burn["6h"] != 2 || r.OK {
		t.Errorf("burn %v ok %v, want 2 in every window and not ok", r.Burn, r.OK)
	}
	if r.Alert != "" {
		t.Errorf("alert %q at burn 2", r.Alert)
	}
	if *r.P50MS < 90 || *r.P50MS > 110 || *r.P99MS < 450 || *r.P99MS > 560 {
		t.Errorf("p50 %v p99 %v, want about 100 and 500", *r.P50MS, *r.P99MS)
	}
	if g := find(rows, "m", "", Stream, data.StageGateway, "p99"); g == nil || !g.OK || *g.WithinRatio != 1 {
		t.Errorf("gateway row %+v: every request was within 25ms", g)
	}
}

func TestAllOverBudgetPagesAndWindowsSlide(t *testing.T) {
	e, c := newEval(t, Config{})
	for range 50 {
		e.Observe(stream("m", time.Second, time.Second))
	}
	r := find(e.Evaluate(false), "m", "", Stream, data.StageTTFT, "p99")
	if r == nil || r.Alert != "page" || r.OK || r.Burn["1h"] != 100 {
		t.Fatalf("every request over the ttft p99 budget: row %+v", r)
	}
	// Six minutes later the 5m window is empty: no page, but the long
	// windows still remember, so the ticket rule fires.
	c.add(6 * time.Minute)
	r = find(e.Evaluate(false), "m", "", Stream, data.StageTTFT, "p99")
	if r == nil || r.Requests != 0 || r.WithinRatio != nil || r.P95MS != nil || r.Burn["5m"] != 0 || r.Burn["30m"] != 100 || r.Alert != "ticket" {
		t.Fatalf("after 6 minutes: row %+v", r)
	}
	// Past the longest window the model has no row at all.
	c.add(7 * time.Hour)
	if rows := e.Evaluate(false); len(rows) != 0 {
		t.Errorf("after 7 hours: %d rows", len(rows))
	}
}

func TestStreamsAndJSONKeptApart(t *testing.T) {
	e, _ := newEval(t, Config{})
	for range 20 {
		e.Observe(stream("m", 100*time.Millisecond, 150*time.Millisecond))
		st := data.UnknownStages()
		st.Gateway, st.TTFT, st.Total = time.Millisecond, 3*time.Second, 3*time.Second
		e.Observe(Request{Model: "m", Source: SourceDefault, Kind: JSON, Answered: true, Stages: st})
	}
	rows := e.Evaluate(false)
	if r := find(rows, "m", "", Stream, data.StageTTFT, "p95"); r == nil || !r.OK || *r.P95MS > 200 {
		t.Errorf("stream ttft row %+v: JSON answers' whole-answer time leaked into it", r)
	}
	if r := find(rows, "m", "", JSON, data.StageTTFT, "p95"); r != nil {
		t.Errorf("a JSON answer has a ttft row: %+v", r)
	}
	if r := find(rows, "m", "", JSON, data.StageTotal, "p95"); r == nil || *r.WithinRatio != 1 || *r.P50MS < 2500 {
		t.Errorf("json total row %+v", r)
	}
}

func TestFailedRequestMissesTheEndToEndBudget(t *testing.T) {
	e, _ := newEval(t, Config{})
	e.Observe(stream("m", 100*time.Millisecond, 150*time.Millisecond))
	st := data.UnknownStages()
	st.Gateway = time.Millisecond
	e.Observe(Request{Model: "m", Source: SourceDefault, Kind: Stream, Answered: false, Stages: st})
	rows := e.Evaluate(false)
	if r := find(rows, "m", "", Stream, data.StageTTFT, "p95"); r == nil || r.Requests != 2 || *r.WithinRatio != 0.5 {
		t.Errorf("ttft row %+v: a stream that failed before its first token must count over budget", r)
	}
	if r := find(rows, "m", "", Stream, data.StageEngineTTFT, "p95"); r == nil || r.Requests != 1 {
		t.Errorf("engine_ttft row %+v: a stage never measured says nothing", r)
	}
}

func TestPerModelBudgetsOverrideTheDefaultStageByStage(t *testing.T) {
	cfg := Config{Models: map[string]Budgets{"big": {Stream: map[string]Percentiles{data.StageTTFT: {"p90": 2 * time.Second}}}}}
	e, _ := newEval(t, cfg)
	e.Observe(stream("big", time.Second, 1500*time.Millisecond))
	e.Observe(stream("small", time.Second, 1500*time.Millisecond))
	rows := e.Evaluate(false)
	if r := find(rows, "big", "", Stream, data.StageTTFT, "p90"); r == nil || !r.OK {
		t.Errorf("big's own ttft budget: %+v", r)
	}
	if r := find(rows, "big", "", Stream, data.StageTTFT, "p95"); r != nil {
		t.Errorf("big kept the default ttft budget: %+v", r)
	}
	if r := find(rows, "big", "", Stream, data.StageEngineTTFT, "p95"); r == nil || r.OK {
		t.Errorf("big inherits the default engine_ttft budget: %+v", r)
	}
	if r := find(rows, "small", "", Stream, data.StageTTFT, "p95"); r == nil || r.OK {
		t.Errorf("small under the default: %+v", r)
	}
}

func TestPerSourceRows(t *testing.T) {
	e, _ := newEval(t, Config{Sources: SourceConfig{Labels: []string{"eu", "us"}}})
	for range 10 {
		r := stream("m", 100*time.Millisecond, 150*time.Millisecond)
		r.Source = e.Sources().Label("eu", "10.0.0.1:5")
		e.Observe(r)
		r = stream("m", 100*time.Millisecond, 900*time.Millisecond)
		r.Source = e.Sources().Label("US", "10.0.0.1:5")
		e.Observe(r)
	}
	rows := e.Evaluate(true)
	eu, us := find(rows, "m", "eu", Stream, data.StageTTFT, "p95"), find(rows, "m", "us", Stream, data.StageTTFT, "p95")
	if eu == nil || us == nil || !eu.OK || us.OK || eu.Requests != 10 || us.Requests != 10 {
		t.Fatalf("eu %+v us %+v: the slow source must show apart", eu, us)
	}
	if all := find(e.Evaluate(false), "m", "", Stream, data.StageTTFT, "p95"); all == nil || all.Requests != 20 || *all.WithinRatio != 0.5 {
		t.Errorf("summed over sources: %+v", all)
	}
}

func TestSourceLabels(t *testing.T) {
	s, err := NewSources(SourceConfig{Labels: []string{"eu"}, CIDRs: map[string]string{"10.1.0.0/16": "lab", "10.0.0.0/8": "corp", "fd00::/8": "v6"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ header, remote, want string }{
		{"eu", "10.1.2.3:4", "eu"},
		{" EU ", "", "eu"},
		{"mars", "10.1.2.3:4", SourceOther}, // unknown labels fold, whatever the address
		{"", "10.1.2.3:4", "lab"},           // the longest prefix wins
		{"", "10.9.2.3:4", "corp"},
		{"", "[fd00::1]:80", "v6"},
		{"", "[::ffff:10.9.0.1]:80", "corp"},
		{"", "192.0.2.1:80", SourceDefault},
		{"", "garbage", SourceDefault},
	} {
		if got := s.Label(tc.header, tc.remote); got != tc.want {
			t.Errorf("Label(%q, %q) = %q, want %q", tc.header, tc.remote, got, tc.want)
		}
	}
	var many []string
	for i := range MaxSources + 1 {
		many = append(many, "s"+string(rune('a'+i)))
	}
	for _, tc := range []struct {
		cfg  SourceConfig
		want string
	}{
		{SourceConfig{Labels: many}, "at most 16"},
		{SourceConfig{Labels: []string{"Bad Label"}}, "lowercase label"},
		{SourceConfig{Labels: []string{"other"}}, "lowercase label"},
		{SourceConfig{CIDRs: map[string]string{"10.0.0.0/33": "x"}}, "10.0.0.0/33"},
	} {
		if err := tc.cfg.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: error %v, want %q", tc.cfg, err, tc.want)
		}
	}
}

func TestBudgetFlagsAndValidation(t *testing.T) {
	b := DefaultBudgets()
	if err := b.ParseFlag("stream.engine_ttft=p95:300ms,p99:500ms"); err != nil {
		t.Fatal(err)
	}
	if err := b.ParseFlag("stream.network=off"); err != nil {
		t.Fatal(err)
	}
	objs := (&Config{Default: &b}).Objectives("m")
	var got []string
	for _, o := range objs {
		if o.Kind == Stream {
			got = append(got, o.Stage+":"+o.Name+":"+o.Budget.String())
		}
	}
	want := "gateway:p99:25ms engine_queue:p95:100ms engine_ttft:p95:300ms engine_ttft:p99:500ms ttft:p95:400ms ttft:p99:600ms"
	if strings.Join(got, " ") != want {
		t.Errorf("stream objectives %q, want %q", strings.Join(got, " "), want)
	}
	for _, tc := range []struct{ flag, want string }{
		{"stream.ttft", "KIND.STAGE="},
		{"batch.ttft=p95:1s", "KIND stream or json"},
		{"stream.prefill=p95:1s", "unknown stage"},
		{"json.ttft=p95:1s", "no time to first token"},
		{"stream.ttft=95:1s", "percentile"},
		{"stream.ttft=p100:1s", "percentile"},
		{"stream.ttft=p95:fast", "pNN:DURATION"},
		{"stream.ttft=p95:-1s", "positive duration"},
	} {
		if err := b.ParseFlag(tc.flag); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want %q", tc.flag, err, tc.want)
		}
	}
}

func TestMetricsViaRegistry(t *testing.T) {
	e, _ := newEval(t, Config{})
	for range 19 {
		e.Observe(stream("m", 100*time.Millisecond, 150*time.Millisecond))
	}
	e.Observe(stream("m", 400*time.Millisecond, 450*time.Millisecond))
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(e.Collector()); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	get := func(name string, labels map[string]string) (float64, bool) {
		for _, mf := range mfs {
			if mf.GetName() != name {
				continue
			}
		next:
			for _, m := range mf.GetMetric() {
				for _, lp := range m.GetLabel() {
					if v, ok := labels[lp.GetName()]; ok && v != lp.GetValue() {
						continue next
					}
				}
				return m.GetGauge().GetValue(), true
			}
		}
		return 0, false
	}
	eng := map[string]string{"model": "m", "kind": "stream", "stage": "engine_ttft", "objective": "p95", "window": "5m"}
	if v, ok := get("tailgate_slo_within_budget_ratio", eng); !ok || v != 0.95 {
		t.Errorf("within ratio %v %v, want 0.95", v, ok)
	}
	if v, ok := get("tailgate_slo_burn_rate", eng); !ok || v != 1 {
		t.Errorf("burn rate %v %v, want 1", v, ok)
	}
	if v, ok := get("tailgate_slo_budget_seconds", map[string]string{"model": "m", "stage": "ttft", "objective": "p99"}); !ok || v != 0.6 {
		t.Errorf("ttft p99 budget %v %v, want 0.6", v, ok)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if !strings.Contains("model kind stage objective window", lp.GetName()) {
					t.Errorf("%s has label %s: labels stay bounded", mf.GetName(), lp.GetName())
				}
			}
		}
	}
}

func TestHistogramBinsBoundTheError(t *testing.T) {
	for _, us := range []int64{0, 1, 7, 8, 9, 100, 1000, 12345, 400_000, 1 << 27} {
		v := histValue(histBin(us))
		if d := v - float64(us); d < -float64(us)/8-1 || d > float64(us)/8+1 {
			t.Errorf("%d µs lands in a bin worth %v", us, v)
		}
	}
	if histBin(1<<40) != histBins-1 {
		t.Error("a huge value is not in the last bin")
	}
}

// BenchmarkObserve is the per-request cost of the evaluation on the
// request path (a stream with five budgeted stages).
func BenchmarkObserve(b *testing.B) {
	e, err := New(Config{}, nil)
	if err != nil {
		b.Fatal(err)
	}
	r := stream("m", 100*time.Millisecond, 150*time.Millisecond)
	r.Stages.Network, r.Stages.EngineQueue = time.Millisecond, 2*time.Millisecond
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			e.Observe(r)
		}
	})
}

// A request counts in the windows of when it ended, as its caller's clock
// read it: one that ended ten minutes before it was observed is outside
// the 5m window and inside the 30m one.
func TestRequestCountsWhenItEnded(t *testing.T) {
	e, c := newEval(t, Config{})
	late := stream("m", 100*time.Millisecond, 150*time.Millisecond)
	late.End = c.now().Add(-10 * time.Minute)
	e.Observe(late)
	e.Observe(stream("m", 100*time.Millisecond, 150*time.Millisecond))
	r := find(e.Evaluate(false), "m", "", Stream, data.StageTTFT, "p95")
	if r == nil || r.Requests != 1 {
		t.Fatalf("ttft row %+v: want the one request that ended in the last 5 minutes", r)
	}
	if within := r.within["30m"]; within == nil || r.Burn["30m"] != 0 {
		t.Fatalf("ttft row %+v: the 30m window has no request", r)
	}
}
