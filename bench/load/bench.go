package load

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"
)

// Main runs one `tailgate bench` invocation: it validates o, runs the plan
// against each side — a scenario's own fleet, started and torn down per
// side, or the deployments named — prints the report (or the comparison) on
// o.Stdout and writes the files asked for. A run stopped early still reports
// what it saw, and Main returns why it stopped ("interrupted" when ctx was
// cancelled). Main is bounded in time whatever ctx says: the phases, the
// drain, the fleet's start and each hook, with room to spare.
func Main(ctx context.Context, o Options) error {
	if o.Scenario == "fanout" || o.Fanout.Sweep {
		return mainFanout(ctx, o)
	}
	if o.Scenario == "priority" {
		return mainPriority(ctx, o)
	}
	if o.Scenario == "multiturn" {
		return mainMultiturn(ctx, o)
	}
	if o.Scenario == "geo" {
		return mainGeo(ctx, o)
	}
	b, err := o.resolve()
	if err != nil {
		return err
	}
	if err := b.readReplay(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, b.bound())
	defer cancel()
	reports, runErr := b.run(ctx)
	if len(reports) == 0 {
		return runErr
	}
	if err := b.output(reports); err != nil {
		return errors.Join(runErr, err)
	}
	for _, r := range reports {
		if c := r.ColdStart; c != nil && c.Verdict != "PASS" {
			runErr = errors.Join(runErr, errors.New("cold start: FAIL (first token later than 1s after ready or after the wake from sleep, no replica asleep, or errors within the queue bound)"))
		}
	}
	if fails, checks := sloFailures(reports); fails > 0 {
		runErr = errors.Join(runErr, fmt.Errorf("latency budgets: %d of %d checks FAIL", fails, checks))
	}
	return runErr
}

// bench is one validated invocation.
type bench struct {
	opts     Options // defaults applied
	scenario *Scenario
	plan     Plan
	workload WorkloadConfig // all but the model, which is each side's
	sides    []Side         // B completed from A
}

// bound is the longest an invocation may take.
func (b *bench) bound() time.Duration {
	o := &b.opts
	return 2*(b.plan.Length+o.Timeout) + 2*o.StartupTimeout + time.Duration(len(b.plan.Actions))*o.HookTimeout + time.Minute
}

func (b *bench) readReplay() error {
	path := b.opts.Replay
	if path == "" {
		return nil
	}
	fh, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("--replay: %w", err)
	}
	defer fh.Close()
	if b.workload.Replay, err = ReadReplay(fh); err != nil {
		return fmt.Errorf("--replay %s: %w", path, err)
	}
	return nil
}

// run runs every side in turn and returns the reports it has; it stops at
// the first side that fails, or before the next one once ctx is done.
func (b *bench) run(ctx context.Context) ([]*Report, error) {
	if b.scenario != nil && b.scenario.Static {
		return b.runOverhead(ctx)
	}
	if b.scenario != nil && b.scenario.Databases {
		return b.runDatabases(ctx)
	}
	var reports []*Report
	for i, s := range b.sides {
		if i > 0 && ctx.Err() != nil {
			break
		}
		var rep *Report
		var err error
		if b.scenario != nil {
			rep, err = b.runScenario(ctx, s, i)
		} else {
			rep, err = b.runExternal(ctx, s, i)
		}
		if rep != nil {
			reports = append(reports, rep)
		}
		if err != nil {
			return reports, err
		}
	}
	return reports, nil
}

func sideName(i int) string { return string(rune('A' + i)) }

// comparing tells whether there is a B side.
func (b *bench) comparing() bool { return len(b.sides) > 1 }

// binary is the tailgate executable a scenario's fleet runs.
func (b *bench) binary() (string, error) {
	if b.opts.Binary != "" {
		return b.opts.Binary, nil
	}
	self, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("find own executable: %w", err)
	}
	return self, nil
}

// startFleet starts a scenario's fleet with a side's extra flags.
func (b *bench) startFleet(ctx context.Context, s Side) (*Local, error) {
	cfg, err := b.fleetConfig(s)
	if err != nil {
		return nil, err
	}
	return StartLocal(ctx, cfg)
}

// fleetConfig is the configuration of a scenario's fleet with a side's
// extra flags.
func (b *bench) fleetConfig(s Side) (LocalConfig, error) {
	o, sc := &b.opts, b.scenario
	bin, err := b.binary()
	if err != nil {
		return LocalConfig{}, err
	}
	return LocalConfig{
		Binary: bin, Keep: o.Keep, Replicas: o.Replicas, Static: sc.Static, Model: s.Model,
		GatewayArgs: strings.Fields(s.GatewayArgs),
		WorkerArgs:  append(append([]string{}, sc.SimArgs...), strings.Fields(s.WorkerArgs)...),
		Fleet:       b.fleetBounds(),
		Replace:     !o.NoReplace && b.fleetBounds() == nil, ReplaceDelay: o.ReplaceDelay, StartupTimeout: o.StartupTimeout, Log: o.Stderr,
	}, nil
}

