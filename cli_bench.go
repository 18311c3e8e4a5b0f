package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"tailgate/bench/load"
)

// benchSide is one target (or one configuration of a scenario) of a run.
type benchSide struct {
	label          string
	target         string
	key, keyFile   string
	admin          string
	adminTokenFile string
	model          string
	gatewayArgs    string // scenario: extra gateway flags
	workerArgs     string // scenario: extra worker (or sim) flags
}

type benchFlags struct {
	scenario string
	a, b     benchSide
	compare  bool

	adminTenant    string
	replicas       int
	replace        bool
	replaceDelay   time.Duration
	keep           bool
	startupTimeout time.Duration

	rate           float64
	concurrency    int
	phases         string
	seed           int64
	promptTokens   string
	outputTokens   string
	streamFraction float64
	replay         string
	endpoint       string
	ignoreEOS      bool
	timeout        time.Duration
	keepAlive      bool
	maxConns       int
	maxInflight    int

	onKill, onScaleOut string
	hookTimeout        time.Duration

	jsonOut, htmlOut string
	window           time.Duration
	sampleInterval   time.Duration
	quiet            bool
}

func (f *benchFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.scenario, "scenario", "", "run a built-in scenario on a local fleet the bench starts: failover, burst, scaleout, overhead (list: describe them)")
	fs.StringVar(&f.a.target, "target", "", "OpenAI base URL of the deployment under test, ending in /v1 (instead of --scenario)")
	fs.StringVar(&f.a.key, "key", "", "API key for --target")
	fs.StringVar(&f.a.keyFile, "key-file", "", "file holding the API key for --target")
	fs.StringVar(&f.a.admin, "admin", "", "tailgate admin URL of the target (http://host:8081): stage timings of streams and replica queue depth")
	fs.StringVar(&f.a.adminTokenFile, "admin-token-file", "", "file holding the admin token (the gateway's DIR/admin.token)")
	fs.StringVar(&f.adminTenant, "admin-tenant", "", "tenant of --key, to find its requests among the admin API's recent requests")
	fs.StringVar(&f.a.model, "model", "", "model to ask for (default: the scenario's, or the target's first model)")
	fs.StringVar(&f.a.label, "label", "", "name of the (first) target in the report")
	fs.StringVar(&f.a.gatewayArgs, "gateway-args", "", "scenario: extra flags for the gateway, e.g. \"--default-max-tokens 256\"")
	fs.StringVar(&f.a.workerArgs, "worker-args", "", "scenario: extra flags for every worker (sim knobs), e.g. \"--sim-stall-prob 0.02\"")

	fs.BoolVar(&f.compare, "compare", false, "run the same seeded workload twice, against A and B, and print them side by side")
	fs.StringVar(&f.b.target, "target-b", "", "compare: B's base URL (any OpenAI-compatible server)")
	fs.StringVar(&f.b.key, "key-b", "", "compare: B's API key (default: --key)")
	fs.StringVar(&f.b.keyFile, "key-file-b", "", "compare: file holding B's API key")
	fs.StringVar(&f.b.admin, "admin-b", "", "compare: B's tailgate admin URL")
	fs.StringVar(&f.b.adminTokenFile, "admin-token-file-b", "", "compare: B's admin token file")
	fs.StringVar(&f.b.model, "model-b", "", "compare: B's model (default: --model)")
	fs.StringVar(&f.b.label, "label-b", "", "compare: name of B in the report")
	fs.StringVar(&f.b.gatewayArgs, "b-gateway-args", "", "compare a scenario: extra gateway flags for B only")
	fs.StringVar(&f.b.workerArgs, "b-worker-args", "", "compare a scenario: extra worker flags for B only")

	fs.IntVar(&f.replicas, "replicas", 0, "scenario: replicas started (default: the scenario's)")
	fs.BoolVar(&f.replace, "replace", true, "scenario: start a replacement worker after each kill, as a fleet manager would")
	fs.DurationVar(&f.replaceDelay, "replace-delay", 0, "scenario: how long after a kill the replacement starts")
	fs.BoolVar(&f.keep, "keep", false, "scenario: keep the fleet's directory (gateway data, logs) and print where it is")
	fs.DurationVar(&f.startupTimeout, "startup-timeout", time.Minute, "scenario: how long the fleet may take to be ready")

	fs.Float64Var(&f.rate, "rate", 0, "open loop: Poisson arrivals per second (default 10, or the scenario's)")
	fs.IntVar(&f.concurrency, "concurrency", 0, "closed loop: clients sending back to back (instead of --rate)")
	fs.StringVar(&f.phases, "phases", "", "phases, e.g. steady:30s,burst:10s:x3,kill:1,steady:20s,scaleout:1,steady:20s (default steady:30s, or the scenario's)")
	fs.Int64Var(&f.seed, "seed", 1, "seed of the request sequence and the schedule: the same seed sends the same requests at the same times")
	fs.StringVar(&f.promptTokens, "prompt-tokens", "", "prompt length distribution: N, lognormal:MEDIAN:SPREAD or uniform:MIN:MAX (default lognormal:256:0.5)")
	fs.StringVar(&f.outputTokens, "output-tokens", "", "output length distribution (default lognormal:64:0.5)")
	fs.Float64Var(&f.streamFraction, "stream-fraction", 0.5, "share of requests that stream, 0..1")
	fs.StringVar(&f.replay, "replay", "", "JSONL file of requests to replay in order (bodies, or {\"prompt_tokens\":N,\"output_tokens\":M})")
	fs.StringVar(&f.endpoint, "endpoint", "chat", "chat (/v1/chat/completions) or completions (/v1/completions)")
	fs.BoolVar(&f.ignoreEOS, "ignore-eos", true, "send ignore_eos so the engine generates exactly the drawn length (vLLM, tailgate; turn off for OpenAI's API)")
	fs.DurationVar(&f.timeout, "timeout", 30*time.Second, "deadline of one request")
	fs.BoolVar(&f.keepAlive, "keepalive", true, "reuse connections (false: a new connection per request)")
	fs.IntVar(&f.maxConns, "max-conns", 0, "cap on the client's connections (0: none); waiting for one counts in latency")
	fs.IntVar(&f.maxInflight, "max-inflight", 4096, "open loop: cap on requests in flight; arrivals beyond it are errors (client_overload)")

	fs.StringVar(&f.onKill, "on-kill", "", "external target: shell command run at a kill phase (env TAILGATE_BENCH_COUNT; may print the replica ids it killed)")
	fs.StringVar(&f.onScaleOut, "on-scaleout", "", "external target: shell command run at a scaleout phase (may print the new replica ids)")
	fs.DurationVar(&f.hookTimeout, "hook-timeout", 2*time.Minute, "deadline of one hook command")

	fs.StringVar(&f.jsonOut, "json", "", "write the full report (every request, replica samples) as JSON to this file")
	fs.StringVar(&f.htmlOut, "html", "", "write a self-contained HTML report (TTFT over time, per-phase CDFs) to this file")
	fs.DurationVar(&f.window, "window", 10*time.Second, "failover window: latency and queue figures cover this long after a kill or scale-out")
	fs.DurationVar(&f.sampleInterval, "sample-interval", 250*time.Millisecond, "how often the admin API's replica list is sampled")
	fs.BoolVar(&f.quiet, "quiet", false, "no progress line on stderr")
}

