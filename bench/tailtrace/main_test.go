package main

import (
	"bytes"
	"context"
	"runtime"
	"runtime/trace"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// The slowest request of a real execution trace is put down to what it
// waited on: here a lock another goroutine held while the request waited.
func TestTheSlowestRequestIsPutDownToTheLockItWaitedFor(t *testing.T) {
	var buf bytes.Buffer
	if err := trace.Start(&buf); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	held, release := make(chan struct{}), make(chan struct{})
	go func() {
		mu.Lock()
		close(held)
		<-release
		mu.Unlock()
	}()
	<-held
	var wg sync.WaitGroup
	wg.Go(func() { waitForLock(&mu) })
	for range 20 {
		wg.Go(func() {
			_, task := trace.NewTask(context.Background(), "tailgate.request")
			task.End()
		})
	}
	// The lock is let go once the request has had the time to park on it:
	// nothing here is timed, the report is asked where the request waited.
	for !waiting.Load() {
		runtime.Gosched()
	}
	time.Sleep(20 * time.Millisecond)
	close(release)
	wg.Wait()
	trace.Stop()

	a, err := read(&buf, "tailgate.request")
	if err != nil {
		t.Fatal(err)
	}
	if len(a.done) != 21 {
		t.Fatalf("%d requests read, want the 21 the test made", len(a.done))
	}
	var out strings.Builder
	a.report(&out, 0.01, 1)
	report := out.String()
	_, slowest, ok := strings.Cut(report, "the slowest 1 ")
	if !ok {
		t.Fatalf("no section on the slowest request:\n%s", report)
	}
	lines := strings.Split(slowest, "\n")
	if len(lines) < 2 || !strings.Contains(lines[1], "blocked (sync)") || !strings.Contains(lines[1], "waitForLock") {
		t.Fatalf("the slowest request's largest share is not its wait for the lock in waitForLock:\n%s", report)
	}
}

var waiting atomic.Bool

// waitForLock is a request that waits for mu.
func waitForLock(mu *sync.Mutex) {
	_, task := trace.NewTask(context.Background(), "tailgate.request")
	defer task.End()
	waiting.Store(true)
	mu.Lock()
	mu.Unlock()
}
