package load

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Target is the OpenAI-compatible endpoint under test.
type Target struct {
	// Label names the target in reports ("A", "tailgate", "vllm-direct").
	Label string
	// BaseURL is the OpenAI base URL, ending in /v1.
	BaseURL string
	// Also are more base URLs of the same deployment (gateways sharing one
	// database); request i goes to BaseURL and these in turn, as clients
	// behind a DNS name with several addresses would spread. nil: BaseURL
	// alone.
	Also []string
	// Key is sent as a bearer token; "" sends none.
	Key string
	// AdminURL is a tailgate gateway's admin listener (http://host:port);
	// "" means the target is not a tailgate gateway or has no admin access,
	// and streams have no stage timings and there are no replica samples.
	AdminURL   string
	AdminToken string
	// AdminTenant restricts the recent-requests poll to one tenant.
	AdminTenant string
}

// Config configures one run against one target.
type Config struct {
	Target   Target
	Workload *Workload
	Plan     Plan
	// Rate is the open-loop arrival rate (requests per second, Poisson);
	// Concurrency the closed-loop number of clients. Exactly one is set.
	Rate        float64
	Concurrency int
	// Seed seeds the arrival schedule (the workload has its own seed).
	Seed int64
	// Timeout bounds each request; 0 means 30s. The run waits at most this
	// long after the last phase for requests still in flight.
	Timeout time.Duration
	// DisableKeepAlive opens a new connection for every request.
	DisableKeepAlive bool
	// MaxConns caps the client's connections to the target; 0 means no cap.
	// Requests waiting for a connection count that wait in their latency.
	MaxConns int
	// MaxInflight caps open-loop requests in flight; an arrival beyond it is
	// recorded as a client_overload error without being sent. 0 means 4096.
	MaxInflight int
	// SampleInterval is how often /admin/v1/replicas is polled; 0 means 250ms.
	SampleInterval time.Duration
	// Fleet carries out kill and scaleout phases; required when the plan has
	// any.
	Fleet Fleet
	// Progress receives a live progress line and the fleet actions; nil
	// means none. ProgressTTY rewrites one line in place instead of printing
	// a line every few seconds.
	Progress    io.Writer
	ProgressTTY bool
}

func (c *Config) setDefaults() {
	if c.Timeout <= 0 {
		c.Timeout = 30 * time.Second
	}
	if c.MaxInflight <= 0 {
		c.MaxInflight = 4096
	}
	if c.SampleInterval <= 0 {
		c.SampleInterval = 250 * time.Millisecond
	}
}

// Validate reports a configuration that cannot run.
func (c *Config) Validate() error {
	switch {
	case c.Workload == nil:
		return errors.New("a workload is required")
	case len(c.Plan.Spans) == 0:
		return errors.New("a plan with at least one timed phase is required")
	case (c.Rate > 0) == (c.Concurrency > 0):
		return errors.New("set exactly one of a rate (open loop) and a concurrency (closed loop)")
	case c.Rate > 1e6 || math.IsNaN(c.Rate) || c.Concurrency > 100000:
		return errors.New("rate or concurrency out of range")
	case !strings.HasPrefix(c.Target.BaseURL, "http://") && !strings.HasPrefix(c.Target.BaseURL, "https://"):
		return fmt.Errorf("target %q: want an http(s) base URL ending in /v1", c.Target.BaseURL)
	case len(c.Plan.Actions) > 0 && c.Fleet == nil:
		return errors.New("the phases kill or scale out replicas: run a --scenario or give --on-kill/--on-scaleout hooks")
	}
	return nil
}

// Result is everything a run observed.
type Result struct {
	Label       string
	BaseURL     string
	Rate        float64
	Concurrency int
	Seed        int64
	Workload    string
	Plan        Plan
	Start       time.Time
	Elapsed     time.Duration
	KeepAlive   bool
	Records     []Record
	Samples     []ReplicaSample
	Events      []Event
	// SampleInterval is the replica polling interval (the resolution of the
	// "left the ready set" and "ready" figures).
	SampleInterval time.Duration
	// Admin tells whether the admin API was used, and how many of its polls
	// failed.
	Admin       bool
	AdminErrors int
	// Aborted counts requests cut because the run was stopped; they are
	// not in Records.
	Aborted int
}

