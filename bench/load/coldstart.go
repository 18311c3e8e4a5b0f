package load

import (
	"fmt"
	"math"
	"slices"
	"time"
)

// The coldstart scenario: the gateway's fleet controller at min 0 over one
// simulated engine that takes --sim-start-delay to load, as vLLM takes to
// load a model before it listens. Requests arrive at zero replicas: they
// are held (the hold stage) while the controller starts a worker, and go
// out when it is ready. Then the model idles past --fleet-sleep-after: the
// controller puts the replica to vLLM sleep, and the next requests are held
// while it wakes (--sim-wake-delay). After the idle period the controller
// stops it.

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

// coldstartWakeDelay is the simulated engine's wake from a level 1 sleep:
// vLLM's published figures put it at 0.1 s (0.6B) to about 6 s (235B), the
// first prompt after a wake at 0.96 s; a 7–8B model copies ~16 GB back
// over PCIe 4 in ~0.7 s (docs/capacity.md). It is the sim's default, given
// here so the report can say it.
const coldstartWakeDelay = time.Second

var coldstartSimArgs = []string{"--sim-ttft", "40ms", "--sim-tpot", "4ms", "--sim-max-seqs", "64",
	"--sim-start-delay", coldstartStartDelay.String(), "--sim-wake-delay", coldstartWakeDelay.String()}

// FirstRequest is the first request of a phase that found no ready
// replica: when it was sent, whether it succeeded, its time to first
// token, how long the gateway held it (the hold stage), and its first
// token after the hold ended (TTFT − hold): the hold ends the moment a
// replica of the model is ready, so this is the first token's distance
// from ready (or woken) at the gateway.
type FirstRequest struct {
	FirstSentS        float64  `json:"first_sent_s"`
	FirstOK           bool     `json:"first_ok"`
	FirstStream       bool     `json:"first_stream"`
	FirstTTFTMS       *float64 `json:"first_ttft_ms"`
	FirstHoldMS       *float64 `json:"first_hold_ms"`
	FirstAfterReadyMS *float64 `json:"first_token_after_ready_ms"`
	FirstTokenS       *float64 `json:"first_token_s"`
}

func firstRequest(r *Record) FirstRequest {
	f := FirstRequest{FirstSentS: secs(r.Intended), FirstOK: r.OK(), FirstStream: r.Stream}
	if t, ok := r.FirstToken(); ok && r.OK() {
		f.FirstTTFTMS, f.FirstTokenS = optMS(r.TTFT), optS(t)
		if h, ok := r.StageMS["hold"]; ok {
			f.FirstHoldMS = &h
			after := ms(r.TTFT) - h
			f.FirstAfterReadyMS = &after
		}
	}
	return f
}

// withinTarget reports whether the first token came within ColdStartTarget
// of ready.
func (f *FirstRequest) withinTarget() bool {
	return f.FirstAfterReadyMS != nil && *f.FirstAfterReadyMS <= ms(ColdStartTarget)
}

// line is the first request's finding; ready names what the hold waited
// for ("its replica was ready", "its replica woke").
func (f *FirstRequest) line(ready string) string {
	kind := "JSON"
	if f.FirstStream {
		kind = "stream"
	}
	s := fmt.Sprintf("first request (%s, sent at %.1f s): ", kind, f.FirstSentS)
	if !f.FirstOK {
		return s + "FAILED"
	}
	return s + fmt.Sprintf("held %s, first token after %s; %s after %s (target ≤ %s)",
		optf(f.FirstHoldMS, "%.0f ms"), optf(f.FirstTTFTMS, "%.0f ms"), optf(f.FirstAfterReadyMS, "%.0f ms"), ready, ColdStartTarget)
}

func optf(v *float64, f string) string {
	if v == nil {
		return "—"
	}
	return fmt.Sprintf(f, *v)
}

