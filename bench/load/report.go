package load

import (
	"fmt"
	"slices"
	"time"
)

// Report is the analysis of a run: per-phase figures, failover and scale-out
// figures, and the raw observations they were computed from.
type Report struct {
	Label       string    `json:"label"`
	Target      string    `json:"target"`
	Rate        float64   `json:"rate,omitempty"`
	Concurrency int       `json:"concurrency,omitempty"`
	Seed        int64     `json:"seed"`
	Workload    string    `json:"workload"`
	Plan        string    `json:"plan"`
	KeepAlive   bool      `json:"keepalive"`
	Started     time.Time `json:"started"`
	ElapsedS    float64   `json:"elapsed_s"`
	// WindowS is the failover window: figures "after the kill" cover
	// requests sent this long after it.
	WindowS          float64 `json:"window_s"`
	SampleIntervalMS float64 `json:"sample_interval_ms"`
	// TTFTStreamsOnly: the run had streams, so TTFT and the gateway's
	// TTFT-like stages (TTFTStages) summarize streams only; a non-streaming
	// answer arrives whole and counts in total.
	TTFTStreamsOnly bool `json:"ttft_streams_only"`

	// SLO holds the latency-budget checks per phase (and "all") when the
	// run was checked against budgets; SLOFrom says where they came from.
	SLO     []SLOCheck `json:"slo,omitempty"`
	SLOFrom string     `json:"slo_from,omitempty"`

	Phases    []PhaseReport    `json:"phases"`
	All       PhaseReport      `json:"all"`
	Failovers []FailoverReport `json:"failovers"`
	ScaleOuts []ScaleOutReport `json:"scaleouts"`
	Notes     []string         `json:"notes,omitempty"`
	// Ledger is the ledger's check against the answers (the databases
	// scenario); nil when not checked.
	Ledger *LedgerCheck `json:"ledger,omitempty"`
	// ColdStart is the start from zero replicas (the coldstart scenario);
	// nil in other runs.
	ColdStart *ColdStartReport `json:"coldstart,omitempty"`
	// Geo is the figures by geography (the geo scenario); nil otherwise.
	Geo *GeoReport `json:"geo,omitempty"`

	Events   []Event         `json:"events"`
	Samples  []ReplicaSample `json:"replica_samples,omitempty"`
	Requests []Record        `json:"requests"`
}

// TTFTStages are the gateway stages that, for a non-streaming request,
// last until the whole answer is ready.
var TTFTStages = []string{"upstream_ttft", "engine_ttft", "network", "ttft"}

// PhaseReport holds the figures of one phase (or of the whole run). Latency
// summaries cover successful requests; errors are counted apart.
type PhaseReport struct {
	Name   string  `json:"name"`
	StartS float64 `json:"start_s"`
	EndS   float64 `json:"end_s"`
	// TargetRate is the open-loop arrival rate of the phase; Clients the
	// closed-loop concurrency.
	TargetRate float64 `json:"target_rate,omitempty"`
	Clients    int     `json:"clients,omitempty"`

	Requests         int            `json:"requests"`
	Streams          int            `json:"streams"`
	OK               int            `json:"ok"`
	Errors           int            `json:"errors"`
	ErrorRate        float64        `json:"error_rate"`
	ErrorsByClass    map[string]int `json:"errors_by_class"`
	BeforeFirstToken int            `json:"errors_before_first_token"`
	Midstream        int            `json:"errors_midstream"`
	// Throughput is successful requests per second of the phase.
	Throughput float64 `json:"throughput"`
	// OutputTokens are the completion tokens of the successful requests
	// (as their usage reported them) and OutputTokensPerS their rate over
	// the phase: the figure a team sizing GPUs compares.
	OutputTokens     int64   `json:"output_tokens"`
	OutputTokensPerS float64 `json:"output_tokens_per_s"`

	TTFT  Summary `json:"ttft_ms"`
	Total Summary `json:"total_ms"`
	// TPOT is the time per output token after the first, one value per
	// successful stream of at least two tokens (see [Record.TPOT]).
	TPOT Summary `json:"tpot_ms"`
	// ITL, the inter-token latency, summarizes the gaps between content
	// chunks of streams (an engine sends one token per chunk unless it
	// batches them).
	ITL Summary `json:"itl_ms"`
	// SendLag is how late the client sent requests against the schedule;
	// it is part of every latency above.
	SendLag Summary `json:"send_lag_ms"`
	// Stages are the gateway's stage durations (and client_connect).
	Stages map[string]Summary `json:"stages_ms"`
	// Sources holds each source label's figures when the run labelled its
	// requests (--sources): one global percentile hides a slow source.
	Sources map[string]SourceReport `json:"sources,omitempty"`
}

