package router

import (
	"fmt"
	"slices"
)

// NoReplicaError is [ErrNoReplica] with the why, for the client's error
// message: the model asked for and, for each replica that serves it, why
// it could not take the request. errors.Is(err, ErrNoReplica) holds.
type NoReplicaError struct {
	Model    string
	Replicas []OutReplica // every replica that serves Model, in ID order
}

// OutReplica is one replica of a [NoReplicaError] and why it is out.
type OutReplica struct {
	ID    string
	State State
	// Why is the replica's own reason for a state other than ready, or why
	// selection passed over a ready one; "" when nothing more is known.
	Why string
}

func (e *NoReplicaError) Error() string {
	return fmt.Sprintf("%v of model %q (%d replicas, none can take it)", ErrNoReplica, e.Model, len(e.Replicas))
}

// Is makes errors.Is(err, ErrNoReplica) hold.
func (e *NoReplicaError) Is(target error) bool { return target == ErrNoReplica }

// noReplica says why no replica of model could be picked for a request,
// given the replicas it had already tried (exclude). Only [Call]'s pick
// calls it, once the request has nowhere to go: a hedge that finds no
// replica is skipped without it, so it costs nothing on a request's way.
func (r *Registry) noReplica(model string, exclude []*Replica) error {
	e := &NoReplicaError{Model: model}
	now := r.cfg.Now()
	for _, rep := range *r.list.Load() {
		if !rep.Serves(model) {
			continue
		}
		o := OutReplica{ID: rep.ID, State: rep.State(), Why: rep.Reason()}
		if o.State == StateReady {
			switch {
			case slices.Contains(exclude, rep):
				o.Why = "already tried for this request"
			case rep.backingOff(now):
				o.Why = "backing off: its engine asked to retry later"
			}
		}
		e.Replicas = append(e.Replicas, o)
	}
	return e
}
