package load

import (
	"errors"
	"fmt"
	"io"
	"math"
	"net/url"
	"strings"
	"time"
)

// Options configures one `tailgate bench` invocation for [Main]: what is
// measured (a built-in scenario on a fleet the bench starts, or a deployment
// it did not), the workload, and where the report goes. Fields mirror the
// command's flags, and [Options.Validate] names the flag at fault. The zero
// value of a field is its default — the scenario's value where the scenario
// has one — and says so in its doc; a feature that is on by default is
// turned off by a No… or Disable… field.
type Options struct {
	// Scenario names a built-in scenario (see [Scenarios]) run on a local
	// fleet the bench starts. Exactly one of Scenario and A.Target is set.
	Scenario string
	// A is the deployment measured (or, in a scenario, the configuration of
	// its fleet); B is the second of a comparison.
	A, B Side
	// Compare runs the same seeded workload against A, then B, and sets the
	// reports side by side. A B.Target implies it. In a scenario B needs
	// GatewayArgs or WorkerArgs of its own (except in overhead, which always
	// compares the gateway with the engine behind it).
	Compare bool
	// AdminTenant is the tenant of the API key, to find its requests among
	// the admin API's recent requests; "" means every tenant's.
	AdminTenant string
	// Fanout configures the fanout scenario and the hedge sweep.
	Fanout FanoutOptions
	// Priority configures the priority scenario.
	Priority PriorityOptions
	// Multiturn configures the multiturn scenario.
	Multiturn MultiturnOptions

	// Postgres starts the PostgreSQL of the databases scenario; nil: that
	// scenario cannot run.
	Postgres PostgresFunc

	// Binary is the tailgate executable a scenario's fleet runs; "" means
	// the running executable, so [Main] called from anything but tailgate
	// itself must set it.
	Binary string
	// Replicas is the number of replicas a scenario starts, 1 to 32; 0
	// means the scenario's.
	Replicas int
	// NoReplace leaves a scenario's fleet one short after a kill; the zero
	// value starts a replacement worker, as a fleet manager would,
	// ReplaceDelay after the kill.
	NoReplace    bool
	ReplaceDelay time.Duration
	// FleetController runs the scenario's fleet under the gateway's fleet
	// controller (`tailgate up --fleet-min N --fleet-max N`, N the
	// replicas): it, not the bench, replaces a killed worker. The
	// scenario's scaleout phases are dropped (the controller decides the
	// count). The coldstart scenario always runs so.
	FleetController bool
	// Keep keeps the fleet's directory (gateway data, logs) and prints
	// where it is; the zero value removes it.
	Keep bool
	// StartupTimeout bounds the start of a scenario's fleet; 0 means 1
	// minute.
	StartupTimeout time.Duration

	// Rate is the open-loop Poisson arrival rate, requests per second; 0
	// means the scenario's, or 10. Concurrency > 0 runs a closed loop of
	// that many clients instead; then Rate must be 0.
	Rate        float64
	Concurrency int
	// Phases is the phase list, e.g. steady:30s,burst:10s:x3,kill:1 (see
	// [ParsePhases]); "" means the scenario's, or steady:30s.
	Phases string
	// Seed seeds the request sequence and the schedule: the same seed sends
	// the same requests at the same times. 0 is a seed like any other (the
	// command's default is 1).
	Seed int64
	// PromptTokens and OutputTokens are length distributions (see
	// [ParseDist]); "" means the scenario's, or lognormal:256:0.5 and
	// lognormal:64:0.5.
	PromptTokens, OutputTokens string
	// StreamFraction is the share of requests that stream, 0 to 1; nil
	// means the scenario's, or 0.5.
	StreamFraction *float64
	// Replay is a JSONL file of requests replayed in order (see
	// [ReadReplay]); "" means drawn requests.
	Replay string
	// Endpoint is "chat" (/v1/chat/completions) or "completions"
	// (/v1/completions); "" means chat.
	Endpoint string
	// NoIgnoreEOS leaves ignore_eos out of the requests (OpenAI's API
	// rejects it); the zero value sends it, so the engine generates exactly
	// the drawn length.
	NoIgnoreEOS bool
	// Timeout is the deadline of one request; 0 means 30s.
	Timeout time.Duration
	// DisableKeepAlive opens a new connection for every request.
	DisableKeepAlive bool
	// MaxConns caps the client's connections (0: no cap); MaxInflight caps
	// open-loop requests in flight (0: 4096).
	MaxConns, MaxInflight int

	// OnKill and OnScaleOut are shell commands that carry out kill and
	// scaleout phases against a target (see [Hooks]); a scenario does
	// without them. HookTimeout bounds one; 0 means 2 minutes.
	OnKill, OnScaleOut string
	HookTimeout        time.Duration

	// Sources label the requests in turn with these source names (sent as
	// x-tailgate-source); the report gives each source's figures. nil: no
	// labels.
	Sources []string

	// SLO, when set, checks every phase against these latency budgets
	// (SLOFrom names where they came from, for the report); SLOFromGateway
	// reads them from the target gateway's admin API instead (a scenario's
	// own gateway, or A.Admin). A FAIL makes [Main] return an error.
	SLO            *SLO
	SLOFrom        string
	SLOFromGateway bool

	// JSONFile and HTMLFile receive the full report as JSON and as a
	// self-contained HTML page; "" writes none.
	JSONFile, HTMLFile string
	// Window is how long after a kill or scale-out the failover figures
	// cover; 0 means 10s.
	Window time.Duration
	// SampleInterval is how often the admin API's replica list is sampled,
	// at least 10ms; 0 means 250ms.
	SampleInterval time.Duration

	// Stdout receives the report, Stderr a line per step and the fleet's
	// notes; nil discards them. Progress receives the live progress line
	// (nil: none), rewritten in place when ProgressTTY.
	Stdout, Stderr io.Writer
	Progress       io.Writer
	ProgressTTY    bool
}

