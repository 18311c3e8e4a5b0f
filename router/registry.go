package router

import (
	"errors"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Registry is the set of replicas the gateway may route to.
type Registry struct {
	cfg    Config
	log    *slog.Logger
	sel    Selector
	budget *Budget
	hedges *hedger
	m      *metrics
	// sessions is the table of recent sessions; nil unless AffinitySession.
	sessions *sessions
	holds    *holds // requests waiting for a replica (wait.go)

	mu   sync.Mutex // serialises writers of list
	list atomic.Pointer[[]*Replica]

	onLoss    atomic.Pointer[func(LossEvent)] // see OnLoss
	ejectedBy sync.Map                        // replica id → *atomic.Int64 (Ejections)
}

// New returns an empty registry, or an error for a configuration Validate
// rejects or metrics the Registerer refuses. A nil log discards.
func New(cfg Config, log *slog.Logger) (*Registry, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	r := &Registry{cfg: cfg, log: log, sel: cfg.Selector, budget: NewBudget(cfg.Budget, cfg.Now), hedges: newHedger(cfg.Hedge, cfg.Now)}
	if r.sel == nil {
		r.sel = newP2C(cfg)
	}
	if cfg.Affinity == AffinitySession {
		r.sessions = newSessions(cfg.Sessions)
	}
	r.list.Store(&[]*Replica{})
	m, err := newMetrics(cfg.Registerer, r)
	if err != nil {
		return nil, err
	}
	r.m = m
	if r.holds, err = newHolds(cfg.Registerer, r); err != nil {
		return nil, err
	}
	return r, nil
}

// Add puts rep in the registry, replacing a replica with the same ID, and
// returns the replica now registered under that ID. From then on rep keeps
// time by the registry's clock.
func (r *Registry) Add(rep *Replica) *Replica {
	rep.clock.Store(&r.cfg.Now)
	ready := func() { r.replicaReady(rep) }
	rep.onReady.Store(&ready)
	defer func() {
		if rep.State() == StateReady {
			r.replicaReady(rep)
		}
	}()
	r.mu.Lock()
	defer r.mu.Unlock()
	old := *r.list.Load()
	next := make([]*Replica, 0, len(old)+1)
	for _, o := range old {
		if o.ID != rep.ID {
			next = append(next, o)
		}
	}
	next = append(next, rep)
	slices.SortFunc(next, func(a, b *Replica) int {
		switch {
		case a.ID < b.ID:
			return -1
		case a.ID > b.ID:
			return 1
		}
		return 0
	})
	r.list.Store(&next)
	return rep
}

// Remove drops the replica with the given ID.
func (r *Registry) Remove(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	old := *r.list.Load()
	next := slices.DeleteFunc(slices.Clone(old), func(o *Replica) bool { return o.ID == id })
	r.list.Store(&next)
}

// Get returns the replica with the given ID, or nil.
func (r *Registry) Get(id string) *Replica {
	for _, rep := range *r.list.Load() {
		if rep.ID == id {
			return rep
		}
	}
	return nil
}

// Replicas returns a snapshot of all replicas, ordered by ID.
func (r *Registry) Replicas() []*Replica { return *r.list.Load() }

// ReadyModels returns the sorted models served by at least one ready replica.
func (r *Registry) ReadyModels() []string {
	var out []string
	for _, rep := range *r.list.Load() {
		if rep.State() != StateReady {
			continue
		}
		for _, m := range rep.Models() {
			if !slices.Contains(out, m) {
				out = append(out, m)
			}
		}
	}
	slices.Sort(out)
	return out
}

// ContextLen is the smallest context length among the ready replicas that
// serve model and reported one (a request that fits it fits any of them);
// 0 when none did.
func (r *Registry) ContextLen(model string) int64 {
	var n int64
	for _, rep := range *r.list.Load() {
		if rep.State() != StateReady || !rep.Serves(model) {
			continue
		}
		if c := rep.ContextLen(); c > 0 && (n == 0 || c < n) {
			n = c
		}
	}
	return n
}

// Alternatives reports whether more than one ready replica serves model:
// whether a request for it, once sent to one, could be hedged or retried on
// another.
func (r *Registry) Alternatives(model string) bool {
	n := 0
	for _, rep := range *r.list.Load() {
		if rep.State() == StateReady && rep.Serves(model) {
			if n++; n > 1 {
				return true
			}
		}
	}
	return false
}

// AnyReady reports whether at least one replica is ready.
func (r *Registry) AnyReady() bool {
	for _, rep := range *r.list.Load() {
		if rep.State() == StateReady {
			return true
		}
	}
	return false
}

// Known reports whether any replica, in any state, serves model.
func (r *Registry) Known(model string) bool {
	for _, rep := range *r.list.Load() {
		if rep.Serves(model) {
			return true
		}
	}
	return false
}

// Eject takes rep out of routing until a probe succeeds again. Only a ready
// replica is ejected; for any other the failure is only counted.
func (r *Registry) Eject(rep *Replica, reason string) {
	now := r.cfg.Now()
	rep.markFailure(now)
	if !rep.transition(StateReady, StateEjected, reason, now) {
		return
	}
	rep.signalEjected()
	delay := time.Duration(0)
	if f := rep.firstFailAt.Load(); f != 0 {
		delay = now.Sub(time.Unix(0, f))
	}
	r.log.Warn("replica ejected", "replica", rep.ID, "reason", reason, "since_first_failure", delay.Round(time.Millisecond))
	r.countEjection(rep.ID, reason)
	r.m.ejectDelay.Observe(delay.Seconds())
}

// countEjection counts one ejection of replica id with reason, in
// tailgate_ejections_total{replica,reason} and in [Registry.Ejections].
func (r *Registry) countEjection(id, reason string) {
	r.m.ejections.WithLabelValues(id, reason).Inc()
	n, _ := r.ejectedBy.LoadOrStore(id, new(atomic.Int64))
	n.(*atomic.Int64).Add(1)
}

// Ejections returns how often replica id was taken out of routing by the
// gateway since it started, for any reason (tailgate_ejections_total
// summed over reasons): ejected after failures, lost when its lease ended
// while ready, out when its engine failed, or replaced by its restarted
// worker while ready. It counts across re-registrations of the id.
func (r *Registry) Ejections(id string) int64 {
	if n, ok := r.ejectedBy.Load(id); ok {
		return n.(*atomic.Int64).Load()
	}
	return 0
}

// Drain takes a ready replica out of routing because it said it is
// draining (it declined a request for that reason): it finishes what it
// has and takes nothing new. A registered replica's heartbeats say when it
// is back; a static one stays out, since its probe cannot tell draining
// from ready.
func (r *Registry) Drain(rep *Replica, reason string) {
	if rep.transition(StateReady, StateDraining, reason, r.cfg.Now()) {
		r.log.Info("replica draining", "replica", rep.ID, "reason", reason)
	}
}

// maxCandidates sizes the on-stack candidate array; larger fleets allocate.
const maxCandidates = 32

// Pick chooses a ready replica serving the hinted model, skipping those in
// exclude and those backing off, with the configured selection policy.
func (r *Registry) Pick(hint Hint, exclude []*Replica) (*Replica, error) {
	return r.pick(hint, exclude, ClassInteractive, false)
}

// errOutranked: the replicas that could take a hedge all have attempts of a
// higher class than its request's in flight.
var errOutranked = errors.New("every free replica serves a higher class")

// pick is Pick that also skips replicas with attempts of a class higher than
// c in flight (none with c = ClassInteractive); errOutranked when that left
// none. With best, the load-aware policy scores every candidate instead of
// two drawn at random (see P2C.best); other policies ignore it. A request
// of a known session goes by [Registry.pickSession] whatever the policy.
func (r *Registry) pick(hint Hint, exclude []*Replica, c Class, best bool) (*Replica, error) {
	var buf [maxCandidates]*Replica
	cands := buf[:0]
	known, outranked := false, false
	now := r.cfg.Now()
	for _, rep := range *r.list.Load() {
		if !rep.Serves(hint.Model) {
			continue
		}
		known = true
		if rep.State() != StateReady || slices.Contains(exclude, rep) || rep.backingOff(now) {
			continue
		}
		if rep.busyAbove(c) {
			outranked = true
			continue
		}
		cands = append(cands, rep)
	}
	switch {
	case !known:
		return nil, ErrUnknownModel
	case len(cands) == 0 && outranked:
		return nil, errOutranked
	case len(cands) == 0:
		return nil, ErrNoReplica
	}
	if hint.Session != 0 && r.sessions != nil {
		rep, outcome := r.pickSession(cands, hint.Session)
		r.m.session(outcome)
		return rep, nil
	}
	// The selectors of this package are called on their concrete types:
	// through the interface, cands could be kept, so buf moved to the heap
	// (256 bytes an attempt: router.(*Registry).pick's runtime.newobject,
	// 60 of the gateway's 41,038 samples at 1000 req/s, /work/wt/profile
	// tg3.script). Another Selector gets a copy.
	switch sel := r.sel.(type) {
	case *P2C:
		if best {
			return sel.best(cands, hint), nil
		}
		return sel.Select(cands, hint), nil
	case *RoundRobin:
		return sel.Select(cands, hint), nil
	}
	return r.sel.Select(slices.Clone(cands), hint), nil
}

// ScoreInputs returns the numbers the load-aware policy scores rep with, for
// metrics and the admin API.
func (r *Registry) ScoreInputs(rep *Replica) (inflight, waiting, ttftSeconds, slowStart, score float64) {
	in := scorer{now: r.cfg.Now, slowStart: r.cfg.SlowStart}.inputs(rep, fallbackTTFT(r.Replicas()))
	return in.Inflight, in.Waiting, in.TTFT, in.SlowStart, in.Score
}
