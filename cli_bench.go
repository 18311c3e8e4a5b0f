package main

import (
	"context"
	"errors"
	"flag"
	"io"
	"strings"
	"time"

	"github.com/tailgate-dev/tailgate/bench/load"
)

// benchFlags are the flags of `tailgate bench`. Most are bound straight to
// load.Options; the rest say the opposite of a No… field, or need to know
// whether they were given.
type benchFlags struct {
	opts                          load.Options
	replace, ignoreEOS, keepAlive bool
	streamFraction                float64
	quiet                         bool
	sloFile                       string
	sources                       string
}

func (f *benchFlags) register(fs *flag.FlagSet) {
	o := &f.opts
	fs.StringVar(&o.Scenario, "scenario", "", "run a built-in scenario on a local fleet the bench starts: failover, coldstart, burst, scaleout, overhead, fanout, priority, multiturn, geo (list: describe them)")
	fs.StringVar(&o.A.Target, "target", "", "OpenAI base URL of the deployment under test, ending in /v1 (instead of --scenario)")
	fs.StringVar(&o.A.Key, "key", "", "API key for --target (default: $TAILGATE_API_KEY unless --key-file is given)")
	fs.StringVar(&o.A.KeyFile, "key-file", "", "file holding the API key for --target")
	fs.StringVar(&o.A.Admin, "admin", "", "tailgate admin URL of the target (http://host:8081): stage timings of streams and replica queue depth")
	fs.StringVar(&o.A.AdminTokenFile, "admin-token-file", "", "file holding the admin token (the gateway's DIR/admin.token)")
	fs.StringVar(&o.AdminTenant, "admin-tenant", "", "tenant of --key, to find its requests among the admin API's recent requests")
	fs.StringVar(&o.A.Model, "model", "", "model to ask for (default: the scenario's, or the target's first model)")
	fs.StringVar(&o.A.Label, "label", "", "name of the (first) target in the report")
	fs.StringVar(&o.A.GatewayArgs, "gateway-args", "", "scenario: extra flags for the gateway, e.g. \"--default-max-tokens 256\"")
	fs.StringVar(&o.A.WorkerArgs, "worker-args", "", "scenario: extra flags for every worker (sim knobs), e.g. \"--sim-stall-prob 0.02\"")

	fs.BoolVar(&o.Compare, "compare", false, "run the same seeded workload twice, against A and B, and print them side by side")
	fs.StringVar(&o.B.Target, "target-b", "", "compare: B's base URL (any OpenAI-compatible server)")
	fs.StringVar(&o.B.Key, "key-b", "", "compare: B's API key (default: $TAILGATE_API_KEY_B unless --key-file-b is given, else --key)")
	fs.StringVar(&o.B.KeyFile, "key-file-b", "", "compare: file holding B's API key")
	fs.StringVar(&o.B.Admin, "admin-b", "", "compare: B's tailgate admin URL")
	fs.StringVar(&o.B.AdminTokenFile, "admin-token-file-b", "", "compare: B's admin token file")
	fs.StringVar(&o.B.Model, "model-b", "", "compare: B's model (default: --model)")
	fs.StringVar(&o.B.Label, "label-b", "", "compare: name of B in the report")
	fs.StringVar(&o.B.GatewayArgs, "b-gateway-args", "", "compare a scenario: extra gateway flags for B only")
	fs.StringVar(&o.B.WorkerArgs, "b-worker-args", "", "compare a scenario: extra worker flags for B only")

	fs.IntVar(&o.Replicas, "replicas", 0, "scenario: replicas started (default: the scenario's)")
	fs.BoolVar(&f.replace, "replace", true, "scenario: start a replacement worker after each kill, as a fleet manager would")
	fs.DurationVar(&o.ReplaceDelay, "replace-delay", 0, "scenario: how long after a kill the replacement starts")
	fs.BoolVar(&o.FleetController, "fleet-controller", false, "scenario: run the workers under the gateway's fleet controller (up --fleet-min N --fleet-max N): it, not the bench, replaces a killed worker; scaleout phases are dropped")
	fs.BoolVar(&o.Keep, "keep", false, "scenario: keep the fleet's directory (gateway data, logs) and print where it is")
	fs.DurationVar(&o.StartupTimeout, "startup-timeout", time.Minute, "scenario: how long the fleet may take to be ready")

	fs.Float64Var(&o.Rate, "rate", 0, "open loop: Poisson arrivals per second (default 10, or the scenario's)")
	fs.IntVar(&o.Concurrency, "concurrency", 0, "closed loop: clients sending back to back (instead of --rate)")
	fs.StringVar(&o.Phases, "phases", "", "phases, e.g. steady:30s,burst:10s:x3,kill:1,steady:20s,scaleout:1,steady:20s (default steady:30s, or the scenario's)")
	fs.Int64Var(&o.Seed, "seed", 1, "seed of the request sequence and the schedule: the same seed sends the same requests at the same times")
	fs.StringVar(&o.PromptTokens, "prompt-tokens", "", "prompt length distribution: N, lognormal:MEDIAN:SPREAD or uniform:MIN:MAX (default lognormal:256:0.5)")
	fs.StringVar(&o.OutputTokens, "output-tokens", "", "output length distribution (default lognormal:64:0.5)")
	fs.Float64Var(&f.streamFraction, "stream-fraction", 0.5, "share of requests that stream, 0..1")
	fs.StringVar(&o.Replay, "replay", "", "JSONL file of requests to replay in order (bodies, or {\"prompt_tokens\":N,\"output_tokens\":M})")
	fs.StringVar(&o.Endpoint, "endpoint", "chat", "chat (/v1/chat/completions) or completions (/v1/completions)")
	fs.BoolVar(&f.ignoreEOS, "ignore-eos", true, "send ignore_eos so the engine generates exactly the drawn length (vLLM, tailgate; turn off for OpenAI's API)")
	fs.DurationVar(&o.Timeout, "timeout", 30*time.Second, "deadline of one request")
	fs.BoolVar(&f.keepAlive, "keepalive", true, "reuse connections (false: a new connection per request)")
	fs.IntVar(&o.MaxConns, "max-conns", 0, "cap on the client's connections (0: none); waiting for one counts in latency")
	fs.IntVar(&o.MaxInflight, "max-inflight", 4096, "open loop: cap on requests in flight; arrivals beyond it are errors (client_overload)")

	fs.StringVar(&o.OnKill, "on-kill", "", "external target: shell command run at a kill phase (env TAILGATE_BENCH_COUNT; may print the replica ids it killed)")
	fs.StringVar(&o.OnScaleOut, "on-scaleout", "", "external target: shell command run at a scaleout phase (may print the new replica ids)")
	fs.DurationVar(&o.HookTimeout, "hook-timeout", 2*time.Minute, "deadline of one hook command")

	fs.StringVar(&o.JSONFile, "json", "", "write the full report (every request, replica samples) as JSON to this file")
	fs.StringVar(&o.HTMLFile, "html", "", "write a self-contained HTML report (TTFT over time, per-phase CDFs) to this file")
	fs.DurationVar(&o.Window, "window", 10*time.Second, "failover window: latency and queue figures cover this long after a kill or scale-out")
	fs.DurationVar(&o.SampleInterval, "sample-interval", 250*time.Millisecond, "how often the admin API's replica list is sampled")
	fs.BoolVar(&f.quiet, "quiet", false, "no progress line on stderr")
	fs.StringVar(&f.sloFile, "slo", "", "check every phase against the latency budgets of this YAML file (a gateway --config file's slo and models.NAME.slo keys, over the defaults): PASS/FAIL per phase and stage, exit status 1 on a FAIL")
	fs.StringVar(&f.sources, "sources", "", "label the requests in turn with these sources, comma-separated (sent as x-tailgate-source); the report gives each source's latencies")
	fs.BoolVar(&o.SLOFromGateway, "slo-from-gateway", false, "as --slo, with the budgets the gateway under test holds (its /admin/v1/slo; needs --admin unless a scenario)")
	registerFanout(fs, &o.Fanout)
	registerPriority(fs, &o.Priority)
	registerMultiturn(fs, &o.Multiturn)
}

