package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tailgate-dev/tailgate/bench/load"
	"github.com/tailgate-dev/tailgate/serving"
	"github.com/tailgate-dev/tailgate/serving/launcher"
)

// `tailgate tune` lives with the worker's files: it runs on a worker's box
// and starts the engine from the worker's own flags (workerFlags,
// engineCommand), as `tailgate worker` would.

// tuneFlags are the flags of `tailgate tune`; the worker's own flags (the
// engine, the model, the --sim-* knobs, vLLM's flags) are registered beside
// them, and those given are the base of every candidate and of the written
// worker config.
type tuneFlags struct {
	sloFile        string
	ttftP99        time.Duration
	totalP99       time.Duration
	maxErrorRate   float64
	space          stringList
	rates          string
	duration       time.Duration
	maxCandidates  int
	maxDuration    time.Duration
	out            string
	reportFile     string
	check          string
	promptTokens   string
	outputTokens   string
	streamFraction float64
	replay         string
	seed           int64
	timeout        time.Duration
}

func (t *tuneFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&t.sloFile, "slo", "", "the latency target: budgets of the YAML FILE (a gateway --config file's slo and models.NAME.slo keys, as bench --slo reads it)")
	fs.DurationVar(&t.ttftP99, "ttft-p99", 0, "the latency target: 99 % of streams have their first token within this (beside or instead of --slo)")
	fs.DurationVar(&t.totalP99, "e2e-p99", 0, "the latency target: 99 % of non-streaming answers are complete within this (beside or instead of --slo)")
	fs.Float64Var(&t.maxErrorRate, "max-error-rate", 0.01, "the target: at most this share of requests fail")
	fs.Var(&t.space, "space", "search space: an engine flag and its values, e.g. max-num-seqs=16,64,256 (repeatable; flags: "+strings.Join(tuneKnobNames(), ", ")+"; default: max-num-seqs=16,64,256 and max-num-batched-tokens=2048,8192)")
	fs.StringVar(&t.rates, "rate", "5", "arrival rates to replay, requests per second, ascending: the first is the target rate a candidate must hold, the others find the rate that breaks it")
	fs.DurationVar(&t.duration, "duration", time.Minute, "how long each rate is replayed")
	fs.IntVar(&t.maxCandidates, "max-candidates", 8, "at most this many candidates are started (the engine's configuration as given counts as one)")
	fs.DurationVar(&t.maxDuration, "max-duration", 30*time.Minute, "no candidate is started after this long")
	fs.StringVar(&t.out, "out", "tuned-worker.conf", "write the chosen configuration to this FILE: worker flags that tailgate worker --config takes")
	fs.StringVar(&t.reportFile, "report", "", "also write the text report to this file")
	fs.StringVar(&t.check, "check", "", "revalidate: replay the workload at the target rate against the worker configuration in this file and exit 1 when it misses the target")
	fs.StringVar(&t.promptTokens, "prompt-tokens", "lognormal:256:0.5", "prompt length distribution: N, lognormal:MEDIAN:SPREAD or uniform:MIN:MAX (as bench's)")
	fs.StringVar(&t.outputTokens, "output-tokens", "lognormal:64:0.5", "output length distribution (as bench's)")
	fs.Float64Var(&t.streamFraction, "stream-fraction", 1, "share of requests that stream, 0..1")
	fs.StringVar(&t.replay, "replay", "", "JSONL token profile to replay instead of the drawn lengths ({\"prompt_tokens\":N,\"output_tokens\":M} a line, as bench's --replay)")
	fs.Int64Var(&t.seed, "seed", 1, "seed of the request sequence and arrival schedule: every candidate sees the same requests at the same times")
	fs.DurationVar(&t.timeout, "timeout", 30*time.Second, "deadline of one request")
}

// tuneKnob is an engine flag the search turns: its name as vLLM's (and the
// worker's) flag, and the simulated engine's flag that models it.
type tuneKnob struct{ name, vllm, sim string }

var tuneKnobs = []tuneKnob{
	{"max-num-seqs", "max-num-seqs", "sim-max-seqs"},
	{"max-num-batched-tokens", "max-num-batched-tokens", "sim-max-num-batched-tokens"},
	{"tensor-parallel-size", "tensor-parallel-size", "sim-tensor-parallel-size"},
}

