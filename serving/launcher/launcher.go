// Package launcher starts and supervises one inference engine process (vLLM,
// or anything that speaks its HTTP API) on a worker box.
//
// # Overview
//
// A [Launcher] makes a directory only the worker's user can open (mode
// 0700) for the engine's Unix socket, starts the engine in a process group
// of its own listening on that socket and on no TCP port (vLLM's --uds; see
// [VLLMCommand]), forwards its output to the log line by line, waits until
// GET /health answers 200 and the model is listed on GET /v1/models, runs a
// few short warm-up generations (chat completions, or plain completions for
// a model without a chat template), and only then reports
// [serving.StateReady]. The socket is made mode 0600 before that, whatever
// mode the engine bound it with. Probes, warm-up and the sidecar all reach
// the engine through the socket ([Launcher.EngineSocket]).
//
// The socket, not the key, is what keeps the rest of the box out: vLLM's
// key guards only its /v1 paths, and /invocations (chat), /tokenize,
// /rerank, /score, /pooling and /classify answer whoever connects.
// Each start gets a fresh random API key in the engine's environment
// (VLLM_API_KEY, which vLLM and the simulated engine read like --api-key),
// so the engine refuses /v1 requests from anyone on the box but the
// launcher's probes and the sidecar ([Launcher.EngineKey]); the key is
// never on the command line, where ps would show it, and it replaces a
// VLLM_API_KEY the worker inherited (with a warning).
// An engine that exits, never becomes ready within the startup deadline, or
// fails its warm-up is stopped and started again after an exponential
// backoff; its state is reported through [Config.OnState] and
// [Launcher.State] all along, each failure with the last line the engine
// wrote. An engine that rejects its command line (argparse's exit status 2)
// is not restarted: the same arguments would be rejected again. After
// [Config.StartFailures] starts in a row that never became
// ready the state says the engine cannot start, and it is tried again only
// every [Config.CannotStartBackoff]. [Launcher.EngineLog] holds the engine's
// last error lines (its stderr and the errors of its log) for operators.
//
// When Run's context ends the launcher stops the whole process group:
// SIGTERM, then SIGKILL after [Config.StopGrace]. Draining requests before
// that is the sidecar's job, not this package's; it never touches requests
// other than its own readiness probes and warm-up.
//
// The package is Linux-only in practice: it relies on process groups and on
// the parent-death signal so an engine never outlives a killed worker.
package launcher

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tailgate-dev/tailgate/serving"
	"github.com/tailgate-dev/tailgate/serving/hop"
)

// State is a replica state: one of the serving.State* names. The launcher
// reports starting, warming, ready and failed; draining is the worker's.
type State = string

