package load

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"
)

// The geo scenario: three regions, each a real gateway (--region NAME)
// with simulated workers, all on one throwaway PostgreSQL so one key works
// in every region, as a shared database gives a team. Clients in three
// places each reach their own edge (`tailgate edge`, as a Cloudflare
// Worker runs at the point of presence nearest the client), and each
// edge reaches every region over a link with that place's delay and
// jitter to it (see [link]). Mid-run the kill phase takes one region down
// (its processes SIGKILLed and its links cut: its port refuses, as a dead
// process's host does), and the report says how soon the edges stopped
// sending it requests, what the sources it served paid for the move and
// whether any request sent after the kill failed.

// geoRegions are the regions, in the edges' --region order.
var geoRegions = []string{"eu", "us", "ap"}

// geoSource is a place clients send from: the one-way delay from its edge
// to each region (index as geoRegions), and the region it is nearest.
type geoSource struct {
	name   string
	near   string
	oneWay [3]time.Duration
}

// Round trips of public cloud regions' backbones (Paris–Frankfurt ~10 ms,
// Paris–Virginia ~80 ms, Paris–Tokyo ~220 ms, Virginia–Tokyo ~160 ms),
// halved. Each link's jitter is geoJitter of its delay.
var geoSources = []geoSource{
	{"paris", "eu", [3]time.Duration{5 * time.Millisecond, 40 * time.Millisecond, 110 * time.Millisecond}},
	{"virginia", "us", [3]time.Duration{40 * time.Millisecond, 5 * time.Millisecond, 80 * time.Millisecond}},
	{"tokyo", "ap", [3]time.Duration{110 * time.Millisecond, 80 * time.Millisecond, 5 * time.Millisecond}},
}

const (
	geoJitter = 0.1
	// geoLocal is the one-way delay from clients to their edge, next to
	// them.
	geoLocal     = 2 * time.Millisecond
	geoPhases    = "steady:15s,kill:1,steady:15s"
	geoRate      = 8 // per source
	geoReplicas  = 2 // per region
	geoKill      = "eu"
	geoPollEvery = 20 * time.Millisecond // the move's resolution
)

// geoSimArgs leave each region room for a second region's traffic: a
// request holds a slot ~0.1 s, two sources' 16 requests a second keep
// about 2 of 2×16 slots busy.
var geoSimArgs = []string{"--sim-ttft", "40ms", "--sim-tpot", "4ms", "--sim-max-seqs", "16"}

func geoRTT(s geoSource, region int) time.Duration { return 2 * s.oneWay[region] }