const benchSynopsis = `bench (--scenario NAME | --target URL [--key KEY]) [--rate R | --concurrency C] [--phases LIST] [--seed N] [--json F] [--html F] [--compare ...]

Examples:
  tailgate bench --scenario failover --html failover.html
  tailgate bench --target http://gw:8080/v1 --key-file team.key --admin http://gw:8081 \
      --admin-token-file admin.token --rate 20 --phases steady:60s,burst:20s:x3,steady:30s
  tailgate bench --scenario failover --compare --b-worker-args "--sim-stall-prob 0.05"
  tailgate bench --target http://gw:8080/v1 --key K --compare --target-b http://vllm:8000/v1`

func cmdBench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("bench", benchSynopsis, stderr)
	var f benchFlags
	f.register(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q (flags only)", fs.Arg(0))
	}
	set := map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { set[fl.Name] = true })
	if f.scenario == "list" {
		return listScenarios(stdout)
	}
	plan, sc, err := f.resolve(set)
	if err != nil {
		return err
	}
	var progress io.Writer
	tty := false
	if !f.quiet {
		progress = stderr
		if fl, ok := stderr.(*os.File); ok {
			if st, err := fl.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
				tty = true
			}
		}
	}
	b := &bench{flags: &f, plan: plan, scenario: sc, stdout: stdout, stderr: stderr, progress: progress, tty: tty}
	// Every run is bounded: the phases, the drain, the fleet's start and
	// each hook, with room to spare.
	bound := 2*(plan.Length+f.timeout) + 2*f.startupTimeout + time.Duration(len(plan.Actions))*f.hookTimeout + time.Minute
	ctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	return b.run(ctx)
}

