package router

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

// wholeAttempt is an attempt whose answer is read whole: read says how its
// read goes, given the attempt's own context (cancelled when it loses).
type wholeAttempt struct {
	fakeAttempt
	ctx  context.Context
	read func(ctx context.Context, progress func(int64, time.Time)) error
}

// readWhole is the AssembleFunc of wholeAttempts.
func readWhole(_ context.Context, att Attempt, progress func(int64, time.Time)) error {
	w := att.(*wholeAttempt)
	if w.read == nil {
		return nil
	}
	return w.read(w.ctx, progress)
}

// crawl reads nothing more until the attempt is cancelled.
func crawl(ctx context.Context, _ func(int64, time.Time)) error {
	<-ctx.Done()
	return ErrBroke(ctx.Err(), false)
}

// decided runs one request whose first attempt answers at once and returns
// its call, still running (not finished); reads says how each attempt's
// answer is read, by its number in the call (the first: 1).
func (f *fleet) decided(req Request, reads ...func(context.Context, func(int64, time.Time)) error) (*Call, *[]*Replica) {
	f.t.Helper()
	var opened []*Replica
	res, err := f.reg.Do(context.Background(), req, func(ctx context.Context, rep *Replica, _ int, _ AttemptReason) (Attempt, error) {
		opened = append(opened, rep)
		w := &wholeAttempt{ctx: ctx}
		if i := len(opened) - 1; i < len(reads) {
			w.read = reads[i]
		}
		return w, nil
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
		res.observePace(first, f.c.Now(), 20)
		res.Finish()
		res.Losers()
	}
}

// armed waits for the next timer armed on the virtual clock (rearmed, read
// before) and returns its delay and channel.
func (f *fleet) armed(rearmed chan struct{}) (time.Duration, chan time.Time) {
	f.t.Helper()
	select {
	case <-rearmed:
	case <-time.After(10 * time.Second):
		f.t.Fatal("no timer armed in 10s")
	}
	f.c.mu.Lock()
	defer f.c.mu.Unlock()
	return f.c.armed, f.c.fire
}

func (f *fleet) rearmed() chan struct{} {
	f.c.mu.Lock()
	defer f.c.mu.Unlock()
	return f.c.rearmed
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

// TestWholeAnswerThatFallsBehindIsHedgedElsewhere: an answer read whole
// that produces nothing after its first token falls behind its model's
// pace; a pace hedge opens on the other replica, its answer is whole first
// and becomes the call's; the beaten original is cancelled, aborted and
// given back; the metrics count a won pace hedge and a hedge attempt.
func TestWholeAnswerThatFallsBehindIsHedgedElsewhere(t *testing.T) {
	f := newFleet(t, Config{Hedge: HedgeConfig{MinSamples: 10}})
	f.learnPace(10, 10*time.Millisecond)
	res, opened := f.decided(hint("m"), crawl)
	orig := res.Attempt.(*wholeAttempt)
	rearmed := f.rearmed()
	done := make(chan error, 1)
	go func() { done <- res.Whole(context.Background(), readWhole) }()
	d, fire := f.armed(rearmed)
	if want := 40 * time.Millisecond; d != want { // PaceLead 4 tokens of 10ms
		t.Fatalf("pace watch armed for %v, want %v", d, want)
	}
	f.c.set(f.c.Now().Add(d))
	fire <- f.c.Now()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if len(*opened) != 2 || res.Replica != (*opened)[1] || res.Replica == (*opened)[0] {
		t.Fatalf("answer from %v of %v: want the hedge, on the other replica", res.Replica, *opened)
	}
	if res.Reason != ReasonHedge || res.N != 2 || res.Attempts != 2 || !res.Hedged {
		t.Fatalf("call %+v: want the hedge as the winner, 2 attempts", res)
	}
	if !orig.aborted.Load() || (*opened)[0].Inflight() != 0 {
		t.Fatal("the beaten original was not aborted and its slot given back")
	}
	if res.Replica.Inflight() != 1 {
		t.Fatal("the hedge's slot is not held until Finish")
	}
	res.Finish()
	if res.Replica.Inflight() != 0 {
		t.Fatal("Finish did not give back the hedge's slot")
	}
	lost := res.Losers()
	if len(lost) != 1 || lost[0].Attempt != orig || lost[0].Reason != ReasonFirst || lost[0].Err != nil {
		t.Fatalf("losers %+v, want the original with its attempt, not blamed", lost)
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

// TestWholeAnswerOnPaceIsNotHedged: an answer whose tokens keep coming is
// looked at again when its watch fires, re-armed for the tokens it has, and
// never hedged.
func TestWholeAnswerOnPaceIsNotHedged(t *testing.T) {
	f := newFleet(t, Config{Hedge: HedgeConfig{MinSamples: 10}})
	f.learnPace(10, 10*time.Millisecond)
	tokens, told := make(chan int64), make(chan struct{})
	res, opened := f.decided(hint("m"), func(ctx context.Context, progress func(int64, time.Time)) error {
		for k := range tokens {
			progress(k, time.Time{})
			told <- struct{}{}
		}
		return nil
	})
	defer res.Finish()
	first := f.c.Now()
	rearmed := f.rearmed()
	done := make(chan error, 1)
	go func() { done <- res.Whole(context.Background(), readWhole) }()
	d, fire := f.armed(rearmed)
	tokens <- 10 // ten tokens by 100ms: due at 140ms
	<-told
	rearmed = f.rearmed()
	f.c.set(first.Add(d))
	fire <- f.c.Now()
	if d2, _ := f.armed(rearmed); d2 != 100*time.Millisecond {
		t.Fatalf("re-armed for %v, want the 100ms left to 140ms", d2)
	}
	close(tokens)
	if err := <-done; err != nil || len(*opened) != 1 || res.Hedged {
		t.Fatalf("Whole = %v after %d attempts (hedged %v); want the original's answer, no hedge", err, len(*opened), res.Hedged)
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
	try := func(req Request) bool {
		res, _ := f.decided(req)
		defer res.Finish()
		results := make(chan *attempt, 2)
		h := res.paceHedge(context.Background(), readWhole, results)
		if h != nil {
			res.decidePace(h, false, results, true)
			if h.rep.Inflight() != 0 {
				t.Fatal("a losing pace hedge kept its slot")
			}
		}
		return h != nil
	}
	optOut := hint("m")
	optOut.NoHedge = true
	if try(optOut) || try(hint("off")) {
		t.Fatal("pace hedge for an opted-out request or a model with hedging off")
	}
	if !try(hint("m")) { // the burst of one
		t.Fatal("no pace hedge with the budget full")
	}
	if try(hint("m")) {
		t.Fatal("pace hedge with the budget spent")
	}
	for _, r := range f.reg.Replicas() {
		r.load.Store(&Load{Waiting: 3})
	}
	if try(hint("m")) {
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

// TestBrokenWholeAnswerIsRetriedElsewhere: an answer read whole that
// breaks after its first token starts again on the other replica within
// the retry budget; the replica it broke on is ejected ("midstream") and
// its attempt is a loser blamed for it; one that went quiet is ejected for
// its idle deadline. With the retry budget spent the break is the answer.
func TestBrokenWholeAnswerIsRetriedElsewhere(t *testing.T) {
	broke := errors.New("connection reset mid-answer")
	for _, tc := range []struct {
		name   string
		idle   bool
		eject  string
		budget bool
	}{
		{"midstream", false, "midstream", true},
		{"idle", true, "idle_deadline", true},
		{"no budget", false, "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFleet(t, Config{Budget: BudgetConfig{Burst: 1, Ratio: 0.0001, MinPerSecond: 0.0001}})
			if !tc.budget {
				f.reg.budget.TakeRetry()
			}
			var reads atomic.Int32
			res, opened := f.decided(hint("m"), func(context.Context, func(int64, time.Time)) error {
				reads.Add(1)
				return ErrBroke(broke, tc.idle)
			})
			defer res.Finish()
			first := res.Attempt
			err := res.Whole(context.Background(), readWhole)
			if !tc.budget {
				if !errors.Is(err, broke) || len(*opened) != 1 || (*opened)[0].State() != StateReady {
					t.Fatalf("Whole = %v after %d attempts, %s %v: want the break, no retry, no ejection", err, len(*opened), (*opened)[0].ID, (*opened)[0].State())
				}
				return
			}
			if err != nil || len(*opened) != 2 || res.Replica != (*opened)[1] || res.Reason != ReasonRetry || res.Attempts != 2 {
				t.Fatalf("Whole = %v, answer from %v (%v, %d attempts): want the retry's, on the other replica", err, res.Replica, res.Reason, res.Attempts)
			}
			if got := metricValue(t, f.prom, "tailgate_ejections_total", "replica", (*opened)[0].ID, "reason", tc.eject); got != 1 {
				t.Errorf("tailgate_ejections_total{%s,%s} = %v, want 1", (*opened)[0].ID, tc.eject, got)
			}
			lost := res.Losers()
			if len(lost) != 1 || lost[0].Attempt != first || !IsBroke(lost[0].Err) || !first.(*wholeAttempt).aborted.Load() || (*opened)[0].Inflight() != 0 {
				t.Fatalf("losers %+v: want the broken original, blamed, aborted and given back", lost)
			}
		})
	}
}

// TestRelayedAnswerThatGoesQuietEjectsItsReplica: the reader of a relayed
// answer reports its end; one that went quiet takes its replica out, one
// that broke otherwise does not (the client had its output: no retry).
func TestRelayedAnswerThatGoesQuietEjectsItsReplica(t *testing.T) {
	f := newFleet(t, Config{})
	res, opened := f.decided(hint("m"))
	res.End(ErrBroke(errors.New("reset"), false))
	res.Finish()
	if (*opened)[0].State() != StateReady {
		t.Fatal("a replica whose relayed answer broke was ejected")
	}
	res, opened = f.decided(hint("m"))
	res.Progress(3, f.c.Now())
	res.End(ErrBroke(errors.New("quiet"), true))
	res.Finish()
	if got := metricValue(t, f.prom, "tailgate_ejections_total", "replica", (*opened)[0].ID, "reason", "idle_deadline"); got != 1 || (*opened)[0].State() != StateEjected {
		t.Fatalf("tailgate_ejections_total{idle_deadline} = %v, state %v: want the quiet replica ejected", got, (*opened)[0].State())
	}
}