// Run runs the plan against the target and returns what it observed. It
// returns early, with what it has, when ctx is done.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	r := &runner{cfg: cfg, adm: newAdmin(cfg.Target.AdminURL, cfg.Target.AdminToken, cfg.Target.AdminTenant),
		adminStages: map[string]adminStages{}}
	client := newHTTPClient(cfg.DisableKeepAlive, cfg.MaxConns)
	defer client.CloseIdleConnections()
	r.start = time.Now()
	r.snd = &sender{client: client, key: cfg.Target.Key, timeout: cfg.Timeout, start: r.start}
	for _, u := range append([]string{cfg.Target.BaseURL}, cfg.Target.Also...) {
		r.snd.bases = append(r.snd.bases, strings.TrimSuffix(u, "/"))
	}
	r.prog = newProgress(cfg.Progress, cfg.ProgressTTY, cfg.Plan, r.start)

	bg, stopBg := context.WithCancel(ctx)
	var bgWG sync.WaitGroup
	if r.adm != nil {
		bgWG.Go(func() { r.sampleReplicas(bg) })
		bgWG.Go(func() { r.pollRequests(bg) })
	}
	bgWG.Go(func() { r.prog.run(bg) })
	actionsDone := make(chan struct{})
	go func() { defer close(actionsDone); r.runActions(ctx) }()

	var recs []Record
	if cfg.Rate > 0 {
		recs = r.openLoop(ctx)
	} else {
		recs = r.closedLoop(ctx)
	}
	<-actionsDone
	stopBg()
	bgWG.Wait()
	r.prog.finish()
	if r.adm != nil {
		// Also after a stop: what ran deserves its stages (each fetch is
		// bounded).
		r.finalStages(context.WithoutCancel(ctx), recs)
	}
	// Requests cut because the run was stopped say nothing about the target.
	aborted := 0
	recs = slices.DeleteFunc(recs, func(rec Record) bool {
		if rec.ErrClass == ErrAborted {
			aborted++
			return true
		}
		return false
	})
	res := &Result{
		Label: cfg.Target.Label, BaseURL: cfg.Target.BaseURL, Rate: cfg.Rate, Concurrency: cfg.Concurrency, Seed: cfg.Seed,
		Workload: cfg.Workload.Describe(), Plan: cfg.Plan, Start: r.start, Elapsed: time.Since(r.start),
		KeepAlive: !cfg.DisableKeepAlive, Records: recs, Samples: r.samples, Events: r.events,
		SampleInterval: cfg.SampleInterval, Admin: r.adm != nil, AdminErrors: int(r.adminErrors.Load()), Aborted: aborted,
	}
	return res, ctx.Err()
}

type runner struct {
	cfg   Config
	start time.Time
	snd   *sender
	adm   *admin
	prog  *progress

	samples     []ReplicaSample // written by sampleReplicas only
	events      []Event         // written by runActions only
	adminStages map[string]adminStages
	adminMu     sync.Mutex
	adminErrors atomic.Int64
}

// sleepUntil waits until t; false when ctx ended first.
func sleepUntil(ctx context.Context, t time.Time) bool {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err() == nil
	}
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-tm.C:
		return true
	}
}

// openLoop sends every arrival of the schedule at its time, whatever the
// answers to earlier ones are doing.
func (r *runner) openLoop(ctx context.Context) []Record {
	arrivals := OpenLoop(r.cfg.Plan, r.cfg.Rate, r.cfg.Seed)
	recs := make([]Record, len(arrivals))
	sem := make(chan struct{}, r.cfg.MaxInflight)
	var wg sync.WaitGroup
	n := 0
	for i, a := range arrivals {
		req := r.cfg.Workload.Request(a.Index) // built before its time comes
		due := r.start.Add(a.At)
		if !sleepUntil(ctx, due) {
			break
		}
		n++
		rec := &recs[i]
		rec.Span = a.Span
		select {
		case sem <- struct{}{}:
		default:
			*rec = Record{Index: a.Index, Span: a.Span, Intended: a.At, Sent: a.At, Stream: req.Stream, Source: req.Source, TTFT: -1, Total: -1, LastToken: -1,
				PromptTokens: req.PromptTokens, MaxTokens: req.MaxTokens, ErrClass: ErrOverload, ErrStage: BeforeFirstToken}
			r.prog.sent()
			r.prog.done(rec)
			continue
		}
		r.prog.sent()
		wg.Go(func() {
			defer func() { <-sem }()
			r.snd.send(ctx, req, due, rec)
			r.prog.done(rec)
		})
	}
	wg.Wait()
	// A trailing idle phase is watched to its end (replica samples, a
	// fleet scaling down), as the closed loop does.
	sleepUntil(ctx, r.start.Add(r.cfg.Plan.Length))
	return recs[:n]
}