func tuneKnobNames() []string {
	var out []string
	for _, k := range tuneKnobs {
		out = append(out, k.name)
	}
	return out
}

func lookupKnob(name string) (tuneKnob, bool) {
	for _, k := range tuneKnobs {
		if k.name == name {
			return k, true
		}
	}
	return tuneKnob{}, false
}

const tuneSynopsis = `tune --engine vllm|sim --model M (--slo FILE | --ttft-p99 D) [--space FLAG=V1,V2 ...] [--rate R1,R2,...] [--duration D] [--out FILE] [worker flags]
       tune --check FILE (--slo FILE | --ttft-p99 D) [--rate R] [--duration D]

Starts the engine with each candidate configuration through the launcher,
warms it, replays the workload at each rate (ascending; a candidate that
misses the target at one rate is not tried higher) and writes the cheapest
configuration that holds the target at the first rate (fewest GPUs, then
the highest rate held) as a worker config file. See docs/tuning.md.

Examples:
  tailgate tune --engine vllm --model meta-llama/Llama-3.1-8B-Instruct --gpus 0 \
      --slo gateway.yaml --replay profile.jsonl --rate 4,8,16 --out tuned-worker.conf
  tailgate tune --engine sim --ttft-p99 300ms --sim-max-seqs 1 --space max-num-seqs=4,16 --rate 5,10 --duration 20s
  tailgate tune --check tuned-worker.conf --ttft-p99 300ms --rate 5   # exit status 1 when it misses`

func cmdTune(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return tune(ctx, args, stdout, stderr, false)
}

// tune runs `tailgate tune`; recorded says whether args already hold the
// target recorded in the --check file.
func tune(ctx context.Context, args []string, stdout, stderr io.Writer, recorded bool) error {
	fs := newFlagSet("tune", tuneSynopsis, stderr)
	var (
		tf tuneFlags
		wf workerFlags
	)
	tf.register(fs)
	wf.register(fs)
	args, err := withWorkerConfig(args) // a base configuration to start from
	if err != nil {
		return err
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if tf.check != "" && !recorded {
		// The target and workload the file was tuned for, under those the
		// command line gives.
		target, err := readTuneTarget(tf.check)
		if err != nil {
			return err
		}
		return tune(ctx, append(target, args...), stdout, stderr, true)
	}
	rates, err := parseRates(tf.rates)
	if err != nil {
		return err
	}
	objs, err := tf.objectives()
	if err != nil {
		return err
	}
	wl, err := tf.workload()
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	r := &tuneRun{flags: tf, objs: objs, workload: wl, log: log, progress: stderr}

	if tf.check != "" {
		base, err := readWorkerConfig(tf.check)
		if err != nil {
			return err
		}
		c := &tuneCandidate{name: "as configured in " + tf.check, args: base}
		r.try(ctx, c, rates[:1])
		fmt.Fprint(stdout, r.checkReport(c, rates[0]))
		if !c.passed() {
			return fmt.Errorf("tune --check %s: the configuration misses the target at %g req/s: %s", tf.check, rates[0], c.why)
		}
		return nil
	}

	base := workerArgs(fs)
	space, err := parseSpace(tf.space)
	if err != nil {
		return err
	}
	cands := candidates(base, wf.engine, space, tf.maxCandidates)
	start := time.Now()
	for i, c := range cands {
		if time.Since(start) >= tf.maxDuration {
			for _, rest := range cands[i:] {
				rest.why = "not tried: --max-duration " + tf.maxDuration.String() + " was spent"
			}
			break
		}
		fmt.Fprintf(stderr, "tune: candidate %d of %d: %s\n", i+1, len(cands), c.name)
		r.try(ctx, c, rates)
		if ctx.Err() != nil {
			return errors.New("interrupted")
		}
	}
	best := chooseCandidate(cands)
	report := r.report(cands, best, rates, wf.engine)
	fmt.Fprint(stdout, report)
	if tf.reportFile != "" {
		if err := os.WriteFile(tf.reportFile, []byte(report), 0o644); err != nil {
			return err
		}
	}
	if best == nil {
		return fmt.Errorf("tune: no candidate held the target at %g req/s", rates[0])
	}
	if err := writeWorkerConfig(tf.out, best, rates[0], tuneTarget(fs, rates[0])); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "\nwrote %s: tailgate worker --config %s --gateway ... --cluster-token-file ...\n", tf.out, tf.out)
	return nil
}