// resolve applies the scenario's defaults to the flags the user did not set.
func (f *benchFlags) resolve(set map[string]bool) (load.Plan, *load.Scenario, error) {
	var sc *load.Scenario
	switch {
	case f.scenario != "" && f.a.target != "":
		return load.Plan{}, nil, errors.New("give --scenario or --target, not both")
	case f.scenario == "" && f.a.target == "":
		return load.Plan{}, nil, errors.New("give --scenario NAME (a local fleet; try --scenario failover) or --target URL (a deployment)")
	case f.scenario != "":
		s, ok := load.LookupScenario(f.scenario)
		if !ok {
			return load.Plan{}, nil, fmt.Errorf("unknown scenario %q: want failover, burst, scaleout or overhead", f.scenario)
		}
		sc = &s
		if f.onKill != "" || f.onScaleOut != "" {
			return load.Plan{}, nil, errors.New("--on-kill and --on-scaleout are for --target; a scenario kills and starts its own workers")
		}
		if f.b.target != "" {
			return load.Plan{}, nil, errors.New("--target-b is for comparing --target deployments; compare scenario configurations with --b-gateway-args/--b-worker-args")
		}
		if !set["replicas"] {
			f.replicas = s.Replicas
		}
		if !set["rate"] && !set["concurrency"] {
			f.rate = s.Rate
		}
		if !set["phases"] {
			f.phases = s.Phases
		}
		if !set["prompt-tokens"] {
			f.promptTokens = s.Prompt
		}
		if !set["output-tokens"] {
			f.outputTokens = s.Output
		}
		if !set["stream-fraction"] {
			f.streamFraction = s.StreamFraction
		}
		if f.a.model == "" {
			f.a.model = "tailgate-sim"
		}
	default:
		if f.compare && f.b.target == "" {
			return load.Plan{}, nil, errors.New("--compare with --target needs --target-b")
		}
		if f.b.gatewayArgs != "" || f.b.workerArgs != "" || f.a.gatewayArgs != "" || f.a.workerArgs != "" {
			return load.Plan{}, nil, errors.New("--gateway-args and --worker-args configure a --scenario's own fleet")
		}
	}
	if f.b.target != "" {
		f.compare = true
	}
	if f.compare && sc != nil && !sc.Static && f.b.gatewayArgs == "" && f.b.workerArgs == "" {
		return load.Plan{}, nil, errors.New("--compare with a scenario needs B's configuration: --b-gateway-args or --b-worker-args")
	}
	if set["rate"] && set["concurrency"] {
		return load.Plan{}, nil, errors.New("give --rate (open loop) or --concurrency (closed loop), not both")
	}
	if set["concurrency"] {
		f.rate = 0
		if f.concurrency < 1 {
			return load.Plan{}, nil, errors.New("--concurrency must be at least 1")
		}
	} else if f.rate == 0 {
		f.rate = 10
	}
	if f.rate < 0 {
		return load.Plan{}, nil, errors.New("--rate must be positive")
	}
	if f.phases == "" {
		f.phases = "steady:30s"
	}
	if f.promptTokens == "" {
		f.promptTokens = "lognormal:256:0.5"
	}
	if f.outputTokens == "" {
		f.outputTokens = "lognormal:64:0.5"
	}
	if f.endpoint != "chat" && f.endpoint != "completions" {
		return load.Plan{}, nil, fmt.Errorf("--endpoint %q: want chat or completions", f.endpoint)
	}
	if f.timeout <= 0 || f.window <= 0 || f.sampleInterval < 10*time.Millisecond {
		return load.Plan{}, nil, errors.New("--timeout and --window must be positive, --sample-interval at least 10ms")
	}
	phases, err := load.ParsePhases(f.phases)
	if err != nil {
		return load.Plan{}, nil, fmt.Errorf("--phases: %w", err)
	}
	plan, err := load.NewPlan(phases)
	if err != nil {
		return load.Plan{}, nil, fmt.Errorf("--phases: %w", err)
	}
	if len(plan.Actions) > 0 && sc == nil {
		for _, a := range plan.Actions {
			if (a.Kind == load.Kill && f.onKill == "") || (a.Kind == load.ScaleOut && f.onScaleOut == "") {
				return load.Plan{}, nil, fmt.Errorf("the phases include %s: against --target it needs --on-%s CMD (or run a --scenario)", a.Kind, a.Kind)
			}
		}
	}
	if sc != nil && sc.Static && len(plan.Actions) > 0 {
		return load.Plan{}, nil, fmt.Errorf("scenario %s has no workers to kill or scale out", sc.Name)
	}
	return plan, sc, nil
}

