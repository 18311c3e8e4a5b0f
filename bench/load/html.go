package load

import (
	_ "embed"
	"fmt"
	"html/template"
	"io"
	"math"
	"slices"
	"strings"
)

//go:embed report.html
var reportHTML string

var reportTmpl = template.Must(template.New("report").Funcs(template.FuncMap{
	"ms":   fmtMS,
	"opt":  fmtOpt,
	"pct":  func(f float64) string { return fmt.Sprintf("%.2f%%", 100*f) },
	"errs": errorList,
	"who":  eventWho,
	"newr": newReplicaLine,
	"peak": peakQueue,
	"rows": func(p PhaseReport) [][2]any { return p.stageRows() },
	"sum":  func(v any) Summary { return v.(Summary) },
}).Parse(reportHTML))

// htmlRun is what the page's script draws for one report.
type htmlRun struct {
	Label    string      `json:"label"`
	Length   float64     `json:"length"`
	Phases   []htmlPhase `json:"phases"`
	Events   []htmlEvent `json:"events"`
	Replicas []string    `json:"replicas"`
	T        []float64   `json:"t"`      // intended send time, s
	TTFT     []float64   `json:"ttft"`   // ms; -1 when none
	Total    []float64   `json:"total"`  // ms; -1 when none
	OK       []int       `json:"ok"`     // 1 ok, 0 error
	Stream   []int       `json:"stream"` // 1 stream
	// StreamsOnly: TTFT is plotted for streams only (see Report.TTFTStreamsOnly).
	StreamsOnly bool         `json:"streams_only"`
	Phase       []int        `json:"phase"`   // 0-based
	Replica     []int        `json:"replica"` // index in Replicas, -1 unknown
	Series      []htmlSeries `json:"series"`  // replica samples
}

type htmlPhase struct {
	Name  string  `json:"name"`
	Start float64 `json:"start"`
	End   float64 `json:"end"`
}

type htmlEvent struct {
	Kind string  `json:"kind"`
	At   float64 `json:"at"`
	Who  string  `json:"who"`
}

type htmlSeries struct {
	ID       string    `json:"id"`
	T        []float64 `json:"t"`
	Inflight []int     `json:"inflight"`
	Waiting  []float64 `json:"waiting"`
}

func round3(v float64) float64 { return math.Round(v*1000) / 1000 }

func toHTMLRun(r *Report) htmlRun {
	h := htmlRun{Label: r.Label, Replicas: []string{}, Series: []htmlSeries{}, StreamsOnly: r.TTFTStreamsOnly}
	if h.Label == "" {
		h.Label = r.Target
	}
	for _, p := range r.Phases {
		h.Phases = append(h.Phases, htmlPhase{p.Name, p.StartS, p.EndS})
		h.Length = max(h.Length, p.EndS)
	}
	for _, e := range r.Events {
		h.Events = append(h.Events, htmlEvent{string(e.Kind), secs(e.At), eventWho(e)})
	}
	idx := map[string]int{}
	for i := range r.Requests {
		q := &r.Requests[i]
		ri := -1
		if q.Replica != "" {
			v, ok := idx[q.Replica]
			if !ok {
				v = len(h.Replicas)
				idx[q.Replica] = v
				h.Replicas = append(h.Replicas, q.Replica)
			}
			ri = v
		}
		ttft, total := -1.0, -1.0
		if q.TTFT >= 0 {
			ttft = ms(q.TTFT)
		}
		if q.Total >= 0 {
			total = ms(q.Total)
		}
		ok, stream := 0, 0
		if q.OK() {
			ok = 1
		}
		if q.Stream {
			stream = 1
		}
		h.Stream = append(h.Stream, stream)
		h.T = append(h.T, round3(secs(q.Intended)))
		h.TTFT, h.Total, h.OK = append(h.TTFT, ttft), append(h.Total, total), append(h.OK, ok)
		h.Phase, h.Replica = append(h.Phase, q.Span), append(h.Replica, ri)
	}
	series := map[string]*htmlSeries{}
	var ids []string
	for _, s := range r.Samples {
		for _, rs := range s.Replicas {
			se, ok := series[rs.ID]
			if !ok {
				se = &htmlSeries{ID: rs.ID}
				series[rs.ID] = se
				ids = append(ids, rs.ID)
			}
			se.T = append(se.T, round3(secs(s.At)))
			se.Inflight = append(se.Inflight, rs.Inflight)
			se.Waiting = append(se.Waiting, rs.EngineWaiting)
		}
	}
	slices.Sort(ids)
	for _, id := range ids {
		h.Series = append(h.Series, *series[id])
	}
	return h
}

// WriteHTML writes a self-contained page (no external resources): for each
// report its tables, TTFT over time with the phase boundaries and fleet
// actions marked, queue depth per replica, and per-phase latency CDFs (two
// reports are overlaid, A solid and B dashed).
func WriteHTML(w io.Writer, reports ...*Report) error {
	if len(reports) == 0 {
		return fmt.Errorf("no report")
	}
	runs := make([]htmlRun, len(reports))
	titles := make([]string, len(reports))
	for i, r := range reports {
		runs[i] = toHTMLRun(r)
		titles[i] = runs[i].Label
	}
	var cmp *Comparison
	var cmpText string
	if len(reports) == 2 {
		cmp = Compare(reports[0], reports[1])
		var b strings.Builder
		_ = cmp.WriteText(&b)
		cmpText = b.String()
	}
	return reportTmpl.Execute(w, map[string]any{
		"Title":   "tailgate bench — " + strings.Join(titles, " vs "),
		"Reports": reports,
		"Runs":    runs,
		"Compare": cmpText,
	})
}
