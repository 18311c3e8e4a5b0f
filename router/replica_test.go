package router

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
)

func TestTransitionTable(t *testing.T) {
	now := time.Unix(1000, 0)
	all := []State{StateStarting, StateWarming, StateReady, StateDraining, StateEjected, StateFailed}
	for _, from := range all {
		for _, to := range all {
			// The rule the table encodes: only the gateway ejects, and only
			// a replica taking traffic; a worker may report any other state
			// from any state.
			want := to != StateEjected || from == StateReady || from == to
			verdict := "allowed"
			if !want {
				verdict = "refused"
			}
			t.Run(fmt.Sprintf("%s to %s %s", from, to, verdict), func(t *testing.T) {
				r := NewReplica("r", "http://r")
				r.status.Store(&status{state: from, reason: "set up"})
				got := r.transition(from, to, "why", now)
				if got != want {
					t.Fatalf("transition %s → %s = %v, want %v", from, to, got, want)
				}
				wantState, wantReason := from, "set up"
				if want {
					wantState, wantReason = to, "why"
				}
				if r.State() != wantState || r.Reason() != wantReason {
					t.Fatalf("after %s → %s: %s (%q), want %s (%q)", from, to, r.State(), r.Reason(), wantState, wantReason)
				}
			})
		}
	}
}

func TestTransitionBehaviour(t *testing.T) {
	t0 := time.Unix(1000, 0)
	later := t0.Add(time.Minute)
	for _, tc := range []struct {
		name           string
		from           State // the replica's state before
		seen, to       State // the caller's view and its target
		ok             bool
		wantState      State
		wantReadySince time.Time
	}{
		{"a move to ready starts slow start at now", StateWarming, StateWarming, StateReady, true, StateReady, later},
		{"staying ready keeps when it became ready", StateReady, StateReady, StateReady, true, StateReady, t0},
		{"a move out of ready keeps when it became ready", StateReady, StateReady, StateDraining, true, StateDraining, t0},
		{"a re-admitted replica starts slow start again", StateEjected, StateEjected, StateReady, true, StateReady, later},
		{"a move decided on a stale view does nothing", StateDraining, StateReady, StateEjected, false, StateDraining, t0},
		{"a state that does not exist is refused", StateReady, StateReady, State(42), false, StateReady, t0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := NewReplica("r", "http://r")
			r.status.Store(&status{state: tc.from, readySince: t0.UnixNano()})
			if got := r.transition(tc.seen, tc.to, "why", later); got != tc.ok {
				t.Fatalf("transition = %v, want %v", got, tc.ok)
			}
			if r.State() != tc.wantState {
				t.Fatalf("state %s, want %s", r.State(), tc.wantState)
			}
			if got := time.Unix(0, r.readySince()); !got.Equal(tc.wantReadySince) {
				t.Fatalf("ready since %v, want %v", got, tc.wantReadySince)
			}
		})
	}
}

func TestSetStateUsesTheRegistrysClock(t *testing.T) {
	now := time.Unix(1000, 0)
	reg := newRegistry(t, Config{Now: func() time.Time { return now }, SlowStart: 10 * time.Second})
	r := reg.Add(NewReplica("r", "http://r"))
	if !r.SetState(StateReady, "") {
		t.Fatal("starting → ready refused")
	}
	now = now.Add(5 * time.Second)
	if _, _, _, ss, _ := reg.ScoreInputs(r); ss != 0.75 {
		t.Fatalf("slow-start factor halfway through the ramp = %v, want 0.75", ss)
	}
	if r.SetState(StateEjected, "no") {
		t.Fatal("SetState ejected a replica: only Registry.Eject may")
	}
}

// fakeProber answers every probe with err.
type fakeProber struct{ err error }

func (p fakeProber) Probe(context.Context, *Replica) ([]string, error) { return []string{"m"}, p.err }