func parseRates(s string) ([]float64, error) {
	var out []float64
	for f := range strings.SplitSeq(s, ",") {
		v, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || v <= 0 || (len(out) > 0 && v <= out[len(out)-1]) {
			return nil, fmt.Errorf("--rate %q: want positive rates, ascending, e.g. 5,10,20", s)
		}
		out = append(out, v)
	}
	return out, nil
}

// objectives are the target: the SLO file's budgets for the model and the
// p99 flags.
func (t *tuneFlags) objectives() ([]load.Objective, error) {
	var objs []load.Objective
	if t.sloFile != "" {
		s, err := readBenchSLO(t.sloFile)
		if err != nil {
			return nil, err
		}
		objs = append(objs, s.Default...)
	}
	if t.ttftP99 > 0 {
		objs = append(objs, load.Objective{Kind: "stream", Stage: "ttft", Name: "p99", Target: 0.99, BudgetMS: float64(t.ttftP99) / 1e6})
	}
	if t.totalP99 > 0 {
		objs = append(objs, load.Objective{Kind: "json", Stage: "total", Name: "p99", Target: 0.99, BudgetMS: float64(t.totalP99) / 1e6})
	}
	if len(objs) == 0 {
		return nil, errors.New("a latency target is required: --slo FILE, --ttft-p99 D or --e2e-p99 D")
	}
	return objs, nil
}

func (t *tuneFlags) workload() (load.WorkloadConfig, error) {
	w := load.WorkloadConfig{StreamFraction: t.streamFraction, IgnoreEOS: true, Seed: t.seed}
	var err error
	if w.Prompt, err = load.ParseDist(t.promptTokens); err != nil {
		return w, fmt.Errorf("--prompt-tokens: %w", err)
	}
	if w.Output, err = load.ParseDist(t.outputTokens); err != nil {
		return w, fmt.Errorf("--output-tokens: %w", err)
	}
	if t.streamFraction < 0 || t.streamFraction > 1 {
		return w, errors.New("--stream-fraction: want 0..1")
	}
	if t.replay != "" {
		f, err := os.Open(t.replay)
		if err != nil {
			return w, fmt.Errorf("--replay: %w", err)
		}
		defer f.Close()
		if w.Replay, err = load.ReadReplay(f); err != nil {
			return w, fmt.Errorf("--replay %s: %w", t.replay, err)
		}
	}
	return w, nil
}

// tuneSecretFlags are never written to a config file: the file names the
// files that hold them instead.
var tuneSecretFlags = []string{"cluster-token", "join-token", "mesh-authkey"}

// workerArgs returns the worker flags given on tune's command line, as
// --name=value arguments.
func workerArgs(fs *flag.FlagSet) []string {
	worker := flag.NewFlagSet("worker", flag.ContinueOnError)
	var wf workerFlags
	wf.register(worker)
	var out []string
	fs.Visit(func(f *flag.Flag) {
		if worker.Lookup(f.Name) == nil || slices.Contains(tuneSecretFlags, f.Name) {
			return
		}
		if l, ok := f.Value.(*stringList); ok {
			for _, v := range *l {
				out = append(out, "--"+f.Name+"="+v)
			}
			return
		}
		out = append(out, "--"+f.Name+"="+f.Value.String())
	})
	return out
}

type tuneDim struct {
	knob   tuneKnob
	values []int
}

func parseSpace(specs []string) ([]tuneDim, error) {
	if len(specs) == 0 {
		specs = []string{"max-num-seqs=16,64,256", "max-num-batched-tokens=2048,8192"}
	}
	var out []tuneDim
	for _, s := range specs {
		name, vals, ok := strings.Cut(s, "=")
		k, known := lookupKnob(strings.TrimPrefix(name, "--"))
		if !ok || !known {
			return nil, fmt.Errorf("--space %q: want FLAG=V1,V2 with FLAG one of %s", s, strings.Join(tuneKnobNames(), ", "))
		}
		d := tuneDim{knob: k}
		for v := range strings.SplitSeq(vals, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil || n < 1 {
				return nil, fmt.Errorf("--space %q: %q is not a positive whole number", s, v)
			}
			d.values = append(d.values, n)
		}
		out = append(out, d)
	}
	return out, nil
}

