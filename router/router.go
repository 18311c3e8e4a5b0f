// Package router owns tailgate's replica registry: which replicas exist, which
// models they serve, whether they may take traffic, how busy they are, and how
// one request's attempts are spread over them (selection, retries, failover,
// hedging).
//
// # Overview
//
// [New] makes a [Registry] from a [Config]; it holds [Replica] values. Replicas come from static upstreams or
// from worker heartbeats ([Registry.Heartbeat], with leases); a
// [HealthChecker] probes them through a [Prober] and expires leases. A
// replica's state changes in one place, a transition checked against the
// table of allowed moves in replica.go; heartbeats, probes,
// [Registry.Eject], [Registry.Drain] and [Replica.SetState] all go through
// it, on the registry's clock.
// Selection is a [Selector] in [Config], one file per policy: [P2C] (load
// and latency aware, with slow start and prefix affinity; the default) and
// [RoundRobin]; [ParsePolicy] maps a policy name to one. With
// [AffinitySession] a request that names its session skips the policy: it
// goes to the replica of the session's last turn while that replica is
// within a load bound of the mean, else moves once, in the session's
// rendezvous order (session.go; the table of sessions is a bounded LRU).
//
// # One request's attempts
//
// A [Call] ([Registry.NewCall]) owns one request's attempts from the first
// to the end of its answer, and decides everything about them: which
// replica each goes to, retries, hedges, which attempt wins, which replica
// is blamed or ejected. Each attempt has its own state (replica, in-flight
// slot, context, first output, progress); the caller opens attempts through
// its [OpenFunc], reads answers, and reports what it saw — progress
// ([Call.Progress]), how a relayed answer ended ([Call.End], an [ErrBroke]
// error for one that broke or went quiet) — and never ejects a replica
// itself: a replica's refusal is a [Declined] error whose pushback
// (Retry-After, draining) the call takes apart where it decides the retry.
// With [Request.Hold] set, [Call.Start] also waits for capacity that is
// coming, before its first pass and once more when every replica declined
// it. [Registry.Do] is NewCall and Start in one. The caller ends every
// call with [Call.Finish], which gives the winner's in-flight slot back.
//
//	       Start
//	         │ pick a replica (Exclude and those tried are out)
//	         ▼
//	┌──▶ opening ──not sent / declined──────────▶ retry at once ──┐
//	│        │  └──no output, retry budget──────▶ retry ──────────┤
//	│        │  └──hedge delay passed, budget───▶ hedge beside it │
//	│        │  └──final error (a 400)──────────▶ failed          │
//	└────────┼────────────────────────────────────────────────────┘
//	         │ first output: the first attempt to have it wins,
//	         ▼ the others are cancelled and lost (a late original
//	      relaying  waits a grace for its hedge)
//	stream:  │ Progress … End(nil | ErrBroke)   → idle: ejected
//	whole:   │ Whole: behind its decode pace? ──▶ pace hedge; first whole answer wins
//	         │        broke (ErrBroke)?   ──────▶ retry pass elsewhere (retry budget),
//	         ▼                                    the broken replica ejected
//	      Finish: the winner's slot given back, the request leaves its group
//
// [Call.Start] retries by failure class ([ErrNotSent], [ErrDeclined] at
// once; [ErrNoToken] within a [Budget]) and, when hedging is on, opens a
// second attempt after an adaptive delay and keeps whichever produces a
// first output. [Call.Whole] reads an answer the client sees only whole
// through the caller's [AssembleFunc]: it hedges it on decode pace and
// retries it once elsewhere when it breaks. A request's [Class] keeps its
// hedges off replicas where attempts of a higher class are in flight.
// In-flight counts are taken and given back by the call itself, so they
// cannot leak or go negative.
//
// The router counts what it decides (attempts, retries, hedges, ejections)
// and exports each replica's load and score as Prometheus metrics, through
// the [Config.Registerer] it is given, never a global registry.
//
// The package talks to replicas only through the caller's functions; it
// imports no HTTP framework and nothing of the project.
package router

import (
	"errors"
	"fmt"
	"time"
)

// Errors returned by selection.
var (
	// ErrUnknownModel: no replica has ever served the model.
	ErrUnknownModel = errors.New("unknown model")
	// ErrNoReplica: the model is known but no replica can take the request now.
	ErrNoReplica = errors.New("no ready replica")
)

// notSentError marks an attempt that never reached the replica.
type notSentError struct{ err error }

func (e *notSentError) Error() string { return fmt.Sprintf("not sent: %v", e.err) }
func (e *notSentError) Unwrap() error { return e.err }

// ErrNotSent wraps err to say the attempt never reached the replica (dial
// refused, connection reset before the request was written): nothing ran, so
// the request may be retried elsewhere at once, even a POST. The replica is
// ejected.
func ErrNotSent(err error) error { return &notSentError{err: err} }

// IsNotSent reports whether err says the attempt never reached its replica.
func IsNotSent(err error) bool {
	var ns *notSentError
	return errors.As(err, &ns)
}

// Declined is a replica's refusal of an attempt before it did any work (an
// engine's 429 or 503: overloaded, draining, not ready), with what the
// replica asked for. The request is retried on another replica at once, and
// the replica is not ejected — it is healthy, just not taking work. The
// call takes the refusal apart where it decides (Registry.blame): a
// replica that asked for RetryAfter is left out of selection that long,
// one that said it is Draining is drained. grpc-go's retry owner reads a
// server's pushback the same way (stream.go, csAttempt.shouldRetry).
type Declined struct {
	Err        error         // what the replica answered
	RetryAfter time.Duration // how long it asked to be left alone; 0: no pushback
	Draining   bool          // it said it is draining
}

func (e *Declined) Error() string { return fmt.Sprintf("declined: %v", e.Err) }
func (e *Declined) Unwrap() error { return e.Err }

// ErrDeclined wraps err as a [Declined] refusal with no pushback.
func ErrDeclined(err error) error { return &Declined{Err: err} }

// IsDeclined reports whether err says the replica declined the request.
func IsDeclined(err error) bool {
	if err == nil {
		return false // and no errors.As target on the heap: Start asks on every success
	}
	var d *Declined
	return errors.As(err, &d)
}

// noTokenError marks an attempt that reached the replica but produced no
// token (an error status, a dropped connection, a deadline).
type noTokenError struct {
	err   error
	eject string
}

func (e *noTokenError) Error() string { return fmt.Sprintf("no token: %v", e.err) }
func (e *noTokenError) Unwrap() error { return e.err }

// ErrNoToken wraps err to say the attempt reached the replica but produced
// no token. It may be retried on another replica within the retry budget.
// A non-empty eject names why the replica should be taken out as well
// (e.g. "ttft_deadline"); "" keeps it in.
func ErrNoToken(err error, eject string) error { return &noTokenError{err: err, eject: eject} }

// IsNoToken reports whether err says the attempt produced no token.
func IsNoToken(err error) bool {
	var nt *noTokenError
	return errors.As(err, &nt)
}

func noTokenEject(err error) string {
	var nt *noTokenError
	if errors.As(err, &nt) {
		return nt.eject
	}
	return ""
}
