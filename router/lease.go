package router

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
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
	// PriorityScheduling: the engine takes a request's priority (vLLM
	// --scheduling-policy priority); see [Replica.PriorityScheduling].
	PriorityScheduling bool
	Load               Load
	// EngineLog is the engine's last error output the worker sent (while
	// not ready), oldest first; nil when it sent none.
	EngineLog []string
	// Lease is how long the replica stays routable without another update.
	Lease time.Duration
	// Worker is the id of the worker credential the update came with.
	Worker string
}

// ErrTaken is returned by [Registry.Claim] when a replica id or address
// belongs to a static upstream or to another worker.
var ErrTaken = errors.New("taken")

// Claim reports whether the worker with credential id worker may register
// replica id at url: neither may belong to a static upstream, nor to a
// registered replica of another worker. A replica whose lease ended (lost,
// or not yet swept) holds nothing, so its id and address are free here again; the
// gateway keeps the id for the worker credential it was issued to until
// that is revoked (server's registration checks the store).
// The error wraps [ErrTaken] and says who holds what.
func (r *Registry) Claim(id, url, worker string) error {
	now := r.cfg.Now().UnixNano()
	for _, rep := range r.Replicas() {
		if exp := rep.lease.Load(); !rep.Static && exp != 0 && now > exp {
			continue // lease over, not yet swept
		}
		what := ""
		switch {
		case rep.ID == id:
			what = "replica id " + strconv.Quote(id)
		case rep.URL == url:
			what = "address " + url
		default:
			continue
		}
		switch {
		case rep.Static:
			return fmt.Errorf("%s belongs to the configured upstream %q: %w", what, rep.ID, ErrTaken)
		case rep.Worker != worker:
			return fmt.Errorf("%s is held by another worker (replica %q) while its lease lasts: %w", what, rep.ID, ErrTaken)
		}
	}
	return nil
}

// Heartbeat registers or refreshes a worker's replica and returns it. A
// replica whose address or worker changed is replaced (its counters start
// afresh). A static replica is never touched: Heartbeat returns nil (the
// caller checks [Registry.Claim] first and says why). The
// worker's state is taken as it is, except that a replica the gateway ejected
// stays out until a probe lets it back in. A ready replica whose worker
// reports its engine failed (crashed, or frozen behind a live sidecar) is
// taken out like an ejection: attempts waiting for a first token there go
// elsewhere at once, and it is counted with reason "engine".
func (r *Registry) Heartbeat(u Update) *Replica {
	now := r.cfg.Now()
	rep := r.Get(u.ID)
	if rep != nil && rep.Static {
		return nil
	}
	wasLost := rep != nil && rep.State() == StateLost
	if rep == nil || rep.URL != u.URL || rep.Worker != u.Worker {
		old := rep
		rep = NewReplica(u.ID, u.URL)
		rep.Worker = u.Worker
		if old != nil {
			rep.lastLoss.Store(r.replaced(old, u, now))
		}
		r.log.Info("replica registered", "replica", u.ID, "address", u.URL, "engine", u.Engine)
		r.Add(rep)
		if old != nil {
			old.signalEjected()
		}
	}
	if wasLost {
		r.lossChanged(rep, nil)
	}
	if !slices.Equal(rep.Models(), u.Models) {
		rep.SetModels(u.Models)
	}
	prev, load := rep.Load(), u.Load
	rep.load.Store(&load)
	rep.learnSlots(prev, load)
	if rep.Engine() != u.Engine {
		e := u.Engine
		rep.engine.Store(&e)
	}
	rep.priority.Store(u.PriorityScheduling)
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
			r.countEjection(rep.ID, "engine")
			r.log.Warn("replica out of routing: its engine failed", "replica", u.ID, "reason", u.Reason)
			break
		}
		r.log.Info("replica state", "replica", u.ID, "from", cur.String(), "to", u.State.String(), "reason", u.Reason)
	}
	return rep
}

// ExpireLeases marks registered replicas whose lease ended before now as
// lost and forgets those lost for longer than Config.ForgetLost; it returns
// the IDs it forgot. A lost replica stays listed (state lost, why, ready 0
// in metrics) so that the admin API, the dashboard and alerts still see a
// worker that died, and is never routed to; attempts still waiting for a
// first token there go elsewhere at once. Its id and address are free for
// [Registry.Claim], and its worker's next heartbeat brings it back.
func (r *Registry) ExpireLeases(now time.Time) []string {
	var forgot []string
	for _, rep := range r.Replicas() {
		exp := rep.lease.Load()
		if rep.Static || exp == 0 || now.UnixNano() <= exp {
			continue
		}
		cur := rep.State()
		if cur == StateLost {
			if now.Sub(time.Unix(0, exp)) > r.cfg.ForgetLost {
				r.Remove(rep.ID)
				r.lossChanged(rep, nil)
				r.log.Info("lost replica forgotten", "replica", rep.ID, "lost_for", now.Sub(time.Unix(0, exp)).Round(time.Second))
				forgot = append(forgot, rep.ID)
			}
			continue
		}
		ago := now.Sub(rep.LastOK()).Round(time.Millisecond)
		why := lossReason(rep.ProbeError(), ago, cur)
		if !rep.transition(cur, StateLost, why, now) {
			continue // a heartbeat or an ejection came first: judged at the next sweep
		}
		rep.signalEjected()
		// Its last heartbeat's load is no longer true: a lost engine runs
		// and queues nothing the gateway could count on.
		rep.load.Store(&Load{})
		loss := &Loss{Reason: why, At: time.Unix(0, exp), Was: cur}
		rep.lastLoss.Store(loss)
		if cur == StateReady {
			r.countEjection(rep.ID, "lost")
		}
		r.lossChanged(rep, loss)
		r.log.Warn("replica lost: its lease ended, it takes no traffic until its worker is heard again", "replica", rep.ID,
			"last_heartbeat_ago", ago, "forgotten_in", r.cfg.ForgetLost)
	}
	return forgot
}