// tuneCandidate is one configuration tried and what it showed.
type tuneCandidate struct {
	name  string   // the knobs, e.g. "max-num-seqs=8"
	args  []string // the worker flags that start it
	gpus  int
	start time.Duration // start-up to ready (warm-up included)
	mem   string        // GPU memory in use once ready (nvidia-smi); "" without one
	runs  []tuneRate
	held  float64 // the highest rate that met the target; 0: none
	why   string  // why it passed or failed
}

type tuneRate struct {
	rate   float64
	rep    *load.Report
	checks []load.SLOCheck
	ok     bool
	why    string
	// engine is the engine's own split of the time, from its /metrics
	// histograms over the replay: the mean queue wait and prefill, in ms;
	// nil when the engine did not answer.
	engine map[string]float64
}

// engineStages are the vLLM histograms whose means the report gives per
// rate: queueing apart from model execution.
var engineStages = []struct{ name, metric string }{
	{"queue", "vllm:request_queue_time_seconds"},
	{"prefill", "vllm:request_prefill_time_seconds"},
	{"decode", "vllm:request_decode_time_seconds"},
}

// scrapeEngine reads the sums and counts of engineStages from the engine's
// /metrics (summed over label sets); nil when it does not answer.
func scrapeEngine(ctx context.Context, base string) map[string][2]float64 {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/metrics", nil)
	if err != nil {
		return nil
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil
	}
	out := map[string][2]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		for _, st := range engineStages {
			rest, ok := strings.CutPrefix(line, st.metric)
			if !ok {
				continue
			}
			i := -1
			switch {
			case strings.HasPrefix(rest, "_sum"):
				i = 0
			case strings.HasPrefix(rest, "_count"):
				i = 1
			}
			f := strings.Fields(rest)
			if i < 0 || len(f) < 2 {
				continue
			}
			if v, err := strconv.ParseFloat(f[len(f)-1], 64); err == nil {
				sc := out[st.name]
				sc[i] += v
				out[st.name] = sc
			}
		}
	}
	return out
}

// engineMeans returns each stage's mean in ms between two scrapes.
func engineMeans(before, after map[string][2]float64) map[string]float64 {
	if before == nil || after == nil {
		return nil
	}
	out := map[string]float64{}
	for name, a := range after {
		b := before[name]
		if n := a[1] - b[1]; n > 0 {
			out[name] = 1000 * (a[0] - b[0]) / n
		}
	}
	return out
}

func (c *tuneCandidate) passed() bool { return c.held > 0 }

// candidates are the engine's configuration as given, then every
// combination of the space's values, at most max in all.
func candidates(base []string, engine string, space []tuneDim, maxN int) []*tuneCandidate {
	out := []*tuneCandidate{{name: "as given (engine defaults for the knobs not set)", args: base}}
	combos := [][]int{{}}
	for _, d := range space {
		var next [][]int
		for _, c := range combos {
			for _, v := range d.values {
				next = append(next, append(slices.Clone(c), v))
			}
		}
		combos = next
	}
	for _, combo := range combos {
		if len(out) >= maxN {
			break
		}
		args := slices.Clone(base)
		var names []string
		for i, d := range space {
			flagName := d.knob.vllm
			if engine == "sim" {
				flagName = d.knob.sim
			}
			args = slices.DeleteFunc(args, func(a string) bool { return strings.HasPrefix(a, "--"+flagName+"=") })
			args = append(args, fmt.Sprintf("--%s=%d", flagName, combo[i]))
			names = append(names, fmt.Sprintf("%s=%d", d.knob.name, combo[i]))
		}
		out = append(out, &tuneCandidate{name: strings.Join(names, " "), args: args})
	}
	return out
}

