package router

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// newRegistry returns a registry for cfg, failing the test on an error.
func newRegistry(t testing.TB, cfg Config) *Registry {
	t.Helper()
	reg, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	return reg
}

func readyReplica(id string, models ...string) *Replica {
	r := NewReplica(id, "http://"+id)
	r.SetModels(models)
	r.SetState(StateReady, "")
	return r
}

// fakeAttempt is an Attempt that records whether it was aborted.
type fakeAttempt struct{ aborted atomic.Bool }

func (f *fakeAttempt) Abort() { f.aborted.Store(true) }

func hint(model string) Request { return Request{Hint: Hint{Model: model}} }

func TestPickLeastLoadedOfTwo(t *testing.T) {
	reg := newRegistry(t, Config{Rand: func(n int) int { return 0 }})
	a := reg.Add(readyReplica("a", "m"))
	b := reg.Add(readyReplica("b", "m"))
	a.inflight.Store(5)
	for range 10 {
		got, err := reg.Pick(Hint{Model: "m"}, nil)
		if err != nil || got != b {
			t.Fatalf("Pick = %v, %v; want b (less loaded)", got, err)
		}
	}
}

func TestPickWeighsEngineQueueAndTTFT(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(a, b *Replica)
		want  string
	}{
		{"engine queue from heartbeat", func(a, b *Replica) { a.load.Store(&Load{Waiting: 4}) }, "b"},
		{"slower replica", func(a, b *Replica) { a.ObserveTTFT(300 * time.Millisecond); b.ObserveTTFT(100 * time.Millisecond) }, "b"},
		{"slower but idle beats faster but busy", func(a, b *Replica) {
			a.ObserveTTFT(200 * time.Millisecond)
			b.ObserveTTFT(100 * time.Millisecond)
			b.inflight.Store(4)
		}, "a"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := newRegistry(t, Config{Rand: func(n int) int { return 0 }})
			a := reg.Add(readyReplica("a", "m"))
			b := reg.Add(readyReplica("b", "m"))
			tc.setup(a, b)
			got, _ := reg.Pick(Hint{Model: "m"}, nil)
			if got.ID != tc.want {
				t.Fatalf("picked %s, want %s", got.ID, tc.want)
			}
		})
	}
}

func TestSlowStartRampsAFreshReplica(t *testing.T) {
	now := time.Unix(1000, 0)
	clock := func() time.Time { return now }
	reg := newRegistry(t, Config{Now: clock, SlowStart: 10 * time.Second, Rand: func(n int) int { return 0 }})
	old := reg.Add(NewReplica("old", "http://old"))
	fresh := reg.Add(NewReplica("fresh", "http://fresh"))
	for _, r := range []*Replica{old, fresh} {
		r.SetModels([]string{"m"})
	}
	old.SetState(StateReady, "")
	now = now.Add(time.Hour)
	fresh.SetState(StateReady, "")
	// Just ready: its score counts double, so an equally idle warm replica wins.
	if got, _ := reg.Pick(Hint{Model: "m"}, nil); got != old {
		t.Fatalf("fresh replica picked at once: %s", got.ID)
	}
	// Ten seconds later it competes on load alone.
	now = now.Add(10 * time.Second)
	old.inflight.Store(1)
	if got, _ := reg.Pick(Hint{Model: "m"}, nil); got != fresh {
		t.Fatalf("after the ramp the idle replica should win, got %s", got.ID)
	}
	_, _, _, ss, _ := reg.ScoreInputs(fresh)
	if ss != 1 {
		t.Fatalf("slow-start factor after the ramp = %v", ss)
	}
}

func TestSlowStartOffByDefault(t *testing.T) {
	now := time.Unix(1000, 0)
	reg := newRegistry(t, Config{Now: func() time.Time { return now }})
	fresh := reg.Add(NewReplica("fresh", "http://fresh"))
	fresh.SetState(StateReady, "")
	if _, _, _, ss, _ := reg.ScoreInputs(fresh); ss != 1 {
		t.Fatalf("slow-start factor of a replica ready this instant = %v with SlowStart 0; want 1 (off)", ss)
	}
}

// TestPrefixAffinityKeepsAPrefixTogetherWhenLoadIsComparable, in prefix
// mode and for a request that names no session in session mode.
func TestPrefixAffinityKeepsAPrefixTogetherWhenLoadIsComparable(t *testing.T) {
	for _, mode := range []Affinity{AffinityPrefix, AffinitySession} {
		t.Run(mode.String(), func(t *testing.T) { testPrefixAffinity(t, mode) })
	}
}

