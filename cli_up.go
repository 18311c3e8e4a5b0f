package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tailgate-dev/tailgate/server/gateway"
	"github.com/tailgate-dev/tailgate/serving/fleet"
	"github.com/tailgate-dev/tailgate/serving/launcher"
	"github.com/tailgate-dev/tailgate/serving/sim"
	"github.com/tailgate-dev/tailgate/serving/worker"
)

func cmdUp(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("up", "up [--data DIR] [--listen ADDR] [--admin-listen ADDR] [--replicas N] [--model NAME] [--sim-* knobs]", stderr)
	var (
		cfg       gateway.Config
		sf        sim.Flags
		lf        logFlags
		replicas  = fs.Int("replicas", 2, "number of local replicas to start")
		engine    = fs.String("engine", "sim", "engine of the local replicas: sim, or vllm (one GPU per replica: replica i gets GPU i-1)")
		model     = fs.String("model", "", "model the replicas serve (sim default: tailgate-sim; required with --engine vllm)")
		warmup    = fs.Int("warmup", 3, "short generations each replica runs before it takes traffic (0: none)")
		vllmBin   = fs.String("vllm-binary", "", "vllm executable of the local replicas (default: vllm on PATH)")
		vllmArgs  stringList
		fleetMin  = fs.Int("fleet-min", 0, "with --fleet-max: replicas the fleet controller keeps at least (0: scale to zero when idle)")
		fleetMax  = fs.Int("fleet-max", 0, "run the fleet controller instead of a fixed --replicas: at most this many local replicas, started as requests wait (0: off)")
		fleetIdle = fs.Duration("fleet-idle", 5*time.Minute, "with --fleet-max: stop a replica above --fleet-min after the model was idle this long")
		fleetNap  = fs.Duration("fleet-sleep-after", 0, "with --fleet-max: put the replicas to vLLM sleep (level 1) after the model was idle this long, wake one when requests wait, still stop after --fleet-idle (0: never sleep; the workers get --sleep-mode)")
		verbose   = fs.Bool("verbose", false, "on a terminal, show the whole log (workers and engines too) instead of warnings and one progress line; it is in DIR/up.log either way")
	)
	fs.Var(&vllmArgs, "vllm-arg", "extra argument for every vllm serve (repeatable)")
	cfg.RegisterFlags(fs)
	sf.Register(fs)
	lf.register(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	switch {
	case *engine != "sim" && *engine != "vllm":
		return fmt.Errorf("--engine %q: want sim or vllm", *engine)
	case *engine == "vllm" && *model == "":
		return errors.New("--engine vllm needs --model (a Hugging Face id or a local path)")
	case *model == "":
		*model = "tailgate-sim"
	}
	if *fleetMax == 0 && (*replicas < 1 || *replicas > 64) {
		return fmt.Errorf("--replicas must be between 1 and 64, not %d", *replicas)
	}
	if *warmup < 0 {
		return fmt.Errorf("--warmup %d: want 0 (none) or more", *warmup)
	}
	switch {
	case *fleetNap < 0:
		return fmt.Errorf("--fleet-sleep-after %s: want 0 (never) or more", *fleetNap)
	case *fleetNap > 0 && *fleetMax == 0:
		return errors.New("--fleet-sleep-after needs --fleet-max: the fleet controller puts replicas to sleep and wakes them")
	case sf.Check() != nil:
		return sf.Check()
	}
	if *engine == "vllm" {
		// A missing vLLM or a refused --vllm-arg would end every worker at
		// once, and up would restart them forever: say it once, before
		// starting anything.
		argv, _, err := launcher.VLLMCommand(launcher.VLLMOptions{Binary: *vllmBin, Model: *model, ExtraArgs: vllmArgs}, "engine.sock")
		if err != nil {
			return err
		}
		*vllmBin = argv[0]
	}
	if err := cfg.Load(fs); err != nil {
		return err
	}
	undo, opened := undoNewDir(cfg.DataDir), false
	defer func() {
		if !opened {
			undo() // after the screen closed its log in the directory
		}
	}()
	screen, err := newUpScreen(lf, stderr, cfg.DataDir, *verbose)
	if err != nil {
		return err
	}
	defer screen.close()
	log := screen.log
	cfg.BuildInfo = readBuildInfo().collector()
	gw, err := gateway.Open(ctx, cfg, log)
	if err != nil {
		return err
	}
	opened = true
	defer gw.Close()

	keyPath := filepath.Join(cfg.DataDir, "demo.key")
	if err := gw.EnsureDemoKey(ctx, keyPath); err != nil {
		return err
	}

	// up starts its workers itself: their ids are approved, so the cluster
	// token is all they need (one revoked comes back with the next up).
	ids := make([]string, *replicas)
	for i := range ids {
		ids[i] = fmt.Sprintf("worker-%d", i+1)
	}
	// The ids are this box's: a credential for one that its worker's
	// directory does not hold (a database restored from another box) is
	// revoked, not left to refuse the worker forever.
	held := func(id string) string {
		b, _ := os.ReadFile(worker.CredentialFile(filepath.Join(cfg.DataDir, id), id))
		return strings.TrimSpace(string(b))
	}
	adopt := func(ctx context.Context, ids ...string) error { return gw.AdoptWorkers(ctx, held, ids...) }
	if err := adopt(ctx, ids...); err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find own executable: %w", err)
	}
	argv := func(i int, id, model string) []string {
		childArgs := []string{"worker", "--gateway", "http://" + gw.AdminAddr(),
			"--cluster-token-file", filepath.Join(cfg.DataDir, "cluster.token"),
			"--data", filepath.Join(cfg.DataDir, id), "--listen", "127.0.0.1:0", "--replica-id", id,
			"--engine", *engine, "--model", model, "--log-level", lf.level, "--log-format", lf.format,
			"--warmup", fmt.Sprint(*warmup), "--upstream-client", cfg.UpstreamClient}
		if *fleetNap > 0 {
			childArgs = append(childArgs, "--sleep-mode")
		}
		childArgs = append(childArgs, cfg.Tracing.Args()...)
		switch *engine {
		case "sim":
			childArgs = append(childArgs, "--sim-seed", fmt.Sprint(sf.Seed()+int64(i)-1))
			childArgs = append(childArgs, sf.Args()...)
		case "vllm":
			childArgs = append(childArgs, "--gpus", fmt.Sprint(i-1), "--vllm-binary", *vllmBin)
			for _, a := range vllmArgs {
				childArgs = append(childArgs, "--vllm-arg", a)
			}
		}
		return append([]string{self}, childArgs...)
	}
	if *fleetMax > 0 {
		cfg.Fleet.Models = map[string]fleet.Model{*model: {Min: *fleetMin, Max: *fleetMax, IdleAfter: *fleetIdle, SleepAfter: *fleetNap}}
		gw.SetFleetModels(cfg.Fleet.Models)
	}
	// With models to manage, the fleet controller starts the replicas as
	// demand comes: child workers (--fleet-provider local), or the
	// operator's scripts.
	var n atomic.Int64
	local := &fleet.Local{Log: log, Approve: func(ctx context.Context, id string) error { return adopt(ctx, id) },
		Argv: func(model, id string) []string { return argv(int(n.Add(1)), id, model) }}
	if err := gw.UseConfiguredFleet(local); err != nil {
		return err
	}
	if cfg.Fleet.Enabled() {
		*replicas = 0
	}
	cctx, stopChildren := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for i := 1; i <= *replicas; i++ {
		id := fmt.Sprintf("worker-%d", i)
		c := &fleet.Child{Name: id, Argv: argv(i, id, *model), Log: screen.children.With("replica", id)}
		wg.Go(func() { c.Supervise(cctx) })
	}
	// On a clean stop the workers go once no request is left for them and
	// before the admin listener closes, so their last heartbeat (draining)
	// still reaches the gateway instead of reporting it unreachable.
	stopWorkers := func() { stopChildren(); wg.Wait() }
	gw.StopWorkersWith(stopWorkers)
	defer stopWorkers()
	admin := filepath.Join(cfg.DataDir, "admin.token")
	dash := gw.DashboardLink(isTerminal(stdout))
	what := "SIMULATED replica(s)"
	if *engine == "vllm" {
		what = "vLLM replica(s)"
	}
	fmt.Fprintf(stdout, `tailgate up: %d %s of model %q%s
  API        %s        key: %s
  dashboard  %s       admin token: %s
  metrics    curl -H "Authorization: Bearer $(cat %s)" http://%s/metrics
  try it:
    curl -N %s/chat/completions -H "Authorization: Bearer $(cat %s)" \
      -H 'Content-Type: application/json' \
      -d '{"model":"%s","stream":true,"messages":[{"role":"user","content":"Say hello"}]}'
`, *replicas, what, *model, simNote(*engine), gw.PublicURL(), keyPath, dash, admin, admin, gw.AdminAddr(), gw.PublicURL(), keyPath, *model)
	if screen.con != nil {
		fmt.Fprintf(stdout, "  log        %s (all of it; --verbose shows it here)\n", screen.logPath)
		context.AfterFunc(ctx, func() { screen.con.println("stopping: finishing in-flight requests, then the replicas…") })
	}
	p := &readiness{gw: gw, log: log, want: *replicas, con: screen.con, stdout: stdout,
		what: fmt.Sprintf("API %s — dashboard http://%s/ui/ — key: %s", gw.PublicURL(), gw.AdminAddr(), keyPath)}
	wg.Go(func() { p.run(cctx) })
	return gw.Run(ctx)
}

func simNote(engine string) string {
	if engine == "sim" {
		return " — answers are filler text, not a real model (structured outputs are filler that fits the schema)"
	}
	return ""
}