// chooseCandidate returns the cheapest candidate that held the target:
// fewest GPUs, then the highest rate held, then the first tried.
func chooseCandidate(cs []*tuneCandidate) *tuneCandidate {
	var best *tuneCandidate
	for _, c := range cs {
		if !c.passed() {
			continue
		}
		if best == nil || c.gpus < best.gpus || (c.gpus == best.gpus && c.held > best.held) {
			best = c
		}
	}
	return best
}

// tuneRun holds what every candidate is measured with.
type tuneRun struct {
	flags     tuneFlags
	objs      []load.Objective
	workload  load.WorkloadConfig
	log       *slog.Logger
	progress  io.Writer
	simulated bool
}

// try starts c's engine, replays each rate in turn until one misses, and
// stops the engine.
func (r *tuneRun) try(ctx context.Context, c *tuneCandidate, rates []float64) {
	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var wf workerFlags
	wf.register(fs)
	if err := fs.Parse(c.args); err != nil {
		c.why = "bad worker flags: " + err.Error()
		return
	}
	c.gpus = 1
	if wf.engine == "sim" {
		r.simulated = true
		if f := fs.Lookup("sim-tensor-parallel-size"); f != nil {
			c.gpus, _ = strconv.Atoi(f.Value.String())
		}
		if wf.model == "" {
			wf.model = "tailgate-sim"
		}
	} else if wf.vllm.TensorParallelSize > 1 {
		c.gpus = wf.vllm.TensorParallelSize
	}
	c.gpus = max(c.gpus, 1)
	model := wf.model
	if wf.servedModelName != "" {
		model = wf.servedModelName
	}
	if model == "" {
		c.why = "no --model"
		return
	}
	cmd, err := wf.engineCommand(model)
	if err != nil {
		c.why = err.Error()
		return
	}
	engCtx, stop := context.WithCancel(ctx)
	defer stop()
	ready := make(chan struct{})
	failed := make(chan string, 1) // the first failure's reason: no second start is waited for
	var once sync.Once
	l, err := launcher.New(launcher.Config{
		Command: cmd, Model: model, StartupTimeout: wf.startupTimeout,
		Warmup: wf.warmup, NoWarmup: wf.warmup == 0, StartFailures: 1, Log: r.log,
		OnState: func(state launcher.State, reason string) {
			switch state {
			case serving.StateReady:
				once.Do(func() { close(ready) })
			case serving.StateFailed:
				select {
				case failed <- reason:
				default:
				}
			}
		},
	})
	if err != nil {
		c.why = err.Error()
		return
	}
	began := time.Now()
	done := make(chan error, 1)
	go func() { done <- l.Run(engCtx) }()
	defer func() { stop(); <-done }()
	select {
	case <-ready:
		c.start = time.Since(began)
		if wf.engine != "sim" {
			c.mem = gpuMemoryUsed()
		}
	case err := <-done:
		c.why = fmt.Sprintf("the engine did not start: %v", err)
		return
	case reason := <-failed:
		c.why = "the engine did not start: " + reason
		return
	case <-time.After(wf.startupTimeout):
		_, reason := l.State()
		c.why = "the engine was not ready within --startup-timeout " + wf.startupTimeout.String() + ": " + reason
		return
	case <-ctx.Done():
		c.why = "interrupted"
		return
	}
	fwd, err := forwardTCP(engCtx, l.EngineSocket())
	if err != nil {
		c.why = err.Error()
		return
	}
	target := load.Target{Label: c.name, BaseURL: "http://" + fwd + "/v1", Key: l.EngineKey()}
	wl := r.workload
	wl.Model = model
	for _, rate := range rates {
		tr := r.replay(engCtx, target, wl, rate)
		c.runs = append(c.runs, tr)
		if !tr.ok {
			if c.held == 0 {
				c.why = fmt.Sprintf("FAIL at %g req/s: %s", rate, tr.why)
			} else {
				c.why = fmt.Sprintf("PASS: held %g req/s; broke at %g req/s: %s", c.held, rate, tr.why)
			}
			return
		}
		c.held = rate
		c.why = fmt.Sprintf("PASS: held every rate tried, up to %g req/s", rate)
	}
}