// mainGeo runs `bench --scenario geo`.
func mainGeo(ctx context.Context, o Options) error {
	switch {
	case o.A.Target != "":
		return errors.New("--scenario geo starts its own regions and edges: give no --target")
	case o.Compare:
		return errors.New("--compare does not apply to the geo scenario: it reports each source and region by itself")
	case o.Concurrency > 0:
		return errors.New("--scenario geo runs an open loop: give --rate (requests per second from each source), not --concurrency")
	case o.Postgres == nil:
		return errors.New("scenario geo: no way to start PostgreSQL was given (its regions share one database, so one key works in each)")
	}
	phases, err := ParsePhases(orDefault(o.Phases, geoPhases))
	if err != nil {
		return fmt.Errorf("--phases: %w", err)
	}
	plan, err := NewPlan(phases)
	if err != nil {
		return fmt.Errorf("--phases: %w", err)
	}
	kills := 0
	for _, a := range plan.Actions {
		if a.Kind != Kill {
			return errors.New("--scenario geo: the only action is kill (one region); remove scaleout from --phases")
		}
		kills++
	}
	if kills > 1 {
		return errors.New("--scenario geo: kill one region at most (one kill in --phases)")
	}
	rate := orDefault(o.Rate, geoRate)
	model := orDefault(o.A.Model, "tailgate-sim")
	wl, err := geoWorkload(o, model)
	if err != nil {
		return err
	}
	bin, err := (&bench{opts: o}).binary()
	if err != nil {
		return err
	}
	startup := orDefault(o.StartupTimeout, time.Minute)
	ctx, cancel := context.WithTimeout(ctx, 3*startup+2*(plan.Length+orDefault(o.Timeout, 30*time.Second))+time.Minute)
	defer cancel()

	fmt.Fprintln(o.Stderr, "bench: starting a throwaway PostgreSQL on 127.0.0.1 (one database for every region)")
	dbURL, stopDB, err := o.Postgres(ctx)
	if err != nil {
		return fmt.Errorf("scenario geo: %w", err)
	}
	defer func() { _ = stopDB() }()
	f, err := startGeo(ctx, o, bin, dbURL, model)
	if f != nil {
		defer f.Close()
	}
	if err != nil {
		return err
	}
	t := Target{Label: "scenario geo", BaseURL: f.clientURLs[0] + "/v1", Also: f.clientURLs[1:], Key: f.key}
	for i := range t.Also {
		t.Also[i] += "/v1"
	}
	fmt.Fprintf(o.Stderr, "bench: geo — %g req/s from each of %d sources, %s, %s (%.0fs)\n",
		rate, len(geoSources), wl.Describe(), FormatPhases(plan.Phases), plan.Length.Seconds())
	res, runErr := Run(ctx, Config{
		Target: t, Workload: wl, Plan: plan, Rate: rate * float64(len(geoSources)), Seed: o.Seed,
		Timeout: o.Timeout, MaxInflight: o.MaxInflight, Fleet: f, Progress: o.Progress, ProgressTTY: o.ProgressTTY,
	})
	f.waitMoves()
	if res == nil {
		return runErr
	}
	rep := Analyze(res, orDefault(o.Window, 10*time.Second))
	rep.Geo = f.analyze(ctx, res, orDefault(o.Window, 10*time.Second))
	if runErr != nil {
		rep.Notes = append(rep.Notes, "the run was stopped early: "+runErr.Error())
	}
	if err := (&bench{opts: o}).output([]*Report{rep}); err != nil {
		return errors.Join(runErr, err)
	}
	if fails := rep.Geo.failures(); len(fails) > 0 {
		runErr = errors.Join(runErr, fmt.Errorf("scenario geo: %s", strings.Join(fails, "; ")))
	}
	return runErr
}

// geoWorkload is the requests of every source, labelled in turn (request
// i from source i mod 3, to that source's edge): streams, so TTFT is the
// first token.
func geoWorkload(o Options, model string) (*Workload, error) {
	prompt, err := ParseDist(orDefault(o.PromptTokens, "lognormal:128:0.5"))
	if err != nil {
		return nil, fmt.Errorf("--prompt-tokens: %w", err)
	}
	output, err := ParseDist(orDefault(o.OutputTokens, "lognormal:16:0.5"))
	if err != nil {
		return nil, fmt.Errorf("--output-tokens: %w", err)
	}
	frac := 1.0
	if o.StreamFraction != nil {
		frac = *o.StreamFraction
	}
	var sources []string
	for _, s := range geoSources {
		sources = append(sources, s.name)
	}
	return NewWorkload(WorkloadConfig{Model: model, Prompt: prompt, Output: output, StreamFraction: frac,
		IgnoreEOS: !o.NoIgnoreEOS, Seed: o.Seed, Sources: sources})
}

// geoFleet is the regions, the links and the edges; it is the run's
// [Fleet]: Kill takes a region down.
type geoFleet struct {
	o          *Options
	dir        string
	model      string
	key        string
	regions    []*Local
	edgeLinks  [][]*link // [source][region]
	clientLink []*link   // [source]: clients to their edge
	clientURLs []string
	edges      *Local   // spawns the edges in dir
	edgeProcs  []*child // [source]
	edgeAdmins []string // [source]

	killAt   time.Time
	killed   int       // region index, -1 before a kill
	openedAt [][]int64 // [source][region]: connections each edge link had opened at the kill
	watch    sync.WaitGroup
	mu       sync.Mutex
	movedMS  []*float64 // [source]: when its edge stopped routing to the killed region
	closeOne sync.Once
}

var edgeRE = regexp.MustCompile(`tailgate edge: http://(\S+) .* admin http://(\S+)`)