func listScenarios(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SCENARIO\tREPLICAS\tRATE\tPHASES\tWHAT")
	for _, s := range load.Scenarios() {
		fmt.Fprintf(tw, "%s\t%d\t%g/s\t%s\t%s\n", s.Name, s.Replicas, s.Rate, s.Phases, s.About)
	}
	return tw.Flush()
}

// bench is one invocation of the command.
type bench struct {
	flags    *benchFlags
	plan     load.Plan
	scenario *load.Scenario
	stdout   io.Writer
	stderr   io.Writer
	progress io.Writer
	tty      bool
}

func (b *bench) run(ctx context.Context) error {
	f := b.flags
	var reports []*load.Report
	var runErr error
	switch {
	case b.scenario != nil && b.scenario.Static:
		reports, runErr = b.runOverhead(ctx)
	case b.scenario != nil:
		sides := []benchSide{f.a}
		if f.compare {
			bs := f.b
			bs.gatewayArgs = strings.TrimSpace(f.a.gatewayArgs + " " + f.b.gatewayArgs)
			bs.workerArgs = strings.TrimSpace(f.a.workerArgs + " " + f.b.workerArgs)
			sides = append(sides, bs)
		}
		for i, s := range sides {
			if i > 0 && ctx.Err() != nil {
				break
			}
			rep, err := b.runScenario(ctx, s, i)
			if rep != nil {
				reports = append(reports, rep)
			}
			if err != nil {
				runErr = err
				break
			}
		}
	default:
		sides := []benchSide{f.a}
		if f.compare {
			bs := f.b
			if bs.key == "" && bs.keyFile == "" {
				bs.key, bs.keyFile = f.a.key, f.a.keyFile
			}
			if bs.model == "" {
				bs.model = f.a.model
			}
			sides = append(sides, bs)
		}
		for i, s := range sides {
			if i > 0 && ctx.Err() != nil {
				break
			}
			rep, err := b.runExternal(ctx, s, i)
			if rep != nil {
				reports = append(reports, rep)
			}
			if err != nil {
				runErr = err
				break
			}
		}
	}
	if len(reports) == 0 {
		return runErr
	}
	if err := b.output(reports); err != nil {
		return errors.Join(runErr, err)
	}
	return runErr
}

func sideName(i int) string { return string(rune('A' + i)) }

// runScenario starts a local fleet for one configuration, runs the plan on
// it and tears it down.
func (b *bench) runScenario(ctx context.Context, s benchSide, i int) (*load.Report, error) {
	f := b.flags
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("find own executable: %w", err)
	}
	fleet, err := load.StartLocal(ctx, load.LocalConfig{
		Binary: self, Keep: f.keep, Replicas: f.replicas, Model: f.a.model,
		GatewayArgs: strings.Fields(s.gatewayArgs),
		WorkerArgs:  append(append([]string{}, b.scenario.SimArgs...), strings.Fields(s.workerArgs)...),
		Replace:     f.replace, ReplaceDelay: f.replaceDelay, StartupTimeout: f.startupTimeout, Log: b.stderr,
	})
	if err != nil {
		return nil, err
	}
	defer func() {
		fleet.Close()
		if f.keep {
			fmt.Fprintf(b.stderr, "bench: kept %s (gateway data and logs)\n", fleet.Dir())
		}
	}()
	t := fleet.Target()
	t.Label = s.label
	if t.Label == "" {
		t.Label = "scenario " + b.scenario.Name
		if extra := strings.TrimSpace(s.gatewayArgs + " " + s.workerArgs); extra != "" {
			t.Label += " " + extra
		}
		if f.compare {
			t.Label = sideName(i) + ": " + t.Label
		}
	}
	return b.runOne(ctx, t, f.a.model, fleet)
}

