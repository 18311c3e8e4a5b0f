package router

import "sync/atomic"

// RoundRobin takes candidates in turn, blind to load. It is kept as the
// baseline the load-aware policy is measured against.
type RoundRobin struct {
	next atomic.Uint64
}

// Select implements Selector.
func (rr *RoundRobin) Select(cands []*Replica, _ Hint) *Replica {
	return cands[(rr.next.Add(1)-1)%uint64(len(cands))]
}
