package router

import (
	"context"
	"errors"
	"testing"
)

func readyReplica(id string, models ...string) *Replica {
	r := NewReplica(id, "http://"+id)
	r.SetModels(models)
	r.SetState(StateReady, "")
	return r
}

func TestPickLeastLoadedOfTwo(t *testing.T) {
	reg := New(Config{Rand: func(n int) int { return 0 }}, nil)
	a := reg.Add(readyReplica("a", "m"))
	b := reg.Add(readyReplica("b", "m"))
	a.inflight.Store(5)
	for range 10 {
		got, err := reg.Pick("m", nil)
		if err != nil || got != b {
			t.Fatalf("Pick = %v, %v; want b (less loaded)", got, err)
		}
	}
}

func TestPickSkipsReplicasThatMayNotTakeTraffic(t *testing.T) {
	reg := New(Config{}, nil)
	ready := reg.Add(readyReplica("ready", "m"))
	for _, s := range []State{StateStarting, StateWarming, StateDraining, StateEjected, StateFailed} {
		r := readyReplica("x-"+s.String(), "m")
		r.SetState(s, "test")
		reg.Add(r)
	}
	for range 50 {
		got, err := reg.Pick("m", nil)
		if err != nil || got != ready {
			t.Fatalf("Pick = %v, %v; want the only ready replica", got, err)
		}
	}
}

func TestPickUnknownVersusUnavailable(t *testing.T) {
	reg := New(Config{}, nil)
	r := reg.Add(readyReplica("a", "m"))
	if _, err := reg.Pick("other", nil); !errors.Is(err, ErrUnknownModel) {
		t.Fatalf("unknown model: err = %v", err)
	}
	r.SetState(StateEjected, "test")
	if _, err := reg.Pick("m", nil); !errors.Is(err, ErrNoReplica) {
		t.Fatalf("known model, nothing ready: err = %v", err)
	}
}

func TestDoRetriesNotSentOnAnotherReplicaAndEjects(t *testing.T) {
	var ejected []string
	reg := New(Config{OnEject: func(r *Replica, reason string) { ejected = append(ejected, r.ID+":"+reason) }}, nil)
	a := reg.Add(readyReplica("a", "m"))
	b := reg.Add(readyReplica("b", "m"))
	var seen []string
	res, err := reg.Do(context.Background(), "m", func(ctx context.Context, rep *Replica, n int) error {
		seen = append(seen, rep.ID)
		if rep.Inflight() != 1 {
			t.Errorf("inflight during attempt = %d, want 1", rep.Inflight())
		}
		if n == 1 {
			return ErrNotSent(errors.New("connection refused"))
		}
		return nil
	})
	if err != nil || res.Attempts != 2 || len(seen) != 2 || seen[0] == seen[1] {
		t.Fatalf("Do = %+v, %v; attempts on %v", res, err, seen)
	}
	if len(ejected) != 1 || ejected[0] != seen[0]+":connect" {
		t.Fatalf("ejected = %v, want the first replica", ejected)
	}
	if a.Inflight() != 0 || b.Inflight() != 0 {
		t.Fatalf("inflight after Do: a=%d b=%d", a.Inflight(), b.Inflight())
	}
}

func TestDoDoesNotRetryAfterTheRequestWasSent(t *testing.T) {
	reg := New(Config{}, nil)
	reg.Add(readyReplica("a", "m"))
	reg.Add(readyReplica("b", "m"))
	calls := 0
	boom := errors.New("upstream 500")
	res, err := reg.Do(context.Background(), "m", func(ctx context.Context, rep *Replica, n int) error {
		calls++
		return boom
	})
	if !errors.Is(err, boom) || calls != 1 || res.Attempts != 1 {
		t.Fatalf("Do = %+v, %v after %d calls", res, err, calls)
	}
}

func TestInflightReturnsToZeroOnPanic(t *testing.T) {
	reg := New(Config{}, nil)
	a := reg.Add(readyReplica("a", "m"))
	func() {
		defer func() { _ = recover() }()
		_, _ = reg.Do(context.Background(), "m", func(ctx context.Context, rep *Replica, n int) error {
			panic("handler bug")
		})
	}()
	if a.Inflight() != 0 {
		t.Fatalf("inflight after panic = %d", a.Inflight())
	}
}

func TestDoRetriesDeclinedElsewhereWithoutEjecting(t *testing.T) {
	reg := New(Config{}, nil)
	a := reg.Add(readyReplica("a", "m"))
	b := reg.Add(readyReplica("b", "m"))
	var seen []*Replica
	res, err := reg.Do(context.Background(), "m", func(ctx context.Context, rep *Replica, n int) error {
		seen = append(seen, rep)
		if n == 1 {
			return ErrDeclined(errors.New("draining"))
		}
		return nil
	})
	if err != nil || res.Attempts != 2 || seen[0] == seen[1] {
		t.Fatalf("Do = %+v, %v", res, err)
	}
	if a.State() != StateReady || b.State() != StateReady {
		t.Fatalf("a declined attempt ejected a replica: a=%s b=%s", a.State(), b.State())
	}
}
