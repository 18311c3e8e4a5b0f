package router

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

func TestHedgeDelayIsAPercentileOfRecentTTFT(t *testing.T) {
	h := newHedger(HedgeConfig{Enabled: true, Percentile: 0.95, MinSamples: 50, Min: time.Millisecond, Max: time.Second}, time.Now)
	for i := 1; i <= 49; i++ {
		h.observe("m", true, time.Duration(i)*time.Millisecond)
	}
	if _, ok := h.delay("m", true); ok {
		t.Fatal("hedging before MinSamples")
	}
	for i := 50; i <= 96; i++ {
		h.observe("m", true, time.Duration(i)*time.Millisecond)
	}
	// p95 of 1..96 ms: the 92nd smallest (ceil(0.95·96) = 92).
	if d, ok := h.delay("m", true); !ok || d != 92*time.Millisecond {
		t.Fatalf("delay = %v %v, want p95 = 92ms", d, ok)
	}
	// Clamped.
	for range 1000 {
		h.observe("m", true, time.Hour)
	}
	if d, _ := h.delay("m", true); d != time.Second {
		t.Fatalf("delay = %v, want the 1s max", d)
	}
	// Per-model override off.
	off := false
	h2 := newHedger(HedgeConfig{Enabled: true, Models: map[string]HedgeModel{"m": {Enabled: &off}}}, time.Now)
	for range 200 {
		h2.observe("m", true, time.Millisecond)
	}
	if _, ok := h2.delay("m", true); ok {
		t.Fatal("hedging a model configured off")
	}
}

// hedgeCounts reads what a registry's metrics say of its hedges.
type hedgeCounts struct {
	t    *testing.T
	prom *prometheus.Registry
}

// attempts returns the hedge attempts started.
func (h hedgeCounts) attempts() float64 {
	return metricValue(h.t, h.prom, "tailgate_upstream_attempts_total", "reason", "hedge")
}

// won returns the hedged requests the hedge answered.
func (h hedgeCounts) won() float64 {
	return metricValue(h.t, h.prom, "tailgate_hedges_total", "outcome", "won")
}

// primed returns a registry whose hedge delay for "m" is known (~10ms).
func primed(t *testing.T, cfg Config) (*Registry, hedgeCounts) {
	t.Helper()
	prom := prometheus.NewRegistry()
	cfg.Registerer = prom
	cfg.Hedge.Enabled = true
	cfg.Hedge.MinSamples = 10
	cfg.Hedge.Min = 10 * time.Millisecond
	reg := newRegistry(t, cfg)
	reg.Add(readyReplica("a", "m"))
	reg.Add(readyReplica("b", "m"))
	for range 20 {
		reg.hedges.observe("m", false, time.Millisecond)
	}
	return reg, hedgeCounts{t, prom}
}

// slowFirst makes attempt 1 hang until cancelled and later attempts answer at once.
func slowFirst(aborted *sync.Map) OpenFunc {
	return func(ctx context.Context, rep *Replica, n int, reason AttemptReason) (Attempt, error) {
		if n == 1 {
			select {
			case <-ctx.Done():
			case <-time.After(5 * time.Second): // bound the test if the hedge never comes
			}
			aborted.Store(n, true)
			return nil, ErrNoToken(ctx.Err(), "")
		}
		return &fakeAttempt{}, nil
	}
}

func TestHedgeWinsAndTheLoserIsCancelled(t *testing.T) {
	reg, ev := primed(t, Config{})
	var aborted sync.Map
	res, err := reg.Do(context.Background(), hint("m"), slowFirst(&aborted))
	if err != nil {
		t.Fatal(err)
	}
	if !res.Hedged || res.Reason != ReasonHedge || res.N != 2 {
		t.Fatalf("result %+v: want the hedge (attempt 2) to win", res)
	}
	lost := res.Losers()
	res.Finish()
	if _, ok := aborted.Load(1); !ok || len(lost) != 1 || lost[0].N != 1 {
		t.Fatalf("the first attempt was not cancelled: lost %+v", lost)
	}
	if ev.won() != 1 || ev.attempts() != 1 {
		t.Fatalf("metrics: won %v, hedge attempts %v", ev.won(), ev.attempts())
	}
	for _, r := range reg.Replicas() {
		if r.Inflight() != 0 {
			t.Fatalf("%s inflight %d", r.ID, r.Inflight())
		}
	}
}

