package fleet

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/tailgate-dev/tailgate/serving/proc"
)

// Child runs one child process of this binary and restarts it with backoff
// when it exits, until its context is done. Its output lines are logged on
// Log: the child's own log records as they are, anything else it writes (a
// panic, its exit error) as a warning. `tailgate up` runs its workers as
// Children, and [Local] starts the fleet's.
type Child struct {
	Name string
	Argv []string
	Log  *slog.Logger
}

// Supervise runs the child until ctx is done.
func (c *Child) Supervise(ctx context.Context) {
	backoff := 250 * time.Millisecond
	for {
		start := time.Now()
		err := c.runOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		if time.Since(start) > 30*time.Second {
			backoff = 250 * time.Millisecond
		}
		c.Log.Warn("child exited; restarting", "err", err, "in", backoff)
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 15*time.Second)
	}
}

// runOnce runs the child until it exits or ctx is done; then its process
// group is stopped (SIGTERM, SIGKILL after 5s).
func (c *Child) runOnce(ctx context.Context) error {
	sink := func(line string) { c.Log.Warn(line) }
	p, err := proc.Start(proc.Config{Argv: c.Argv, Stdout: sink, Stderr: sink})
	if err != nil {
		return fmt.Errorf("start: %w", err)
	}
	c.Log.Info("child started", "pid", p.PID())
	select {
	case <-p.Done():
		return p.Wait()
	case <-ctx.Done():
		return p.Stop(5 * time.Second)
	}
}

// Local is a provider of child workers of this binary on this machine, as
// `tailgate up` starts them: Argv says the worker command line of a replica.
type Local struct {
	// Argv returns the command line of the worker serving model as id.
	Argv func(model, id string) []string
	// Approve admits id as a worker before it starts (up's workers need
	// only the cluster token); nil: nothing to do.
	Approve func(ctx context.Context, id string) error
	Log     *slog.Logger

	mu       sync.Mutex
	children map[string]func() // id → stop and wait
}

// Name says the provider's kind in the fleet's status.
func (l *Local) Name() string { return "local" }

func (l *Local) Start(ctx context.Context, model, id string) error {
	if l.Approve != nil {
		if err := l.Approve(ctx, id); err != nil {
			return err
		}
	}
	log := l.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	c := &Child{Name: id, Argv: l.Argv(model, id), Log: log.With("replica", id)}
	cctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); c.Supervise(cctx) }()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.children == nil {
		l.children = map[string]func(){}
	}
	l.children[id] = func() { cancel(); <-done }
	return nil
}

func (l *Local) Stop(ctx context.Context, model, id string) error {
	l.mu.Lock()
	stop := l.children[id]
	delete(l.children, id)
	l.mu.Unlock()
	if stop == nil {
		return nil
	}
	done := make(chan struct{})
	go func() { stop(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