// Side is one target of a run, or one configuration of a scenario's fleet.
type Side struct {
	// Label names the side in the report; "" means the target's base URL,
	// or the scenario and its extra flags ("A: "/"B: " in front when
	// comparing).
	Label string
	// Target is the OpenAI base URL of a deployment, ending in /v1; a
	// scenario has none.
	Target string
	// Key, or the trimmed content of KeyFile, is the API key; at most one
	// is set, and neither sends none. B without either uses A's.
	Key, KeyFile string
	// Admin is a tailgate gateway's admin URL (http://host:8081) and
	// AdminTokenFile holds its admin token (required with Admin); they add
	// the stage timings of streams and the replica samples. "" means none.
	Admin, AdminTokenFile string
	// Model is the model asked for; "" means tailgate-sim in a scenario
	// (whose fleets all serve A's model), or the first the target lists (B:
	// A's model).
	Model string
	// GatewayArgs and WorkerArgs are extra flags, split at white space, for
	// a scenario's gateway and for each of its workers (or engines); B's
	// come after A's, so they win.
	GatewayArgs, WorkerArgs string
}

// The flags of a side, for error messages.
var sideFlags = [2]struct{ target, key, keyFile, admin, adminTokenFile string }{
	{"--target", "--key", "--key-file", "--admin", "--admin-token-file"},
	{"--target-b", "--key-b", "--key-file-b", "--admin-b", "--admin-token-file-b"},
}

// Validate reports options that cannot run, in one line naming the flag at
// fault. It reads no file and starts nothing.
func (o Options) Validate() error {
	_, err := o.resolve()
	return err
}

// resolve validates o and turns it into a ready invocation: defaults
// applied, phases planned, distributions parsed, sides merged.
func (o Options) resolve() (*bench, error) {
	sc, err := o.lookupScenario()
	if err != nil {
		return nil, err
	}
	if err := o.checkMode(sc); err != nil {
		return nil, err
	}
	if err := o.checkLoop(); err != nil {
		return nil, err
	}
	if err := o.checkSLO(sc); err != nil {
		return nil, err
	}
	o = o.withDefaults(sc)
	if err := o.checkTimes(); err != nil {
		return nil, err
	}
	plan, err := o.plan(sc)
	if err != nil {
		return nil, err
	}
	wcfg, err := o.workload()
	if err != nil {
		return nil, err
	}
	b := &bench{opts: o, scenario: sc, plan: plan, workload: wcfg, sides: o.sides(sc)}
	if sc == nil {
		for i, s := range b.sides {
			if err := s.check(i); err != nil {
				return nil, err
			}
		}
	}
	return b, nil
}

// lookupScenario checks that exactly one of a scenario and a target is
// given and returns the scenario, if any.
func (o *Options) lookupScenario() (*Scenario, error) {
	switch {
	case o.Scenario != "" && o.A.Target != "":
		return nil, errors.New("give --scenario or --target, not both")
	case o.Scenario == "" && o.A.Target == "":
		return nil, errors.New("give --scenario NAME (a local fleet; try --scenario failover) or --target URL (a deployment)")
	case o.Scenario == "":
		return nil, nil
	}
	s, ok := LookupScenario(o.Scenario)
	if !ok {
		var names []string
		for _, sc := range Scenarios() {
			names = append(names, sc.Name)
		}
		return nil, fmt.Errorf("unknown scenario %q: want one of %s", o.Scenario, strings.Join(names, ", "))
	}
	return &s, nil
}

