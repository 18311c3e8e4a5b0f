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
type liveCalls struct{ m sync.Map } // id → LiveCall

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

// track lists cl until the returned func is called.
func (l *liveCalls) track(cl *call) func() {
	lc := LiveCall{ID: cl.id, Start: cl.start, Endpoint: cl.ep.path}
	if p := cl.principal; p != nil {
		lc.Tenant, lc.KeyID, lc.KeyPrefix = p.Tenant, p.KeyID, p.KeyPrefix
	}
	l.m.Store(cl.id, lc)
	return func() { l.m.Delete(cl.id) }
}

// list returns the requests in flight, oldest first.
func (l *liveCalls) list() []LiveCall {
	out := []LiveCall{}
	l.m.Range(func(_, v any) bool {
		out = append(out, v.(LiveCall))
		return true
	})
	sort.Slice(out, func(i, j int) bool { return out[i].Start.Before(out[j].Start) })
	return out
}
