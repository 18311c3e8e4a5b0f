package router

import (
	"context"
	"testing"
	"time"
)

// decided runs one request whose first attempt answers at once and returns
// its result, still running (not finished).
func (f *fleet) decided(req Request) (*Result, *[]*Replica) {
	f.t.Helper()
	var opened []*Replica
	res, err := f.reg.Do(context.Background(), req, func(_ context.Context, rep *Replica, _ int, _ AttemptReason) (Attempt, error) {
		opened = append(opened, rep)
		return &fakeAttempt{}, nil
	})
	if err != nil {
		f.t.Fatal(err)
	}
	return res, &opened
}

// learnPace teaches model m a pace of per a token: n attempts of 20 tokens
// after their first, on the virtual clock.
func (f *fleet) learnPace(n int, per time.Duration) {
	for range n {
		res, _ := f.decided(hint("m"))
		first := f.c.Now()
		f.c.set(first.Add(20 * per))
		res.ObservePace(first, f.c.Now(), 20)
		res.Finish()
		res.Losers()
	}
}

// TestPaceRuleSaysWhenAnAttemptFellBehind: the decode pace is learnt from
// attempts' time per token after the first; an attempt is behind when it
// has fewer tokens than the pace percentile gives by then, less a lead of
// PaceLead tokens (or Min, whichever is longer) so a few jittery first
// tokens do not trip it; nothing is said before MinSamples.
func TestPaceRuleSaysWhenAnAttemptFellBehind(t *testing.T) {
	f := newFleet(t, Config{Hedge: HedgeConfig{MinSamples: 10, Min: time.Millisecond, PaceLead: 4}})
	f.learnPace(9, 10*time.Millisecond)
	res, _ := f.decided(hint("m"))
	if p, ok := res.Pace(); ok {
		t.Fatalf("pace %+v with 9 samples, want none before 10", p)
	}
	res.Finish()
	f.learnPace(1, 10*time.Millisecond)

	res, _ = f.decided(hint("m"))
	defer res.Finish()
	behind := func(since time.Duration, k int64) bool {
		p, ok := res.Pace()
		if !ok {
			t.Fatal("no pace learnt after 10 samples")
		}
		return since >= p.Due(k)
	}
	for _, c := range []struct {
		since time.Duration
		k     int64
		want  bool
	}{
		{since: 35 * time.Millisecond, k: 0, want: false}, // three tokens' time, none yet: within the lead of four
		{since: 45 * time.Millisecond, k: 0, want: true},  // four and a half: behind
		{since: 135 * time.Millisecond, k: 10, want: false},
		{since: 145 * time.Millisecond, k: 10, want: true},
		{since: 400 * time.Millisecond, k: 40, want: false}, // on pace
		{since: 400 * time.Millisecond, k: 9, want: true},   // a quarter of the pace
	} {
		if got := behind(c.since, c.k); got != c.want {
			t.Errorf("%d tokens %v after the first: behind %v, want %v", c.k, c.since, got, c.want)
		}
	}

	// Min lengthens the lead where the pace is fast.
	g := newFleet(t, Config{Hedge: HedgeConfig{MinSamples: 10, Min: 100 * time.Millisecond}})
	g.learnPace(10, time.Millisecond)
	r2, _ := g.decided(hint("m"))
	defer r2.Finish()
	if p, ok := r2.Pace(); !ok || p.Due(5) != 105*time.Millisecond {
		t.Errorf("due %v %v at 5 tokens of 1ms with Min 100ms, want 105ms", p.Due(5), ok)
	}
}