// SourceReport holds the figures of one source's requests in a phase.
type SourceReport struct {
	Requests int     `json:"requests"`
	Errors   int     `json:"errors"`
	TTFT     Summary `json:"ttft_ms"`
	Total    Summary `json:"total_ms"`
}

// FailoverReport holds the figures of one kill.
type FailoverReport struct {
	AtS      float64  `json:"at_s"`
	Killed   []string `json:"killed"`
	Inferred bool     `json:"killed_inferred,omitempty"`
	Err      string   `json:"error,omitempty"`
	// ScopeEndS ends the period errors are counted in: the next fleet
	// action or the end of the run.
	ScopeEndS float64 `json:"scope_end_s"`

	// LeftReadyMS: first replica sample in which a killed replica was no
	// longer ready (resolution: the sample interval).
	LeftReadyMS *float64 `json:"left_ready_set_after_ms"`
	// LastRoutedMS: send time of the last request sent after the kill that
	// was answered (or failed) by a killed replica.
	LastRoutedMS *float64 `json:"last_routed_after_ms"`
	RoutedAfter  int      `json:"routed_after_kill"`
	// LastRetryMS: send time of the last request after the kill that took
	// more than one attempt (the gateway tried a replica and moved on).
	LastRetryMS *float64 `json:"last_retry_after_ms"`
	Retried     int      `json:"retried"`

	Errors           int            `json:"errors"`
	BeforeFirstToken int            `json:"errors_before_first_token"`
	Midstream        int            `json:"errors_midstream"`
	ErrorsByClass    map[string]int `json:"errors_by_class"`

	// After covers requests sent in the window after the kill, Before the
	// same length before it.
	After  WindowReport `json:"after"`
	Before WindowReport `json:"before"`

	Replacements []NewReplica `json:"replacements"`
}

// WindowReport holds latency and queue figures of a window around an action.
type WindowReport struct {
	FromS    float64 `json:"from_s"`
	ToS      float64 `json:"to_s"`
	Requests int     `json:"requests"`
	Errors   int     `json:"errors"`
	TTFT     Summary `json:"ttft_ms"`
	Total    Summary `json:"total_ms"`
	// Peak queue depth on the survivors: the engine's waiting requests and
	// the gateway's in-flight count, with the replica that had it.
	PeakWaiting         float64 `json:"peak_engine_waiting"`
	PeakWaitingReplica  string  `json:"peak_engine_waiting_replica,omitempty"`
	PeakInflight        int     `json:"peak_inflight"`
	PeakInflightReplica string  `json:"peak_inflight_replica,omitempty"`
	Samples             int     `json:"samples"`
}

// NewReplica is a replica started by a scale-out or as a replacement.
type NewReplica struct {
	ID       string   `json:"id"`
	Inferred bool     `json:"inferred,omitempty"`
	StartMS  *float64 `json:"started_after_ms"`
	ReadyMS  *float64 `json:"ready_after_ms"`
	// ServingMS: first token of the first successful request it answered.
	ServingMS *float64 `json:"serving_after_ms"`
	// WarmMS: time to warm performance, the first token of the answer with
	// which the TTFT p95 of its recent answers first came within
	// WarmTolerance of WarmBaselineMS, the fleet's steady TTFT p95 (the
	// window before the action); nil when it never did in scope.
	WarmMS         *float64 `json:"warm_after_ms"`
	WarmBaselineMS float64  `json:"warm_baseline_p95_ms,omitempty"`
	// Share of successful requests it answered among those sent in the
	// window from its first one (bounded by the next action).
	Share float64 `json:"traffic_share"`
}

