package edge

import (
	"slices"
	"time"
)

// regionView is one region as a poll round left it: what the selection
// reads. It is a copy; the selection holds no lock.
type regionView struct {
	idx      int // in Config.Regions: the order of the flags, the last tie-breaker
	name     string
	healthy  bool
	draining bool
	rtt      time.Duration
	models   map[string]modelView
}

type modelView struct {
	ready   int
	p50     time.Duration
	queued  float64 // requests that would wait ahead of a new one, per ready replica
	unknown bool    // no TTFT samples yet: p50 is 0 and means nothing
}

// expected returns a request's expected time to first token in r for
// model ("" for a request that names none): the round trip, the region's
// recent median TTFT and a penalty of one median per request queued ahead
// on each replica. A model without a median in r (no samples yet: a fresh
// or restarted region) is unknown, not fast: it counts the slowest median
// the other regions report for it (unknown), so the round trip and the
// queues decide, never the want of data. ok is false when r may not take
// it: unhealthy, draining, or no ready replica of the model.
func (r regionView) expected(model string, queueWeight float64, unknown map[string]time.Duration) (time.Duration, bool) {
	if !r.healthy || r.draining {
		return 0, false
	}
	if model == "" {
		var best time.Duration = -1
		for id, m := range r.models {
			if m.ready == 0 {
				continue
			}
			if d := m.cost(queueWeight, unknown[id]); best < 0 || d < best {
				best = d
			}
		}
		if best < 0 {
			best = 0 // a region that serves nothing yet still answers /v1/models
		}
		return r.rtt + best, true
	}
	m, ok := r.models[model]
	if !ok || m.ready == 0 {
		return 0, false
	}
	return r.rtt + m.cost(queueWeight, unknown[model]), true
}

// cost is the model's median TTFT plus its queue penalty; an unknown
// median counts as unknownP50.
func (m modelView) cost(queueWeight float64, unknownP50 time.Duration) time.Duration {
	p50 := m.p50
	if m.unknown {
		p50 = unknownP50
	}
	return p50 + time.Duration(queueWeight*m.queued*float64(p50))
}

// unknownMedians returns, for each model, what a region without a median
// of its own counts: the slowest median of the regions that may take the
// model's requests and have one (0 when none has: the round trips and
// queues decide alone).
func unknownMedians(views []regionView) map[string]time.Duration {
	out := map[string]time.Duration{}
	for _, v := range views {
		if !v.healthy || v.draining {
			continue
		}
		for id, m := range v.models {
			if !m.unknown && m.ready > 0 && m.p50 > out[id] {
				out[id] = m.p50
			}
		}
	}
	return out
}

// ranked is a route's regions best first, each with its score.
type ranked struct {
	idx   int
	score time.Duration
}

// rank returns the regions that may take model's requests, by expected
// TTFT; the preferred region's score is discounted by tieMargin, so it
// wins a near tie (geography as the tie-breaker), then the flags' order.
func rank(views []regionView, model string, queueWeight float64, prefer int, tieMargin float64) []ranked {
	var out []ranked
	unknown := unknownMedians(views)
	for _, v := range views {
		d, ok := v.expected(model, queueWeight, unknown)
		if !ok {
			continue
		}
		out = append(out, ranked{v.idx, d})
	}
	eff := func(r ranked) float64 {
		if r.idx == prefer {
			return float64(r.score) * (1 - tieMargin)
		}
		return float64(r.score)
	}
	slices.SortStableFunc(out, func(a, b ranked) int {
		switch ea, eb := eff(a), eff(b); {
		case ea < eb:
			return -1
		case ea > eb:
			return 1
		}
		return a.idx - b.idx
	})
	return out
}

// route is one model's choice with its hysteresis: the current region
// keeps the traffic until a challenger is better by more than the switch
// margin for SwitchPolls rounds in a row, or the current one may no longer
// take it.
type route struct {
	current    int // -1: none
	challenger int
	wins       int
	order      []int // current first, then the other eligible regions, best first
}

// update folds a ranking into the route: a poll round's (round true) or
// one made between rounds after a connection failed, which moves the
// route off a region that may no longer take it but counts no wins.
func (rt *route) update(rs []ranked, margin float64, polls int, round bool) {
	if len(rs) == 0 {
		rt.current, rt.challenger, rt.wins, rt.order = -1, -1, 0, nil
		return
	}
	best := rs[0]
	cur := slices.IndexFunc(rs, func(r ranked) bool { return r.idx == rt.current })
	switch {
	case cur < 0: // no route yet, or the current region may not take it now
		rt.current, rt.challenger, rt.wins = best.idx, -1, 0
	case best.idx == rt.current:
		rt.challenger, rt.wins = -1, 0
	case !round:
	case float64(best.score) < float64(rs[cur].score)*(1-margin):
		if rt.challenger != best.idx {
			rt.challenger, rt.wins = best.idx, 0
		}
		rt.wins++
		if rt.wins >= polls {
			rt.current, rt.challenger, rt.wins = best.idx, -1, 0
		}
	default:
		rt.challenger, rt.wins = -1, 0
	}
	order := []int{rt.current}
	for _, r := range rs {
		if r.idx != rt.current {
			order = append(order, r.idx)
		}
	}
	rt.order = order
}