// replay runs the workload at rate for the configured duration and checks
// it against the target.
func (r *tuneRun) replay(ctx context.Context, t load.Target, wcfg load.WorkloadConfig, rate float64) tuneRate {
	tr := tuneRate{rate: rate}
	phases, err := load.ParsePhases("steady:" + r.flags.duration.String())
	if err == nil {
		var plan load.Plan
		if plan, err = load.NewPlan(phases); err == nil {
			var wl *load.Workload
			if wl, err = load.NewWorkload(wcfg); err == nil {
				var res *load.Result
				engine := strings.TrimSuffix(t.BaseURL, "/v1")
				before := scrapeEngine(ctx, engine)
				res, err = load.Run(ctx, load.Config{Target: t, Workload: wl, Plan: plan, Rate: rate, Seed: r.flags.seed, Timeout: r.flags.timeout})
				tr.engine = engineMeans(before, scrapeEngine(ctx, engine))
				if res != nil {
					tr.rep = load.Analyze(res, 10*time.Second)
				}
			}
		}
	}
	if tr.rep == nil {
		tr.why = fmt.Sprintf("the replay did not run: %v", err)
		return tr
	}
	tr.checks = load.CheckSLO(tr.rep, r.objs)
	var fails []string
	for _, c := range tr.checks {
		if c.Phase == "all" && c.Source == "" && c.Result == load.Fail {
			v := "no answer"
			if c.ValueMS != nil {
				v = fmt.Sprintf("%.0fms", *c.ValueMS)
			}
			fails = append(fails, fmt.Sprintf("%s %s %s %s over its budget %.0fms (%.1f %% within)", c.Kind, c.Stage, c.Name, v, c.BudgetMS, 100*c.WithinRatio))
		}
	}
	if er := tr.rep.All.ErrorRate; er > r.flags.maxErrorRate {
		fails = append(fails, fmt.Sprintf("%.1f %% of requests failed (over --max-error-rate %g)", 100*er, r.flags.maxErrorRate))
	}
	if err != nil && ctx.Err() == nil {
		fails = append(fails, "the replay stopped early: "+err.Error())
	}
	tr.ok, tr.why = len(fails) == 0, strings.Join(fails, "; ")
	return tr
}

// forwardTCP serves a loopback TCP port that forwards every connection to
// the engine's Unix socket, for the bench's HTTP client, until ctx ends;
// it returns the port's host:port.
func forwardTCP(ctx context.Context, socket string) (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	go func() {
		<-ctx.Done()
		ln.Close()
	}()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				u, err := net.Dial("unix", socket)
				if err != nil {
					return
				}
				defer u.Close()
				go func() {
					<-ctx.Done()
					u.Close()
					c.Close()
				}()
				go func() { _, _ = io.Copy(u, c); _ = u.(*net.UnixConn).CloseWrite() }()
				_, _ = io.Copy(c, u)
			}()
		}
	}()
	return ln.Addr().String(), nil
}

// hostCPU returns the host's CPU model as /proc/cpuinfo names it.
func hostCPU() string {
	raw, err := os.ReadFile("/proc/cpuinfo")
	if err == nil {
		for line := range strings.SplitSeq(string(raw), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				return strings.TrimSpace(v)
			}
		}
	}
	return "unknown"
}

// gpuMemoryUsed returns the memory in use on each GPU, as nvidia-smi says,
// or "" without an answer. vLLM claims its share (--gpu-memory-utilization)
// at start-up, so this is read once the engine is ready.
func gpuMemoryUsed() string {
	out, err := exec.Command("nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader").Output()
	if err != nil {
		return ""
	}
	return strings.Join(strings.Split(strings.TrimSpace(string(out)), "\n"), "; ")
}

// hostGPUs returns the GPUs nvidia-smi lists, or "none found".
func hostGPUs() string {
	out, err := exec.Command("nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader").Output()
	if err != nil || len(bytes.TrimSpace(out)) == 0 {
		return "none found (no nvidia-smi answer)"
	}
	return strings.Join(strings.Split(strings.TrimSpace(string(out)), "\n"), "; ")
}