// checkSLO refuses two sources of budgets, and budgets from a gateway
// without its admin API.
func (o *Options) checkSLO(sc *Scenario) error {
	switch {
	case o.SLO != nil && o.SLOFromGateway:
		return errors.New("give --slo FILE or --slo-from-gateway, not both")
	case o.SLOFromGateway && sc == nil && o.A.Admin == "":
		return errors.New("--slo-from-gateway reads the budgets from the gateway's admin API: give --admin and --admin-token-file")
	}
	return nil
}

// checkMode refuses what belongs to the other mode.
func (o *Options) checkMode(sc *Scenario) error {
	if sc != nil {
		return o.checkScenario(sc)
	}
	return o.checkTargets()
}

// checkScenario refuses hooks and B's target in a scenario, a comparison
// without B's configuration, and a replica count out of range.
func (o *Options) checkScenario(sc *Scenario) error {
	switch {
	case o.OnKill != "" || o.OnScaleOut != "":
		return errors.New("--on-kill and --on-scaleout are for --target; a scenario kills and starts its own workers")
	case o.B.Target != "":
		return errors.New("--target-b is for comparing --target deployments; compare scenario configurations with --b-gateway-args/--b-worker-args")
	case sc.Databases && (o.Compare || o.B.GatewayArgs != "" || o.B.WorkerArgs != ""):
		return errors.New("the databases scenario compares SQLite (A) with PostgreSQL (B) by itself: drop --compare and the --b-* flags")
	case o.Compare && !sc.Static && o.B.GatewayArgs == "" && o.B.WorkerArgs == "":
		return errors.New("--compare with a scenario needs B's configuration: --b-gateway-args or --b-worker-args")
	case o.Replicas < 0 || o.Replicas > 32:
		return fmt.Errorf("--replicas %d: want 1 to 32", o.Replicas)
	case o.FleetController && (sc.Static || sc.Databases):
		return fmt.Errorf("--fleet-controller: scenario %s has no workers for a fleet controller to run", sc.Name)
	}
	return nil
}

// checkTargets refuses a comparison without B's target and a fleet's flags
// against targets.
func (o *Options) checkTargets() error {
	switch {
	case o.Compare && o.B.Target == "":
		return errors.New("--compare with --target needs --target-b")
	case o.A.GatewayArgs != "" || o.A.WorkerArgs != "" || o.B.GatewayArgs != "" || o.B.WorkerArgs != "":
		return errors.New("--gateway-args and --worker-args configure a --scenario's own fleet")
	}
	return nil
}

// withDefaults fills the zero fields: from the scenario first, then the
// command's defaults.
func (o Options) withDefaults(sc *Scenario) Options {
	if o.B.Target != "" {
		o.Compare = true
	}
	if sc != nil {
		o.Replicas = orDefault(o.Replicas, sc.Replicas)
		if o.Concurrency == 0 {
			o.Rate = orDefault(o.Rate, sc.Rate)
		}
		if o.Phases == "" && o.FleetController {
			o.Phases = withoutScaleOut(sc.Phases)
		}
		o.Phases = orDefault(o.Phases, sc.Phases)
		o.PromptTokens = orDefault(o.PromptTokens, sc.Prompt)
		o.OutputTokens = orDefault(o.OutputTokens, sc.Output)
		if o.StreamFraction == nil {
			o.StreamFraction = &sc.StreamFraction
		}
		o.A.Model = orDefault(o.A.Model, "tailgate-sim")
	}
	if o.Concurrency == 0 {
		o.Rate = orDefault(o.Rate, 10)
	}
	o.Phases = orDefault(o.Phases, "steady:30s")
	o.PromptTokens = orDefault(o.PromptTokens, "lognormal:256:0.5")
	o.OutputTokens = orDefault(o.OutputTokens, "lognormal:64:0.5")
	if o.StreamFraction == nil {
		half := 0.5
		o.StreamFraction = &half
	}
	o.Endpoint = orDefault(o.Endpoint, "chat")
	o.StartupTimeout = orDefault(o.StartupTimeout, time.Minute)
	o.Timeout = orDefault(o.Timeout, 30*time.Second)
	o.HookTimeout = orDefault(o.HookTimeout, 2*time.Minute)
	o.Window = orDefault(o.Window, 10*time.Second)
	o.SampleInterval = orDefault(o.SampleInterval, 250*time.Millisecond)
	if o.Stdout == nil {
		o.Stdout = io.Discard
	}
	if o.Stderr == nil {
		o.Stderr = io.Discard
	}
	return o
}