// WakeReport is the sleep phase of a coldstart run: the replica put to
// sleep after the idle period, then woken for the next requests. Times are
// from the start of the run, in seconds; durations in milliseconds.
type WakeReport struct {
	// WakeDelay is the engine's wake asked for (--sim-wake-delay);
	// SleepAfterS the controller's idle period before it puts a replica
	// to sleep.
	WakeDelay   string  `json:"engine_wake_delay"`
	SleepAfterS float64 `json:"fleet_sleep_after_s"`
	// AsleepS is the first sample with a replica sleeping (nil: none
	// slept within the run, and there is nothing more to say).
	AsleepS *float64 `json:"asleep_s"`
	// The first request sent after AsleepS: held while the replica woke.
	FirstRequest
	// WakeMS is the wake seen in the samples: from the last sample with
	// the replica sleeping to the first with it ready; ColdLoadMS the cold
	// start's: from the first sample with a replica starting to the first
	// with it ready (worker start, engine load, warm-up); ColdOverWake
	// their ratio, what a wake saves over a start.
	WakeMS       *float64 `json:"wake_ms"`
	ColdLoadMS   *float64 `json:"cold_start_ms"`
	ColdOverWake *float64 `json:"cold_start_over_wake"`
	// Requests and Errors (but for 429 queue_full) from AsleepS on.
	Requests int `json:"requests"`
	Errors   int `json:"errors"`
	// Verdict is PASS when the first token came within ColdStartTarget of
	// the wake and no request from AsleepS on failed.
	Verdict string `json:"verdict"`
}