// TestPaceHedgeGoesElsewhereWinsAndCountsAsAHedge: a pace hedge opens on
// the replica the winner is not on; when it is decided the winner, the
// request's result is the hedge's and the beaten attempt is a loser, aborted
// with its first token; the metrics count a won pace hedge and a hedge
// attempt.
func TestPaceHedgeGoesElsewhereWinsAndCountsAsAHedge(t *testing.T) {
	f := newFleet(t, Config{Hedge: HedgeConfig{MinSamples: 10}})
	f.learnPace(10, 10*time.Millisecond)
	res, opened := f.decided(hint("m"))
	orig := res.Attempt.(*fakeAttempt)
	h := res.PaceHedge(context.Background())
	if h == nil {
		t.Fatal("no pace hedge")
	}
	<-h.Opened()
	att, err := h.Attempt()
	if err != nil || h.Replica() == (*opened)[0] {
		t.Fatalf("hedge on %s (%v), the original on %s: want another replica", h.Replica().ID, err, (*opened)[0].ID)
	}
	if r := h.Replica(); r.Inflight() != 1 {
		t.Fatalf("hedge replica has %d in flight, want its slot taken", r.Inflight())
	}
	res.Decide(h, true)
	if res.Attempt != att || res.Replica != h.Replica() || res.Reason != ReasonHedge || res.N != 2 || res.Attempts != 2 || !res.Hedged {
		t.Fatalf("result %+v: want the hedge as the winner, 2 attempts", res)
	}
	if !orig.aborted.Load() || (*opened)[0].Inflight() != 0 {
		t.Fatal("the beaten original was not aborted and its slot given back")
	}
	res.Finish()
	if h.Replica().Inflight() != 0 {
		t.Fatal("Finish did not give back the hedge's slot")
	}
	lost := res.Losers()
	if len(lost) != 1 || lost[0].Attempt != orig || lost[0].Reason != ReasonFirst {
		t.Fatalf("losers %+v, want the original with its attempt", lost)
	}
	for _, c := range []struct {
		name   string
		labels []string
	}{
		{"tailgate_pace_hedges_total", []string{"model", "m", "outcome", "won"}},
		{"tailgate_hedges_total", []string{"model", "m", "outcome", "won"}},
		{"tailgate_upstream_attempts_total", []string{"model", "m", "reason", "hedge"}},
	} {
		if got := metricValue(t, f.prom, c.name, c.labels...); got != 1 {
			t.Errorf("%s%v = %v, want 1", c.name, c.labels, got)
		}
	}
}

// TestPaceHedgeObeysTheHedgeSwitches: a request that opted out, a model
// with hedging off, a spent budget and a saturated fleet get no pace hedge,
// each counted with its reason; a hedge that loses is cancelled and given
// back.
func TestPaceHedgeObeysTheHedgeSwitches(t *testing.T) {
	off := false
	f := newFleet(t, Config{Hedge: HedgeConfig{MinSamples: 10, Budget: 0.01, Burst: 1, Models: map[string]HedgeModel{"off": {Enabled: &off}}}})
	f.learnPace(10, 10*time.Millisecond)
	try := func(req Request) *Hedge {
		res, _ := f.decided(req)
		defer res.Finish()
		h := res.PaceHedge(context.Background())
		if h != nil {
			res.Decide(h, false)
			if h.Replica().Inflight() != 0 {
				t.Fatal("a losing pace hedge kept its slot")
			}
		}
		return h
	}
	optOut := hint("m")
	optOut.NoHedge = true
	if try(optOut) != nil || try(hint("off")) != nil {
		t.Fatal("pace hedge for an opted-out request or a model with hedging off")
	}
	if try(hint("m")) == nil { // the burst of one
		t.Fatal("no pace hedge with the budget full")
	}
	if try(hint("m")) != nil {
		t.Fatal("pace hedge with the budget spent")
	}
	for _, r := range f.reg.Replicas() {
		r.load.Store(&Load{Waiting: 3})
	}
	if try(hint("m")) != nil {
		t.Fatal("pace hedge to a queueing replica")
	}
	for _, c := range []struct{ model, reason string }{{"m", "opt_out"}, {"off", "disabled"}, {"m", "budget"}, {"m", "saturation"}} {
		if got := metricValue(t, f.prom, "tailgate_hedges_skipped_total", "model", c.model, "reason", c.reason); got != 1 {
			t.Errorf("tailgate_hedges_skipped_total{%s,%s} = %v, want 1", c.model, c.reason, got)
		}
	}
	if got := metricValue(t, f.prom, "tailgate_pace_hedges_total", "model", "m", "outcome", "lost"); got != 1 {
		t.Errorf("tailgate_pace_hedges_total{m,lost} = %v, want 1", got)
	}
}