// ErrNotLost is returned by [Registry.Forget] for a replica that is not
// lost: one whose worker still beats is taken out by revoking the worker.
var ErrNotLost = errors.New("replica is not lost")

// Forget drops a lost replica at once (an operator knows its worker is gone
// for good). It reports whether there was such a replica; the error wraps
// [ErrNotLost] when the replica is there but not lost.
func (r *Registry) Forget(id string) (bool, error) {
	rep := r.Get(id)
	if rep == nil {
		return false, nil
	}
	if st := rep.State(); st != StateLost {
		return true, fmt.Errorf("replica %q is %s: %w", id, st, ErrNotLost)
	}
	r.Remove(id)
	r.lossChanged(rep, nil)
	r.log.Info("lost replica forgotten by an operator", "replica", id)
	return true, nil
}

// RemoveWorker drops the replicas registered with the worker credential
// id worker (after a revocation) and returns their IDs.
func (r *Registry) RemoveWorker(worker string) []string {
	var gone []string
	for _, rep := range r.Replicas() {
		if worker != "" && rep.Worker == worker && !rep.Static {
			r.Remove(rep.ID)
			rep.signalEjected()
			if rep.State() == StateLost {
				r.lossChanged(rep, nil)
			}
			r.log.Warn("replica out of routing: its worker was revoked", "replica", rep.ID, "worker", worker)
			gone = append(gone, rep.ID)
		}
	}
	return gone
}

// lossReason says why a replica whose lease ended went away: what its last
// failed probe said (a refused connection: the worker's process is gone or
// its sidecar stopped), and how long no heartbeat came.
func lossReason(probeErr string, ago time.Duration, was State) string {
	lease := "no heartbeat for " + ago.String() + " (lease ended; was " + was.String() + ")"
	switch {
	case probeErr == "":
		return "heartbeat lease expired: " + lease
	case strings.Contains(probeErr, "connection refused"):
		return "worker unreachable: connection refused (its process died or its sidecar stopped); " + lease
	default:
		return "worker unreachable: " + probeErr + "; " + lease
	}
}

// replaced is why old went away when a heartbeat registers its id afresh
// (a restarted worker at another address, or another credential). A ready
// one is counted as an ejection with reason "restarted": attempts waiting
// there go elsewhere, and the table's ejections say it happened.
func (r *Registry) replaced(old *Replica, u Update, now time.Time) *Loss {
	cur := old.State()
	if cur == StateLost {
		return old.LastLoss()
	}
	why := "worker restarted: its sidecar moved from " + old.URL + " to " + u.URL + " (was " + cur.String() + ")"
	if old.URL == u.URL {
		why = "worker re-registered with another credential (was " + cur.String() + ")"
	}
	if e := old.ProbeError(); e != "" {
		why += "; its last probe: " + e
	}
	if cur == StateReady {
		r.countEjection(old.ID, "restarted")
	}
	r.log.Warn("replica replaced", "replica", old.ID, "reason", why)
	return &Loss{Reason: why, At: now, Was: cur}
}

// LossEvent says a registered replica was lost (Loss set) or is no longer
// lost (Loss nil: its worker was heard again, or it was forgotten or
// revoked).
type LossEvent struct {
	ID, Worker, URL string
	Models          []string
	Loss            *Loss
}

// OnLoss has f called, synchronously, whenever a registered replica is
// lost or stops being lost, so that the caller can keep lost replicas
// across a restart (see [Registry.RestoreLost]). Set it before replicas
// register.
func (r *Registry) OnLoss(f func(LossEvent)) { r.onLoss.Store(&f) }

func (r *Registry) lossChanged(rep *Replica, loss *Loss) {
	if f := r.onLoss.Load(); f != nil {
		(*f)(LossEvent{ID: rep.ID, Worker: rep.Worker, URL: rep.URL, Models: rep.Models(), Loss: loss})
	}
}

// RestoreLost lists a replica lost before a restart as lost again, with
// its reason, so alerts on tailgate_replica_lost keep firing until its
// worker is heard again, an operator forgets it, or Config.ForgetLost
// passes since it was lost. An id already registered is left alone; it
// reports whether it added one.
func (r *Registry) RestoreLost(ev LossEvent) bool {
	if ev.Loss == nil || r.Get(ev.ID) != nil {
		return false
	}
	rep := NewReplica(ev.ID, ev.URL)
	rep.Worker = ev.Worker
	rep.SetModels(ev.Models)
	loss := *ev.Loss
	rep.transition(StateStarting, StateLost, loss.Reason, loss.At)
	at := loss.At.UnixNano()
	if at == 0 {
		at = 1
	}
	rep.lease.Store(at)
	rep.lastOK.Store(at)
	rep.lastLoss.Store(&loss)
	r.Add(rep)
	return true
}