const benchSynopsis = `bench (--scenario NAME | --target URL [--key KEY]) [--rate R | --concurrency C] [--phases LIST] [--seed N] [--json F] [--html F] [--compare ...] [--slo FILE | --slo-from-gateway]

Examples:
  tailgate bench --scenario failover --html failover.html
  tailgate bench --scenario coldstart                  # from zero replicas, then from sleep, under the fleet controller; exit status 1 unless the first token comes within 1s of ready and of the wake
  tailgate bench --target http://gw:8080/v1 --key-file team.key --admin http://gw:8081 \
      --admin-token-file admin.token --rate 20 --phases steady:60s,burst:20s:x3,steady:30s
  tailgate bench --scenario fanout --seeds 1,2,3
  tailgate bench --scenario fanout --sweep-hedge
  tailgate bench --scenario priority                   # exit status 1 when interactive p99 rises over 1.2x beside a batch
  tailgate bench --scenario multiturn --seed 2         # follow-up TTFT per --affinity mode; exit status 1 unless session wins
  tailgate bench --scenario geo --html geo.html        # 3 regions behind edges, one killed; exit status 1 on an error after the kill
  tailgate bench --scenario failover --compare --b-worker-args "--sim-stall-prob 0.05"
  tailgate bench --target http://gw:8080/v1 --key K --compare --target-b http://vllm:8000/v1
  tailgate bench --scenario burst --slo gateway.yaml   # exit status 1 when a stage is over budget`

