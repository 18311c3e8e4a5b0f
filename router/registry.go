package router

import (
	"context"
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
	// failure (reason is a short, bounded label such as "connect").
	OnEject func(rep *Replica, reason string)
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
}

// Registry is the set of replicas the gateway may route to.
type Registry struct {
	cfg Config
	log *slog.Logger

	mu   sync.Mutex // serialises writers of list
	list atomic.Pointer[[]*Replica]
}

// New returns an empty registry.
func New(cfg Config, log *slog.Logger) *Registry {
	cfg.setDefaults()
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	r := &Registry{cfg: cfg, log: log}
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
	rep.failures.Add(1)
	if State(rep.state.Load()) != StateReady {
		return
	}
	if !rep.state.CompareAndSwap(int32(StateReady), int32(StateEjected)) {
		return
	}
	rep.reason.Store(&reason)
	r.log.Warn("replica ejected", "replica", rep.ID, "reason", reason)
	if r.cfg.OnEject != nil {
		r.cfg.OnEject(rep, reason)
	}
}

// Pick chooses a ready replica serving model, skipping those in exclude:
// the less loaded of two chosen at random (power of two choices).
func (r *Registry) Pick(model string, exclude []*Replica) (*Replica, error) {
	list := *r.list.Load()
	var a, b *Replica
	n := 0
	known := false
	for _, rep := range list {
		if !rep.Serves(model) {
			continue
		}
		known = true
		if rep.State() != StateReady || slices.Contains(exclude, rep) {
			continue
		}
		// Reservoir-sample two distinct candidates in one pass, no allocation.
		n++
		switch {
		case n == 1:
			a = rep
		case n == 2:
			b = rep
		default:
			if j := r.cfg.Rand(n); j == 0 {
				a = rep
			} else if j == 1 {
				b = rep
			}
		}
	}
	switch {
	case !known:
		return nil, ErrUnknownModel
	case a == nil:
		return nil, ErrNoReplica
	case b == nil:
		return a, nil
	}
	if r.cfg.Rand(2) == 1 {
		a, b = b, a
	}
	if b.Inflight() < a.Inflight() {
		return b, nil
	}
	return a, nil
}

// AttemptFunc runs one attempt of a request on rep; n counts attempts from 1.
// It returns an error wrapped with [ErrNotSent] when the request never
// reached the replica.
type AttemptFunc func(ctx context.Context, rep *Replica, n int) error

// Result tells how a request was served.
type Result struct {
	Replica  *Replica // the replica of the last attempt (nil if none was picked)
	Attempts int
}

// Do runs fn on a ready replica for model, retrying on another replica at
// once when an attempt never reached its replica. The replica's in-flight
// count is held for the whole attempt and always given back.
func (r *Registry) Do(ctx context.Context, model string, fn AttemptFunc) (Result, error) {
	var (
		res   Result
		tried []*Replica
		last  error
	)
	for res.Attempts < r.cfg.MaxAttempts {
		rep, err := r.Pick(model, tried)
		if err != nil {
			if last != nil {
				return res, last
			}
			return res, err
		}
		res.Replica = rep
		res.Attempts++
		tried = append(tried, rep)
		err = r.attempt(ctx, rep, res.Attempts, fn)
		if err == nil {
			rep.markOK(r.cfg.Now())
			return res, nil
		}
		if ctx.Err() != nil {
			return res, err
		}
		switch {
		case IsNotSent(err):
			r.Eject(rep, "connect")
		case IsDeclined(err):
		default:
			return res, err
		}
		last = err
	}
	return res, last
}

func (r *Registry) attempt(ctx context.Context, rep *Replica, n int, fn AttemptFunc) error {
	release := rep.acquire()
	defer release()
	return fn(ctx, rep, n)
}