func TestStateWriters(t *testing.T) {
	ready := Update{ID: "w", URL: "http://w", Models: []string{"m"}, State: StateReady, Lease: time.Minute}
	draining := ready
	draining.State, draining.Reason = StateDraining, "worker shutting down"
	for _, tc := range []struct {
		name   string
		act    func(reg *Registry, rep *Replica)
		want   State
		reason string
	}{
		{"a heartbeat does not lift an ejection", func(reg *Registry, rep *Replica) {
			reg.Eject(rep, "connect")
			reg.Heartbeat(ready)
		}, StateEjected, "connect"},
		{"a heartbeat can drain an ejected replica", func(reg *Registry, rep *Replica) {
			reg.Eject(rep, "connect")
			reg.Heartbeat(draining)
		}, StateDraining, "worker shutting down"},
		{"a good probe re-admits an ejected worker", func(reg *Registry, rep *Replica) {
			reg.Eject(rep, "connect")
			NewHealthChecker(reg, fakeProber{}, HealthConfig{}).ProbeAll(context.Background())
		}, StateReady, ""},
		{"a failed probe ejects a ready replica", func(reg *Registry, rep *Replica) {
			NewHealthChecker(reg, fakeProber{err: errors.New("refused")}, HealthConfig{}).ProbeAll(context.Background())
		}, StateEjected, "probe"},
		{"a probe saying not ready leaves the worker's state", func(reg *Registry, rep *Replica) {
			NewHealthChecker(reg, fakeProber{err: ErrProbeNotReady}, HealthConfig{}).ProbeAll(context.Background())
		}, StateReady, ""},
		{"a replica that says it drains is drained", func(reg *Registry, rep *Replica) {
			reg.Drain(rep, "draining (told by the replica)")
		}, StateDraining, "draining (told by the replica)"},
		{"drain leaves an ejected replica ejected", func(reg *Registry, rep *Replica) {
			reg.Eject(rep, "idle_deadline")
			reg.Drain(rep, "draining (told by the replica)")
		}, StateEjected, "idle_deadline"},
		{"a draining replica is not ejected", func(reg *Registry, rep *Replica) {
			reg.Drain(rep, "draining (told by the replica)")
			reg.Eject(rep, "connect")
		}, StateDraining, "draining (told by the replica)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := newRegistry(t, Config{})
			rep := reg.Heartbeat(ready)
			tc.act(reg, rep)
			if rep.State() != tc.want || rep.Reason() != tc.reason {
				t.Fatalf("%s (%q), want %s (%q)", rep.State(), rep.Reason(), tc.want, tc.reason)
			}
		})
	}
}

func TestStaticReplicaProbedIntoReadiness(t *testing.T) {
	for _, tc := range []struct {
		name string
		from State
		want State
	}{
		{"a starting static replica that answers is ready", StateStarting, StateReady},
		{"an ejected static replica that answers is ready", StateEjected, StateReady},
		{"a draining static replica stays out", StateDraining, StateDraining},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := newRegistry(t, Config{})
			rep := NewReplica("s", "http://s")
			rep.Static = true
			rep.status.Store(&status{state: tc.from})
			reg.Add(rep)
			NewHealthChecker(reg, fakeProber{}, HealthConfig{}).ProbeAll(context.Background())
			if rep.State() != tc.want {
				t.Fatalf("%s after a good probe, want %s", rep.State(), tc.want)
			}
			if !rep.Serves("m") {
				t.Fatal("the models the probe listed were not taken")
			}
		})
	}
}

// TestWorkerReportedEngineFailureTakesAReadyReplicaOut: a ready replica
// whose worker says the engine failed leaves routing like an ejection —
// attempts waiting there are woken, it is counted — and comes back when the
// worker says ready; its engine lines are kept as last sent.
func TestWorkerReportedEngineFailureTakesAReadyReplicaOut(t *testing.T) {
	reg := newRegistry(t, Config{})
	ready := Update{ID: "w", URL: "http://w", Models: []string{"m"}, State: StateReady, Lease: time.Minute}
	rep := reg.Heartbeat(ready)
	woken := rep.Ejected()

	failed := ready
	failed.State, failed.Reason = StateFailed, "engine not answering /health for 2.0s (timed out after 1s)"
	failed.EngineLog = []string{"RuntimeError: CUDA error: an illegal memory access was encountered"}
	reg.Heartbeat(failed)
	if rep.State() != StateFailed || rep.Reason() != failed.Reason || !slices.Equal(rep.EngineLog(), failed.EngineLog) {
		t.Fatalf("%s %q %q, want failed with the worker's reason and lines", rep.State(), rep.Reason(), rep.EngineLog())
	}
	select {
	case <-woken:
	default:
		t.Fatal("attempts waiting on the replica were not woken")
	}
	if n := engineEjections(t, reg); n != 1 {
		t.Fatalf("ejections{reason=engine} = %v, want 1", n)
	}
	reg.Heartbeat(failed) // still failed: counted once
	if n := engineEjections(t, reg); n != 1 {
		t.Fatalf("ejections{reason=engine} = %v after a repeated beat, want 1", n)
	}

	reg.Heartbeat(ready)
	if rep.State() != StateReady || rep.EngineLog() != nil {
		t.Fatalf("%s %q after the worker said ready", rep.State(), rep.EngineLog())
	}
	starting := ready
	starting.State = StateStarting
	reg.Heartbeat(starting)
	if n := engineEjections(t, reg); n != 1 {
		t.Fatalf("a move to starting counted as an engine failure")
	}
}

func engineEjections(t *testing.T, reg *Registry) float64 {
	t.Helper()
	var m dto.Metric
	if err := reg.m.ejections.WithLabelValues("w", "engine").Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}
