package launcher

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

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
//
// The directory holds a lock file, locked (flock) until release: the
// kernel lets go of the lock however the process ends, so a directory
// whose lock can be taken was left by a worker that was killed before it
// could remove it (SIGKILL, an OOM kill). Those are removed first, each
// logged; one whose lock is held belongs to a worker still running.
func socketDir(log *slog.Logger) (dir string, release func(), err error) {
	sweepSocketDirs(log)
	dir, err = os.MkdirTemp("", socketDirPrefix)
	if err != nil {
		return "", nil, fmt.Errorf("make the engine socket's directory: %w", err)
	}
	if p := filepath.Join(dir, socketName); len(p) > maxSocketPath {
		_ = os.Remove(dir)
		return "", nil, fmt.Errorf("engine socket path %s is longer than a Unix socket path may be (%d bytes): set TMPDIR to a shorter directory", p, maxSocketPath)
	}
	// Locked under another name, then renamed: a sweep by another worker
	// never finds the lock file before it is locked.
	lock, err := lockSocketDir(dir, "lock.new", os.O_CREATE)
	if err == nil {
		err = os.Rename(filepath.Join(dir, "lock.new"), filepath.Join(dir, "lock"))
	}
	if err != nil {
		_ = os.RemoveAll(dir)
		return "", nil, fmt.Errorf("lock the engine socket's directory: %w", err)
	}
	return dir, func() {
		_ = os.RemoveAll(dir)
		lock.Close()
	}, nil
}

// socketDirPrefix begins the name of every engine socket directory in the
// temporary directory.
const socketDirPrefix = "tailgate-engine-"

// lockSocketDir opens the file name in dir (flag may add os.O_CREATE) and
// takes its lock without waiting.
func lockSocketDir(dir, name string, flag int) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(dir, name), os.O_RDWR|flag, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// sweepSocketDirs removes the engine socket directories of this user's
// that killed workers left in the temporary directory: those with a lock
// file nobody holds. A directory without one (made by a version before
// the lock) is left alone.
func sweepSocketDirs(log *slog.Logger) {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), socketDirPrefix+"*"))
	for _, dir := range dirs {
		if fi, err := os.Stat(dir); err != nil || !fi.IsDir() || !ownedByMe(fi) {
			continue
		}
		lock, err := lockSocketDir(dir, "lock", 0)
		if err != nil {
			continue // held: a running worker's; or no lock file
		}
		err = os.RemoveAll(dir)
		lock.Close()
		if err == nil {
			log.Info("removed the engine socket directory a killed worker left", "dir", dir)
		}
	}
}

// ownedByMe says whether this process's user owns fi.
func ownedByMe(fi os.FileInfo) bool {
	st, ok := fi.Sys().(*syscall.Stat_t)
	return ok && int(st.Uid) == os.Getuid()
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