// runOverhead runs the overhead scenario: the same load through the gateway
// and straight to the engine behind it.
func (b *bench) runOverhead(ctx context.Context) ([]*load.Report, error) {
	f := b.flags
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("find own executable: %w", err)
	}
	fleet, err := load.StartLocal(ctx, load.LocalConfig{
		Binary: self, Keep: f.keep, Replicas: f.replicas, Static: true, Model: f.a.model,
		GatewayArgs:    strings.Fields(f.a.gatewayArgs),
		WorkerArgs:     append(append([]string{}, b.scenario.SimArgs...), strings.Fields(f.a.workerArgs)...),
		StartupTimeout: f.startupTimeout, Log: b.stderr,
	})
	if err != nil {
		return nil, err
	}
	defer fleet.Close()
	gw := fleet.Target()
	gw.Label = "A: through the gateway"
	direct := load.Target{Label: "B: straight to the engine", BaseURL: fleet.Engines()[0]}
	var reports []*load.Report
	for _, t := range []load.Target{gw, direct} {
		rep, err := b.runOne(ctx, t, f.a.model, nil)
		if rep != nil {
			reports = append(reports, rep)
		}
		if err != nil {
			return reports, err
		}
	}
	return reports, nil
}

// runExternal runs the plan against a deployment the bench did not start.
func (b *bench) runExternal(ctx context.Context, s benchSide, i int) (*load.Report, error) {
	f := b.flags
	t := load.Target{Label: s.label, BaseURL: strings.TrimSuffix(s.target, "/"), AdminURL: strings.TrimSuffix(s.admin, "/"),
		AdminTenant: f.adminTenant}
	if u, err := url.Parse(t.BaseURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("target %q: want a base URL like http://host:8080/v1", s.target)
	}
	if !strings.HasSuffix(t.BaseURL, "/v1") {
		fmt.Fprintf(b.stderr, "bench: warning: %s does not end in /v1; requests go to %s/chat/completions\n", t.BaseURL, t.BaseURL)
	}
	var err error
	if t.Key, err = readSecret(s.key, s.keyFile, "key"); err != nil {
		return nil, err
	}
	if s.admin != "" {
		if s.adminTokenFile == "" {
			return nil, errors.New("--admin needs --admin-token-file (the gateway's DIR/admin.token)")
		}
		if t.AdminToken, err = readSecret("", s.adminTokenFile, "admin token"); err != nil {
			return nil, err
		}
	}
	if t.Label == "" {
		t.Label = t.BaseURL
		if f.compare {
			t.Label = sideName(i) + ": " + t.Label
		}
	}
	model := s.model
	if model == "" && f.replay == "" {
		if model, err = firstModel(ctx, t); err != nil {
			return nil, err
		}
		fmt.Fprintf(b.stderr, "bench: model %q (the first the target lists; --model to choose)\n", model)
	}
	var fleet load.Fleet
	if len(b.plan.Actions) > 0 {
		fleet = &load.Hooks{OnKill: f.onKill, OnScaleOut: f.onScaleOut, Timeout: f.hookTimeout, Stderr: b.stderr,
			Env: []string{"TAILGATE_BENCH_SIDE=" + sideName(i), "TAILGATE_BENCH_TARGET=" + t.BaseURL}}
	}
	return b.runOne(ctx, t, model, fleet)
}

