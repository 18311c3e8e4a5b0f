package router

import (
	"testing"
	"time"
)

func TestLateOriginalWaitsAGraceForItsHedge(t *testing.T) {
	// The model's median first token takes 100ms and its p95 200ms: a
	// request is hedged at 200ms, and an original whose first token comes
	// after that while its hedge has none is held for 100ms.
	for _, tc := range []struct {
		name        string
		hedge       time.Duration // the hedge's first token, from its start at 200ms
		winner      AttemptReason
		answeredAt  time.Duration // when the router decided, from the request's start
		graceWinner string
	}{
		// The original's first token at 250ms, the hedge's at 280ms: within
		// the grace, so the hedge wins.
		{"hedge within the grace", 80 * time.Millisecond, ReasonHedge, 280 * time.Millisecond, "hedge"},
		// The hedge's at 400ms: past the grace (250+100ms), so the original
		// wins when the grace ends.
		{"hedge past the grace", 200 * time.Millisecond, ReasonFirst, 350 * time.Millisecond, "original"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFleet(t, Config{Hedge: HedgeConfig{Budget: 1, Burst: 1e6}})
			teachTwoLevels(f)
			if d, ok := f.reg.HedgeDelay("m", false); !ok || d != 200*time.Millisecond {
				t.Fatalf("hedge delay %v %v, want the p95 of 200ms", d, ok)
			}
			before := f.c.Now().Add(time.Second) // serve starts the request a second on
			res := f.serve(hint("m"), 250*time.Millisecond, tc.hedge)
			if !res.Hedged || res.Reason != tc.winner {
				t.Fatalf("hedged %v, answered by the %v attempt; want the %v", res.Hedged, res.Reason, tc.winner)
			}
			if got := f.c.Now().Sub(before); got != tc.answeredAt {
				t.Errorf("answered %v after the request started, want %v", got, tc.answeredAt)
			}
			losers := res.Losers()
			if len(losers) != 1 {
				t.Fatalf("%d losers, want 1", len(losers))
			}
			if tc.winner == ReasonHedge {
				// The original had its first token: it is a loser whose
				// tokens count as hedge overhead, and it was aborted.
				l := losers[0]
				if l.Reason != ReasonFirst || l.Attempt == nil || !l.Attempt.(*fakeAttempt).aborted.Load() {
					t.Errorf("loser %+v; want the original, with its attempt, aborted", l)
				}
			}
			if got := metricValue(t, f.prom, "tailgate_hedge_graces_total", "model", "m", "winner", tc.graceWinner); got != 1 {
				t.Errorf("tailgate_hedge_graces_total{winner=%q} = %v, want 1", tc.graceWinner, got)
			}
		})
	}
}

// panickyAttempt is an attempt whose Abort has a bug.
type panickyAttempt struct{}

func (panickyAttempt) Abort() { panic("abort bug") }

func TestPanicWhileTheTimerDecidesReachesTheCaller(t *testing.T) {
	// Past the hedge delay the timer's goroutine decides the request while
	// the caller's still runs the first attempt. A panic there (here: the
	// held original's Abort, when its hedge wins within the grace) must
	// come out of Do on the caller's goroutine — where the server's
	// recovery turns it into a 500 — not kill the process from a goroutine
	// nobody recovers.
	f := newFleet(t, Config{Hedge: HedgeConfig{Budget: 1, Burst: 1e6}})
	teachTwoLevels(f)
	f.lateOriginal = func() Attempt { return panickyAttempt{} }
	var got any
	func() {
		defer func() { got = recover() }()
		f.serve(hint("m"), 250*time.Millisecond, 80*time.Millisecond)
	}()
	if got != "abort bug" {
		t.Fatalf("Do raised %v on the caller's goroutine, want the timer goroutine's panic \"abort bug\"", got)
	}
}
