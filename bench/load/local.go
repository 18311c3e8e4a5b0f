package load

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"tailgate/serving/proc"
)

// LocalConfig configures a fleet of tailgate processes on loopback.
type LocalConfig struct {
	// Binary is the tailgate executable; required.
	Binary string
	// Dir holds the gateway's data, the workers' and the logs; "" means a
	// new temporary directory, removed by Close unless Keep.
	Dir  string
	Keep bool
	// Replicas is the number of replicas started with the gateway.
	Replicas int
	// Static starts `tailgate sim` engines as the gateway's --upstream
	// instead of workers; such a fleet cannot kill or scale out.
	Static bool
	// Model is the model name served; "" means tailgate-sim.
	Model string
	// GatewayArgs are added to the gateway's command line; WorkerArgs to
	// every worker's (or sim's, when Static). Later flags win, so these
	// override the bench's own.
	GatewayArgs, WorkerArgs []string
	// Replace starts a new worker ReplaceDelay after each one killed, as a
	// fleet manager would.
	Replace      bool
	ReplaceDelay time.Duration
	// StartupTimeout bounds the start of the gateway and of the first
	// replicas; 0 means 60s.
	StartupTimeout time.Duration
	// Log receives a line per lifecycle step; nil discards them.
	Log io.Writer
}

// Local is a running fleet: a gateway and its replicas, each a child process
// in its own process group.
type Local struct {
	cfg        LocalConfig
	dir        string
	ownDir     bool
	api        string // http://host:port/v1
	admin      string // http://host:port
	adminToken string
	key        string
	sims       []string // static engines' base URLs (…/v1)

	mu      sync.Mutex
	gateway *child
	workers []*child // every worker started, in order
	others  []*child // static sims
	next    int      // number of the next worker
	closed  bool
	once    sync.Once
}

// child is one process of the fleet, the leader of its own process group.
type child struct {
	*proc.Process
	name    string
	logPath string
	log     *os.File // its output, one line per line
	killed  bool
}

func (p *child) alive() bool {
	select {
	case <-p.Done():
		return false
	default:
		return true
	}
}

// StartLocal starts the gateway and cfg.Replicas replicas and returns once
// they are all ready.
func StartLocal(ctx context.Context, cfg LocalConfig) (_ *Local, err error) {
	if cfg.Binary == "" {
		return nil, errors.New("local fleet: the tailgate binary is required")
	}
	if cfg.Replicas < 1 || cfg.Replicas > 32 {
		return nil, fmt.Errorf("local fleet: replicas must be from 1 to 32, not %d", cfg.Replicas)
	}
	if cfg.Model == "" {
		cfg.Model = "tailgate-sim"
	}
	if cfg.StartupTimeout <= 0 {
		cfg.StartupTimeout = 60 * time.Second
	}
	if cfg.Log == nil {
		cfg.Log = io.Discard
	}
	l := &Local{cfg: cfg, dir: cfg.Dir, next: 1}
	if l.dir == "" {
		if l.dir, err = os.MkdirTemp("", "tailgate-bench-"); err != nil {
			return nil, fmt.Errorf("local fleet: %w", err)
		}
		l.ownDir = true
	}
	defer func() {
		if err != nil {
			l.Close()
		}
	}()
	if err := os.MkdirAll(filepath.Join(l.dir, "logs"), 0o700); err != nil {
		return nil, fmt.Errorf("local fleet: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.StartupTimeout)
	defer cancel()

	var upstreams []string
	if cfg.Static {
		for i := 1; i <= cfg.Replicas; i++ {
			name := fmt.Sprintf("sim-%d", i)
			args := append([]string{"sim", "--listen", "127.0.0.1:0", "--announce", "--model", cfg.Model,
				"--sim-seed", strconv.Itoa(i)}, cfg.WorkerArgs...)
			p, err := l.spawn(name, args)
			if err != nil {
				return nil, err
			}
			l.others = append(l.others, p)
			m, err := l.waitLine(ctx, p, announceRE)
			if err != nil {
				return nil, err
			}
			upstreams = append(upstreams, "http://"+m[1])
			l.sims = append(l.sims, "http://"+m[1]+"/v1")
		}
	}
	gwArgs := []string{"gateway", "--data", filepath.Join(l.dir, "gateway"), "--listen", "127.0.0.1:0",
		"--admin-listen", "127.0.0.1:0", "--shutdown-grace", "2s"}
	for _, u := range upstreams {
		gwArgs = append(gwArgs, "--upstream", u)
	}
	fmt.Fprintf(cfg.Log, "bench: starting a gateway and %d simulated replica(s) on 127.0.0.1 (files in %s)\n", cfg.Replicas, l.dir)
	if l.gateway, err = l.spawn("gateway", append(gwArgs, cfg.GatewayArgs...)); err != nil {
		return nil, err
	}
	m, err := l.waitLine(ctx, l.gateway, gatewayRE)
	if err != nil {
		return nil, err
	}
	l.api, l.admin = "http://"+m[1]+"/v1", "http://"+m[2]
	tok, err := os.ReadFile(filepath.Join(l.dir, "gateway", "admin.token"))
	if err != nil {
		return nil, fmt.Errorf("local fleet: %w", err)
	}
	l.adminToken = strings.TrimSpace(string(tok))
	if err := l.createKey(ctx); err != nil {
		return nil, err
	}
	if !cfg.Static {
		for range cfg.Replicas {
			if _, err := l.startWorker(); err != nil {
				return nil, err
			}
		}
	}
	if err := l.waitReady(ctx, cfg.Replicas); err != nil {
		return nil, err
	}
	fmt.Fprintf(cfg.Log, "bench: %d replica(s) ready behind %s\n", cfg.Replicas, l.api)
	return l, nil
}

var (
	gatewayRE  = regexp.MustCompile(`API http://(\S+)/v1\s+admin http://(\S+)/ui/`)
	announceRE = regexp.MustCompile(`(?m)^TAILGATE_LISTEN (\S+)`)
)

// spawn starts a child in its own process group, its output in a log file
// (closed by Close). The child is killed if the bench dies.
func (l *Local) spawn(name string, args []string) (*child, error) {
	logPath := filepath.Join(l.dir, "logs", name+".log")
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("local fleet: %w", err)
	}
	sink := proc.LineWriter(f, "")
	p, err := proc.Start(proc.Config{Argv: append([]string{l.cfg.Binary}, args...), Stdout: sink, Stderr: sink})
	if err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("local fleet: start %s: %w", name, err)
	}
	return &child{Process: p, name: name, logPath: logPath, log: f}, nil
}