// Config configures a [Launcher]. Zero values mean the documented default;
// a feature is turned off by its own field (NoWarmup).
type Config struct {
	// Command builds the engine's argv (argv[0] the executable) and the
	// environment added to the worker's own, for an engine listening on
	// the Unix socket at socket and on no TCP port. It is called before
	// every start, always with the same path, where no file is then. The
	// launcher adds VLLM_API_KEY (see [EngineKeyEnv]) after that
	// environment. Required; see [VLLMCommand].
	Command func(socket string) (argv []string, env []string, err error)
	// Model is the served model name readiness waits for on /v1/models and
	// that the warm-up requests name. Required.
	Model string
	// StartupTimeout bounds the time from start to readiness; 0 means 20m
	// (large models load for minutes). Past it the engine is stopped, the
	// state is failed, and it is started again after the backoff.
	StartupTimeout time.Duration
	// Progress is how often a line reports the wait for readiness; 0 means 15s.
	Progress time.Duration
	// PollInterval is how often readiness is probed; 0 means 500ms.
	PollInterval time.Duration
	// Warmup is the number of short generations run before ready; 0 means
	// DefaultWarmup (3). See NoWarmup to run none.
	Warmup int
	// NoWarmup skips the warm-up: the engine is ready as soon as it serves
	// the model.
	NoWarmup bool
	// WarmupTimeout bounds the whole warm-up; 0 means 2m.
	WarmupTimeout time.Duration
	// BackoffMin and BackoffMax bound the pause before a restart, which
	// doubles after each failure; 0 means 1s and 60s.
	BackoffMin, BackoffMax time.Duration
	// StableAfter is how long an engine must stay ready for the backoff to
	// start over from BackoffMin; 0 means 10m.
	StableAfter time.Duration
	// StopGrace is how long the engine has to exit after SIGTERM before its
	// process group is killed; 0 means 30s.
	StopGrace time.Duration
	// StartFailures is how many starts in a row may end before the engine
	// was ever ready (it exited, missed StartupTimeout, or failed its
	// warm-up) before the state says the engine cannot start; 0 means
	// DefaultStartFailures (3). Starts are counted, not timed: vLLM takes
	// tens of seconds to reject a bad flag or model id.
	StartFailures int
	// CannotStartBackoff is the pause before each new start once the engine
	// cannot start; 0 means 5m. The state stays failed meanwhile, also while
	// a new start runs, until the engine is ready.
	CannotStartBackoff time.Duration
	// Log receives the launcher's lines and the engine's output, one record
	// per output line; nil means discard.
	Log *slog.Logger
	// OnState, when set, is called whenever the state or its reason
	// changes, from Run's goroutine and in order. It must not block for
	// long. Progress updates of the reason while starting are visible
	// through [Launcher.State] but do not call it.
	OnState func(state State, reason string)
}

// Defaults of the zero Config fields.
const (
	DefaultStartupTimeout = 20 * time.Minute
	DefaultProgress       = 15 * time.Second
	DefaultPollInterval   = 500 * time.Millisecond
	DefaultWarmup         = 3
	DefaultWarmupTimeout  = 2 * time.Minute
	DefaultBackoffMin     = time.Second
	DefaultBackoffMax     = 60 * time.Second
	DefaultStableAfter    = 10 * time.Minute
	DefaultStopGrace      = 30 * time.Second
	DefaultStartFailures  = 3
	DefaultCannotStart    = 5 * time.Minute
)

// Validate reports whether c is usable.
func (c Config) Validate() error {
	switch {
	case c.Command == nil:
		return errors.New("launcher: Command is required")
	case c.Model == "":
		return errors.New("launcher: Model is required")
	case c.Warmup < 0:
		return errors.New("launcher: Warmup must not be negative (NoWarmup turns it off)")
	case c.StartFailures < 0:
		return errors.New("launcher: StartFailures must not be negative")
	case c.StartupTimeout < 0, c.Progress < 0, c.PollInterval < 0, c.WarmupTimeout < 0,
		c.BackoffMin < 0, c.BackoffMax < 0, c.StableAfter < 0, c.StopGrace < 0, c.CannotStartBackoff < 0:
		return errors.New("launcher: durations must not be negative")
	}
	if d := c.withDefaults(); d.BackoffMin > d.BackoffMax {
		return fmt.Errorf("launcher: BackoffMin %s exceeds BackoffMax %s", d.BackoffMin, d.BackoffMax)
	}
	return nil
}

func (c Config) withDefaults() Config {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&c.StartupTimeout, DefaultStartupTimeout)
	def(&c.Progress, DefaultProgress)
	def(&c.PollInterval, DefaultPollInterval)
	def(&c.WarmupTimeout, DefaultWarmupTimeout)
	def(&c.BackoffMin, DefaultBackoffMin)
	def(&c.BackoffMax, DefaultBackoffMax)
	def(&c.StableAfter, DefaultStableAfter)
	def(&c.StopGrace, DefaultStopGrace)
	def(&c.CannotStartBackoff, DefaultCannotStart)
	if c.StartFailures == 0 {
		c.StartFailures = DefaultStartFailures
	}
	switch {
	case c.NoWarmup:
		c.Warmup = 0
	case c.Warmup == 0:
		c.Warmup = DefaultWarmup
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	return c
}