func (r *tuneRun) header(b *strings.Builder, engine string) {
	fmt.Fprintf(b, "host CPU: %s\nGPUs: %s\n", hostCPU(), hostGPUs())
	if r.simulated || engine == "sim" {
		b.WriteString("ENGINE SIMULATED: these figures are tailgate's simulated engine (--engine sim), not a model on a GPU; they test the process, not the hardware.\n")
	}
	b.WriteString("target:")
	for _, o := range r.objs {
		fmt.Fprintf(b, " %s %s %s ≤ %.0fms;", o.Kind, o.Stage, o.Name, o.BudgetMS)
	}
	fmt.Fprintf(b, " errors ≤ %g %%\n", 100*r.flags.maxErrorRate)
	fmt.Fprintf(b, "workload: %s each rate, seed %d", r.flags.duration, r.flags.seed)
	if r.flags.replay != "" {
		fmt.Fprintf(b, ", token profile %s", r.flags.replay)
	} else {
		fmt.Fprintf(b, ", prompt %s, output %s tokens", r.flags.promptTokens, r.flags.outputTokens)
	}
	fmt.Fprintf(b, ", %.0f %% of requests streamed\n", 100*r.flags.streamFraction)
}

func (r *tuneRun) runLines(b *strings.Builder, c *tuneCandidate) {
	for _, tr := range c.runs {
		verdict := "PASS"
		if !tr.ok {
			verdict = "FAIL"
		}
		if tr.rep == nil {
			fmt.Fprintf(b, "    %6g req/s  %s  %s\n", tr.rate, verdict, tr.why)
			continue
		}
		a := tr.rep.All
		fmt.Fprintf(b, "    %6g req/s  %s  ttft p50/p95/p99 %.0f/%.0f/%.0fms  e2e p50/p95/p99 %.0f/%.0f/%.0fms  %.1f req/s  %.0f tok/s  errors %d/%d\n",
			tr.rate, verdict, a.TTFT.P50, a.TTFT.P95, a.TTFT.P99, a.Total.P50, a.Total.P95, a.Total.P99, a.Throughput, a.OutputTokensPerS, a.Errors, a.Requests)
		if len(tr.engine) > 0 {
			b.WriteString("             engine (its /metrics, means):")
			for _, st := range engineStages {
				if v, ok := tr.engine[st.name]; ok {
					fmt.Fprintf(b, " %s %.0fms", st.name, v)
				}
			}
			b.WriteString("\n")
		}
		for _, name := range slices.Sorted(mapsKeys(a.Stages)) {
			s := a.Stages[name]
			fmt.Fprintf(b, "             %s p50/p95/p99 %.0f/%.0f/%.0fms\n", name, s.P50, s.P95, s.P99)
		}
	}
}

func mapsKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// report ranks the candidates: those that held the target first, cheapest
// first, then the others in the order tried.
func (r *tuneRun) report(cs []*tuneCandidate, best *tuneCandidate, rates []float64, engine string) string {
	var b strings.Builder
	b.WriteString("tailgate tune\n")
	r.header(&b, engine)
	fmt.Fprintf(&b, "rates: %v req/s (the first is the target)\n\n", rates)
	ranked := slices.Clone(cs)
	slices.SortStableFunc(ranked, func(x, y *tuneCandidate) int {
		switch {
		case x.passed() != y.passed():
			if x.passed() {
				return -1
			}
			return 1
		case !x.passed():
			return 0
		case x.gpus != y.gpus:
			return x.gpus - y.gpus
		case x.held != y.held:
			if x.held > y.held {
				return -1
			}
			return 1
		}
		return 0
	})
	for i, c := range ranked {
		mark := "  "
		if c == best {
			mark = "=>"
		}
		fmt.Fprintf(&b, "%s %d. %s — %d GPU(s)", mark, i+1, c.name, max(c.gpus, 1))
		if c.start > 0 {
			fmt.Fprintf(&b, ", ready in %.1fs", c.start.Seconds())
		}
		if c.mem != "" {
			fmt.Fprintf(&b, ", GPU memory in use %s", c.mem)
		}
		fmt.Fprintf(&b, "\n     %s\n", c.why)
		r.runLines(&b, c)
	}
	if best == nil {
		fmt.Fprintf(&b, "\nno candidate held the target at %g req/s\n", rates[0])
	} else {
		fmt.Fprintf(&b, "\nchosen: %s (fewest GPUs, then the highest rate held: %g req/s)\n", best.name, best.held)
	}
	return b.String()
}

