package server

import (
	"strings"
	"sync"
	"time"

	"github.com/tailgate-dev/tailgate/data"
	"github.com/tailgate-dev/tailgate/router"
)

// tryLog records every upstream attempt of one call as it happens — the
// first, a hedge, a retry — so that the ledger keeps all of them, not only
// the winner. Attempts run concurrently (a hedge beside the first), and a
// losing one ends on the router's goroutine: every method locks.
type tryLog struct {
	mu     sync.Mutex
	buf    [2]tryRec // most calls make one or two attempts: no allocation
	recs   []tryRec
	winner int // index of the attempt whose answer the client got; -1 none
}

type tryRec struct {
	replica string
	reason  router.AttemptReason
	start   time.Time
	opened  time.Time      // when it produced its first token or failed
	att     router.Attempt // non-nil: it produced a first token
	err     error          // why it produced none
	// cancelled: its context ended before it did (another attempt won, or
	// the client went away); the error is the cancellation's.
	cancelled bool
	aborted   time.Time // when an attempt with a first token was closed
	broke     error     // it won, then broke before the answer was whole (retried)
}

// begin records the start of an attempt on rep and returns its index.
func (t *tryLog) begin(rep *router.Replica, reason router.AttemptReason) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.recs == nil {
		t.recs, t.winner = t.buf[:0], -1
	}
	t.recs = append(t.recs, tryRec{replica: rep.ID, reason: reason, start: time.Now()})
	return len(t.recs) - 1
}

// opened records how attempt i's wait for its first token ended.
func (t *tryLog) opened(i int, att router.Attempt, err error, cancelled bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	r := &t.recs[i]
	r.opened, r.att, r.err, r.cancelled = time.Now(), att, err, err != nil && cancelled
}

// find returns the index of the attempt that produced att, or -1.
func (t *tryLog) findLocked(att router.Attempt) int {
	for i := range t.recs {
		if t.recs[i].att == att {
			return i
		}
	}
	return -1
}

// win marks the attempt whose answer the client gets.
func (t *tryLog) win(att router.Attempt) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.winner = t.findLocked(att)
}

// broke marks a winner that failed before its answer was whole, and so
// lost its place to a retry.
func (t *tryLog) broke(att router.Attempt, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if i := t.findLocked(att); i >= 0 {
		t.recs[i].broke = err
		if t.winner == i {
			t.winner = -1
		}
	}
}

// aborted records when attempt i, which had a first token, was closed:
// for a losing attempt that is when it stopped costing its engine.
func (t *tryLog) aborted(i int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if r := &t.recs[i]; r.aborted.IsZero() {
		r.aborted = time.Now()
	}
}

// reachedEngine reports whether any attempt's request was written to its
// replica (it produced a token, or failed or was cancelled after the write).
func (t *tryLog) reachedEngine() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, r := range t.recs {
		if r.att != nil || router.IsNoToken(r.err) {
			return true
		}
	}
	return false
}

// maxReason bounds a stored failure reason.
const maxReason = 200

// attemptLog is the call's attempts as the ledger stores them, each with its
// outcome and the tokens it cost: the billed usage for the winner; for the
// others what hedgeOverhead counts — what the engine reported or was sent,
// nothing for an attempt that never reached its replica.
func (cl *call) attemptLog() []data.Attempt {
	t := &cl.tries
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.recs) == 0 {
		return nil
	}
	now := time.Now()
	since := func(at time.Time) time.Duration {
		if at.IsZero() {
			return -1
		}
		return at.Sub(cl.start)
	}
	out := make([]data.Attempt, len(t.recs))
	for i, r := range t.recs {
		a := data.Attempt{N: i + 1, Replica: r.replica, Role: r.reason.String(), Start: r.start.Sub(cl.start), TTFT: -1, End: since(r.opened)}
		if r.att != nil {
			a.TTFT, a.End = r.opened.Sub(r.start), since(r.aborted)
			if u, ok := r.att.(*upstream); ok && i != t.winner {
				a.PromptTokens, a.CompletionTokens = u.cost(cl)
			}
		} else if router.IsNoToken(r.err) {
			a.PromptTokens = cl.req.promptEstimate // it reached the replica
		}
		switch {
		case i == t.winner:
			a.Outcome, a.End = data.AttemptWon, now.Sub(cl.start)
			a.PromptTokens, a.CompletionTokens = cl.usage.PromptTokens, cl.usage.CompletionTokens
			switch cl.outcome {
			case data.OutcomeMidstream:
				a.Outcome, a.Reason = data.AttemptFailed, "after its first token: "+string(cl.class)
			case data.OutcomeClientCancelled:
				a.Outcome, a.Reason = data.AttemptCancelled, "the client went away"
			}
		case r.broke != nil:
			a.Outcome, a.Reason = data.AttemptFailed, boundReason("before the answer was whole: "+r.broke.Error())
		case r.att != nil || r.cancelled:
			a.Outcome, a.Reason = data.AttemptCancelled, "another attempt won"
			if t.winner < 0 {
				a.Reason = "the request ended first"
				if cl.outcome == data.OutcomeClientCancelled {
					a.Reason = "the client went away"
				}
			}
		default:
			a.Outcome = data.AttemptFailed
			if r.err != nil {
				a.Reason = boundReason(r.err.Error())
			}
		}
		out[i] = a
	}
	return out
}

func boundReason(s string) string {
	if len(s) <= maxReason {
		return s
	}
	return strings.ToValidUTF8(s[:maxReason], "") + "…"
}

// cost splits what burnt counts into the prompt and the output.
func (u *upstream) cost(cl *call) (prompt, completion int64) {
	if u.gotUsage {
		return u.usage.PromptTokens, u.usage.CompletionTokens
	}
	return cl.req.promptEstimate, u.tokens
}
