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
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tailgate-dev/tailgate/serving/proc"
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
	// Gateways is the number of gateways started, all with GatewayArgs;
	// more than one needs a shared --database in GatewayArgs. The later
	// ones get the first's cluster token, every worker registers with each,
	// and [Local.Target] spreads the requests over them. 0 means 1.
	Gateways int
	// KeyArgs are added to `keys create` for the bench's key (limits, a
	// tenant budget).
	KeyArgs []string
	// Static starts `tailgate sim` engines as the gateway's --upstream
	// instead of workers; such a fleet cannot kill or scale out.
	Static bool
	// Model is the model name served; "" means tailgate-sim.
	Model string
	// ReplicaPrefix starts every worker's replica id (then its number);
	// "" means "sim-". Fleets sharing one database need their own.
	ReplicaPrefix string
	// GatewayArgs are added to the gateway's command line; WorkerArgs to
	// every worker's (or sim's, when Static). Later flags win, so these
	// override the bench's own.
	GatewayArgs, WorkerArgs []string
	// Fleet runs `tailgate up` with the gateway's fleet controller instead
	// of a gateway and Replicas workers: the controller starts, stops and
	// replaces the workers (WorkerArgs are then up's sim knobs). nil: the
	// bench starts the workers itself.
	Fleet *FleetBounds
	// Replace starts a new worker ReplaceDelay after each one killed, as a
	// fleet manager would (not with Fleet: the controller replaces).
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
	cfg    LocalConfig
	dir    string
	ownDir bool
	api    string // http://host:port/v1
	admin  string // http://host:port
	// apis, admins and adminTokens are every gateway's, the first's first.
	apis, admins, adminTokens []string
	adminToken                string
	key                       string
	sims                      []string // static engines' base URLs (…/v1)
	upArgs                    []string // `tailgate up`'s command line, with Fleet

	mu      sync.Mutex
	gateway *child   // the first gateway
	more    []*child // the other gateways
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
	if f := cfg.Fleet; f != nil && (f.Min < 0 || f.Max < max(f.Min, 1) || f.Max > 32 || cfg.Static || cfg.Gateways > 1) {
		return nil, fmt.Errorf("local fleet: fleet controller bounds min %d, max %d: want 0 <= min <= max <= 32, one gateway, workers", f.Min, f.Max)
	}
	if cfg.Model == "" {
		cfg.Model = "tailgate-sim"
	}
	if cfg.StartupTimeout <= 0 {
		cfg.StartupTimeout = 60 * time.Second
	}
	if cfg.Gateways == 0 {
		cfg.Gateways = 1
	}
	if cfg.Gateways < 1 || cfg.Gateways > 8 || cfg.Gateways > 1 && cfg.Static {
		return nil, fmt.Errorf("local fleet: gateways must be from 1 to 8 (1 with static engines), not %d", cfg.Gateways)
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
	if cfg.Fleet != nil {
		if err := l.startUp(ctx); err != nil {
			return nil, err
		}
		if err := l.waitReady(ctx, cfg.Fleet.Min); err != nil {
			return nil, err
		}
		fmt.Fprintf(cfg.Log, "bench: fleet controller ready with %d replica(s) behind %s\n", cfg.Fleet.Min, l.api)
		return l, nil
	}

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
	// --open-registration: the bench starts its workers itself on loopback,
	// as `up` does, so the cluster token is all they need.
	gwArgs := []string{"gateway", "--data", filepath.Join(l.dir, "gateway"), "--listen", "127.0.0.1:0",
		"--admin-listen", "127.0.0.1:0", "--shutdown-grace", "2s", "--open-registration"}
	for _, u := range upstreams {
		gwArgs = append(gwArgs, "--upstream", u)
	}
	fmt.Fprintf(cfg.Log, "bench: starting %s and %d simulated replica(s) on 127.0.0.1 (files in %s)\n", plural(cfg.Gateways, "gateway"), cfg.Replicas, l.dir)
	if l.gateway, err = l.spawn("gateway", append(gwArgs, cfg.GatewayArgs...)); err != nil {
		return nil, err
	}
	m, err := l.waitLine(ctx, l.gateway, gatewayRE)
	if err != nil {
		return nil, err
	}
	l.api, l.admin = "http://"+m[1]+"/v1", "http://"+m[2]
	l.apis, l.admins = []string{l.api}, []string{l.admin}
	tok, err := os.ReadFile(filepath.Join(l.dir, "gateway", "admin.token"))
	if err != nil {
		return nil, fmt.Errorf("local fleet: %w", err)
	}
	l.adminToken = strings.TrimSpace(string(tok))
	l.adminTokens = []string{l.adminToken}
	if err := l.startMoreGateways(ctx); err != nil {
		return nil, err
	}
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
	l.key, err = l.CreateKey(ctx, "bench", l.cfg.KeyArgs...)
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
	id := orDefault(l.cfg.ReplicaPrefix, "sim-") + strconv.Itoa(i)
	var gws []string
	for _, a := range l.admins {
		gws = append(gws, "--gateway", a)
	}
	args := append(append([]string{"worker"}, gws...),
		"--cluster-token-file", filepath.Join(l.dir, "gateway", "cluster.token"),
		"--engine", "sim", "--model", l.cfg.Model, "--listen", "127.0.0.1:0", "--replica-id", id,
		"--data", filepath.Join(l.dir, "w-"+strconv.Itoa(i)), "--drain-grace", "1s", "--sim-seed", strconv.Itoa(i))
	args = append(args, l.cfg.WorkerArgs...)
	p, err := l.spawn(id, args)
	if err != nil {
		return "", err
	}
	l.workers = append(l.workers, p)
	return id, nil
}