// Launcher supervises one engine process. Its accessors are safe for
// concurrent use; Run may be called once.
type Launcher struct {
	cfg    Config // defaults applied
	log    *slog.Logger
	client *http.Client
	ran    atomic.Bool

	errs errorTail // the engine's last error lines

	// cannotStart, when set, says the engine cannot start and why; starts
	// then report failed rather than starting. Only Run's goroutine uses it.
	cannotStart string
	saidKey     bool // the warning about an inherited VLLM_API_KEY was logged

	mu       sync.Mutex
	state    State
	reason   string
	socket   string // the engine's Unix socket; "" until Run made its directory
	url      string
	key      string // the API key of the engine at url
	pid      int
	restarts int
}

// New returns a launcher for cfg; nothing runs until [Launcher.Run].
func New(cfg Config) (*Launcher, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	l := &Launcher{
		cfg:    cfg,
		log:    cfg.Log,
		state:  serving.StateStarting,
		reason: "not started",
	}
	// No keep-alives: probes are rare, and each engine process is a new
	// server behind the same socket path.
	l.client = &http.Client{Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true,
		DialContext: hop.DialUnix(l.EngineSocket, probeTimeout)}}
	return l, nil
}

// State returns the replica state and why it is not ready, if it is not.
func (l *Launcher) State() (state State, reason string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.state, l.reason
}

// EngineURL returns the base URL requests to the current engine process
// carry, "http://localhost", or "" before the first start. Its host is a
// name only: connections go to [Launcher.EngineSocket].
func (l *Launcher) EngineURL() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.url
}

// EngineSocket returns the path of the Unix socket the engine listens on,
// the same for every start, or "" before Run made its directory.
func (l *Launcher) EngineSocket() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.socket
}

// EngineKey returns the API key of the current engine process, which every
// request to its /v1 paths must carry as "Authorization: Bearer KEY", or ""
// before the first start. It changes with each start, as EngineURL does.
func (l *Launcher) EngineKey() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.key
}

// Restarts returns how many times the engine was started again after its
// first start.
func (l *Launcher) Restarts() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.restarts
}

// EngineLog returns the engine's last error lines, oldest first: what it
// wrote to stderr and the error lines of its log, at most
// serving.MaxEngineLogLines, kept across restarts and forgotten each time
// the engine becomes ready. Nil when there are none.
func (l *Launcher) EngineLog() []string { return l.errs.snapshot() }

// PID returns the engine process id, or 0 when no engine runs.
func (l *Launcher) PID() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.pid
}

// setState records a state change and tells OnState. Only Run's goroutine
// calls it, so OnState sees changes in order.
func (l *Launcher) setState(state State, reason string) {
	l.mu.Lock()
	changed := state != l.state || reason != l.reason
	l.state, l.reason = state, reason
	l.mu.Unlock()
	if changed && l.cfg.OnState != nil {
		l.cfg.OnState(state, reason)
	}
}

// setReason updates the reason without a state change (progress while
// starting); OnState is not called.
func (l *Launcher) setReason(reason string) {
	l.mu.Lock()
	l.reason = reason
	l.mu.Unlock()
}

