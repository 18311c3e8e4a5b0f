package router

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Config configures a Registry. The zero value is usable: a zero field means
// its documented default, and a feature that can be off is off at its zero
// value (SlowStart, Affinity) or has an explicit bool (Hedge.Enabled).
type Config struct {
	// Selector picks a replica among the ready ones; nil means [P2C], built
	// from Rand, Now, SlowStart and Affinity. [ParsePolicy] maps a policy
	// name to a Selector.
	Selector Selector
	// MaxAttempts bounds the attempts of one request, first try included;
	// 0 means 3.
	MaxAttempts int
	// Rand returns a random int in [0,n) for the default P2C; nil means
	// math/rand/v2.IntN. Tests inject a deterministic one.
	Rand func(n int) int
	// Now is the clock; nil means time.Now. Replicas added to the registry
	// use it too (slow start, leases, ejection delays).
	Now func() time.Time
	// SlowStart is how long a freshly ready replica ramps up to its full
	// share (its load score counts double at first, easing to normal);
	// 0 means no slow start. The gateway's --slow-start flag defaults to
	// [DefaultSlowStart].
	SlowStart time.Duration
	// Affinity keeps related requests on one replica so its engine's
	// prefix cache is reused: by prompt prefix, or by session and then
	// prefix (see [Affinity]); the zero value is off.
	Affinity Affinity
	// Sessions bounds the table of recent sessions (AffinitySession): the
	// least recently used is forgotten beyond it, and its next turn is
	// placed afresh. 0 means [DefaultSessions].
	Sessions int
	// LoadBound is how far above the mean in-flight load (as a factor) a
	// session's replica may be and still take its turn (AffinitySession);
	// 0 means [DefaultLoadBound].
	LoadBound float64
	// LoadSlack is how many requests above the mean in flight a session's
	// replica may hold and still take its turn, whatever LoadBound says:
	// at a few requests per replica a factor of the mean is a fraction of
	// one request, and moving a session costs its whole prefill on a cold
	// replica. 0 means [DefaultLoadSlack]; a negative value means none
	// (LoadBound alone).
	LoadSlack int
	// Budget bounds retries after a request reached a replica (hedges have
	// their own, in Hedge).
	Budget BudgetConfig
	// Hedge configures delayed hedging and its budget; it is off unless
	// Hedge.Enabled (the gateway sets it unless --hedge=false).
	Hedge HedgeConfig
	// After returns a channel that receives once d has passed: the hedge
	// timer. nil means a real timer; tests inject one driven by Now.
	After func(d time.Duration) <-chan time.Time
	// ForgetLost is how long a registered replica whose lease ended stays
	// listed as lost (never routed to; ready 0 in metrics, so alerts see it
	// gone) before the registry forgets it; 0 means [DefaultForgetLost]. An
	// operator forgets one sooner with [Registry.Forget].
	ForgetLost time.Duration
	// Registerer receives the router's metrics (attempts, retries, hedges,
	// ejections, per-replica load and the budget; see metrics.go); nil
	// means they are kept but not exported.
	Registerer prometheus.Registerer
}

// DefaultSlowStart is the slow start the gateway uses unless told otherwise.
const DefaultSlowStart = 3 * time.Second

// DefaultForgetLost is how long a lost replica stays listed unless
// Config.ForgetLost says otherwise: a day, so an alert on it outlives a night.
const DefaultForgetLost = 24 * time.Hour

// withDefaults returns c with every zero field that has a default filled in.
func (c Config) withDefaults() Config {
	if c.MaxAttempts == 0 {
		c.MaxAttempts = 3
	}
	if c.Rand == nil {
		c.Rand = rand.IntN
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.ForgetLost == 0 {
		c.ForgetLost = DefaultForgetLost
	}
	if c.Sessions == 0 {
		c.Sessions = DefaultSessions
	}
	if c.LoadBound == 0 {
		c.LoadBound = DefaultLoadBound
	}
	if c.LoadSlack == 0 {
		c.LoadSlack = DefaultLoadSlack
	}
	c.Budget = c.Budget.withDefaults()
	c.Hedge = c.Hedge.withDefaults()
	return c
}

// Validate reports a configuration that cannot work. Field names are those
// of the gateway's flags where one sets the field.
func (c Config) Validate() error {
	if c.MaxAttempts < 0 {
		return fmt.Errorf("router: max attempts %d: must not be negative", c.MaxAttempts)
	}
	if c.SlowStart < 0 {
		return fmt.Errorf("router: slow start %v: must not be negative (0 turns it off)", c.SlowStart)
	}
	if c.ForgetLost < 0 {
		return fmt.Errorf("router: forget lost %v: must not be negative (0 means %v)", c.ForgetLost, DefaultForgetLost)
	}
	if c.Affinity < AffinityOff || c.Affinity > AffinitySession {
		return fmt.Errorf("router: affinity %d: want off, prefix or session", c.Affinity)
	}
	if c.Sessions < 0 {
		return fmt.Errorf("router: sessions %d: must not be negative (0 means %d)", c.Sessions, DefaultSessions)
	}
	if c.LoadBound != 0 && !(c.LoadBound >= 1) {
		return fmt.Errorf("router: affinity load bound %v: want 1 or more, a factor of the mean load (0 means %v)", c.LoadBound, DefaultLoadBound)
	}
	if err := c.Budget.validate(); err != nil {
		return err
	}
	return c.Hedge.validate()
}

func (c BudgetConfig) validate() error {
	if c.Ratio < 0 || c.Ratio > 1 {
		return fmt.Errorf("router: retry budget ratio %v: want a fraction between 0 and 1 (0 means the default %v)", c.Ratio, defaultBudgetRatio)
	}
	if c.Burst < 0 || c.MinPerSecond < 0 {
		return errors.New("router: retry budget burst and refill rate must not be negative")
	}
	return nil
}
