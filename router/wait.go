package router

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Holding requests through a cold start.
//
// A model with no ready replica used to refuse every request at once (503
// no_replica). When one of its replicas is starting, or a [Provisioner] can
// start one, a request may instead wait here — in a bounded queue per
// model, for a bounded time — and is released the moment a replica of the
// model becomes ready. Releases go out in class order (interactive first,
// FIFO within a class), so the first slots of a new engine go to the most
// urgent work; what follows is the admission queue's and the selector's, as
// for any request.

// Provisioner is what can add capacity for a model: the gateway's fleet
// controller, which starts replicas and wakes sleeping ones. The registry
// asks it whether a request for a model without a starting replica is
// worth holding, and tells it when one starts waiting (so it wakes a
// sleeping replica of the model, or starts one).
type Provisioner interface {
	// CanStart reports whether a replica of model can be started (the
	// model is managed and below its maximum).
	CanStart(model string) bool
	// CanWake reports whether it wakes the sleeping replicas of model (the
	// model is managed and the provisioner can reach their sidecars).
	CanWake(model string) bool
	// Wake says requests for model wait; it must not block.
	Wake(model string)
	// Models returns the models it manages: they are served (listed,
	// healthy) even while none of their replicas exists.
	Models() []string
}

// HoldOptions bound one request's wait in [Registry.Hold].
type HoldOptions struct {
	// Queue bounds how many requests wait per model; past it the request is
	// refused with [ErrHoldFull]. 0 or less: nothing waits.
	Queue int
	// PerTenant bounds how many of them one tenant's requests may be
	// (Tenant names the request's); past it the request is refused with
	// [ErrHoldFull] too, so one tenant's burst leaves the rest of the
	// queue to others. 0 or less: the whole queue.
	PerTenant int
	Tenant    int64
	// Timeout bounds the wait; past it the request is refused with
	// [ErrHoldTimeout]. 0 or less: nothing waits.
	Timeout time.Duration
	// Every is how often Progress is called while the request waits; 0
	// means never.
	Every time.Duration
	// Progress, if set, is called from the waiting goroutine with what the
	// model's capacity is doing ("starting", "warming", "sleeping", "provisioning")
	// and how long the request has waited.
	Progress func(state string, waited time.Duration)
	// Then, if set, is called when a call's wait ended with a replica
	// ready (see Request.Hold): its error ends the call as the wait's (the
	// caller can no longer serve it, e.g. its ledger went down meanwhile).
	Then func() error
}

// HoldError ends a call whose wait for capacity (Request.Hold) ended
// without it: Err is [ErrHoldFull], [ErrHoldTimeout], [ErrNoReplica], the
// context's error or HoldOptions.Then's.
type HoldError struct{ Err error }

func (e *HoldError) Error() string { return "hold: " + e.Err.Error() }
func (e *HoldError) Unwrap() error { return e.Err }

// Errors of [Registry.Hold].
var (
	// ErrHoldFull: the model's hold queue is full.
	ErrHoldFull = errors.New("hold queue full")
	// ErrHoldShare: the request's tenant holds its share of the model's
	// hold queue (HoldOptions.PerTenant); it is an ErrHoldFull too.
	ErrHoldShare = fmt.Errorf("%w: the tenant's share", ErrHoldFull)
	// ErrHoldTimeout: no replica became ready within the hold timeout.
	ErrHoldTimeout = errors.New("no replica became ready in time")
)

// holds are the registry's per-model hold queues.
type holds struct {
	mu     sync.Mutex
	models map[string]*holdQueue
	prov   Provisioner
}

type holdQueue struct {
	byClass  [numClasses][]*holdWaiter
	n        int
	byTenant map[int64]int // waiters per tenant
}

type holdWaiter struct {
	class  Class
	tenant int64
	ready  chan struct{}
	order  int // release order, 1-based; 0 while waiting
}

func newHolds(reg prometheus.Registerer, r *Registry) (*holds, error) {
	h := &holds{models: map[string]*holdQueue{}}
	if reg != nil {
		if err := reg.Register(&modelLoadCollector{r: r}); err != nil {
			return nil, err
		}
	}
	return h, nil
}

// SetProvisioner sets what can start replicas for models with none ready;
// nil leaves only starting replicas worth holding for. Call it before
// traffic arrives.
func (r *Registry) SetProvisioner(p Provisioner) {
	r.holds.mu.Lock()
	r.holds.prov = p
	r.holds.mu.Unlock()
}

func (r *Registry) provisioner() Provisioner {
	r.holds.mu.Lock()
	defer r.holds.mu.Unlock()
	return r.holds.prov
}