func testPrefixAffinity(t *testing.T, mode Affinity) {
	reg := newRegistry(t, Config{Affinity: mode})
	for _, id := range []string{"a", "b", "c", "d"} {
		reg.Add(readyReplica(id, "m"))
	}
	first, _ := reg.Pick(Hint{Model: "m", Prefix: 12345}, nil)
	for range 50 {
		if got, _ := reg.Pick(Hint{Model: "m", Prefix: 12345}, nil); got != first {
			t.Fatalf("same prefix went to %s, then %s", first.ID, got.ID)
		}
	}
	first.inflight.Store(10) // no longer comparable: load wins
	moved := false
	for range 50 {
		if got, _ := reg.Pick(Hint{Model: "m", Prefix: 12345}, nil); got != first {
			moved = true
		}
	}
	if !moved {
		t.Fatal("affinity kept sending to a replica with 10 requests in flight")
	}
}

func TestRoundRobinTakesTurns(t *testing.T) {
	reg := newRegistry(t, Config{Selector: &RoundRobin{}})
	reg.Add(readyReplica("a", "m"))
	reg.Add(readyReplica("b", "m")).inflight.Store(100) // blind to load
	seen := map[string]int{}
	for range 10 {
		got, _ := reg.Pick(Hint{Model: "m"}, nil)
		seen[got.ID]++
	}
	if seen["a"] != 5 || seen["b"] != 5 {
		t.Fatalf("round robin spread %v", seen)
	}
}

func TestPickSkipsReplicasThatMayNotTakeTraffic(t *testing.T) {
	reg := newRegistry(t, Config{})
	ready := reg.Add(readyReplica("ready", "m"))
	for _, s := range []State{StateStarting, StateWarming, StateDraining, StateFailed, StateSleeping} {
		r := readyReplica("x-"+s.String(), "m")
		r.SetState(s, "test")
		reg.Add(r)
	}
	reg.Eject(reg.Add(readyReplica("x-ejected", "m")), "test")
	backing := reg.Add(readyReplica("backing-off", "m"))
	backing.BackOff(time.Now().Add(time.Minute))
	for range 50 {
		got, err := reg.Pick(Hint{Model: "m"}, nil)
		if err != nil || got != ready {
			t.Fatalf("Pick = %v, %v; want the only ready replica", got, err)
		}
	}
}

func TestPickUnknownVersusUnavailable(t *testing.T) {
	reg := newRegistry(t, Config{})
	r := reg.Add(readyReplica("a", "m"))
	if _, err := reg.Pick(Hint{Model: "other"}, nil); !errors.Is(err, ErrUnknownModel) {
		t.Fatalf("unknown model: err = %v", err)
	}
	reg.Eject(r, "test")
	if _, err := reg.Pick(Hint{Model: "m"}, nil); !errors.Is(err, ErrNoReplica) {
		t.Fatalf("known model, nothing ready: err = %v", err)
	}
}

func TestDoRetriesNotSentOnAnotherReplicaAndEjects(t *testing.T) {
	prom := prometheus.NewRegistry()
	reg := newRegistry(t, Config{Registerer: prom})
	a := reg.Add(readyReplica("a", "m"))
	b := reg.Add(readyReplica("b", "m"))
	var seen []string
	res, err := reg.Do(context.Background(), hint("m"), func(ctx context.Context, rep *Replica, n int, _ AttemptReason) (Attempt, error) {
		seen = append(seen, rep.ID)
		if rep.Inflight() != 1 {
			t.Errorf("inflight during attempt = %d, want 1", rep.Inflight())
		}
		if n == 1 {
			return nil, ErrNotSent(errors.New("connection refused"))
		}
		return &fakeAttempt{}, nil
	})
	if err != nil || res.Attempts != 2 || len(seen) != 2 || seen[0] == seen[1] {
		t.Fatalf("Do = %+v, %v; attempts on %v", res, err, seen)
	}
	res.Finish()
	res.Losers()
	if first := reg.Get(seen[0]); first.State() != StateEjected || first.Reason() != "connect" {
		t.Fatalf("first replica %s is %s (%q), want ejected for connect", first.ID, first.State(), first.Reason())
	}
	if n := metricValue(t, prom, "tailgate_ejections_total"); n != 1 {
		t.Fatalf("%v ejections counted, want 1", n)
	}
	if n := metricValue(t, prom, "tailgate_ejections_total", "replica", seen[0], "reason", "connect"); n != 1 {
		t.Fatalf("ejection of %s for connect counted %v times, want 1", seen[0], n)
	}
	if n := metricValue(t, prom, "tailgate_retries_total", "model", "m", "class", "not_sent"); n != 1 {
		t.Fatalf("not_sent retries counted %v, want 1", n)
	}
	if a.Inflight() != 0 || b.Inflight() != 0 {
		t.Fatalf("inflight after Do: a=%d b=%d", a.Inflight(), b.Inflight())
	}
}