func (r *tuneRun) checkReport(c *tuneCandidate, rate float64) string {
	var b strings.Builder
	b.WriteString("tailgate tune --check\n")
	r.header(&b, "")
	verdict := "PASS"
	if !c.passed() {
		verdict = "FAIL"
	}
	fmt.Fprintf(&b, "\n%s: %s at %g req/s — %s\n", verdict, c.name, rate, c.why)
	r.runLines(&b, c)
	return b.String()
}

// A worker config file holds `tailgate worker` flags, one --name=value a
// line; blank lines and lines starting with # are skipped. Flags given on
// the worker's command line override the file's.

func writeWorkerConfig(path string, c *tuneCandidate, rate float64, target []string) error {
	var b strings.Builder
	fmt.Fprintf(&b, "# tailgate worker --config %s\n# written by tailgate tune on %s (%s): held the target at %g req/s, up to %g req/s\n# candidate: %s\n",
		path, time.Now().UTC().Format(time.RFC3339), hostCPU(), rate, c.held, c.name)
	b.WriteString("# the target and workload, for tailgate tune --check (flags on its command line win):\n")
	for _, a := range target {
		b.WriteString(tuneTargetPrefix + a + "\n")
	}
	for _, a := range c.args {
		b.WriteString(a + "\n")
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

// tuneTargetPrefix starts the comment lines of a worker config file that
// record the target and workload it was tuned for.
const tuneTargetPrefix = "#tune "

// tuneTarget returns tune's own flags given on its command line that
// describe the target and the workload, the rate being the target rate
// alone.
func tuneTarget(fs *flag.FlagSet, rate float64) []string {
	var own tuneFlags
	mine := flag.NewFlagSet("tune", flag.ContinueOnError)
	own.register(mine)
	skip := []string{"out", "report", "check", "space", "max-candidates", "max-duration", "rate"}
	out := []string{"--rate=" + strconv.FormatFloat(rate, 'g', -1, 64)}
	fs.Visit(func(f *flag.Flag) {
		if mine.Lookup(f.Name) != nil && !slices.Contains(skip, f.Name) {
			out = append(out, "--"+f.Name+"="+f.Value.String())
		}
	})
	return out
}

// readTuneTarget returns the target and workload flags recorded in a
// worker config file by tune.
func readTuneTarget(path string) ([]string, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--check: %w", err)
	}
	var out []string
	for line := range strings.SplitSeq(string(raw), "\n") {
		if a, ok := strings.CutPrefix(strings.TrimSpace(line), tuneTargetPrefix); ok {
			out = append(out, strings.TrimSpace(a))
		}
	}
	return out, nil
}

func readWorkerConfig(path string) ([]string, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--config: %w", err)
	}
	var args []string
	sc := bufio.NewScanner(bytes.NewReader(raw))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		if !strings.HasPrefix(line, "-") {
			return nil, fmt.Errorf("--config %s line %d: want a flag, --name=value", path, n)
		}
		args = append(args, line)
	}
	return args, nil
}

// withWorkerConfig returns args with the flags of the --config FILE it
// names (if any) put first, so those on the command line win.
func withWorkerConfig(args []string) ([]string, error) {
	if slices.ContainsFunc(args, func(a string) bool { return a == "-h" || a == "-help" || a == "--help" }) {
		return args, nil // the flags' help, whatever the file holds
	}
	for i, a := range args {
		if a == "--" {
			break
		}
		name, val, hasVal := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !strings.HasPrefix(a, "-") || name != "config" {
			continue
		}
		rest := slices.Clone(args[:i])
		if !hasVal {
			if i+1 >= len(args) {
				return nil, errors.New("--config needs a file")
			}
			val = args[i+1]
			rest = append(rest, args[i+2:]...)
		} else {
			rest = append(rest, args[i+1:]...)
		}
		file, err := readWorkerConfig(val)
		if err != nil {
			return nil, err
		}
		return append(file, rest...), nil
	}
	return args, nil
}
