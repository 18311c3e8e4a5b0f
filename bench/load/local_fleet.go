package load

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// FleetBounds runs the gateway's fleet controller over a local fleet:
// `tailgate up --fleet-min Min --fleet-max Max --fleet-idle Idle`, whose
// local provider starts and stops the workers as demand comes, and replaces
// one that dies. The bench then starts no worker itself.
type FleetBounds struct {
	Min, Max int
	// Idle is how long the model must be idle before the controller stops
	// a replica above Min; 0 means an hour (never, in a bench).
	Idle time.Duration
	// SleepAfter is how long the model must be idle before the controller
	// puts its replicas to vLLM sleep (up --fleet-sleep-after); 0: never.
	SleepAfter time.Duration
}

// upRE reads the addresses `tailgate up` prints (its stdout is not a
// terminal here, so the dashboard line is its address and the token file).
var upRE = regexp.MustCompile(`API\s+http://(\S+)/v1\s[\s\S]*?dashboard\s+http://(\S+)/ui/`)

// startUp starts `tailgate up` with the fleet controller: the gateway and,
// as the controller decides, its workers, all under one child. WorkerArgs
// are up's sim knobs (up passes them to each worker's engine).
func (l *Local) startUp(ctx context.Context) error {
	f := l.cfg.Fleet
	idle := f.Idle
	if idle <= 0 {
		idle = time.Hour
	}
	args := []string{"up", "--data", filepath.Join(l.dir, "gateway"), "--listen", "127.0.0.1:0",
		"--admin-listen", "127.0.0.1:0", "--shutdown-grace", "2s", "--model", l.cfg.Model,
		"--fleet-min", strconv.Itoa(f.Min), "--fleet-max", strconv.Itoa(f.Max), "--fleet-idle", idle.String()}
	if f.SleepAfter > 0 {
		args = append(args, "--fleet-sleep-after", f.SleepAfter.String())
	}
	args = append(append(args, l.cfg.WorkerArgs...), l.cfg.GatewayArgs...)
	l.upArgs = args
	fmt.Fprintf(l.cfg.Log, "bench: starting tailgate up with the fleet controller (min %d, max %d, idle %s, sleep after %s) on 127.0.0.1 (files in %s)\n",
		f.Min, f.Max, idle, f.SleepAfter, l.dir)
	var err error
	if l.gateway, err = l.spawn("up", args); err != nil {
		return err
	}
	m, err := l.waitLine(ctx, l.gateway, upRE)
	if err != nil {
		return err
	}
	l.api, l.admin = "http://"+m[1]+"/v1", "http://"+m[2]
	l.apis, l.admins = []string{l.api}, []string{l.admin}
	tok, err := os.ReadFile(filepath.Join(l.dir, "gateway", "admin.token"))
	if err != nil {
		return fmt.Errorf("local fleet: %w", err)
	}
	l.adminToken = strings.TrimSpace(string(tok))
	l.adminTokens = []string{l.adminToken}
	return l.createKey(ctx)
}

// fleetWorker is a worker process `up`'s fleet controller started.
type fleetWorker struct {
	pid int
	id  string // its --replica-id
}

// fleetWorkers lists the worker processes that are children of `up`, in
// replica id order. It reads /proc (Linux, as the rest of the local fleet:
// its children die with it by Pdeathsig).
func (l *Local) fleetWorkers() ([]fleetWorker, error) {
	up := l.gateway.PID()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("find the fleet's workers: %w", err)
	}
	var out []fleetWorker
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue // gone meanwhile
		}
		// pid (comm) state ppid …: comm may hold spaces and parentheses.
		i := strings.LastIndexByte(string(stat), ')')
		fields := strings.Fields(string(stat[i+1:]))
		if i < 0 || len(fields) < 2 || fields[1] != strconv.Itoa(up) {
			continue
		}
		raw, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		argv := strings.Split(strings.TrimRight(string(raw), "\x00"), "\x00")
		if j := slices.Index(argv, "--replica-id"); j > 0 && j+1 < len(argv) && slices.Contains(argv, "worker") {
			out = append(out, fleetWorker{pid: pid, id: argv[j+1]})
		}
	}
	slices.SortFunc(out, func(a, b fleetWorker) int { return strings.Compare(a.id, b.id) })
	return out, nil
}

// killFleetWorkers SIGKILLs n of the fleet controller's workers (each its
// process group: the worker and its engine), lowest replica id first. The
// replacement is the controller's business, not the bench's.
func (l *Local) killFleetWorkers(n int) (ActionResult, error) {
	ws, err := l.fleetWorkers()
	if err != nil {
		return ActionResult{}, err
	}
	var res ActionResult
	for _, w := range ws {
		if len(res.Replicas) == n {
			break
		}
		// Each worker leads its own process group (serving/proc).
		if err := syscall.Kill(-w.pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
			return res, fmt.Errorf("kill %s: %w", w.id, err)
		}
		res.Replicas = append(res.Replicas, w.id)
	}
	res.Output = "replaced by the gateway's fleet controller: up's local provider starts the worker again under its replica id"
	if len(res.Replicas) < n {
		return res, fmt.Errorf("only %d live workers to kill, not %d", len(res.Replicas), n)
	}
	return res, nil
}

// coldStart analyzes a run on this fleet from zero replicas, with the
// engine load and wake times and idle periods `up` was given (a later flag
// wins).
func (l *Local) coldStart(rep *Report) *ColdStartReport {
	idle, _ := time.ParseDuration(lastFlag(l.upArgs, "--fleet-idle"))
	nap, _ := time.ParseDuration(lastFlag(l.upArgs, "--fleet-sleep-after"))
	return coldStart(rep, coldStartFleet{StartDelay: lastFlag(l.upArgs, "--sim-start-delay"), WakeDelay: lastFlag(l.upArgs, "--sim-wake-delay"),
		Idle: idle, SleepAfter: nap})
}

// lastFlag is the value of the last --name in args ("--name v" or
// "--name=v"); "" when absent.
func lastFlag(args []string, name string) string {
	v := ""
	for i, a := range args {
		switch {
		case a == name && i+1 < len(args):
			v = args[i+1]
		case strings.HasPrefix(a, name+"="):
			v = strings.TrimPrefix(a, name+"=")
		}
	}
	return v
}
