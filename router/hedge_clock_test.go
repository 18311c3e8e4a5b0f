package router

import (
	"context"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// vclock is a virtual clock for Config.Now whose hedge timer (Config.After)
// fires when the first attempt of a request reaches the delay: a request's
// attempts take exactly the virtual times the test gives them.
type vclock struct {
	mu    sync.Mutex
	now   time.Time
	armed time.Duration // the delay last armed for the request in flight; -1 none
	fire  chan time.Time
	// rearmed is closed, and replaced, whenever a timer is armed (the
	// grace of a late original, after the hedge delay).
	rearmed chan struct{}
}

func newVclock() *vclock {
	return &vclock{now: time.Unix(1000, 0), armed: -1, rearmed: make(chan struct{})}
}

func (c *vclock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *vclock) set(t time.Time) {
	c.mu.Lock()
	c.now = t
	c.mu.Unlock()
}

func (c *vclock) After(d time.Duration) <-chan time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.armed = d
	c.fire = make(chan time.Time, 1)
	close(c.rearmed)
	c.rearmed = make(chan struct{})
	return c.fire
}

// fleet is a registry of two replicas on a virtual clock.
type fleet struct {
	t    *testing.T
	c    *vclock
	reg  *Registry
	prom *prometheus.Registry
	// lateOriginal, when set, is the attempt of an original whose first
	// token comes after its hedge started (else a fakeAttempt).
	lateOriginal func() Attempt
}

func newFleet(t *testing.T, cfg Config) *fleet {
	t.Helper()
	f := &fleet{t: t, c: newVclock(), prom: prometheus.NewRegistry()}
	cfg.Now, cfg.After, cfg.Registerer = f.c.Now, f.c.After, f.prom
	cfg.Hedge.Enabled = true
	f.reg = newRegistry(t, cfg)
	f.reg.Add(readyReplica("a", "m", "off"))
	f.reg.Add(readyReplica("b", "m", "off"))
	return f
}

func (f *fleet) skips() float64 {
	return metricValue(f.t, f.prom, "tailgate_hedges_skipped_total")
}

// serve runs one request whose first attempt takes t1 to its first token
// and whose hedge, if one starts, takes t2 from its own start; it returns
// the result once every attempt has ended. An original whose first token
// comes first while its hedge runs may be held for a grace: the hedge wins
// if its first token comes within it.
func (f *fleet) serve(req Request, t1, t2 time.Duration) *Call {
	f.t.Helper()
	c := f.c
	c.mu.Lock()
	c.armed, c.fire = -1, nil
	c.now = c.now.Add(time.Second)
	t0 := c.now
	c.mu.Unlock()
	skipsBefore := f.skips()
	proceed := make(chan struct{}) // the hedge started and will lose
	bound := time.After(10 * time.Second)
	res, err := f.reg.Do(context.Background(), req, func(ctx context.Context, _ *Replica, n int, reason AttemptReason) (Attempt, error) {
		c.mu.Lock()
		armed, fire := c.armed, c.fire
		c.mu.Unlock()
		if reason == ReasonHedge {
			if armed+t2 < t1 {
				c.set(t0.Add(armed + t2))
				return &fakeAttempt{}, nil
			}
			c.mu.Lock()
			rearmed := c.rearmed
			c.mu.Unlock()
			close(proceed)
			select {
			case <-rearmed: // the original is held for a grace
				c.mu.Lock()
				grace, fire := c.armed, c.fire
				c.mu.Unlock()
				if armed+t2 <= t1+grace {
					c.set(t0.Add(armed + t2))
					return &fakeAttempt{}, nil
				}
				c.set(t0.Add(t1 + grace))
				fire <- t0.Add(t1 + grace)
			case <-ctx.Done():
			}
			<-ctx.Done()
			return nil, ErrNoToken(ctx.Err(), "")
		}
		if armed < 0 || t1 <= armed {
			c.set(t0.Add(t1))
			return &fakeAttempt{}, nil
		}
		c.set(t0.Add(armed))
		fire <- t0.Add(armed)
		for {
			select {
			case <-ctx.Done():
				return nil, ErrNoToken(ctx.Err(), "")
			case <-proceed:
				c.set(t0.Add(t1))
				if f.lateOriginal != nil {
					return f.lateOriginal(), nil
				}
				return &fakeAttempt{}, nil
			case <-bound:
				f.t.Error("request not decided in 10s")
				return nil, ErrNoToken(ctx.Err(), "")
			case <-time.After(time.Millisecond):
				if f.skips() > skipsBefore { // the hedge was refused
					c.set(t0.Add(t1))
					return &fakeAttempt{}, nil
				}
			}
		}
	})
	if err != nil {
		f.t.Fatal(err)
	}
	res.Finish()
	res.Losers()
	return res
}