func TestHedgeLoserThatAlsoGotATokenIsAborted(t *testing.T) {
	reg, _ := primed(t, Config{})
	release := make(chan struct{})
	first := &fakeAttempt{}
	res, err := reg.Do(context.Background(), hint("m"), func(ctx context.Context, rep *Replica, n int, _ AttemptReason) (Attempt, error) {
		if n == 1 {
			select { // answers only after the hedge has won
			case <-release:
			case <-time.After(5 * time.Second):
			}
			return first, nil
		}
		return &fakeAttempt{}, nil
	})
	if err != nil || res.N != 2 {
		t.Fatalf("%+v %v", res, err)
	}
	close(release)
	lost := res.Losers()
	if len(lost) != 1 || lost[0].Attempt != first || !first.aborted.Load() {
		t.Fatalf("late first attempt not aborted: %+v", lost)
	}
}

func TestNoHedgeWhenOptedOutSaturatedOrOutOfBudget(t *testing.T) {
	t.Run("opt-out", func(t *testing.T) {
		reg, ev := primed(t, Config{})
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Millisecond)
		defer cancel()
		var aborted sync.Map
		req := hint("m")
		req.NoHedge = true
		res, _ := reg.Do(ctx, req, slowFirst(&aborted))
		if res.Hedged || ev.attempts() != 0 {
			t.Fatal("hedged a request that opted out")
		}
	})
	t.Run("saturated", func(t *testing.T) {
		reg, ev := primed(t, Config{})
		for _, r := range reg.Replicas() {
			r.load.Store(&Load{Waiting: 3})
		}
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Millisecond)
		defer cancel()
		var aborted sync.Map
		res, _ := reg.Do(ctx, hint("m"), slowFirst(&aborted))
		if res.Hedged || ev.attempts() != 0 {
			t.Fatal("hedged onto a replica with a queue")
		}
	})
	t.Run("engine slots full", func(t *testing.T) {
		reg, ev := primed(t, Config{})
		for _, r := range reg.Replicas() {
			// A heartbeat once showed the engine queueing behind 2 running
			// sequences; now the gateway alone has 2 in flight there.
			reg.Heartbeat(Update{ID: r.ID, URL: r.URL, Models: r.Models(), State: StateReady,
				Load: Load{Running: 2, Waiting: 1}, Lease: time.Minute})
			r.load.Store(&Load{Running: 2})
			r.inflight.Store(2)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Millisecond)
		defer cancel()
		var aborted sync.Map
		res, _ := reg.Do(ctx, hint("m"), slowFirst(&aborted))
		if res.Hedged || ev.attempts() != 0 {
			t.Fatal("hedged onto a replica whose engine slots are all taken")
		}
	})
	t.Run("budget", func(t *testing.T) {
		now := time.Unix(0, 0)
		reg, ev := primed(t, Config{Now: func() time.Time { return now },
			Hedge: HedgeConfig{Budget: 0.05, Burst: 2}})
		slow := func(ctx context.Context, rep *Replica, n int, reason AttemptReason) (Attempt, error) {
			if reason == ReasonFirst {
				select { // slower than the 10ms hedge delay, but it answers
				case <-ctx.Done():
					return nil, ErrNoToken(ctx.Err(), "")
				case <-time.After(25 * time.Millisecond):
				}
			}
			return &fakeAttempt{}, nil
		}
		for range 100 {
			res, _ := reg.Do(context.Background(), hint("m"), slow)
			res.Finish()
		}
		// The hedge burst (2) plus 5 % of 100 requests.
		if h := ev.attempts(); h < 2 || h > 2+5 {
			t.Fatalf("%v hedges for 100 requests with a 5 %% budget", h)
		}
	})
	t.Run("budget on a quiet gateway", func(t *testing.T) {
		// The time refill is for retries: seconds between requests must not
		// let hedges go past their share of requests.
		now := time.Unix(0, 0)
		reg, ev := primed(t, Config{Now: func() time.Time { return now },
			Budget: BudgetConfig{MinPerSecond: 100}, Hedge: HedgeConfig{Budget: 0.05, Burst: 2}})
		slow := func(ctx context.Context, rep *Replica, n int, reason AttemptReason) (Attempt, error) {
			if reason == ReasonFirst {
				select {
				case <-ctx.Done():
					return nil, ErrNoToken(ctx.Err(), "")
				case <-time.After(25 * time.Millisecond):
				}
			}
			return &fakeAttempt{}, nil
		}
		for range 100 {
			now = now.Add(10 * time.Second)
			res, _ := reg.Do(context.Background(), hint("m"), slow)
			res.Finish()
		}
		if h := ev.attempts(); h > 2+5 {
			t.Fatalf("%v hedges for 100 requests with a 5 %% budget on a quiet gateway", h)
		}
	})
}