// waitReady waits until every gateway answers /healthz and has n ready
// replicas.
func (l *Local) waitReady(ctx context.Context, n int) error {
	hc := &http.Client{Timeout: 2 * time.Second}
	for {
		// ready is the fewest any gateway has.
		ready := n
		for i := range l.admins {
			ready = min(ready, l.readyAt(ctx, hc, i))
		}
		if ready >= n {
			return nil
		}
		l.mu.Lock()
		var dead *child
		for _, p := range slices.Concat([]*child{l.gateway}, l.more, l.workers) {
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

// readyAt returns the number of ready replicas gateway i has, 0 until its
// /healthz says it can serve.
func (l *Local) readyAt(ctx context.Context, hc *http.Client, i int) int {
	ready := 0
	if reps, err := newAdmin(l.admins[i], l.adminTokens[i], "").replicas(ctx); err == nil {
		for _, r := range reps {
			if r.Ready {
				ready++
			}
		}
	}
	resp, err := hc.Get(strings.TrimSuffix(l.apis[i], "/v1") + "/healthz")
	if err != nil {
		return 0
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0
	}
	return ready
}

// Target returns the gateway as a bench target, admin access (the first
// gateway's) included; with several gateways the requests go to each in
// turn, as clients behind one DNS name with several addresses would.
func (l *Local) Target() Target {
	return Target{BaseURL: l.api, Also: l.apis[1:], Key: l.key, AdminURL: l.admin, AdminToken: l.adminToken, AdminTenant: "bench"}
}

// startMoreGateways starts gateways 2 to cfg.Gateways with the first's
// arguments, each with its own data directory holding the first's cluster
// token (so workers hold one token for all), and waits until each listens.
func (l *Local) startMoreGateways(ctx context.Context) error {
	tok, err := os.ReadFile(filepath.Join(l.dir, "gateway", "cluster.token"))
	if err != nil && l.cfg.Gateways > 1 {
		return fmt.Errorf("local fleet: %w", err)
	}
	for i := 2; i <= l.cfg.Gateways; i++ {
		name := fmt.Sprintf("gateway-%d", i)
		dir := filepath.Join(l.dir, name)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return fmt.Errorf("local fleet: %w", err)
		}
		if err := os.WriteFile(filepath.Join(dir, "cluster.token"), tok, 0o600); err != nil {
			return fmt.Errorf("local fleet: %w", err)
		}
		args := append([]string{"gateway", "--data", dir, "--listen", "127.0.0.1:0",
			"--admin-listen", "127.0.0.1:0", "--shutdown-grace", "2s", "--open-registration"}, l.cfg.GatewayArgs...)
		p, err := l.spawn(name, args)
		if err != nil {
			return err
		}
		l.mu.Lock()
		l.more = append(l.more, p)
		l.mu.Unlock()
		m, err := l.waitLine(ctx, p, gatewayRE)
		if err != nil {
			return err
		}
		adm, err := os.ReadFile(filepath.Join(dir, "admin.token"))
		if err != nil {
			return fmt.Errorf("local fleet: %w", err)
		}
		l.apis, l.admins = append(l.apis, "http://"+m[1]+"/v1"), append(l.admins, "http://"+m[2])
		l.adminTokens = append(l.adminTokens, strings.TrimSpace(string(adm)))
	}
	return nil
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
	if l.cfg.Fleet != nil {
		return l.killFleetWorkers(n)
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
	if l.cfg.Fleet != nil {
		return ActionResult{}, errors.New("the fleet controller decides how many workers run: drop scaleout from --phases")
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
		procs := slices.Concat(l.workers, l.others, l.more)
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
