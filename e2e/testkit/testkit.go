// Package testkit holds the helpers that the tests of several packages share
// (the end-to-end tests in e2e and the packages' own tests): a buffer safe to
// read while a process or logger writes it, a bounded wait for a condition,
// and a look at the sockets a process listens on. It is test support: only
// _test.go files import it, and it imports nothing of the product.
package testkit

import (
	"bytes"
	"strings"
	"sync"
	"testing"
	"time"
)

// Buffer collects what a child process or a logger writes, for a test to
// read while it is still being written. The zero value is ready to use.
type Buffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// DefaultWait bounds [WaitFor]: it only guards against a hung test, it is
// not a timing claim.
const DefaultWait = 20 * time.Second

// WaitFor polls cond until it holds, failing t after [DefaultWait]; what
// names the condition in the failure.
func WaitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	WaitWithin(t, DefaultWait, what, cond)
}

// WaitWithin polls cond until it holds, failing t once within has passed,
// and returns how long it took. The polls start 1 ms apart and back off to
// 20 ms, so a quick condition is seen at once and a slow one costs little.
func WaitWithin(t testing.TB, within time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start, pause := time.Now(), time.Millisecond
	for !cond() {
		if time.Since(start) > within {
			t.Fatalf("%s: not within %v", what, within)
		}
		time.Sleep(pause)
		pause = min(2*pause, 20*time.Millisecond)
	}
	return time.Since(start)
}

// LastLine is the last non-blank line of s, trimmed: what a command printed
// last (a new key, an error).
func LastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}