func TestDoFinalErrorIsNotRetried(t *testing.T) {
	reg := newRegistry(t, Config{})
	reg.Add(readyReplica("a", "m"))
	reg.Add(readyReplica("b", "m"))
	calls := 0
	boom := errors.New("upstream 400")
	res, err := reg.Do(context.Background(), hint("m"), func(ctx context.Context, rep *Replica, n int, _ AttemptReason) (Attempt, error) {
		calls++
		return nil, boom
	})
	if !errors.Is(err, boom) || calls != 1 || res.Attempts != 1 {
		t.Fatalf("Do = %+v, %v after %d calls", res, err, calls)
	}
}

func TestDoRetriesNoTokenWithinBudget(t *testing.T) {
	now := time.Unix(0, 0)
	reg := newRegistry(t, Config{Now: func() time.Time { return now }, MaxAttempts: 2,
		Budget: BudgetConfig{Burst: 2, Ratio: 0.01, MinPerSecond: 0.001}})
	reg.Add(readyReplica("a", "m"))
	reg.Add(readyReplica("b", "m"))
	fail := func(ctx context.Context, rep *Replica, n int, _ AttemptReason) (Attempt, error) {
		if n == 1 {
			return nil, ErrNoToken(errors.New("500"), "")
		}
		return &fakeAttempt{}, nil
	}
	for i := range 2 {
		res, err := reg.Do(context.Background(), hint("m"), fail)
		if err != nil || res.Attempts != 2 {
			t.Fatalf("request %d: %+v %v; want a retry while the budget lasts", i, res, err)
		}
		res.Finish()
	}
	res, err := reg.Do(context.Background(), hint("m"), fail)
	if err == nil || res.Attempts != 1 {
		t.Fatalf("budget spent: %+v %v; want the error without a retry", res, err)
	}
}

func TestDoRetriesDeclinedElsewhereWithoutEjecting(t *testing.T) {
	reg := newRegistry(t, Config{})
	a := reg.Add(readyReplica("a", "m"))
	b := reg.Add(readyReplica("b", "m"))
	var seen []*Replica
	res, err := reg.Do(context.Background(), hint("m"), func(ctx context.Context, rep *Replica, n int, _ AttemptReason) (Attempt, error) {
		seen = append(seen, rep)
		if n == 1 {
			return nil, ErrDeclined(errors.New("draining"))
		}
		return &fakeAttempt{}, nil
	})
	if err != nil || res.Attempts != 2 || seen[0] == seen[1] {
		t.Fatalf("Do = %+v, %v", res, err)
	}
	res.Finish()
	if a.State() != StateReady || b.State() != StateReady {
		t.Fatalf("a declined attempt ejected a replica: a=%s b=%s", a.State(), b.State())
	}
}

