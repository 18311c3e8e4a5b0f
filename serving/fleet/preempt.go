package fleet

import (
	"context"
	"strings"
	"time"

	"github.com/tailgate-dev/tailgate/router"
	"github.com/tailgate-dev/tailgate/serving"
)

// Replicas drained by their worker. A worker drains on a preemption notice
// (a spot VM announces it goes away a minute or two ahead) or when its box
// shuts it down; either way the replica is going away. The controller does
// not wait for its lease to run out: it stops counting it and starts a
// replacement at once, lets the requests in flight there finish, and calls
// the provider's Stop only once the drain is over (the replica left the
// draining state, or the action timeout passed).

// retiree is a replica drained by its worker, not yet stopped.
type retiree struct {
	*replica
	reason string // the worker's draining reason
	since  time.Time
}

// retireLocked notes r as drained by its worker for reason.
func (c *Controller) retireLocked(r *replica, reason string, now time.Time) {
	c.retiring = append(c.retiring, &retiree{replica: r, reason: reason, since: now})
	c.log.Warn("fleet: replica drained by its worker; starting a replacement now", "model", r.model, "replica", r.id,
		"why", goneWhy(reason), "reason", reason)
}

// drainedLocked takes out of c.retiring the replicas of model whose drain
// is over.
func (c *Controller) drainedLocked(model string, now time.Time) []*retiree {
	var done []*retiree
	keep := c.retiring[:0]
	for _, r := range c.retiring {
		rep := c.reg.Get(r.id)
		if r.model == model && (rep == nil || rep.State() != router.StateDraining || now.Sub(r.since) >= c.cfg.ActionTimeout) {
			done = append(done, r)
			continue
		}
		keep = append(keep, r)
	}
	clear(c.retiring[len(keep):])
	c.retiring = keep
	return done
}

// stopRetired stops the drained replicas: the action is "preempted" for a
// preempted one, "replace" for another.
func (c *Controller) stopRetired(ctx context.Context, rs []*retiree) {
	for _, r := range rs {
		kind := "replace"
		if goneWhy(r.reason) == "preempted" {
			kind = "preempted"
		}
		c.acting.Go(func() {
			_ = c.actOn(ctx, Action{Model: r.model, Kind: kind, Replica: r.id, Reason: r.reason},
				func(ctx context.Context) error { return c.prov.Stop(ctx, r.model, r.id) })
		})
	}
}

// goneWhy names why a replica drained by its worker went: "preempted" or
// "drained".
func goneWhy(reason string) string {
	if strings.HasPrefix(reason, serving.ReasonPreempted) {
		return "preempted"
	}
	return "drained"
}