// startGeo starts the regions one after the other (their gateways migrate
// one database), the links and an edge per source, and waits until each
// edge routes to the region nearest it.
func startGeo(ctx context.Context, o Options, bin, dbURL, model string) (*geoFleet, error) {
	dir, err := os.MkdirTemp("", "tailgate-bench-geo-")
	if err != nil {
		return nil, fmt.Errorf("scenario geo: %w", err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "logs"), 0o700); err != nil {
		return nil, fmt.Errorf("scenario geo: %w", err)
	}
	f := &geoFleet{o: &o, dir: dir, model: model, killed: -1, movedMS: make([]*float64, len(geoSources)),
		edges: &Local{cfg: LocalConfig{Binary: bin}, dir: dir}}
	startup := orDefault(o.StartupTimeout, time.Minute)
	replicas := orDefault(o.Replicas, geoReplicas)
	// One edge token for every region, as docs/edge.md sets them up: each
	// gateway makes the file if it is missing and reads it otherwise.
	edgeToken := filepath.Join(dir, "edge.token")
	for _, name := range geoRegions {
		l, err := StartLocal(ctx, LocalConfig{
			Binary: bin, Dir: filepath.Join(dir, name), Keep: true, Replicas: replicas, Model: model, ReplicaPrefix: name + "-",
			GatewayArgs:    append([]string{"--region", name, "--database", dbURL, "--edge-token-file", edgeToken}, strings.Fields(o.A.GatewayArgs)...),
			WorkerArgs:     append(append([]string{}, geoSimArgs...), strings.Fields(o.A.WorkerArgs)...),
			StartupTimeout: startup, Log: o.Stderr,
		})
		if err != nil {
			return f, fmt.Errorf("region %s: %w", name, err)
		}
		f.regions = append(f.regions, l)
	}
	f.key = f.regions[0].key
	seed := uint64(o.Seed)
	for si, s := range geoSources {
		var links []*link
		args := []string{"edge", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--prefer", s.near, "--h2c", "--edge-token-file", edgeToken}
		for ri, name := range geoRegions {
			d := s.oneWay[ri]
			ln, err := newLink(strings.TrimPrefix(strings.TrimSuffix(f.regions[ri].api, "/v1"), "http://"), d, time.Duration(geoJitter*float64(d)), seed+uint64(10*si+ri))
			if err != nil {
				return f, fmt.Errorf("scenario geo: %w", err)
			}
			links = append(links, ln)
			args = append(args, "--region", name+"="+ln.URL())
		}
		f.edgeLinks = append(f.edgeLinks, links)
		p, err := f.edges.spawn("edge-"+s.name, args)
		if err != nil {
			return f, err
		}
		f.edgeProcs = append(f.edgeProcs, p)
		m, err := f.edges.waitLine(ctx, p, edgeRE)
		if err != nil {
			return f, err
		}
		f.edgeAdmins = append(f.edgeAdmins, "http://"+m[2])
		cl, err := newLink(m[1], geoLocal, geoLocal/4, seed+uint64(100+si))
		if err != nil {
			return f, fmt.Errorf("scenario geo: %w", err)
		}
		f.clientLink = append(f.clientLink, cl)
		f.clientURLs = append(f.clientURLs, cl.URL())
	}
	fmt.Fprintf(o.Stderr, "bench: %d regions (%s) of %d replica(s), an edge per source (%s); waiting for each edge to route to its nearest region\n",
		len(geoRegions), strings.Join(geoRegions, ", "), replicas, strings.Join(f.sourceNames(), ", "))
	wctx, cancel := context.WithTimeout(ctx, startup)
	defer cancel()
	for si, s := range geoSources {
		for {
			route, err := f.route(wctx, si)
			if err == nil && len(route) == len(geoRegions) && route[0] == s.near {
				break
			}
			if !sleepUntil(wctx, time.Now().Add(100*time.Millisecond)) {
				return f, fmt.Errorf("scenario geo: the edge of %s did not route %s to %s with every region healthy (route %v, %v; logs in %s)",
					s.name, model, s.near, route, err, filepath.Join(dir, "logs"))
			}
		}
	}
	return f, nil
}

func (f *geoFleet) sourceNames() []string {
	var out []string
	for _, s := range geoSources {
		out = append(out, s.name)
	}
	return out
}

// route returns the regions source si's edge would try for the model now.
func (f *geoFleet) route(ctx context.Context, si int) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, f.edgeAdmins[si]+"/edge/v1/regions", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var v struct {
		Routes map[string][]string `json:"routes"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		return nil, err
	}
	return v.Routes[f.model], nil
}

// Kill takes the region geoKill down at once: its links are cut (new
// connections refused, as by a dead process's host) and its gateway and
// workers SIGKILLed. A watcher then times each edge until its route no
// longer lists the region.
func (f *geoFleet) Kill(ctx context.Context, n int) (ActionResult, error) {
	ri := -1
	for i, name := range geoRegions {
		if name == geoKill {
			ri = i
		}
	}
	f.mu.Lock()
	if f.killed >= 0 {
		f.mu.Unlock()
		return ActionResult{}, errors.New("a region was killed already")
	}
	f.killed, f.killAt = ri, time.Now()
	f.openedAt = make([][]int64, len(geoSources))
	for si := range geoSources {
		for _, l := range f.edgeLinks[si] {
			f.openedAt[si] = append(f.openedAt[si], l.opened.Load())
		}
	}
	f.mu.Unlock()
	for si := range geoSources {
		_ = f.edgeLinks[si][ri].Close()
	}
	l := f.regions[ri]
	var res ActionResult
	var stops sync.WaitGroup
	l.mu.Lock()
	procs := append([]*child{l.gateway}, l.workers...)
	for _, p := range l.workers {
		p.killed = true
		res.Replicas = append(res.Replicas, p.name)
	}
	l.mu.Unlock()
	for _, p := range procs {
		stops.Go(func() { _ = p.Stop(0) })
	}
	stops.Wait()
	res.Output = "region " + geoRegions[ri] + ": gateway and " + plural(len(res.Replicas), "worker") + " SIGKILLed, its links cut"
	for si := range geoSources {
		f.watch.Go(func() { f.watchMove(ctx, si, geoRegions[ri]) })
	}
	return res, nil
}

// watchMove polls source si's edge until its route leaves region (at most
// 20 s) and records when.
func (f *geoFleet) watchMove(ctx context.Context, si int, region string) {
	deadline := f.killAt.Add(20 * time.Second)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		at := time.Now()
		if route, err := f.route(ctx, si); err == nil && !contains(route, region) {
			f.mu.Lock()
			f.movedMS[si] = after(at.Sub(f.killAt))
			f.mu.Unlock()
			return
		}
		sleepUntil(ctx, at.Add(geoPollEvery))
	}
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

func (f *geoFleet) waitMoves() { f.watch.Wait() }

// ScaleOut is not part of the geo scenario.
func (f *geoFleet) ScaleOut(context.Context, int) (ActionResult, error) {
	return ActionResult{}, errors.New("the geo scenario has no scale-out")
}

// Close stops the edges, the links and the regions, and removes the
// directory unless Keep. It is safe twice.
func (f *geoFleet) Close() {
	f.closeOne.Do(func() {
		var stops sync.WaitGroup
		for _, p := range f.edgeProcs {
			stops.Go(func() {
				_ = p.Stop(6 * time.Second)
				_ = p.log.Close()
			})
		}
		stops.Wait()
		for _, links := range append(f.edgeLinks, f.clientLink) {
			for _, l := range links {
				_ = l.Close()
			}
		}
		for _, l := range f.regions {
			l.Close()
		}
		if f.o.Keep {
			fmt.Fprintf(f.o.Stderr, "bench: kept %s (gateway data and logs of each region, the edges' logs)\n", f.dir)
		} else {
			_ = os.RemoveAll(f.dir)
		}
	})
}

// edgeRetries reads source si's edge's retries to region from its
// metrics (-1 when they cannot be read).
func (f *geoFleet) edgeRetries(ctx context.Context, si int, region string) int {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, f.edgeAdmins[si]+"/metrics", nil)
	if err != nil {
		return -1
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return -1
	}
	n := 0
	for _, line := range strings.Split(string(raw), "\n") {
		if strings.HasPrefix(line, "tailgate_edge_retries_total{") && strings.Contains(line, `region="`+region+`"`) {
			var v float64
			if _, err := fmt.Sscanf(line[strings.LastIndexByte(line, ' ')+1:], "%g", &v); err == nil {
				n += int(v)
			}
		}
	}
	return n
}