// waitLine waits for a line matching re in p's log.
func (l *Local) waitLine(ctx context.Context, p *child, re *regexp.Regexp) ([]string, error) {
	for {
		raw, _ := os.ReadFile(p.logPath)
		if m := re.FindStringSubmatch(string(raw)); m != nil {
			return m, nil
		}
		select {
		case <-p.Done():
			return nil, fmt.Errorf("local fleet: %s exited during startup:\n%s", p.name, tail(p.logPath))
		case <-ctx.Done():
			return nil, fmt.Errorf("local fleet: %s did not start: %w\n%s", p.name, ctx.Err(), tail(p.logPath))
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// tail returns the last lines of a log file, for error messages.
func tail(path string) string {
	raw, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimRight(string(raw), "\n"), "\n")
	if len(lines) > 15 {
		lines = lines[len(lines)-15:]
	}
	return "  " + strings.Join(lines, "\n  ")
}

func (l *Local) createKey(ctx context.Context) (err error) {
	l.key, err = l.CreateKey(ctx, "bench")
	return err
}

// CreateKey creates another API key on the fleet's gateway, of tenant and
// with `keys create` flags args (e.g. "--class", "interactive"), and
// returns its secret.
func (l *Local) CreateKey(ctx context.Context, tenant string, args ...string) (string, error) {
	argv := append([]string{"keys", "create", "--data", filepath.Join(l.dir, "gateway"), "--tenant", tenant}, args...)
	cmd := exec.CommandContext(ctx, l.cfg.Binary, argv...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("local fleet: keys create: %w: %s", err, strings.TrimSpace(stderr.String()))
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	key := strings.TrimSpace(lines[len(lines)-1])
	if key == "" {
		return "", errors.New("local fleet: keys create printed no key")
	}
	return key, nil
}

// startWorker starts worker number l.next.
func (l *Local) startWorker() (string, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return "", errors.New("local fleet: closed")
	}
	i := l.next
	l.next++
	id := fmt.Sprintf("sim-%d", i)
	args := append([]string{"worker", "--gateway", l.admin,
		"--cluster-token-file", filepath.Join(l.dir, "gateway", "cluster.token"),
		"--engine", "sim", "--model", l.cfg.Model, "--listen", "127.0.0.1:0", "--replica-id", id,
		"--data", filepath.Join(l.dir, "w-"+strconv.Itoa(i)), "--drain-grace", "1s", "--sim-seed", strconv.Itoa(i)},
		l.cfg.WorkerArgs...)
	p, err := l.spawn(id, args)
	if err != nil {
		return "", err
	}
	l.workers = append(l.workers, p)
	return id, nil
}

// waitReady waits for /healthz and for n ready replicas.
func (l *Local) waitReady(ctx context.Context, n int) error {
	adm := newAdmin(l.admin, l.adminToken, "")
	hc := &http.Client{Timeout: 2 * time.Second}
	health := strings.TrimSuffix(l.api, "/v1") + "/healthz"
	for {
		ready := 0
		if reps, err := adm.replicas(ctx); err == nil {
			for _, r := range reps {
				if r.Ready {
					ready++
				}
			}
		}
		if ready >= n {
			if resp, err := hc.Get(health); err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					return nil
				}
			}
		}
		l.mu.Lock()
		var dead *child
		for _, p := range append([]*child{l.gateway}, l.workers...) {
			if !p.killed && !p.alive() {
				dead = p
			}
		}
		l.mu.Unlock()
		if dead != nil {
			return fmt.Errorf("local fleet: %s exited during startup:\n%s", dead.name, tail(dead.logPath))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("local fleet: %d of %d replicas ready: %w (logs in %s)", ready, n, ctx.Err(), filepath.Join(l.dir, "logs"))
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Target returns the gateway as a bench target, admin access included.
func (l *Local) Target() Target {
	return Target{BaseURL: l.api, Key: l.key, AdminURL: l.admin, AdminToken: l.adminToken, AdminTenant: "bench"}
}

// Engines returns the base URLs (…/v1) of a static fleet's engines.
func (l *Local) Engines() []string { return l.sims }

// Dir returns the fleet's directory (gateway data, logs).
func (l *Local) Dir() string { return l.dir }

// Kill SIGKILLs the n lowest-numbered live workers — each worker's whole
// process group; its engine dies with it — then, with Replace, starts as
// many new workers after ReplaceDelay.
func (l *Local) Kill(ctx context.Context, n int) (ActionResult, error) {
	if l.cfg.Static {
		return ActionResult{}, errors.New("this scenario has no workers to kill")
	}
	var victims []*child
	l.mu.Lock()
	for _, p := range l.workers {
		if len(victims) < n && !p.killed && p.alive() {
			victims = append(victims, p)
		}
	}
	for _, p := range victims {
		p.killed = true
	}
	l.mu.Unlock()
	var res ActionResult
	var stops sync.WaitGroup
	for _, p := range victims {
		stops.Go(func() { _ = p.Stop(0) })
		res.Replicas = append(res.Replicas, p.name)
	}
	stops.Wait()
	var err error
	if len(victims) < n {
		err = fmt.Errorf("only %d live workers to kill, not %d", len(victims), n)
	}
	if !l.cfg.Replace || len(victims) == 0 {
		return res, err
	}
	if !sleepUntil(ctx, time.Now().Add(l.cfg.ReplaceDelay)) {
		return res, errors.Join(err, ctx.Err())
	}
	for range victims {
		at := time.Now()
		id, serr := l.startWorker()
		if serr != nil {
			return res, errors.Join(err, serr)
		}
		res.Replacements = append(res.Replacements, Replacement{ID: id, At: at})
	}
	return res, err
}

// ScaleOut starts n more workers; they register and warm up on their own.
func (l *Local) ScaleOut(ctx context.Context, n int) (ActionResult, error) {
	if l.cfg.Static {
		return ActionResult{}, errors.New("this scenario has no workers to scale out")
	}
	var res ActionResult
	for range n {
		id, err := l.startWorker()
		if err != nil {
			return res, err
		}
		res.Replicas = append(res.Replicas, id)
	}
	return res, nil
}

// Close stops every process group at once (SIGTERM, then SIGKILL after 6s)
// and removes the directory it made unless Keep. It is safe to call twice.
func (l *Local) Close() error {
	l.once.Do(func() {
		l.mu.Lock()
		l.closed = true
		procs := append(append([]*child{}, l.workers...), l.others...)
		if l.gateway != nil {
			procs = append(procs, l.gateway)
		}
		l.mu.Unlock()
		var stops sync.WaitGroup
		for _, p := range procs {
			stops.Go(func() {
				_ = p.Stop(6 * time.Second)
				_ = p.log.Close()
			})
		}
		stops.Wait()
		if l.ownDir && !l.cfg.Keep {
			_ = os.RemoveAll(l.dir)
		}
	})
	return nil
}