// heavyTail draws times to first token: lognormal around 100ms, and one in
// ten requests stalls eight times longer.
func heavyTail(rng *rand.Rand) time.Duration {
	d := 100 * time.Millisecond.Seconds() * math.Exp(0.3*rng.NormFloat64())
	if rng.Float64() < 0.10 {
		d *= 8
	}
	return time.Duration(d * float64(time.Second))
}

func TestHedgeDelayLearnsTheFirstAttemptsPercentile(t *testing.T) {
	// A generous budget: every slow request is hedged, as the estimator
	// must cope with when hedging works best.
	f := newFleet(t, Config{Hedge: HedgeConfig{Budget: 1, Burst: 1e6, Percentile: 0.95, Window: 1000}})
	rng := rand.New(rand.NewPCG(15, 1))
	var firsts []time.Duration
	hedges := 0
	for range 3000 {
		t1, t2 := heavyTail(rng), heavyTail(rng)
		firsts = append(firsts, t1)
		if f.serve(hint("m"), t1, t2).Hedged {
			hedges++
		}
	}
	// The true p95 of the first attempts' time to first token over the
	// estimator's window (the last 1000 requests).
	recent := slices.Clone(firsts[len(firsts)-1000:])
	slices.Sort(recent)
	truth := recent[int(math.Ceil(0.95*1000))-1]
	d, ok := f.reg.HedgeDelay("m", false)
	if !ok {
		t.Fatal("no hedge delay learnt")
	}
	ratio := d.Seconds() / truth.Seconds()
	t.Logf("true p95 %v, delay %v (%.2f), %d hedges for 3000 requests", truth, d, ratio, hedges)
	if ratio < 0.9 || ratio > 1.1 {
		t.Fatalf("hedge delay %v is %.0f%% of the first attempts' p95 %v; want within 10%%", d, 100*ratio, truth)
	}
}

func TestHedgeMetricsSayTheDelayAndWhyHedgesDidNotStart(t *testing.T) {
	off := false
	f := newFleet(t, Config{Hedge: HedgeConfig{Budget: 0.1, Burst: 2, Models: map[string]HedgeModel{"off": {Enabled: &off}}}})
	for range 200 { // learn a 100ms delay that a few slow requests do not move; the buckets fill
		f.serve(hint("m"), 100*time.Millisecond, 0)
		f.serve(hint("off"), 100*time.Millisecond, 0)
	}
	d, ok := f.reg.HedgeDelay("m", false)
	if !ok || d != 100*time.Millisecond {
		t.Fatalf("hedge delay %v %v, want 100ms", d, ok)
	}
	if g := metricValue(t, f.prom, "tailgate_hedge_delay_seconds", "model", "m", "answer", "json"); g != 0.1 {
		t.Errorf("tailgate_hedge_delay_seconds{m,json} = %v, want 0.1", g)
	}
	if g := metricValue(t, f.prom, "tailgate_hedge_delay_seconds", "model", "off"); g != 0 {
		t.Errorf("tailgate_hedge_delay_seconds{off} = %v, want none: hedging is off for it", g)
	}

	slow := func(req Request) bool { return f.serve(req, time.Second, 5*time.Second).Hedged }
	// The bucket holds the burst (2): two hedges; the next two would have
	// fitted a deeper bucket (burst), the fifth not (budget: 0.1 a request).
	var hedged []bool
	for range 5 {
		hedged = append(hedged, slow(hint("m")))
	}
	if !slices.Equal(hedged, []bool{true, true, false, false, false}) {
		t.Fatalf("hedged %v, want the burst of 2 then none", hedged)
	}
	optOut := hint("m")
	optOut.NoHedge = true
	slow(optOut)
	slow(hint("off"))
	for _, r := range f.reg.Replicas() {
		r.load.Store(&Load{Waiting: 3})
	}
	slow(hint("m"))
	for _, c := range []struct {
		model, reason string
		want          float64
	}{
		{"m", "burst", 2}, {"m", "budget", 1}, {"m", "opt_out", 1}, {"m", "saturation", 1}, {"off", "disabled", 1},
	} {
		if got := metricValue(t, f.prom, "tailgate_hedges_skipped_total", "model", c.model, "reason", c.reason); got != c.want {
			t.Errorf("tailgate_hedges_skipped_total{%s,%s} = %v, want %v", c.model, c.reason, got, c.want)
		}
	}
	if got := f.skips(); got != 6 {
		t.Errorf("%v hedges skipped in all, want 6", got)
	}
}