// Run supervises the engine until ctx is done, then stops its process group,
// reports the state failed with reason "engine stopped", and returns nil.
// It returns an error at once, without retrying, when the engine cannot be
// started at all (Command fails, or the executable is missing): that is a
// configuration error for a person to fix. An engine that rejects its
// command line as vLLM's argument parser does (exit status 2 with
// "PROG: error: …" on stderr, e.g. an unknown or removed flag) is not
// started again either: the state stays failed, with the engine's own
// message, until ctx is done, so the worker stays registered and says why.
func (l *Launcher) Run(ctx context.Context) error {
	if !l.ran.CompareAndSwap(false, true) {
		return errors.New("launcher: Run called twice")
	}
	dir, release, err := socketDir(l.log)
	if err != nil {
		l.setState(serving.StateFailed, err.Error())
		return fmt.Errorf("launcher: %w", err)
	}
	defer release()
	l.mu.Lock()
	l.socket = filepath.Join(dir, socketName)
	l.mu.Unlock()
	backoff := l.cfg.BackoffMin
	failedStarts := 0
	for attempt := 0; ctx.Err() == nil; attempt++ {
		run, err := l.runOnce(ctx, attempt > 0)
		if err != nil {
			l.setState(serving.StateFailed, err.Error())
			return fmt.Errorf("launcher: %w", err)
		}
		if ctx.Err() != nil {
			break
		}
		if said := l.rejectedArgs(run); said != "" {
			// The same command line would be rejected again: restarting
			// cannot help, a person must fix it.
			reason := fmt.Sprintf("engine rejected its command line (%v): %s; not restarting: fix the engine's arguments (tailgate's --vllm-arg) and restart the worker",
				run.startExit, said)
			l.log.Error("engine rejected its command line; not restarting", "exit", run.startExit, "said", said,
				"engine_log", l.errs.snapshot())
			l.setState(serving.StateFailed, reason)
			<-ctx.Done()
			break
		}
		if run.readyFor >= l.cfg.StableAfter {
			backoff = l.cfg.BackoffMin
		}
		failedStarts++
		if run.wasReady {
			failedStarts = 0
		}
		reason := run.reason
		if said := l.errs.lastSince(run.mark); said != "" {
			reason += "; last engine output: " + said
		}
		pause := backoff
		if failedStarts >= l.cfg.StartFailures {
			pause = l.cfg.CannotStartBackoff
			l.cannotStart = fmt.Sprintf("engine cannot start: %d starts in a row failed, the last: %s", failedStarts, reason)
			l.log.Error("engine cannot start", "failed_starts", failedStarts, "reason", reason,
				"retry_in", pause, "engine_log", l.errs.snapshot())
			l.setState(serving.StateFailed, fmt.Sprintf("%s; next try in %s", l.cannotStart, pause))
		} else {
			l.log.Warn("engine down; restarting", "reason", reason, "in", pause)
			l.setState(serving.StateFailed, fmt.Sprintf("%s; restarting in %s", reason, pause))
			backoff = min(2*backoff, l.cfg.BackoffMax)
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
		case <-t.C:
		}
	}
	l.setState(serving.StateFailed, "engine stopped")
	return nil
}

// errExited cancels an engine's context when its process exits.
var errExited = errors.New("engine exited")

// outcome is how one engine process went.
type outcome struct {
	wasReady bool          // it became ready
	readyFor time.Duration // for how long
	reason   string        // why it is gone; "" when Run's ctx ended
	mark     int64         // of the error tail at its start
	// startExit is how the process exited on its own before it was
	// ready; nil if it did not.
	startExit error
}

// rejectedArgs returns the engine's complaint about its command line when
// run ended as one rejected by Python's argparse: exit status 2 before the
// engine was ever ready, with an argparse error among the lines it wrote
// since its start. Else "".
func (l *Launcher) rejectedArgs(run outcome) string {
	var exit *exec.ExitError
	if run.wasReady || !errors.As(run.startExit, &exit) || exit.ExitCode() != 2 {
		return ""
	}
	return argumentError(l.errs.since(run.mark))
}

// starting returns the state of a start in progress with detail as its
// reason: starting, or failed while the engine is known not to start, so
// that a new try does not look like progress.
func (l *Launcher) starting(detail string) (State, string) {
	if l.cannotStart != "" {
		return serving.StateFailed, l.cannotStart + "; trying again: " + detail
	}
	return serving.StateStarting, detail
}