func cmdBench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("bench", benchSynopsis, stderr)
	var f benchFlags
	f.register(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if f.opts.Scenario == "list" {
		return load.WriteScenarios(stdout)
	}
	o, err := f.options(fs)
	if err != nil {
		return err
	}
	o.Stdout, o.Stderr = stdout, stderr
	o.Postgres = benchPostgres
	if !f.quiet {
		o.Progress, o.ProgressTTY = stderr, isTerminal(stderr)
	}
	return load.Main(ctx, o)
}

// options maps the parsed flags to load.Options. load.Options reads a zero
// as "the default"; a flag given as 0 where the command never took 0 is
// refused here, naming it. load.Main validates the rest.
func (f *benchFlags) options(fs *flag.FlagSet) (load.Options, error) {
	given := map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { given[fl.Name] = true })
	o := f.opts
	o.NoReplace, o.NoIgnoreEOS, o.DisableKeepAlive = !f.replace, !f.ignoreEOS, !f.keepAlive
	if given["stream-fraction"] {
		o.StreamFraction = &f.streamFraction
	}
	switch {
	case given["rate"] && given["concurrency"]:
		return o, errors.New("give --rate (open loop) or --concurrency (closed loop), not both")
	case given["concurrency"] && o.Concurrency == 0:
		return o, errors.New("--concurrency must be at least 1")
	case given["replicas"] && o.Replicas == 0 && o.Scenario != "":
		return o, errors.New("--replicas 0: want 1 to 32")
	case given["endpoint"] && o.Endpoint == "":
		return o, errors.New(`--endpoint "": want chat or completions`)
	case o.Timeout == 0 || o.Window == 0 || o.SampleInterval == 0:
		return o, errors.New("--timeout and --window must be positive, --sample-interval at least 10ms")
	}
	for src := range strings.SplitSeq(f.sources, ",") {
		if src = strings.TrimSpace(src); src != "" {
			o.Sources = append(o.Sources, src)
		}
	}
	if f.sloFile != "" {
		s, err := readBenchSLO(f.sloFile)
		if err != nil {
			return o, err
		}
		o.SLO, o.SLOFrom = s, f.sloFile
	}
	return o, nil
}