func TestHedgesDoNotWaitForTheRetryBudget(t *testing.T) {
	// A retry budget that never holds a token: hedges have their own.
	reg, ev := primed(t, Config{Budget: BudgetConfig{Burst: 0.5, MinPerSecond: 1e-9}})
	for range 5 {
		var aborted sync.Map
		res, err := reg.Do(context.Background(), hint("m"), slowFirst(&aborted))
		if err != nil || !res.Hedged {
			t.Fatalf("hedged %v, err %v: a spent retry budget held the hedge back", res.Hedged, err)
		}
		res.Finish()
		res.Losers()
	}
	if ev.attempts() != 5 {
		t.Fatalf("%v hedges, want 5", ev.attempts())
	}
}

func TestFanOutPartsHedgeTogetherPastTheBurst(t *testing.T) {
	// Eight parts stall at once. Alone, requests get the bucket's burst;
	// parts of one group pool their shares and may run one burst ahead on
	// credit, so the whole document is hedged.
	for _, tc := range []struct {
		group string
		want  float64
	}{{"", 4}, {"doc-1", 8}} {
		t.Run("group="+tc.group, func(t *testing.T) {
			reg, ev := primed(t, Config{Hedge: HedgeConfig{Budget: 0.1, Burst: 4}})
			for _, id := range []string{"c", "d", "e"} {
				reg.Add(readyReplica(id, "m"))
			}
			var wg sync.WaitGroup
			for range 8 {
				wg.Go(func() {
					req := hint("m")
					req.Group = tc.group
					var aborted sync.Map
					ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
					defer cancel()
					if res, err := reg.Do(ctx, req, slowFirst(&aborted)); err == nil {
						res.Finish()
						res.Losers()
					}
				})
			}
			wg.Wait()
			if got := ev.attempts(); got != tc.want {
				t.Fatalf("%v of 8 stalled parts hedged, want %v", got, tc.want)
			}
		})
	}
}

// Requests add samples and read percentiles of one window at once: the
// refresh that sorts it runs beside them (under -race in the test script),
// every value read is one of the samples, clamped, and the window ends at
// the percentile of what it last held.
func TestHedgeWindowIsReadWhileItIsRefreshed(t *testing.T) {
	h := newHedger(HedgeConfig{Enabled: true, Percentile: 0.9, MinSamples: 50, Window: 256, Min: time.Millisecond, Max: time.Second}, time.Now)
	var wg sync.WaitGroup
	bad := make(chan string, 8)
	for w := range 4 {
		wg.Go(func() {
			for i := range 2000 {
				h.observe("m", false, time.Duration(1+(i+w)%50)*time.Millisecond)
				h.observePace("m", time.Duration(1+i%7)*time.Millisecond)
			}
		})
		wg.Go(func() {
			for range 2000 {
				for _, n := range []int{1, 4, 16} {
					if d, ok := h.delayFor("m", false, n); ok && (d < time.Millisecond || d > 50*time.Millisecond) {
						select {
						case bad <- d.String():
						default:
						}
					}
				}
				h.grace("m", false, 40*time.Millisecond)
				h.pace("m", 4)
				h.budget("m")
				h.levels()
				h.delays()
			}
		})
	}
	wg.Wait()
	close(bad)
	for d := range bad {
		t.Errorf("a percentile read while the window was refreshed is %s, outside the samples 1ms..50ms", d)
	}
	for range 256 {
		h.observe("m", false, 7*time.Millisecond)
	}
	if d, ok := h.delay("m", false); !ok || d != 7*time.Millisecond {
		t.Fatalf("delay = %v %v after a window of 7ms samples, want 7ms", d, ok)
	}
}
