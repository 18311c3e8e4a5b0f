package router

import (
	"slices"
	"time"
)

// Update is one heartbeat from a worker about its replica.
type Update struct {
	ID     string
	URL    string
	Models []string
	State  State
	Reason string
	Engine string
	Load   Load
	// EngineLog is the engine's last error output the worker sent (while
	// not ready), oldest first; nil when it sent none.
	EngineLog []string
	// Lease is how long the replica stays routable without another update.
	Lease time.Duration
}

// Heartbeat registers or refreshes a worker's replica and returns it. A
// replica whose address changed is replaced (its counters start afresh). The
// worker's state is taken as it is, except that a replica the gateway ejected
// stays out until a probe lets it back in. A ready replica whose worker
// reports its engine failed (crashed, or frozen behind a live sidecar) is
// taken out like an ejection: attempts waiting for a first token there go
// elsewhere at once, and it is counted with reason "engine".
func (r *Registry) Heartbeat(u Update) *Replica {
	now := r.cfg.Now()
	rep := r.Get(u.ID)
	if rep == nil || rep.URL != u.URL || rep.Static {
		rep = NewReplica(u.ID, u.URL)
		r.log.Info("replica registered", "replica", u.ID, "address", u.URL, "engine", u.Engine)
		r.Add(rep)
	}
	if !slices.Equal(rep.Models(), u.Models) {
		rep.SetModels(u.Models)
	}
	load := u.Load
	rep.load.Store(&load)
	if load.Waiting > 0 && int64(load.Running) > rep.slots.Load() {
		// Requests queue behind this many running sequences: that is the
		// engine's concurrency.
		rep.slots.Store(int64(load.Running))
	}
	if rep.Engine() != u.Engine {
		e := u.Engine
		rep.engine.Store(&e)
	}
	if u.EngineLog == nil {
		rep.engineLog.Store(nil)
	} else {
		lines := slices.Clone(u.EngineLog)
		rep.engineLog.Store(&lines)
	}
	rep.lease.Store(now.Add(u.Lease).UnixNano())
	rep.lastOK.Store(now.UnixNano())

	cur := rep.State()
	switch {
	case cur == StateEjected && u.State == StateReady:
		// stays ejected: the health checker re-admits it after a good probe
	case cur != u.State || rep.Reason() != u.Reason:
		// From the state seen here only: if the gateway ejected the replica
		// meanwhile, that stands, and the next heartbeat is judged afresh.
		if !rep.transition(cur, u.State, u.Reason, now) || cur == u.State {
			break
		}
		if cur == StateReady && u.State == StateFailed {
			rep.signalEjected()
			r.m.ejections.WithLabelValues(rep.ID, "engine").Inc()
			r.log.Warn("replica out of routing: its engine failed", "replica", u.ID, "reason", u.Reason)
			break
		}
		r.log.Info("replica state", "replica", u.ID, "from", cur.String(), "to", u.State.String(), "reason", u.Reason)
	}
	return rep
}

// ExpireLeases drops registered replicas whose lease ended before now and
// returns their IDs.
func (r *Registry) ExpireLeases(now time.Time) []string {
	var gone []string
	for _, rep := range r.Replicas() {
		if rep.Static {
			continue
		}
		if exp := rep.lease.Load(); exp != 0 && now.UnixNano() > exp {
			r.Remove(rep.ID)
			r.log.Warn("replica lease expired: dropped from routing", "replica", rep.ID,
				"last_heartbeat_ago", now.Sub(rep.LastOK()).Round(time.Millisecond))
			gone = append(gone, rep.ID)
		}
	}
	return gone
}
