package launcher

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
)

// freePort returns a loopback port that was free a moment ago. Another
// process may take it before the engine binds it; the engine then fails to
// start, exits, and is restarted on a new port, so the race costs a backoff,
// never a wrong answer.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	if err := ln.Close(); err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	return port, nil
}

// process is one running engine: the leader of its own process group.
type process struct {
	pid     int
	done    chan struct{} // closed once the leader exited and was reaped
	waitErr error         // set before done is closed

	outputs  sync.WaitGroup // forwarders of stdout and stderr
	readEnds []*os.File
	stopOnce sync.Once
}

// startProcess starts argv with env added to the worker's environment, in a
// new process group, its output forwarded to log.
//
// The output goes through pipes we own rather than exec's copying
// goroutines: engine children (vLLM's GPU workers) inherit the write ends,
// and cmd.Wait must not hang on them once the leader has exited.
func startProcess(argv, env []string, log *slog.Logger) (*process, error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), env...) // later entries win
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Setpgid: true,
		// The engine must not outlive a killed worker. The signal fires when
		// the thread that started it exits; Go keeps threads alive unless a
		// goroutine locked to one ends, which this package never does.
		Pdeathsig: syscall.SIGKILL,
	}
	p := &process{done: make(chan struct{})}
	var writeEnds []*os.File
	closeAll := func() {
		for _, f := range append(p.readEnds, writeEnds...) {
			_ = f.Close()
		}
	}
	for range 2 {
		r, w, err := os.Pipe()
		if err != nil {
			closeAll()
			return nil, fmt.Errorf("engine output pipe: %w", err)
		}
		p.readEnds = append(p.readEnds, r)
		writeEnds = append(writeEnds, w)
	}
	cmd.Stdout, cmd.Stderr = writeEnds[0], writeEnds[1]
	if err := cmd.Start(); err != nil {
		closeAll()
		return nil, fmt.Errorf("start engine: %w", err)
	}
	for _, w := range writeEnds {
		_ = w.Close()
	}
	p.pid = cmd.Process.Pid
	olog := log.With("engine", filepath.Base(argv[0]), "pid", p.pid)
	for _, r := range p.readEnds {
		p.outputs.Go(func() { forwardLines(r, olog) })
	}
	go func() {
		p.waitErr = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// exitErr describes how the leader exited; call it only after done.
func (p *process) exitErr() error {
	if p.waitErr == nil {
		return errors.New("exit status 0")
	}
	return p.waitErr
}

// stop ends the whole process group: SIGTERM, SIGKILL once the leader has
// exited or grace has passed (whatever is left of the group then are
// orphans). It waits for the leader and, briefly, for the output. Safe to
// call more than once.
func (p *process) stop(grace time.Duration) {
	p.stopOnce.Do(func() {
		select {
		case <-p.done:
		default:
			_ = syscall.Kill(-p.pid, syscall.SIGTERM)
			t := time.NewTimer(grace)
			select {
			case <-p.done:
				t.Stop()
			case <-t.C:
			}
		}
		// ESRCH when the group is already empty is fine.
		_ = syscall.Kill(-p.pid, syscall.SIGKILL)
		<-p.done
		// A process that left the group can hold the pipes open; don't
		// wait on it forever.
		out := make(chan struct{})
		go func() { p.outputs.Wait(); close(out) }()
		select {
		case <-out:
		case <-time.After(2 * time.Second):
		}
		for _, r := range p.readEnds {
			_ = r.Close()
		}
		<-out
	})
}

// maxLine bounds one forwarded log record; longer lines are split.
const maxLine = 16 << 10

// forwardLines logs each line of r as one record until r ends. Carriage
// returns end lines too, so progress bars become one record per update
// instead of one unbounded line.
func forwardLines(r io.Reader, log *slog.Logger) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 4096), maxLine)
	sc.Split(splitLines)
	for sc.Scan() {
		if line := sc.Bytes(); len(bytes.TrimSpace(line)) > 0 {
			log.Info(string(line))
		}
	}
	// A read error (the pipe closed under us) ends forwarding; keep the
	// engine from blocking on a full pipe by draining whatever is left.
	_, _ = io.Copy(io.Discard, r)
}

func splitLines(data []byte, atEOF bool) (advance int, token []byte, err error) {
	if i := bytes.IndexAny(data, "\r\n"); i >= 0 {
		return i + 1, data[:i], nil
	}
	if len(data) >= maxLine || (atEOF && len(data) > 0) {
		return len(data), data, nil
	}
	return 0, nil, nil
}

// redact hides the values of secret-looking flags (--api-key K,
// --hf-token=T, …) so a command line can be logged.
func redact(argv []string) []string {
	secret := func(flag string) bool {
		flag = strings.ToLower(flag)
		if !strings.HasPrefix(flag, "-") {
			return false
		}
		for _, s := range []string{"key", "token", "secret", "password"} {
			if strings.HasSuffix(flag, s) {
				return true
			}
		}
		return false
	}
	out := slices.Clone(argv)
	for i := 1; i < len(out); i++ {
		if flag, _, ok := strings.Cut(out[i], "="); ok {
			if secret(flag) {
				out[i] = flag + "=REDACTED"
			}
		} else if secret(out[i]) && i+1 < len(out) {
			out[i+1] = "REDACTED"
			i++
		}
	}
	return out
}