// runOne runs the plan against one target and analyzes it.
func (b *bench) runOne(ctx context.Context, t load.Target, model string, fleet load.Fleet) (*load.Report, error) {
	f := b.flags
	wcfg := load.WorkloadConfig{Model: model, Completions: f.endpoint == "completions", StreamFraction: f.streamFraction,
		IgnoreEOS: f.ignoreEOS, Seed: f.seed}
	var err error
	if wcfg.Prompt, err = load.ParseDist(f.promptTokens); err != nil {
		return nil, fmt.Errorf("--prompt-tokens %w", err)
	}
	if wcfg.Output, err = load.ParseDist(f.outputTokens); err != nil {
		return nil, fmt.Errorf("--output-tokens %w", err)
	}
	if f.replay != "" {
		fh, err := os.Open(f.replay)
		if err != nil {
			return nil, fmt.Errorf("--replay: %w", err)
		}
		wcfg.Replay, err = load.ReadReplay(fh)
		fh.Close()
		if err != nil {
			return nil, fmt.Errorf("--replay %s: %w", f.replay, err)
		}
	}
	wl, err := load.NewWorkload(wcfg)
	if err != nil {
		return nil, err
	}
	mode := fmt.Sprintf("%g req/s open loop", f.rate)
	if f.rate == 0 {
		mode = fmt.Sprintf("%d clients closed loop", f.concurrency)
	}
	fmt.Fprintf(b.stderr, "bench: %s — %s, %s, %s (%.0fs)\n", t.Label, mode, wl.Describe(), load.FormatPhases(b.plan.Phases), b.plan.Length.Seconds())
	res, err := load.Run(ctx, load.Config{
		Target: t, Workload: wl, Plan: b.plan, Rate: f.rate, Concurrency: f.concurrency, Seed: f.seed,
		Timeout: f.timeout, DisableKeepAlive: !f.keepAlive, MaxConns: f.maxConns, MaxInflight: f.maxInflight,
		SampleInterval: f.sampleInterval, Fleet: fleet, Progress: b.progress, ProgressTTY: b.tty,
	})
	if res == nil {
		return nil, err
	}
	rep := load.Analyze(res, f.window)
	if err != nil {
		rep.Notes = append(rep.Notes, "the run was stopped early: "+err.Error())
		if errors.Is(err, context.Canceled) {
			err = errors.New("interrupted")
		}
	}
	return rep, err
}

// output prints the report(s) and writes the files asked for.
func (b *bench) output(reports []*load.Report) error {
	f := b.flags
	var out strings.Builder
	if len(reports) == 1 {
		_ = reports[0].WriteText(&out)
	} else {
		for _, r := range reports {
			_ = r.WriteBrief(&out)
			out.WriteByte('\n')
		}
		_ = load.Compare(reports[0], reports[1]).WriteText(&out)
	}
	if _, err := io.WriteString(b.stdout, out.String()); err != nil {
		return err
	}
	var errs []error
	if f.jsonOut != "" {
		var v any = reports[0]
		if len(reports) == 2 {
			v = load.Compare(reports[0], reports[1])
		}
		raw, err := json.MarshalIndent(v, "", " ")
		if err == nil {
			err = os.WriteFile(f.jsonOut, append(raw, '\n'), 0o644)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("--json: %w", err))
		} else {
			fmt.Fprintf(b.stderr, "bench: wrote %s\n", f.jsonOut)
		}
	}
	if f.htmlOut != "" {
		err := writeFileWith(f.htmlOut, func(w io.Writer) error { return load.WriteHTML(w, reports...) })
		if err != nil {
			errs = append(errs, fmt.Errorf("--html: %w", err))
		} else {
			abs, _ := filepath.Abs(f.htmlOut)
			fmt.Fprintf(b.stderr, "bench: wrote %s (open file://%s)\n", f.htmlOut, abs)
		}
	}
	return errors.Join(errs...)
}

func writeFileWith(path string, write func(io.Writer) error) error {
	fh, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := write(fh); err != nil {
		fh.Close()
		return err
	}
	return fh.Close()
}

// readSecret returns the value of a flag or the trimmed content of a file.
func readSecret(v, file, what string) (string, error) {
	if v != "" && file != "" {
		return "", fmt.Errorf("give the %s or its file, not both", what)
	}
	if file == "" {
		return v, nil
	}
	raw, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("%s file: %w", what, err)
	}
	return strings.TrimSpace(string(raw)), nil
}

// firstModel asks the target which models it serves.
func firstModel(ctx context.Context, t load.Target) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, t.BaseURL+"/models", nil)
	if err != nil {
		return "", err
	}
	if t.Key != "" {
		req.Header.Set("Authorization", "Bearer "+t.Key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", fmt.Errorf("list models (give --model to skip): %w", err)
	}
	defer resp.Body.Close()
	var body struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("list models at %s: status %d (give --model to skip)", t.BaseURL, resp.StatusCode)
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 4<<20)).Decode(&body); err != nil || len(body.Data) == 0 {
		return "", fmt.Errorf("%s/models lists no model: give --model", t.BaseURL)
	}
	return body.Data[0].ID, nil
}
