package policy

import (
	"context"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/data"
)

// openStore opens a fresh database; openSecond opens another handle on the
// same file, as `tailgate keys` does while a gateway runs.
func openStore(t testing.TB) (*data.Store, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "tailgate.db")
	st, err := data.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st, path
}

func openSecond(t testing.TB, path string) *data.Store {
	t.Helper()
	st, err := data.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

func newGate(t testing.TB, st *data.Store, cfg Config) *Gate {
	t.Helper()
	g, err := New(context.Background(), cfg, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	return g
}

// runGate runs g.Run until the test ends.
func runGate(t testing.TB, g *Gate) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- g.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
}

// within polls cond until it holds, failing the test after d.
func within(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, d)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func createKey(t testing.TB, st *data.Store, o KeyOptions) (string, data.Key) {
	t.Helper()
	secret, k, err := CreateKey(context.Background(), st, o)
	if err != nil {
		t.Fatal(err)
	}
	return secret, k
}

func authenticate(t testing.TB, g *Gate, secret string) *Principal {
	t.Helper()
	p, err := g.Authenticate(context.Background(), secret)
	if err != nil {
		t.Fatalf("Authenticate: %v", err)
	}
	return p
}

func ptr(n int64) *int64 { return &n }

// clock is a settable clock for the rate limiters.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}