// Startable reports whether a provisioner can start a replica of model:
// the model is served even while no replica of it exists (scaled to zero).
func (r *Registry) Startable(model string) bool {
	p := r.provisioner()
	return p != nil && p.CanStart(model)
}

// ManagedModels returns the models a provisioner manages, sorted: a
// request for one is held while a replica starts, so they are served even
// at zero replicas.
func (r *Registry) ManagedModels() []string {
	p := r.provisioner()
	if p == nil {
		return nil
	}
	return slices.Sorted(slices.Values(p.Models()))
}

// ReadyFor reports whether a replica serving model is ready.
func (r *Registry) ReadyFor(model string) bool {
	for _, rep := range *r.list.Load() {
		if rep.State() == StateReady && rep.Serves(model) {
			return true
		}
	}
	return false
}

// Waiting returns how many requests wait for a replica of model.
func (r *Registry) Waiting(model string) int {
	r.holds.mu.Lock()
	defer r.holds.mu.Unlock()
	if q := r.holds.models[model]; q != nil {
		return q.n
	}
	return 0
}

// Inflight returns the attempts in flight on the replicas serving model.
func (r *Registry) Inflight(model string) int64 {
	var n int64
	for _, rep := range *r.list.Load() {
		if rep.Serves(model) {
			n += rep.Inflight()
		}
	}
	return n
}

// LastUsed returns when the last attempt started on a replica serving
// model (zero: none yet). An idle clock needs it: in-flight counts read
// once a second miss short requests coming steadily between the reads.
func (r *Registry) LastUsed(model string) time.Time {
	var last int64
	for _, rep := range *r.list.Load() {
		if rep.Serves(model) {
			last = max(last, rep.lastUsed.Load())
		}
	}
	if last == 0 {
		return time.Time{}
	}
	return time.Unix(0, last)
}

// coldState says what the capacity of model is doing while none of its
// replicas is ready: "starting" or "warming" (a replica is on its way),
// "sleeping" (a replica's engine sleeps and the provisioner wakes it),
// "provisioning" (the provisioner can start one), or "" (nothing is coming:
// the request is not worth holding). A sleeping replica no provisioner
// wakes is nothing coming.
func (r *Registry) coldState(model string) string {
	state, sleeping := "", false
	for _, rep := range *r.list.Load() {
		if !rep.Serves(model) {
			continue
		}
		switch rep.State() {
		case StateReady:
			return "ready"
		case StateWarming:
			state = "warming"
		case StateStarting:
			if state == "" {
				state = "starting"
			}
		case StateSleeping:
			sleeping = true
		}
	}
	switch {
	case state != "":
	case sleeping && r.Wakeable(model):
		state = "sleeping"
	case r.Startable(model):
		state = "provisioning"
	}
	return state
}

// Wakeable reports whether a provisioner wakes the sleeping replicas of
// model.
func (r *Registry) Wakeable(model string) bool {
	p := r.provisioner()
	return p != nil && p.CanWake(model)
}

// Sleeping returns the replicas serving model whose engines sleep: the
// capacity a provisioner can wake for requests that wait.
func (r *Registry) Sleeping(model string) []*Replica {
	var out []*Replica
	for _, rep := range *r.list.Load() {
		if rep.State() == StateSleeping && rep.Serves(model) {
			out = append(out, rep)
		}
	}
	return out
}

// Holdable reports whether a request for model that finds no ready replica
// may wait for one: a replica of it is starting or can be started.
func (r *Registry) Holdable(model string) bool {
	s := r.coldState(model)
	return s != "" && s != "ready"
}