// fleetBounds are the fleet controller's bounds for the scenario's fleet;
// nil when the bench starts the workers itself.
func (b *bench) fleetBounds() *FleetBounds {
	o, sc := &b.opts, b.scenario
	switch {
	case sc.Fleet != nil:
		f := *sc.Fleet
		f.Max = o.Replicas
		f.Min = min(f.Min, f.Max)
		return &f
	case o.FleetController:
		return &FleetBounds{Min: o.Replicas, Max: o.Replicas}
	}
	return nil
}

// runScenario starts a local fleet for one configuration, runs the plan on
// it and tears it down.
func (b *bench) runScenario(ctx context.Context, s Side, i int) (*Report, error) {
	fleet, err := b.startFleet(ctx, s)
	if err != nil {
		return nil, err
	}
	defer func() {
		fleet.Close()
		if b.opts.Keep {
			fmt.Fprintf(b.opts.Stderr, "bench: kept %s (gateway data and logs)\n", fleet.Dir())
		}
	}()
	t := fleet.Target()
	t.Label = s.Label
	if t.Label == "" {
		t.Label = "scenario " + b.scenario.Name
		if extra := strings.TrimSpace(s.GatewayArgs + " " + s.WorkerArgs); extra != "" {
			t.Label += " " + extra
		}
		if b.comparing() {
			t.Label = sideName(i) + ": " + t.Label
		}
	}
	return b.runOne(ctx, t, s.Model, fleet)
}

// runOverhead runs the overhead scenario: the same load through the gateway
// and straight to the engine behind it.
func (b *bench) runOverhead(ctx context.Context) ([]*Report, error) {
	s := b.sides[0]
	fleet, err := b.startFleet(ctx, s)
	if err != nil {
		return nil, err
	}
	defer fleet.Close()
	gw := fleet.Target()
	gw.Label = "A: through the gateway"
	direct := Target{Label: "B: straight to the engine", BaseURL: fleet.Engines()[0]}
	var reports []*Report
	for _, t := range []Target{gw, direct} {
		rep, err := b.runOne(ctx, t, s.Model, nil)
		if rep != nil {
			reports = append(reports, rep)
		}
		if err != nil {
			return reports, err
		}
	}
	return reports, nil
}

// checkSLO checks rep against the budgets asked for, if any.
func (b *bench) checkSLO(ctx context.Context, rep *Report, t Target, model string) error {
	o := &b.opts
	s, from := o.SLO, o.SLOFrom
	if o.SLOFromGateway {
		if t.AdminURL == "" && b.scenario != nil && b.scenario.Static {
			return nil // overhead's engine side: no gateway, nothing to check
		}
		var err error
		if s, err = gatewaySLO(ctx, t); err != nil {
			return err
		}
		from = "from the gateway " + t.AdminURL
	}
	if s == nil {
		return nil
	}
	rep.SLO, rep.SLOFrom = checkSLO(rep, s.For(model)), from
	return nil
}

// runOne runs the plan against one target and analyzes it.
func (b *bench) runOne(ctx context.Context, t Target, model string, fleet Fleet) (*Report, error) {
	o := &b.opts
	wcfg := b.workload
	wcfg.Model = model
	wl, err := NewWorkload(wcfg)
	if err != nil {
		return nil, err
	}
	mode := fmt.Sprintf("%g req/s open loop", o.Rate)
	if o.Rate == 0 {
		mode = fmt.Sprintf("%d clients closed loop", o.Concurrency)
	}
	fmt.Fprintf(o.Stderr, "bench: %s — %s, %s, %s (%.0fs)\n", t.Label, mode, wl.Describe(), FormatPhases(b.plan.Phases), b.plan.Length.Seconds())
	res, err := Run(ctx, Config{
		Target: t, Workload: wl, Plan: b.plan, Rate: o.Rate, Concurrency: o.Concurrency, Seed: o.Seed,
		Timeout: o.Timeout, DisableKeepAlive: o.DisableKeepAlive, MaxConns: o.MaxConns, MaxInflight: o.MaxInflight,
		SampleInterval: o.SampleInterval, Fleet: fleet, Progress: o.Progress, ProgressTTY: o.ProgressTTY,
	})
	if res == nil {
		return nil, err
	}
	rep := Analyze(res, o.Window)
	if l, ok := fleet.(*Local); ok && b.scenario != nil && b.scenario.Fleet != nil && b.scenario.Fleet.Min == 0 {
		rep.ColdStart = l.coldStart(rep)
	}
	if serr := b.checkSLO(ctx, rep, t, model); serr != nil {
		err = errors.Join(err, serr)
	}
	if err != nil {
		rep.Notes = append(rep.Notes, "the run was stopped early: "+err.Error())
		if errors.Is(err, context.Canceled) {
			err = errors.New("interrupted")
		}
	}
	return rep, err
}
