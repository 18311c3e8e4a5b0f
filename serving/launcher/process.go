package launcher

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/tailgate-dev/tailgate/serving/proc"
)

// socketName is the engine socket's name in its directory.
const socketName = "engine.sock"

// maxSocketPath is the longest path a Unix socket may have on Linux
// (sun_path holds 108 bytes with the terminating NUL).
const maxSocketPath = 107

// socketDir makes a new directory for the engine's socket that only this
// user can open (mode 0700, as os.MkdirTemp makes it): connecting to a
// socket needs search permission on its directory, so no one else on the
// box reaches the engine, whatever mode it binds the socket with.
func socketDir() (string, error) {
	dir, err := os.MkdirTemp("", "tailgate-engine-")
	if err != nil {
		return "", fmt.Errorf("make the engine socket's directory: %w", err)
	}
	if p := filepath.Join(dir, socketName); len(p) > maxSocketPath {
		_ = os.Remove(dir)
		return "", fmt.Errorf("engine socket path %s is longer than a Unix socket path may be (%d bytes): set TMPDIR to a shorter directory", p, maxSocketPath)
	}
	return dir, nil
}

// startEngine starts argv with env added to the worker's environment, as
// the leader of its own process group, its output logged one record per
// line and its error lines kept in errs.
func startEngine(argv, env []string, log *slog.Logger, errs *errorTail) (*proc.Process, error) {
	// The pid is known only once Start returns; output waits for it. Each
	// stream has its own logger: a traceback on stderr is read line by line
	// in its own order, whatever stdout interleaves.
	var olog, elog *slog.Logger
	started := make(chan struct{})
	stdout := func(line string) {
		<-started
		olog.Info(line)
		if logsError(line) {
			errs.add(line)
		}
	}
	stderr := func(line string) {
		<-started
		elog.Info(line)
		errs.add(line)
	}
	p, err := proc.Start(proc.Config{Argv: argv, Env: env, Stdout: stdout, Stderr: stderr})
	if err != nil {
		return nil, fmt.Errorf("start engine: %w", err)
	}
	olog = log.With("engine", filepath.Base(argv[0]), "pid", p.PID())
	elog = olog.With("stream", "stderr")
	close(started)
	return p, nil
}

// exitErr describes how the engine exited; call it only after it did.
func exitErr(p *proc.Process) error {
	if err := p.Err(); err != nil {
		return err
	}
	return errors.New("exit status 0")
}

// redact hides the values of secret-looking flags (--api-key K,
// --hf-token=T, …) so a command line can be logged.
func redact(argv []string) []string {
	secret := func(flag string) bool {
		flag = strings.ToLower(flag)
		if !strings.HasPrefix(flag, "-") || strings.HasSuffix(flag, "-per-token") {
			return false // a rate per token (--sim-prefill-per-token 40µs) is no secret
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