// ScaleOutReport holds the figures of one scale-out.
type ScaleOutReport struct {
	AtS       float64      `json:"at_s"`
	Err       string       `json:"error,omitempty"`
	ScopeEndS float64      `json:"scope_end_s"`
	Started   []NewReplica `json:"started"`
	// ReadyReplicas is the number of ready replicas at the end of the scope
	// (0 without replica samples).
	ReadyReplicas int          `json:"ready_replicas"`
	After         WindowReport `json:"after"`
	Before        WindowReport `json:"before"`
}

// Analyze computes the report of a run. window is the failover window (0
// means 10s).
func Analyze(res *Result, window time.Duration) *Report {
	if window <= 0 {
		window = 10 * time.Second
	}
	rep := &Report{
		Label: res.Label, Target: res.BaseURL, Rate: res.Rate, Concurrency: res.Concurrency, Seed: res.Seed,
		Workload: res.Workload, Plan: FormatPhases(res.Plan.Phases), KeepAlive: res.KeepAlive, Started: res.Start,
		ElapsedS: secs(res.Elapsed), WindowS: secs(window), SampleIntervalMS: ms(res.SampleInterval),
		Events: slices.Clone(res.Events), Samples: res.Samples, Requests: res.Records,
		Failovers: []FailoverReport{}, ScaleOuts: []ScaleOutReport{},
	}
	if rep.Events == nil {
		rep.Events = []Event{}
	}
	if rep.Requests == nil {
		rep.Requests = []Record{}
	}
	for i := range res.Records {
		if res.Records[i].Stream {
			rep.TTFTStreamsOnly = true
			break
		}
	}
	a := analysis{res: res, rep: rep, window: window, streamsOnly: rep.TTFTStreamsOnly}
	for _, s := range res.Plan.Spans {
		var recs []*Record
		for i := range res.Records {
			if res.Records[i].Span == s.Index {
				recs = append(recs, &res.Records[i])
			}
		}
		// A stopped run cuts its phase short.
		pr := a.phaseReport(s.Name, s.Start, max(min(s.End, res.Elapsed), s.Start), recs)
		if res.Rate > 0 {
			pr.TargetRate = res.Rate * s.Factor
		} else {
			pr.Clients = int(float64(res.Concurrency)*s.Factor + 0.5)
		}
		rep.Phases = append(rep.Phases, pr)
	}
	all := make([]*Record, len(res.Records))
	for i := range res.Records {
		all[i] = &res.Records[i]
	}
	rep.All = a.phaseReport("all", 0, min(res.Plan.Length, res.Elapsed), all)

	for i := range rep.Events {
		ev := &rep.Events[i]
		scopeEnd := res.Elapsed
		if i+1 < len(rep.Events) {
			scopeEnd = rep.Events[i+1].At
		}
		switch ev.Kind {
		case Kill:
			rep.Failovers = append(rep.Failovers, a.failover(ev, scopeEnd))
		case ScaleOut:
			rep.ScaleOuts = append(rep.ScaleOuts, a.scaleOut(ev, scopeEnd))
		}
	}
	rep.Notes = a.notes()
	return rep
}

type analysis struct {
	res         *Result
	rep         *Report
	window      time.Duration
	streamsOnly bool
}

// countsTTFT reports whether r's time to first token is summarized.
func (a *analysis) countsTTFT(r *Record) bool { return r.Stream || !a.streamsOnly }

