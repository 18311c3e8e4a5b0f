// Package proc runs a child process as the leader of its own process group:
// it starts it, forwards its output line by line, reports how it exited, and
// stops the whole group with grace (SIGTERM, then SIGKILL).
//
// # Overview
//
// [Start] starts [Config.Argv] in a new process group with the parent-death
// signal set, so the child dies with a killed parent. Its stdout and stderr
// are pipes this package owns; each line is handed to [Config.Stdout] or
// [Config.Stderr]. [Process.Done] is closed when the leader has exited, and
// [Process.Err] then says how. [Process.Stop] ends the whole group —
// grandchildren included — and waits; it is safe to call more than once and
// after the leader has exited.
//
// A grandchild that inherited the output pipes (vLLM's GPU workers do) can
// keep them open after the leader is gone. Nothing here waits for it without
// bound: once the leader has exited, output is read for at most
// [Config.OutputGrace] more, then the pipes are closed.
//
// Restart policies, readiness and logging formats are the callers'; this
// package only owns the process group. It is Linux-only in practice: it
// relies on process groups and on the parent-death signal.
package proc

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"
)

// Config describes a process to start. Only Argv is required.
type Config struct {
	// Argv is the command: Argv[0] the executable (looked up in PATH when
	// it holds no slash), the rest its arguments. Required.
	Argv []string
	// Env is added to this process's environment; later entries win. Nil
	// means the child inherits the environment unchanged.
	Env []string
	// Stdout and Stderr receive the child's output, one call per line
	// without its line end. Carriage returns end lines too (progress bars
	// become one line per update), blank lines are dropped, and lines
	// longer than [MaxLine] bytes are split. Each is called from its own
	// goroutine, so a func given for both must be safe for concurrent use
	// ([LineWriter]'s are). A sink that blocks stalls the child once its
	// pipe is full. Nil discards the stream.
	Stdout, Stderr func(line string)
	// OutputGrace is how long output is still read once the leader has
	// exited, for processes that outlived it and hold the pipes open; their
	// later writes fail. 0 means [DefaultOutputGrace].
	OutputGrace time.Duration
}

// DefaultOutputGrace is the default of [Config.OutputGrace].
const DefaultOutputGrace = 2 * time.Second

// Validate reports whether c can be started.
func (c Config) Validate() error {
	switch {
	case len(c.Argv) == 0 || c.Argv[0] == "":
		return errors.New("proc: Argv is required")
	case c.OutputGrace < 0:
		return errors.New("proc: OutputGrace must not be negative")
	}
	return nil
}

func (c Config) withDefaults() Config {
	if c.OutputGrace == 0 {
		c.OutputGrace = DefaultOutputGrace
	}
	return c
}

// Process is a started process group. Its methods are safe for concurrent
// use.
type Process struct {
	pid  int
	cmd  *exec.Cmd
	done chan struct{} // closed once the leader exited and was reaped
	err  error         // the leader's exit; set before done is closed

	finished chan struct{} // closed once output forwarding ended too
	stopOnce sync.Once
}

// Start starts cfg.Argv as the leader of a new process group and returns at
// once. Its error, if any, comes from exec (e.g. "fork/exec /x: no such
// file or directory") or from making the output pipes.
//
// The child is sent SIGKILL when the thread that started it exits. Go keeps
// its threads alive unless a goroutine locked to one (runtime.LockOSThread)
// ends without unlocking, so do not call Start from such a goroutine.
func Start(cfg Config) (*Process, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	cmd := exec.Command(cfg.Argv[0], cfg.Argv[1:]...)
	if cfg.Env != nil {
		cmd.Env = append(os.Environ(), cfg.Env...)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}

	// The output goes through pipes we own rather than exec's copying
	// goroutines: grandchildren inherit the write ends, and cmd.Wait must
	// not hang on them once the leader has exited.
	var readEnds, writeEnds []*os.File
	closeAll := func() {
		for _, f := range append(readEnds, writeEnds...) {
			_ = f.Close()
		}
	}
	for range 2 {
		r, w, err := os.Pipe()
		if err != nil {
			closeAll()
			return nil, fmt.Errorf("output pipe: %w", err)
		}
		readEnds, writeEnds = append(readEnds, r), append(writeEnds, w)
	}
	cmd.Stdout, cmd.Stderr = writeEnds[0], writeEnds[1]
	if err := cmd.Start(); err != nil {
		closeAll()
		return nil, err
	}
	for _, w := range writeEnds {
		_ = w.Close()
	}

	p := &Process{pid: cmd.Process.Pid, cmd: cmd, done: make(chan struct{}), finished: make(chan struct{})}
	var outputs sync.WaitGroup
	for i, sink := range []func(string){cfg.Stdout, cfg.Stderr} {
		outputs.Go(func() { forwardLines(readEnds[i], sink) })
	}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
		out := make(chan struct{})
		go func() { outputs.Wait(); close(out) }()
		t := time.NewTimer(cfg.OutputGrace)
		select {
		case <-out:
			t.Stop()
		case <-t.C:
		}
		// Closing the read ends also ends a forwarder blocked in Read.
		for _, r := range readEnds {
			_ = r.Close()
		}
		<-out
		close(p.finished)
	}()
	return p, nil
}

// PID returns the leader's process id, which is also the process group id.
func (p *Process) PID() int { return p.pid }

// Done returns a channel that is closed when the leader has exited.
func (p *Process) Done() <-chan struct{} { return p.done }

// Err returns how the leader exited: nil for exit status 0, else an error
// such as "exit status 1" or "signal: killed" (an [*exec.ExitError]). It
// returns nil while the leader runs.
func (p *Process) Err() error {
	select {
	case <-p.done:
		return p.err
	default:
		return nil
	}
}

// Wait waits for the leader to exit and for its output to be forwarded (at
// most [Config.OutputGrace] past the exit), then returns [Process.Err]. It
// leaves the rest of the group alone; see [Process.Stop].
func (p *Process) Wait() error {
	<-p.finished
	return p.err
}

// Signal sends sig to the leader only, not to its group. It returns
// [os.ErrProcessDone] once the leader has been reaped.
func (p *Process) Signal(sig os.Signal) error { return p.cmd.Process.Signal(sig) }

// Stop ends the whole process group and waits for it like [Process.Wait]:
// SIGTERM to the group, then SIGKILL once the leader has exited or grace has
// passed, whichever is first (what is left of the group then are orphans).
// A grace of 0 or less sends SIGKILL at once. Stop is safe to call more than
// once and concurrently; later calls wait for the first and return the same
// result.
func (p *Process) Stop(grace time.Duration) error {
	p.stopOnce.Do(func() {
		select {
		case <-p.done:
		default:
			if grace > 0 {
				_ = syscall.Kill(-p.pid, syscall.SIGTERM)
				t := time.NewTimer(grace)
				select {
				case <-p.done:
					t.Stop()
				case <-t.C:
				}
			}
		}
		// ESRCH when the group is already empty is fine.
		_ = syscall.Kill(-p.pid, syscall.SIGKILL)
	})
	return p.Wait()
}