// Hold waits until a replica serving model is ready and returns nil, at
// once when one is. It returns [ErrNoReplica] when none is ready and none
// is coming (see [Registry.Holdable]), [ErrHoldFull] when the model's queue
// is full, [ErrHoldTimeout] when opt.Timeout passed first, or ctx's error.
// Waiters are released in class order: c, then arrival.
func (r *Registry) Hold(ctx context.Context, model string, c Class, opt HoldOptions) error {
	// One look at the replicas: a replica that became ready between a
	// ReadyFor and a Holdable would make the request look unholdable.
	switch r.coldState(model) {
	case "ready":
		return nil
	case "":
		return ErrNoReplica
	}
	if opt.Queue <= 0 || opt.Timeout <= 0 {
		return ErrNoReplica
	}
	w := &holdWaiter{class: c, tenant: opt.Tenant, ready: make(chan struct{})}
	h := r.holds
	h.mu.Lock()
	q := h.models[model]
	if q == nil {
		q = &holdQueue{byTenant: map[int64]int{}}
		h.models[model] = q
	}
	if opt.PerTenant > 0 && q.byTenant[opt.Tenant] >= opt.PerTenant {
		h.mu.Unlock()
		return ErrHoldShare
	}
	if q.n >= opt.Queue {
		h.mu.Unlock()
		return ErrHoldFull
	}
	q.byClass[c.slot()] = append(q.byClass[c.slot()], w)
	q.n++
	q.byTenant[opt.Tenant]++
	prov := h.prov
	h.mu.Unlock()
	if prov != nil {
		prov.Wake(model)
	}
	// A replica that became ready between the check above and the push
	// released nobody: look again now that the waiter is visible.
	if r.ReadyFor(model) {
		r.release(model)
	}

	start := r.cfg.Now()
	deadline := time.NewTimer(opt.Timeout)
	defer deadline.Stop()
	var tick <-chan time.Time
	if opt.Every > 0 && opt.Progress != nil {
		t := time.NewTicker(opt.Every)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case <-w.ready:
			return nil
		case <-ctx.Done():
			if r.leave(model, w) {
				return ctx.Err()
			}
			return nil // released as it gave up: the caller sees ctx's end
		case <-deadline.C:
			if r.leave(model, w) {
				return ErrHoldTimeout
			}
			return nil
		case <-tick:
			s := r.coldState(model)
			if s == "" {
				s = "waiting"
			}
			opt.Progress(s, r.cfg.Now().Sub(start))
		}
	}
}

// leave takes w out of model's queue; false when it was released first.
func (r *Registry) leave(model string, w *holdWaiter) bool {
	h := r.holds
	h.mu.Lock()
	defer h.mu.Unlock()
	q := h.models[model]
	if q == nil {
		return false
	}
	s := w.class.slot()
	i := slices.Index(q.byClass[s], w)
	if i < 0 {
		return false
	}
	q.byClass[s] = slices.Delete(q.byClass[s], i, i+1)
	q.n--
	if q.byTenant[w.tenant]--; q.byTenant[w.tenant] <= 0 {
		delete(q.byTenant, w.tenant)
	}
	return true
}

// release lets every request waiting for model go, highest class first.
func (r *Registry) release(model string) {
	h := r.holds
	h.mu.Lock()
	defer h.mu.Unlock()
	q := h.models[model]
	if q == nil || q.n == 0 {
		return
	}
	order := 0
	for s := numClasses - 1; s >= 0; s-- {
		for _, w := range q.byClass[s] {
			order++
			w.order = order
			close(w.ready)
		}
		q.byClass[s] = nil
	}
	q.n = 0
	clear(q.byTenant)
}

// replicaReady is called when rep became ready: the requests waiting for
// any model it serves go.
func (r *Registry) replicaReady(rep *Replica) {
	for _, m := range rep.Models() {
		r.release(m)
	}
}

// modelLoadCollector exports, at scrape time, each model's demand: the
// requests held for it and the attempts in flight on its replicas, for
// every model a replica serves or a request waits for (0 included, so an
// autoscaler's query has a series to read at zero).
type modelLoadCollector struct{ r *Registry }

var (
	modelWaitingDesc = prometheus.NewDesc("tailgate_model_waiting_requests",
		"Requests held per model while no replica of it is ready (one is starting, or the fleet controller can start one): the demand signal for autoscalers (KEDA, HPA, the fleet controller).",
		[]string{"model"}, nil)
	modelInflightDesc = prometheus.NewDesc("tailgate_model_inflight_requests",
		"Upstream attempts in flight on the replicas serving a model (with tailgate_model_waiting_requests, the load an autoscaler sizes the model's replicas by).",
		[]string{"model"}, nil)
)

func (c *modelLoadCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- modelWaitingDesc
	ch <- modelInflightDesc
}

func (c *modelLoadCollector) Collect(ch chan<- prometheus.Metric) {
	inflight := map[string]int64{}
	for _, rep := range c.r.Replicas() {
		for _, m := range rep.Models() {
			inflight[m] += rep.Inflight()
		}
	}
	waiting := map[string]int{}
	c.r.holds.mu.Lock()
	for m, q := range c.r.holds.models {
		waiting[m] = q.n
		if _, ok := inflight[m]; !ok {
			inflight[m] = 0
		}
	}
	c.r.holds.mu.Unlock()
	for m, n := range inflight {
		ch <- prometheus.MustNewConstMetric(modelInflightDesc, prometheus.GaugeValue, float64(n), m)
		ch <- prometheus.MustNewConstMetric(modelWaitingDesc, prometheus.GaugeValue, float64(waiting[m]), m)
	}
}
