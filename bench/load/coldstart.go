package load

import (
	"fmt"
	"slices"
	"time"
)

// The coldstart scenario: the gateway's fleet controller at min 0 over one
// simulated engine that takes --sim-start-delay to load, as vLLM takes to
// load a model before it listens. Requests arrive at zero replicas: they
// are held (the hold stage) while the controller starts a worker, and go
// out when it is ready; after the idle period the controller stops it.

// coldstartStartDelay is the simulated engine's load time: a small model
// (Llama-3.2-1B, 2.5 GB of bf16 weights) on vLLM loads its weights from a
// local disk in a few seconds and, with warm torch.compile and CUDA graph
// caches, compiles and captures in roughly 10–15 s more; 20 s is such a
// start. A 7–8B model takes 40–90 s (see server.DefaultHold); give
// --worker-args "--sim-start-delay 60s" to see one.
const coldstartStartDelay = 20 * time.Second

// ColdStartTarget is how long after its replica became ready the first
// request may get its first token.
const ColdStartTarget = time.Second

var coldstartSimArgs = []string{"--sim-ttft", "40ms", "--sim-tpot", "4ms", "--sim-max-seqs", "64",
	"--sim-start-delay", coldstartStartDelay.String()}

// ColdStartReport is what a run from zero replicas showed. Times are from
// the start of the run, in seconds; durations in milliseconds. Figures read
// from replica samples have the sample interval's resolution.
type ColdStartReport struct {
	// StartDelay is the engine's load time asked for (--sim-start-delay);
	// IdleS the controller's idle period before it stops a replica.
	StartDelay string  `json:"engine_start_delay"`
	IdleS      float64 `json:"fleet_idle_s"`

	// The first request: when it was sent, whether it succeeded, its time
	// to first token, how long the gateway held it (the hold stage), and
	// its first token after the hold ended (TTFT − hold): the hold ends the
	// moment a replica of the model is ready, so this is the first token's
	// distance from engine ready at the gateway.
	FirstSentS           float64  `json:"first_sent_s"`
	FirstOK              bool     `json:"first_ok"`
	FirstStream          bool     `json:"first_stream"`
	FirstTTFTMS          *float64 `json:"first_ttft_ms"`
	FirstHoldMS          *float64 `json:"first_hold_ms"`
	FirstAfterReadyMS    *float64 `json:"first_token_after_ready_ms"`
	EngineUpS            *float64 `json:"engine_up_s"`     // first sample with a replica warming or ready: the engine listens
	ReplicaReadyS        *float64 `json:"replica_ready_s"` // first sample with a ready replica
	FirstTokenS          *float64 `json:"first_token_s"`
	FirstAfterEngineUpMS *float64 `json:"first_token_after_engine_up_ms"`
	// Verdict is PASS when the first token came within ColdStartTarget of
	// ready and no request failed (but for 429 queue_full: past the bound).
	Verdict string `json:"verdict"`

	Requests      int            `json:"requests"`
	Errors        int            `json:"errors"`
	QueueFull     int            `json:"queue_full"`
	ErrorsByClass map[string]int `json:"errors_by_class"`
	// Held counts the requests the gateway held; Hold summarizes their
	// hold stage.
	Held int     `json:"held"`
	Hold Summary `json:"hold_ms"`

	// Scale-down: LastEndS is when the last request ended, ZeroS the first
	// sample after it with no replica starting, warming or ready, and
	// ScaleDownAfterS the time between (nil: not within the run).
	LastEndS        float64  `json:"last_end_s"`
	ZeroS           *float64 `json:"zero_replicas_s"`
	ScaleDownAfterS *float64 `json:"scale_down_after_s"`
}

func optS(d time.Duration) *float64 {
	v := secs(d)
	return &v
}