// ColdStartReport is what a run from zero replicas showed. Times are from
// the start of the run, in seconds; durations in milliseconds. Figures read
// from replica samples have the sample interval's resolution.
type ColdStartReport struct {
	// StartDelay is the engine's load time asked for (--sim-start-delay);
	// IdleS the controller's idle period before it stops a replica.
	StartDelay string  `json:"engine_start_delay"`
	IdleS      float64 `json:"fleet_idle_s"`

	// The first request, from zero replicas.
	FirstRequest
	ReplicaStartingS     *float64 `json:"replica_starting_s"` // first sample with a replica starting: its worker registered
	EngineUpS            *float64 `json:"engine_up_s"`        // first sample with a replica warming or ready: the engine listens
	ReplicaReadyS        *float64 `json:"replica_ready_s"`    // first sample with a ready replica
	FirstAfterEngineUpMS *float64 `json:"first_token_after_engine_up_ms"`
	// Verdict is PASS when the first token came within ColdStartTarget of
	// ready, no request failed (but for 429 queue_full: past the bound),
	// and, with a sleep phase, the wake PASSed.
	Verdict string `json:"verdict"`
	// Wake is the sleep phase (nil: the fleet did not sleep,
	// --fleet-sleep-after 0).
	Wake *WakeReport `json:"wake,omitempty"`

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

// coldStartFleet is what `up` was given: the engine's load and wake
// times, and the controller's idle periods (SleepAfter 0: no sleep phase).
type coldStartFleet struct {
	StartDelay, WakeDelay string
	Idle, SleepAfter      time.Duration
}

// coldStart analyzes rep, a run that began at zero replicas.
func coldStart(rep *Report, f coldStartFleet) *ColdStartReport {
	c := &ColdStartReport{StartDelay: f.StartDelay, IdleS: secs(f.Idle), ErrorsByClass: map[string]int{}, Verdict: "FAIL"}
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
	c.FirstRequest = firstRequest(first)
	for _, s := range rep.Samples {
		for _, r := range s.Replicas {
			if c.ReplicaStartingS == nil && (r.State == "starting" || r.State == "warming" || r.Ready) {
				c.ReplicaStartingS = optS(s.At)
			}
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
		if !slices.ContainsFunc(s.Replicas, inService) {
			c.ZeroS, c.ScaleDownAfterS = optS(s.At), optS(s.At-lastEnd)
			break
		}
	}
	if c.withinTarget() && c.Errors == c.QueueFull {
		c.Verdict = "PASS"
	}
	if f.SleepAfter > 0 {
		c.Wake = wake(rep, c, f)
		if c.Wake.Verdict != "PASS" {
			c.Verdict = "FAIL"
		}
	}
	return c
}

// inService reports whether a replica holds capacity: starting, warming,
// ready or asleep (its engine and GPU still there).
func inService(r ReplicaState) bool {
	return r.State == "starting" || r.State == "warming" || r.State == "ready" || r.State == "sleeping"
}

func sleeping(r ReplicaState) bool { return r.State == "sleeping" }

// wake analyzes the sleep phase of rep: the first replica asleep in the
// samples, the first request sent after, and the wake in the samples.
func wake(rep *Report, c *ColdStartReport, f coldStartFleet) *WakeReport {
	w := &WakeReport{WakeDelay: f.WakeDelay, SleepAfterS: secs(f.SleepAfter), Verdict: "FAIL"}
	asleep := slices.IndexFunc(rep.Samples, func(s ReplicaSample) bool { return slices.ContainsFunc(s.Replicas, sleeping) })
	if asleep < 0 {
		return w
	}
	at := rep.Samples[asleep].At
	w.AsleepS = optS(at)
	var first *Record
	for i := range rep.Requests {
		r := &rep.Requests[i]
		if r.Intended < at {
			continue
		}
		w.Requests++
		if !r.OK() && r.ErrCode != "queue_full" {
			w.Errors++
		}
		if first == nil || r.Intended < first.Intended {
			first = r
		}
	}
	if first == nil {
		return w
	}
	w.FirstRequest = firstRequest(first)
	// The wake: the last sample asleep before the first ready one after
	// the first request was sent.
	var lastAsleep, woken *ReplicaSample
	for i := range rep.Samples {
		s := &rep.Samples[i]
		if s.At < at {
			continue
		}
		if slices.ContainsFunc(s.Replicas, func(r ReplicaState) bool { return r.Ready }) && s.At >= first.Intended {
			woken = s
			break
		}
		if slices.ContainsFunc(s.Replicas, sleeping) {
			lastAsleep = s
		}
	}
	if lastAsleep != nil && woken != nil {
		w.WakeMS = optMS(woken.At - lastAsleep.At)
	}
	if c.ReplicaStartingS != nil && c.ReplicaReadyS != nil {
		v := 1000 * (*c.ReplicaReadyS - *c.ReplicaStartingS)
		w.ColdLoadMS = &v
	}
	if w.WakeMS != nil && w.ColdLoadMS != nil && *w.WakeMS > 0 {
		v := math.Round(10**w.ColdLoadMS / *w.WakeMS) / 10
		w.ColdOverWake = &v
	}
	if w.withinTarget() && w.Errors == 0 {
		w.Verdict = "PASS"
	}
	return w
}

// Lines says what the report shows, one finding a line, for the text and
// HTML reports.
func (c *ColdStartReport) Lines() []string {
	lines := []string{
		fmt.Sprintf("engine load %s (--sim-start-delay); replica starting at %s, engine up (warming) at %s, ready at %s, first token at %s (%s after the engine was up: warm-up and heartbeat included)",
			orDefault(c.StartDelay, "0s"), optf(c.ReplicaStartingS, "%.1f s"), optf(c.EngineUpS, "%.1f s"), optf(c.ReplicaReadyS, "%.1f s"), optf(c.FirstTokenS, "%.1f s"), optf(c.FirstAfterEngineUpMS, "%.0f ms")),
		c.line("its replica was ready"),
		fmt.Sprintf("requests: %d, errors: %d (%d past the queue bound, 429 queue_full)%s; held: %d, hold stage p50 %s ms, max %s ms",
			c.Requests, c.Errors, c.QueueFull, errSuffix(c.ErrorsByClass), c.Held, c.Hold.Show("p50"), c.Hold.Show("max")),
	}
	if w := c.Wake; w != nil {
		lines = append(lines, w.lines()...)
	}
	return append(lines,
		fmt.Sprintf("scale-down: last request ended at %.1f s; no replica starting, warming, ready or asleep at %s (%s later; fleet idle period %.0f s)",
			c.LastEndS, optf(c.ZeroS, "%.1f s"), optf(c.ScaleDownAfterS, "%.1f s"), c.IdleS),
		"cold start: "+c.Verdict)
}

func (w *WakeReport) lines() []string {
	head := fmt.Sprintf("from sleep (--fleet-sleep-after %gs, engine wake %s): ", w.SleepAfterS, orDefault(w.WakeDelay, "the sim's default"))
	if w.AsleepS == nil {
		return []string{head + "no replica slept within the run", "wake from sleep: " + w.Verdict}
	}
	return []string{
		head + fmt.Sprintf("replica asleep at %.1f s; woken in %s (sleeping → ready in the samples) against a cold start of %s (starting → ready): %s faster",
			*w.AsleepS, optf(w.WakeMS, "%.0f ms"), optf(w.ColdLoadMS, "%.0f ms"), optf(w.ColdOverWake, "%.1f×")),
		w.line("its replica woke"),
		fmt.Sprintf("requests from sleep: %d, errors: %d", w.Requests, w.Errors),
		"wake from sleep: " + w.Verdict,
	}
}
func errSuffix(m map[string]int) string {
	if len(m) == 0 {
		return ""
	}
	return " — " + errorList(m)
}
