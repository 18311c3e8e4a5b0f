package router

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
)

// switchProber answers every probe with its current error.
type switchProber struct {
	mu  sync.Mutex
	err error
}

func (p *switchProber) set(err error) { p.mu.Lock(); p.err = err; p.mu.Unlock() }

func (p *switchProber) Probe(context.Context, *Replica) ([]string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return []string{"m"}, p.err
}

// TestProbeFailuresAreLoggedWithTheirReason: a static upstream that never
// answers its probe says why at WARN — at the first failure, when the
// reason changes, and again every LogEvery while it lasts, not every probe.
func TestProbeFailuresAreLoggedWithTheirReason(t *testing.T) {
	var (
		mu   sync.Mutex
		logs strings.Builder
	)
	now := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	reg, err := New(Config{Now: func() time.Time { mu.Lock(); defer mu.Unlock(); return now }},
		slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) { mu.Lock(); defer mu.Unlock(); return logs.Write(p) }), nil)))
	if err != nil {
		t.Fatal(err)
	}
	rep := NewReplica("gpu-a", "http://10.0.0.5:8000")
	rep.Static = true
	reg.Add(rep)
	p := &switchProber{err: errors.New("/v1/models answered 404")}
	h := NewHealthChecker(reg, p, HealthConfig{LogEvery: 30 * time.Second})
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		return strings.Count(logs.String(), "replica probe failed")
	}
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }

	h.ProbeAll(context.Background())
	mu.Lock()
	first := logs.String()
	mu.Unlock()
	for _, w := range []string{"level=WARN", "replica=gpu-a", "url=http://10.0.0.5:8000", `err="/v1/models answered 404"`} {
		if !strings.Contains(first, w) {
			t.Errorf("the first failure's log lacks %s:\n%s", w, first)
		}
	}
	for range 10 { // 10 more seconds of the same failure
		advance(time.Second)
		h.ProbeAll(context.Background())
	}
	if n := count(); n != 1 {
		t.Fatalf("the same failure logged %d times within LogEvery, want once", n)
	}
	p.set(errors.New("dial tcp 10.0.0.5:8000: connect: connection refused"))
	advance(time.Second)
	h.ProbeAll(context.Background())
	if n := count(); n != 2 {
		t.Fatalf("a new reason logged %d lines in all, want 2", n)
	}
	advance(30 * time.Second)
	h.ProbeAll(context.Background())
	if n := count(); n != 3 {
		t.Fatalf("after LogEvery: %d lines in all, want 3", n)
	}
	mu.Lock()
	last := logs.String()
	mu.Unlock()
	if !strings.Contains(last, "failures=13") || !strings.Contains(last, "failing_for=41s") {
		t.Errorf("the repeated line does not say how long and how often:\n%s", last)
	}
	if rep.State() == StateReady {
		t.Fatal("a failing upstream is ready")
	}

	// Recovery resets: the next failure is logged at once.
	p.set(nil)
	advance(time.Second)
	h.ProbeAll(context.Background())
	if rep.State() != StateReady {
		t.Fatalf("state %s after a good probe, want ready", rep.State())
	}
	p.set(errors.New("dial tcp 10.0.0.5:8000: connect: connection refused"))
	advance(time.Second)
	h.ProbeAll(context.Background())
	if n := count(); n != 4 {
		t.Fatalf("a failure after recovery: %d lines in all, want 4", n)
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