// orDefault returns v, or def when v is the zero value.
func orDefault[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

// checkLoop checks that the load is an open or a closed loop, not both.
func (o *Options) checkLoop() error {
	switch {
	case o.Rate != 0 && o.Concurrency != 0:
		return errors.New("give --rate (open loop) or --concurrency (closed loop), not both")
	case o.Concurrency < 0:
		return errors.New("--concurrency must be at least 1")
	case o.Rate < 0 || math.IsNaN(o.Rate):
		return errors.New("--rate must be positive")
	}
	return nil
}

// checkTimes checks the endpoint and the durations; defaults are applied.
func (o *Options) checkTimes() error {
	switch {
	case o.Endpoint != "chat" && o.Endpoint != "completions":
		return fmt.Errorf("--endpoint %q: want chat or completions", o.Endpoint)
	case o.Timeout < 0 || o.Window < 0 || o.SampleInterval < 10*time.Millisecond:
		return errors.New("--timeout and --window must be positive, --sample-interval at least 10ms")
	}
	return nil
}

// plan parses the phases and checks that someone can carry out their kill
// and scaleout actions.
func (o *Options) plan(sc *Scenario) (Plan, error) {
	phases, err := ParsePhases(o.Phases)
	if err != nil {
		return Plan{}, fmt.Errorf("--phases: %w", err)
	}
	plan, err := NewPlan(phases)
	if err != nil {
		return Plan{}, fmt.Errorf("--phases: %w", err)
	}
	for _, a := range plan.Actions {
		switch {
		case sc != nil && sc.Static:
			return Plan{}, fmt.Errorf("scenario %s has no workers to kill or scale out", sc.Name)
		case sc != nil && (sc.Fleet != nil || o.FleetController) && a.Kind == ScaleOut:
			return Plan{}, errors.New("--phases: scaleout with the fleet controller: the controller decides how many workers run; drop scaleout")
		case sc == nil && (a.Kind == Kill && o.OnKill == "" || a.Kind == ScaleOut && o.OnScaleOut == ""):
			return Plan{}, fmt.Errorf("the phases include %s: against --target it needs --on-%s CMD (or run a --scenario)", a.Kind, a.Kind)
		}
	}
	return plan, nil
}

// withoutScaleOut drops the scaleout phases of a phase list.
func withoutScaleOut(phases string) string {
	var keep []string
	for _, p := range strings.Split(phases, ",") {
		if !strings.HasPrefix(strings.TrimSpace(p), string(ScaleOut)) {
			keep = append(keep, p)
		}
	}
	return strings.Join(keep, ",")
}

// workload parses the workload's distributions; the model and the replayed
// requests are filled in later.
func (o *Options) workload() (WorkloadConfig, error) {
	w := WorkloadConfig{Completions: o.Endpoint == "completions", StreamFraction: *o.StreamFraction, Sources: o.Sources,
		IgnoreEOS: !o.NoIgnoreEOS, Seed: o.Seed}
	var err error
	if w.Prompt, err = ParseDist(o.PromptTokens); err != nil {
		return w, fmt.Errorf("--prompt-tokens %w", err)
	}
	if w.Output, err = ParseDist(o.OutputTokens); err != nil {
		return w, fmt.Errorf("--output-tokens %w", err)
	}
	if sf := w.StreamFraction; sf < 0 || sf > 1 || math.IsNaN(sf) {
		return w, fmt.Errorf("--stream-fraction %v: want a number from 0 to 1", sf)
	}
	return w, nil
}

// sides returns the sides to run, B completed from A: in a scenario B's
// extra flags follow A's and B serves A's model; against targets B borrows
// A's key and model unless it has its own. The overhead scenario has one
// side (it compares by itself).
func (o *Options) sides(sc *Scenario) []Side {
	sides := []Side{o.A}
	if !o.Compare || sc != nil && sc.Static {
		return sides
	}
	b := o.B
	if sc != nil {
		b.GatewayArgs = strings.TrimSpace(o.A.GatewayArgs + " " + o.B.GatewayArgs)
		b.WorkerArgs = strings.TrimSpace(o.A.WorkerArgs + " " + o.B.WorkerArgs)
		b.Model = o.A.Model
		return append(sides, b)
	}
	if b.Key == "" && b.KeyFile == "" {
		b.Key, b.KeyFile = o.A.Key, o.A.KeyFile
	}
	b.Model = orDefault(b.Model, o.A.Model)
	return append(sides, b)
}

// check validates a target side (i: 0 for A, 1 for B).
func (s Side) check(i int) error {
	fl := sideFlags[i]
	if u, err := url.Parse(strings.TrimSuffix(s.Target, "/")); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("%s %q: want a base URL like http://host:8080/v1", fl.target, s.Target)
	}
	if s.Key != "" && s.KeyFile != "" {
		return fmt.Errorf("give %s or %s, not both", fl.key, fl.keyFile)
	}
	if s.Admin != "" && s.AdminTokenFile == "" {
		return fmt.Errorf("%s needs %s (the gateway's DIR/admin.token)", fl.admin, fl.adminTokenFile)
	}
	return nil
}
