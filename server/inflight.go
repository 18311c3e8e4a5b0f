package server

import (
	"sort"
	"sync"
	"time"
)

// liveCalls are the requests being served now, as the dashboard's live log
// lists them. A request is listed from authentication to its answer; what
// it holds is fixed when it starts (its model and replica are known only to
// the ledger row written at its end).
//
// It holds the calls themselves, read only for the fields fixed before they
// are tracked (id, start, endpoint, principal): tracking a request costs its
// map entry and nothing else.
type liveCalls struct{ m sync.Map } // *call → struct{}

// LiveCall is one request in flight.
type LiveCall struct {
	ID        string    `json:"id"`
	Start     time.Time `json:"start"`
	Endpoint  string    `json:"endpoint"`
	Tenant    string    `json:"tenant"`
	KeyID     string    `json:"key_id"`
	KeyPrefix string    `json:"key_prefix"`
}

func newLiveCalls() *liveCalls { return &liveCalls{} }

// track lists cl until untrack.
func (l *liveCalls) track(cl *call) { l.m.Store(cl, struct{}{}) }

func (l *liveCalls) untrack(cl *call) { l.m.Delete(cl) }

// list returns the requests in flight, oldest first.
func (l *liveCalls) list() []LiveCall {
	out := []LiveCall{}
	l.m.Range(func(k, _ any) bool {
		cl := k.(*call)
		lc := LiveCall{ID: cl.id, Start: cl.start, Endpoint: cl.ep.path}
		if p := cl.principal; p != nil {
			lc.Tenant, lc.KeyID, lc.KeyPrefix = p.Tenant, p.KeyID, p.KeyPrefix
		}
		out = append(out, lc)
		return true
	})
	sort.Slice(out, func(i, j int) bool { return out[i].Start.Before(out[j].Start) })
	return out
}
