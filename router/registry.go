package router

import (
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Config configures a Registry. The zero value is usable.
type Config struct {
	// MaxAttempts bounds the attempts of one request, first try included;
	// 0 means 3.
	MaxAttempts int
	// Rand returns a random int in [0,n); nil means math/rand/v2.IntN.
	// Tests inject a deterministic one.
	Rand func(n int) int
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// OnEject is called when a replica is taken out of routing after a
	// failure: reason is a short, bounded label ("connect", "probe",
	// "ttft_deadline", "idle_deadline"), delay the time since the first
	// failure of the streak.
	OnEject func(rep *Replica, reason string, delay time.Duration)
	// Policy names the selection policy: "p2c" (default) or "round-robin".
	Policy string
	// SlowStart is how long a freshly ready replica ramps up to its full
	// share (its load score counts double at first); 0 means 3s, negative
	// disables.
	SlowStart time.Duration
	// Affinity turns on prefix affinity (same prompt prefix → same replica
	// when load is comparable).
	Affinity bool
	// Budget bounds retries after a request reached a replica, and hedges.
	Budget BudgetConfig
	// Hedge configures delayed hedging; the zero value disables it.
	Hedge HedgeConfig
	// Events receives attempt outcomes for metrics; may be nil.
	Events Events
}

// Events receives what happened to attempts, for metrics. Every method must
// be cheap and safe for concurrent use.
type Events interface {
	// Attempt is called when an attempt starts.
	Attempt(model string, reason AttemptReason)
	// Retry is called when a failed attempt is retried; class is
	// "not_sent", "declined" or "no_token".
	Retry(model, class string)
	// Hedge is called when a hedged request ends: won is true when the hedge
	// (not the first attempt) produced the answer.
	Hedge(model string, won bool)
}

func (c *Config) setDefaults() {
	if c.MaxAttempts <= 0 {
		c.MaxAttempts = 3
	}
	if c.Rand == nil {
		c.Rand = rand.IntN
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.SlowStart == 0 {
		c.SlowStart = 3 * time.Second
	}
}

// Validate reports a configuration that cannot work.
func (c Config) Validate() error {
	switch c.Policy {
	case "", "p2c", "round-robin":
	default:
		return fmt.Errorf("router: unknown selection policy %q (want p2c or round-robin)", c.Policy)
	}
	return c.Hedge.validate()
}

// Registry is the set of replicas the gateway may route to.
type Registry struct {
	cfg    Config
	log    *slog.Logger
	sel    Selector
	budget *Budget
	hedges *hedger

	mu   sync.Mutex // serialises writers of list
	list atomic.Pointer[[]*Replica]
}

// New returns an empty registry. It panics on a configuration Validate
// rejects; call Validate first on user input.
func New(cfg Config, log *slog.Logger) *Registry {
	if err := cfg.Validate(); err != nil {
		panic(err)
	}
	cfg.setDefaults()
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	r := &Registry{cfg: cfg, log: log, budget: NewBudget(cfg.Budget, cfg.Now)}
	switch cfg.Policy {
	case "round-robin":
		r.sel = &RoundRobin{}
	default:
		r.sel = &P2C{Rand: cfg.Rand, Now: cfg.Now, SlowStart: max(cfg.SlowStart, 0), Affinity: cfg.Affinity}
	}
	r.hedges = newHedger(cfg.Hedge, cfg.Now)
	r.list.Store(&[]*Replica{})
	return r
}

// Add puts rep in the registry, replacing a replica with the same ID, and
// returns the replica now registered under that ID.
func (r *Registry) Add(rep *Replica) *Replica {
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

// Eject takes rep out of routing until a probe succeeds again.
func (r *Registry) Eject(rep *Replica, reason string) {
	now := r.cfg.Now()
	rep.markFailure(now)
	if !rep.state.CompareAndSwap(int32(StateReady), int32(StateEjected)) {
		return
	}
	rep.reason.Store(&reason)
	rep.signalEjected()
	delay := time.Duration(0)
	if f := rep.firstFailAt.Load(); f != 0 {
		delay = now.Sub(time.Unix(0, f))
	}
	r.log.Warn("replica ejected", "replica", rep.ID, "reason", reason, "since_first_failure", delay.Round(time.Millisecond))
	if r.cfg.OnEject != nil {
		r.cfg.OnEject(rep, reason, delay)
	}
}

// maxCandidates sizes the on-stack candidate array; larger fleets allocate.
const maxCandidates = 32

// Pick chooses a ready replica serving the hinted model, skipping those in
// exclude and those backing off, with the configured selection policy.
func (r *Registry) Pick(hint Hint, exclude []*Replica) (*Replica, error) {
	var buf [maxCandidates]*Replica
	cands := buf[:0]
	known := false
	now := r.cfg.Now()
	for _, rep := range *r.list.Load() {
		if !rep.Serves(hint.Model) {
			continue
		}
		known = true
		if rep.State() != StateReady || slices.Contains(exclude, rep) || rep.backingOff(now) {
			continue
		}
		cands = append(cands, rep)
	}
	switch {
	case !known:
		return nil, ErrUnknownModel
	case len(cands) == 0:
		return nil, ErrNoReplica
	}
	return r.sel.Select(cands, hint), nil
}

// ScoreInputs returns the numbers the load-aware policy scores rep with, for
// metrics and the admin API.
func (r *Registry) ScoreInputs(rep *Replica) (inflight, waiting, ttftSeconds, slowStart, score float64) {
	in := scorer{now: r.cfg.Now, slowStart: max(r.cfg.SlowStart, 0)}.inputs(rep, fallbackTTFT(r.Replicas()))
	return in.Inflight, in.Waiting, in.TTFT, in.SlowStart, in.Score
}