// TestDeclinedPushbackIsTheRoutersToTakeApart: a replica that declines
// with a Retry-After is left out of selection for that long, one that says
// it is draining is drained — by the call, where it decides the retry, not
// by the caller — and the request is served by the other replica.
func TestDeclinedPushbackIsTheRoutersToTakeApart(t *testing.T) {
	for _, tc := range []struct {
		name    string
		decline Declined
		state   State
		out     bool // out of selection afterwards
	}{
		{"retry after", Declined{Err: errors.New("429"), RetryAfter: time.Hour}, StateReady, true},
		{"draining", Declined{Err: errors.New("503"), Draining: true}, StateDraining, true},
		{"no pushback", Declined{Err: errors.New("503")}, StateReady, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := newRegistry(t, Config{Selector: &RoundRobin{}})
			a := reg.Add(readyReplica("a", "m"))
			reg.Add(readyReplica("b", "m"))
			res, err := reg.Do(context.Background(), hint("m"), func(_ context.Context, rep *Replica, _ int, _ AttemptReason) (Attempt, error) {
				if rep == a {
					d := tc.decline
					return nil, &d
				}
				return &fakeAttempt{}, nil
			})
			if err != nil || res.Replica.ID != "b" {
				t.Fatalf("Do = %+v, %v; want it served by b", res, err)
			}
			res.Finish()
			if a.State() != tc.state {
				t.Errorf("a is %s after declining; want %s", a.State(), tc.state)
			}
			picked := map[string]bool{}
			for range 4 {
				rep, err := reg.Pick(Hint{Model: "m"}, nil)
				if err != nil {
					t.Fatal(err)
				}
				picked[rep.ID] = true
			}
			if picked["a"] == tc.out {
				t.Errorf("a picked afterwards: %v; want %v", picked["a"], !tc.out)
			}
		})
	}
}

func TestInflightReturnsToZeroOnEveryOutcome(t *testing.T) {
	for _, tc := range []struct {
		name string
		open OpenFunc
	}{
		{"success", func(context.Context, *Replica, int, AttemptReason) (Attempt, error) { return &fakeAttempt{}, nil }},
		{"error", func(context.Context, *Replica, int, AttemptReason) (Attempt, error) { return nil, errors.New("x") }},
		{"cancel", func(ctx context.Context, _ *Replica, _ int, _ AttemptReason) (Attempt, error) {
			<-ctx.Done()
			return nil, ErrNoToken(ctx.Err(), "")
		}},
		{"panic", func(context.Context, *Replica, int, AttemptReason) (Attempt, error) { panic("handler bug") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := newRegistry(t, Config{})
			a := reg.Add(readyReplica("a", "m"))
			ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
			defer cancel()
			res, _ := reg.Do(ctx, hint("m"), tc.open)
			res.Finish()
			res.Losers()
			if a.Inflight() != 0 {
				t.Fatalf("inflight after %s = %d", tc.name, a.Inflight())
			}
		})
	}
}

// TestAlternativesCountsReadyReplicasOfTheModel: a model has alternatives
// only with two replicas ready that serve it; an ejected, draining or
// other-model replica is none.
func TestAlternativesCountsReadyReplicasOfTheModel(t *testing.T) {
	reg := newRegistry(t, Config{})
	a := reg.Add(readyReplica("a", "m"))
	if reg.Alternatives("m") {
		t.Fatal("one replica: alternatives")
	}
	reg.Add(readyReplica("other", "n"))
	if reg.Alternatives("m") {
		t.Fatal("a replica of another model counted")
	}
	b := reg.Add(readyReplica("b", "m", "n"))
	if !reg.Alternatives("m") || !reg.Alternatives("n") {
		t.Fatal("two ready replicas: no alternatives")
	}
	reg.Eject(b, "test")
	if reg.Alternatives("m") {
		t.Fatal("an ejected replica counted")
	}
	b.SetState(StateReady, "")
	a.SetState(StateDraining, "test")
	if reg.Alternatives("m") {
		t.Fatal("a draining replica counted")
	}
}

// TestLastUsedStampsEachAttempt: a request that came and went between two
// looks of the fleet controller is still seen, as the model's last use;
// another model's is not.
func TestLastUsedStampsEachAttempt(t *testing.T) {
	now := time.Unix(1000, 0)
	reg := newRegistry(t, Config{Now: func() time.Time { return now }})
	reg.Add(readyReplica("a", "m"))
	reg.Add(readyReplica("b", "n"))
	if !reg.LastUsed("m").IsZero() {
		t.Fatalf("last used %v before any request", reg.LastUsed("m"))
	}
	res, err := reg.Do(context.Background(), hint("m"), func(context.Context, *Replica, int, AttemptReason) (Attempt, error) {
		return &fakeAttempt{}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	res.Finish()
	res.Losers()
	if got := reg.LastUsed("m"); !got.Equal(now) || reg.Inflight("m") != 0 {
		t.Errorf("after a finished request: last used %v (want %v), inflight %d", got, now, reg.Inflight("m"))
	}
	if !reg.LastUsed("n").IsZero() {
		t.Errorf("model n last used %v: a request for m counted", reg.LastUsed("n"))
	}
}