// runOnce runs one engine process from start to exit or to ctx's end and
// says how it went, or returns an error when it could not be started at
// all. A restart is counted once its process runs. The process has been
// stopped and its output read by the time runOnce returns.
func (l *Launcher) runOnce(ctx context.Context, restart bool) (run outcome, err error) {
	socket := l.EngineSocket()
	// A socket an engine left (one killed, or vLLM, which never removes
	// it) would make the next bind fail.
	if err := os.Remove(socket); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return run, fmt.Errorf("remove the old engine socket: %w", err)
	}
	argv, env, err := l.cfg.Command(socket)
	if err != nil {
		return run, err
	}
	if len(argv) == 0 {
		return run, errors.New("empty engine command")
	}
	key := newEngineKey()
	// Last, so it wins over a VLLM_API_KEY in Command's or the worker's
	// environment: the engine requires the key the launcher and the
	// sidecar send, never one they do not know.
	if _, inherited := os.LookupEnv(EngineKeyEnv); (inherited || slices.ContainsFunc(env, isEngineKey)) && !l.saidKey {
		l.saidKey = true
		l.log.Warn(EngineKeyEnv + " in the worker's environment is not the engine's key: each engine start gets a random one that only the launcher and the sidecar send; clients use tailgate API keys at the gateway")
	}
	env = append(slices.Clip(env), EngineKeyEnv+"="+key)
	run.mark = l.errs.mark()
	p, err := startEngine(argv, env, l.log, &l.errs)
	if err != nil {
		return run, err
	}
	url := "http://localhost"
	l.mu.Lock()
	l.pid, l.url, l.key = p.PID(), url, key
	if restart {
		l.restarts++
	}
	l.mu.Unlock()
	l.log.Info("engine started", "pid", p.PID(), "socket", socket, "argv", redact(argv))

	// pctx ends when ctx does or when the process exits, whichever is first.
	pctx, cancel := context.WithCancelCause(ctx)
	var watch sync.WaitGroup
	watch.Go(func() {
		select {
		case <-p.Done():
			cancel(errExited)
		case <-pctx.Done():
		}
	})
	defer func() {
		cancel(nil)
		watch.Wait()
		_ = p.Stop(l.cfg.StopGrace)
		l.mu.Lock()
		l.pid = 0
		l.mu.Unlock()
		l.log.Info("engine stopped", "pid", p.PID(), "exit", exitErr(p))
	}()
	gone := func(phase string, err error) string {
		if errors.Is(context.Cause(pctx), errExited) {
			run.startExit = exitErr(p)
			return fmt.Sprintf("engine exited %s: %v", phase, run.startExit)
		}
		return err.Error()
	}

	l.setState(l.starting(fmt.Sprintf("waiting for the engine to serve %q", l.cfg.Model)))
	if err := l.waitReady(pctx, url); err != nil {
		if ctx.Err() != nil {
			return run, nil
		}
		run.reason = gone("while starting", err)
		return run, nil
	}
	// vLLM binds with the umask's mode; the directory keeps others out
	// meanwhile.
	if err := os.Chmod(socket, 0o600); err != nil {
		run.reason = fmt.Sprintf("engine socket: %v", err)
		return run, nil
	}
	if l.cfg.Warmup > 0 {
		l.setState(serving.StateWarming, fmt.Sprintf("running %d warm-up requests", l.cfg.Warmup))
		if err := l.warmUp(pctx, url); err != nil {
			if ctx.Err() != nil {
				return run, nil
			}
			run.reason = gone("while warming up", err)
			return run, nil
		}
	}
	readySince := time.Now()
	run.wasReady = true
	l.cannotStart = ""
	l.errs.reset()
	l.setState(serving.StateReady, "")
	l.log.Info("engine ready", "pid", p.PID(), "socket", socket)
	<-pctx.Done()
	run.readyFor = time.Since(readySince)
	if ctx.Err() == nil {
		run.reason = fmt.Sprintf("engine exited: %v", exitErr(p))
	}
	return run, nil
}
