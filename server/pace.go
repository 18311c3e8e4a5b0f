package server

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"tailgate/data"
	"tailgate/router"
)

// Pace hedging of answers the client sees only whole. A JSON answer is
// assembled from the engine's stream and nothing of it reaches the client
// before it is whole, so an attempt whose first token came in time but
// whose later tokens crawl can still be hedged: when it falls behind its
// model's decode pace (router.Pace), a second attempt starts on another
// replica and the first whole answer is delivered. Streams are never
// hedged on pace: their client already has the first attempt's bytes.

// paceWatch tells assembleRace when the attempt it watches has fallen
// behind its model's decode pace. The attempt's reader reports progress;
// a timer, due when the attempt would be behind with the tokens it has,
// calls behind (once: the timer is not re-armed after it fired).
type paceWatch struct {
	pace    router.Pace
	first   time.Time
	behind  func()
	timer   atomic.Pointer[time.Timer]
	stopped atomic.Bool
}

// newPaceWatch returns a watch of u, the winning attempt of res, that
// calls behind on u's timer goroutine; nil when the model's pace is not
// learnt yet.
func newPaceWatch(res *router.Result, u *upstream, behind func()) *paceWatch {
	p, ok := res.Pace()
	if !ok || u.firstAt.IsZero() {
		return nil
	}
	return &paceWatch{pace: p, first: u.firstAt, behind: behind}
}

// progress re-arms the watch for the output tokens u has produced.
func (w *paceWatch) progress(u *upstream) {
	if w == nil || w.stopped.Load() {
		return
	}
	d := time.Until(w.first.Add(w.pace.Due(u.tokens - 1)))
	if t := w.timer.Load(); t != nil {
		t.Reset(d)
		return
	}
	w.timer.Store(time.AfterFunc(d, func() {
		if w.stopped.CompareAndSwap(false, true) {
			w.behind()
		}
	}))
}

// stop ends the watch: a request is hedged on pace once at most.
func (w *paceWatch) stop() {
	if w == nil {
		return
	}
	w.stopped.Store(true)
	if t := w.timer.Load(); t != nil {
		t.Stop()
	}
}

// assembled is one attempt's assembly, as it ended.
type assembled struct {
	u    *upstream
	body []byte
	err  error
}

// assembleRace assembles the JSON answer of res's winning attempt u and,
// when u falls behind its model's decode pace, races a pace hedge on
// another replica against it (res.PaceHedge decides whether one may start).
// It returns the first whole answer and the attempt that produced it; the
// other attempt is cancelled and res says who won (its losers hold the
// other, whose tokens are overhead). When no attempt made a whole answer
// it returns u and u's failure, so the caller's retry rules see the
// original attempt. The model's decode pace is learnt from u.
//
// The original is assembled on the caller's goroutine: most answers keep
// their pace, and then nothing else ever ran. Should u fall behind, the
// watch's timer goroutine takes over the race — it starts the pace hedge
// and decides — while the caller's goroutine finishes (or is cancelled
// out of) u's assembly and waits for the decision.
func (s *Server) assembleRace(ctx context.Context, cl *call, res *router.Result, u *upstream) (*upstream, []byte, error) {
	results := make(chan assembled, 2)
	const (
		assembling = iota // u is assembled on the caller's goroutine
		takenOver         // u fell behind: the timer's goroutine races
		ended             // u's assembly ended first: the caller returns
	)
	var state atomic.Int32
	taken := make(chan raced, 1)
	watch := newPaceWatch(res, u, func() {
		if !state.CompareAndSwap(assembling, takenOver) {
			return
		}
		defer func() {
			if p := recover(); p != nil {
				taken <- raced{panicky: p}
			}
		}()
		won, body, err := s.paceRace(ctx, cl, res, u, results)
		taken <- raced{won, body, err, nil}
	})
	body, err := s.assembleJSON(ctx, cl, u, watch)
	if !state.CompareAndSwap(assembling, ended) {
		results <- assembled{u, body, err}
		r := <-taken
		if r.panicky != nil {
			panic(r.panicky)
		}
		return r.won, r.body, r.err
	}
	watch.stop()
	if err == nil {
		res.ObservePace(u.firstAt, u.lastAt, u.tokens-1)
	}
	return u, body, err
}

// raced is how a race taken over by the pace watch ended.
type raced struct {
	won     *upstream
	body    []byte
	err     error
	panicky any // a panic while racing, raised again on the caller's goroutine
}

// paceRace races a pace hedge against u, which has fallen behind and is
// still being assembled on the caller's goroutine (its end comes on
// results), and returns the first whole answer as assembleRace does.
func (s *Server) paceRace(ctx context.Context, cl *call, res *router.Result, u *upstream, results chan assembled) (*upstream, []byte, error) {
	behind := make(chan struct{}, 1)
	behind <- struct{}{}
	var (
		h       *router.Hedge
		opened  <-chan struct{}
		hu      *upstream  // the hedge, once it has its first token
		running = 1        // assemblies not yet ended
		broken  *assembled // the original's failure, while the hedge runs on
	)
	for {
		select {
		case <-behind:
			behind = nil
			if h = res.PaceHedge(ctx); h != nil {
				opened = h.Opened()
				s.log.Debug("pace hedge: the answer fell behind its model's decode pace", "request_id", cl.id,
					"replica", u.rep.ID, "hedge_replica", h.Replica().ID, "since_first_token", time.Since(u.firstAt))
			}
		case <-opened:
			opened = nil
			att, err := h.Attempt()
			if err != nil {
				res.Decide(h, false)
				h = nil
				if broken != nil {
					return u, broken.body, broken.err
				}
				continue
			}
			hu = att.(*upstream)
			running++
			go func() {
				body, err := s.assembleJSON(ctx, cl, hu, nil)
				results <- assembled{hu, body, err}
			}()
		case r := <-results:
			running--
			switch {
			case r.err == nil && r.u == u:
				res.ObservePace(u.firstAt, u.lastAt, u.tokens-1)
				if h != nil {
					if hu != nil && running > 0 {
						hu.cancel()
						<-results
					}
					res.Decide(h, false)
				}
				return u, r.body, nil
			case r.err == nil: // the hedge's answer is whole first
				if broken == nil {
					u.cancel()
					<-results
					// Censored: the original's pace so far, at least the
					// threshold it fell behind.
					res.ObservePace(u.firstAt, time.Now(), max(u.tokens-1, 1))
				} else {
					s.blameBroken(cl, u, broken.err)
				}
				res.Decide(h, true)
				return hu, r.body, nil
			case h == nil:
				return u, r.body, r.err
			case r.u == u && (opened != nil || running > 0):
				broken = &r // the hedge may still make the answer
			default: // both failed: the client hears the original's failure
				if r.u == u {
					broken = &r
				} else {
					if ctx.Err() == nil { // not the client going away
						s.blameBroken(cl, hu, r.err)
					}
					if running > 0 {
						continue // the original carries on alone
					}
				}
				res.Decide(h, false)
				return u, broken.body, broken.err
			}
		}
	}
}

// blameBroken records that u broke before its answer was whole (a pace
// hedge made the answer): a connection that broke mid-answer is most
// likely a replica that died, out of routing until a probe says not.
func (s *Server) blameBroken(cl *call, u *upstream, err error) {
	var me *midstreamError
	if errors.As(err, &me) && me.class == data.ClassMidstream {
		s.reg.Eject(u.rep, "midstream")
	}
	cl.tries.broke(u, err)
}