// coldStart analyzes rep, a run that began at zero replicas.
func coldStart(rep *Report, startDelay string, idle time.Duration) *ColdStartReport {
	c := &ColdStartReport{StartDelay: startDelay, IdleS: secs(idle), ErrorsByClass: map[string]int{}, Verdict: "FAIL"}
	recs := rep.Requests
	if len(recs) == 0 {
		return c
	}
	first := &recs[0]
	var holds []float64
	var lastEnd time.Duration
	for i := range recs {
		r := &recs[i]
		if r.Intended < first.Intended {
			first = r
		}
		lastEnd = max(lastEnd, r.End())
		c.Requests++
		if h, ok := r.StageMS["hold"]; ok && h > 0 {
			c.Held++
			holds = append(holds, h)
		}
		if !r.OK() {
			c.Errors++
			c.ErrorsByClass[r.ErrClass]++
			if r.ErrCode == "queue_full" {
				c.QueueFull++
			}
		}
	}
	c.Hold = Summarize(holds)
	c.FirstSentS, c.FirstOK, c.FirstStream = secs(first.Intended), first.OK(), first.Stream
	if t, ok := first.FirstToken(); ok && first.OK() {
		c.FirstTTFTMS, c.FirstTokenS = optMS(first.TTFT), optS(t)
		if h, ok := first.StageMS["hold"]; ok {
			c.FirstHoldMS = &h
			after := ms(first.TTFT) - h
			c.FirstAfterReadyMS = &after
		}
	}
	for _, s := range rep.Samples {
		for _, r := range s.Replicas {
			if c.EngineUpS == nil && (r.State == "warming" || r.Ready) {
				c.EngineUpS = optS(s.At)
			}
			if c.ReplicaReadyS == nil && r.Ready {
				c.ReplicaReadyS = optS(s.At)
			}
		}
	}
	if c.EngineUpS != nil && c.FirstTokenS != nil {
		v := 1000 * (*c.FirstTokenS - *c.EngineUpS)
		c.FirstAfterEngineUpMS = &v
	}
	c.LastEndS = secs(lastEnd)
	for _, s := range rep.Samples {
		if s.At < lastEnd || s.Replicas == nil {
			continue
		}
		if !slices.ContainsFunc(s.Replicas, func(r ReplicaState) bool {
			return r.State == "starting" || r.State == "warming" || r.State == "ready"
		}) {
			c.ZeroS, c.ScaleDownAfterS = optS(s.At), optS(s.At-lastEnd)
			break
		}
	}
	if c.FirstAfterReadyMS != nil && *c.FirstAfterReadyMS <= ms(ColdStartTarget) && c.Errors == c.QueueFull {
		c.Verdict = "PASS"
	}
	return c
}

// Lines says what the report shows, one finding a line, for the text and
// HTML reports.
func (c *ColdStartReport) Lines() []string {
	opt := func(v *float64, f string) string {
		if v == nil {
			return "—"
		}
		return fmt.Sprintf(f, *v)
	}
	kind := "JSON"
	if c.FirstStream {
		kind = "stream"
	}
	first := fmt.Sprintf("first request (%s, sent at %.1f s): ", kind, c.FirstSentS)
	if !c.FirstOK {
		first += "FAILED"
	} else {
		first += fmt.Sprintf("held %s, first token after %s; %s after its replica was ready (target ≤ %s)",
			opt(c.FirstHoldMS, "%.0f ms"), opt(c.FirstTTFTMS, "%.0f ms"), opt(c.FirstAfterReadyMS, "%.0f ms"), ColdStartTarget)
	}
	lines := []string{
		fmt.Sprintf("engine load %s (--sim-start-delay); engine up (replica warming) at %s, ready at %s, first token at %s (%s after the engine was up: warm-up and heartbeat included)",
			orDefault(c.StartDelay, "0s"), opt(c.EngineUpS, "%.1f s"), opt(c.ReplicaReadyS, "%.1f s"), opt(c.FirstTokenS, "%.1f s"), opt(c.FirstAfterEngineUpMS, "%.0f ms")),
		first,
		fmt.Sprintf("requests: %d, errors: %d (%d past the queue bound, 429 queue_full)%s; held through the start: %d, hold stage p50 %s ms, max %s ms",
			c.Requests, c.Errors, c.QueueFull, errSuffix(c.ErrorsByClass), c.Held, c.Hold.Show("p50"), c.Hold.Show("max")),
		fmt.Sprintf("scale-down: last request ended at %.1f s; no replica starting, warming or ready at %s (%s later; fleet idle period %.0f s)",
			c.LastEndS, opt(c.ZeroS, "%.1f s"), opt(c.ScaleDownAfterS, "%.1f s"), c.IdleS),
		"cold start: " + c.Verdict,
	}
	return lines
}

func errSuffix(m map[string]int) string {
	if len(m) == 0 {
		return ""
	}
	return " — " + errorList(m)
}