func (a *analysis) phaseReport(name string, start, end time.Duration, recs []*Record) PhaseReport {
	pr := PhaseReport{Name: name, StartS: secs(start), EndS: secs(end), Requests: len(recs),
		ErrorsByClass: map[string]int{}, Stages: map[string]Summary{}}
	var ttft, total, gaps, lag, tpot []float64
	stages := map[string][]float64{}
	for _, r := range recs {
		if r.Stream {
			pr.Streams++
		}
		lag = append(lag, ms(max(r.Sent-r.Intended, 0)))
		if !r.OK() {
			pr.Errors++
			pr.ErrorsByClass[r.ErrClass]++
			if r.ErrStage == Midstream {
				pr.Midstream++
			} else {
				pr.BeforeFirstToken++
			}
			continue
		}
		pr.OK++
		if r.TTFT >= 0 && a.countsTTFT(r) {
			ttft = append(ttft, ms(r.TTFT))
		}
		if r.Total >= 0 {
			total = append(total, ms(r.Total))
		}
		for _, g := range r.Gaps {
			gaps = append(gaps, ms(g))
		}
		pr.OutputTokens += int64(r.Completion)
		if d, ok := r.TPOT(); ok {
			tpot = append(tpot, ms(d))
		}
		for k, v := range r.StageMS {
			if a.countsTTFT(r) || !slices.Contains(TTFTStages, k) {
				stages[k] = append(stages[k], v)
			}
		}
	}
	if pr.Requests > 0 {
		pr.ErrorRate = float64(pr.Errors) / float64(pr.Requests)
	}
	if d := end - start; d > 0 {
		pr.Throughput = float64(pr.OK) / d.Seconds()
		pr.OutputTokensPerS = float64(pr.OutputTokens) / d.Seconds()
	}
	pr.TTFT, pr.Total, pr.ITL, pr.SendLag = Summarize(ttft), Summarize(total), Summarize(gaps), Summarize(lag)
	pr.TPOT = Summarize(tpot)
	for k, v := range stages {
		pr.Stages[k] = Summarize(v)
	}
	pr.Sources = a.sources(recs)
	return pr
}

// sources summarizes recs per source label; nil when none was labelled.
func (a *analysis) sources(recs []*Record) map[string]SourceReport {
	type acc struct {
		rep          SourceReport
		ttft, totals []float64
	}
	by := map[string]*acc{}
	for _, r := range recs {
		if r.Source == "" {
			continue
		}
		s := by[r.Source]
		if s == nil {
			s = &acc{}
			by[r.Source] = s
		}
		s.rep.Requests++
		if !r.OK() {
			s.rep.Errors++
			continue
		}
		if r.TTFT >= 0 && a.countsTTFT(r) {
			s.ttft = append(s.ttft, ms(r.TTFT))
		}
		if r.Total >= 0 {
			s.totals = append(s.totals, ms(r.Total))
		}
	}
	if len(by) == 0 {
		return nil
	}
	out := make(map[string]SourceReport, len(by))
	for k, s := range by {
		s.rep.TTFT, s.rep.Total = Summarize(s.ttft), Summarize(s.totals)
		out[k] = s.rep
	}
	return out
}

func (a *analysis) notes() []string {
	var notes []string
	res := a.res
	if lag := a.rep.All.SendLag; res.Rate > 0 && lag.N > 0 && lag.P99 > 10 {
		notes = append(notes, fmt.Sprintf("the client sent late (send lag p99 %.1f ms, max %.1f ms): the machine running the bench is busy; latencies include the lag", lag.P99, lag.Max))
	}
	if n := a.rep.All.ErrorsByClass[ErrOverload]; n > 0 {
		notes = append(notes, fmt.Sprintf("%d arrivals were not sent: more than the in-flight cap were open (raise --max-inflight)", n))
	}
	streams, staged := 0, 0
	for i := range res.Records {
		r := &res.Records[i]
		if r.Stream && r.OK() {
			streams++
			if _, ok := r.StageMS["gateway"]; ok {
				staged++
			}
		}
	}
	switch {
	case streams > 0 && !res.Admin:
		notes = append(notes, "streams have no gateway stage timings: pass --admin and --admin-token-file to read them from the admin API")
	case streams > 0 && staged < streams:
		notes = append(notes, fmt.Sprintf("gateway stage timings found for %d of %d streams (the admin API keeps the most recent requests)", staged, streams))
	}
	if res.Aborted > 0 {
		notes = append(notes, fmt.Sprintf("%d requests were still open when the run was stopped; they are left out", res.Aborted))
	}
	if res.AdminErrors > 0 {
		notes = append(notes, fmt.Sprintf("%d admin API polls failed", res.AdminErrors))
	}
	for _, ev := range res.Events {
		if ev.Err != "" {
			notes = append(notes, fmt.Sprintf("%s at %.1fs failed: %s", ev.Kind, secs(ev.At), ev.Err))
		}
	}
	return notes
}