// closedLoop runs Concurrency × factor clients per phase, each sending its
// next request when the previous one is done.
func (r *runner) closedLoop(ctx context.Context) []Record {
	var (
		next int64
		mu   sync.Mutex
		recs []Record
		wg   sync.WaitGroup
	)
	for _, s := range r.cfg.Plan.Spans {
		if !sleepUntil(ctx, r.start.Add(s.Start)) {
			break
		}
		end := r.start.Add(s.End)
		clients := int(math.Round(float64(r.cfg.Concurrency) * s.Factor))
		for range clients {
			wg.Go(func() {
				for ctx.Err() == nil && time.Now().Before(end) {
					mu.Lock()
					i := int(next)
					next++
					mu.Unlock()
					req := r.cfg.Workload.Request(i)
					var rec Record
					r.prog.sent()
					r.snd.send(ctx, req, time.Now(), &rec)
					rec.Span = s.Index
					r.prog.done(&rec)
					mu.Lock()
					recs = append(recs, rec)
					mu.Unlock()
				}
			})
		}
	}
	sleepUntil(ctx, r.start.Add(r.cfg.Plan.Length))
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	return recs
}

// runActions carries out the plan's kill and scaleout actions on time.
func (r *runner) runActions(ctx context.Context) {
	for _, a := range r.cfg.Plan.Actions {
		if !sleepUntil(ctx, r.start.Add(a.At)) {
			return
		}
		ev := Event{Kind: a.Kind, Count: a.Count, At: time.Since(r.start)}
		var (
			res ActionResult
			err error
		)
		if a.Kind == Kill {
			res, err = r.cfg.Fleet.Kill(ctx, a.Count)
		} else {
			res, err = r.cfg.Fleet.ScaleOut(ctx, a.Count)
		}
		ev.Done = time.Since(r.start)
		ev.Replicas, ev.Output = res.Replicas, res.Output
		for _, rp := range res.Replacements {
			ev.Replacements = append(ev.Replacements, EventReplacement{ID: rp.ID, At: rp.At.Sub(r.start)})
		}
		if err != nil {
			ev.Err = err.Error()
		}
		r.events = append(r.events, ev)
		r.prog.event(ev)
	}
}

// sampleReplicas polls /admin/v1/replicas until ctx is done.
func (r *runner) sampleReplicas(ctx context.Context) {
	t := time.NewTicker(r.cfg.SampleInterval)
	defer t.Stop()
	for {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		reps, err := r.adm.replicas(pctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			r.adminErrors.Add(1)
		}
		r.samples = append(r.samples, ReplicaSample{At: time.Since(r.start), Replicas: reps})
		if reps != nil {
			r.prog.replicas(reps)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// pollRequests collects the stage timings the gateway recorded, once a
// second, since /admin/v1/requests only keeps the most recent ones in reach.
func (r *runner) pollRequests(ctx context.Context) {
	rate := r.cfg.Rate
	if rate == 0 {
		rate = float64(r.cfg.Concurrency) * 20
	}
	var peak float64
	for _, s := range r.cfg.Plan.Spans {
		peak = max(peak, s.Factor)
	}
	limit := min(1000, max(200, int(3*rate*peak)))
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		r.fetchStages(ctx, limit)
	}
}

func (r *runner) fetchStages(ctx context.Context, limit int) {
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	m, err := r.adm.requests(pctx, limit)
	if err != nil {
		if ctx.Err() == nil {
			r.adminErrors.Add(1)
		}
		return
	}
	r.adminMu.Lock()
	defer r.adminMu.Unlock()
	for id, st := range m {
		r.adminStages[id] = st
	}
}

// finalStages fetches the last stage timings and fills in the records that
// lack them (streams, errors).
func (r *runner) finalStages(ctx context.Context, recs []Record) {
	missing := func() int {
		r.adminMu.Lock()
		defer r.adminMu.Unlock()
		n := 0
		for i := range recs {
			if recs[i].RequestID != "" && recs[i].StageMS["total"] == 0 {
				if _, ok := r.adminStages[recs[i].RequestID]; !ok {
					n++
				}
			}
		}
		return n
	}
	// The gateway writes its ledger row as a request ends, just after the
	// client sees the end: give the last rows a moment.
	for try := 0; try < 3 && ctx.Err() == nil; try++ {
		time.Sleep(time.Duration(100*(try+1)) * time.Millisecond)
		r.fetchStages(ctx, 1000)
		if missing() == 0 {
			break
		}
	}
	r.adminMu.Lock()
	defer r.adminMu.Unlock()
	for i := range recs {
		rec := &recs[i]
		st, ok := r.adminStages[rec.RequestID]
		if !ok || rec.RequestID == "" {
			continue
		}
		if _, has := rec.StageMS["total"]; !has {
			for k, v := range st.StageMS {
				rec.stageMS(k, v)
			}
		}
		if rec.Replica == "" {
			rec.Replica = st.Replica
		}
		if st.Attempts > rec.Attempts {
			rec.Attempts = st.Attempts
		}
	}
}

func (r *Record) stageMS(name string, v float64) {
	if r.StageMS == nil {
		r.StageMS = make(map[string]float64, len(Stages)+1)
	}
	r.StageMS[name] = v
}
