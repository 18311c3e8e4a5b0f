package load

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestPhasesRunInOrder: the fleet sees the actions in the order written, at
// or after their planned time; every request belongs to the phase its
// intended time falls in; an idle phase sends nothing; the open-loop run
// sends exactly the schedule.
func TestPhasesRunInOrder(t *testing.T) {
	g := newFakeGateway(t, "r1", "r2", "r3")
	g.chunks, g.ttft = 1, time.Millisecond
	fleet := &fakeFleet{g: g, warmup: 50 * time.Millisecond}
	plan := mustPlan(t, "steady:300ms,kill:1,steady:300ms,scaleout:2,idle:200ms,burst:300ms:x2")
	const rate, seed = 40, 5
	res, err := Run(context.Background(), Config{Target: g.target(), Workload: smallWorkload(t, 0.5), Plan: plan, Rate: rate,
		Seed: seed, Fleet: fleet, SampleInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"kill 1", "scaleout 2"}; !slices.Equal(fleet.calls, want) {
		t.Fatalf("fleet calls %v, want %v", fleet.calls, want)
	}
	if len(res.Events) != 2 {
		t.Fatalf("%d events", len(res.Events))
	}
	for i, ev := range res.Events {
		a := plan.Actions[i]
		if ev.Kind != a.Kind || ev.Count != a.Count || ev.At < a.At || ev.Done < ev.At {
			t.Errorf("event %d %+v for action %+v", i, ev, a)
		}
	}
	if got := joinIDs(res.Events[0].Replicas); got != "r1" {
		t.Errorf("kill reported %q", got)
	}
	if got := joinIDs(res.Events[1].Replicas); got != "new-2,new-3" {
		t.Errorf("scaleout reported %q", got)
	}
	sched := OpenLoop(plan, rate, seed)
	if len(res.Records) != len(sched) {
		t.Fatalf("%d requests, the schedule has %d", len(res.Records), len(sched))
	}
	perSpan := map[int]int{}
	for i, r := range res.Records {
		if r.Index != sched[i].Index || r.Intended != sched[i].At || r.Span != sched[i].Span {
			t.Fatalf("record %d (%d at %v in %d) does not match arrival %+v", i, r.Index, r.Intended, r.Span, sched[i])
		}
		if plan.SpanAt(r.Intended) != r.Span {
			t.Fatalf("record at %v in span %d", r.Intended, r.Span)
		}
		perSpan[r.Span]++
	}
	if perSpan[2] != 0 {
		t.Errorf("%d requests in the idle phase", perSpan[2])
	}
	rep := Analyze(res, time.Second)
	if len(rep.Phases) != 4 || rep.Phases[3].Name != "4 burst x2" || rep.Phases[3].TargetRate != 80 {
		t.Fatalf("phases %+v", rep.Phases)
	}
	total := 0
	for _, p := range rep.Phases {
		total += p.Requests
	}
	if total != len(res.Records) || rep.All.Requests != total {
		t.Fatalf("phases hold %d requests, all %d, of %d", total, rep.All.Requests, len(res.Records))
	}
}

// TestScriptedFailoverFigures: a gateway that, when a replica is killed,
// cuts its open requests and routes two more to it (502) counts every
// failure it causes; the report's failover figures match those counts, find
// the replacement ready and serving, and read stream stages from the admin
// API.
func TestScriptedFailoverFigures(t *testing.T) {
	g := newFakeGateway(t, "r1", "r2")
	g.deadRouting = 2
	g.chunks, g.chunkEvery, g.ttft = 6, 20*time.Millisecond, 30*time.Millisecond
	fleet := &fakeFleet{g: g, warmup: 100 * time.Millisecond}
	plan := mustPlan(t, "steady:600ms,kill:1,steady:900ms")
	res, err := Run(context.Background(), Config{Target: g.target(), Workload: smallWorkload(t, 0.6), Plan: plan, Rate: 60,
		Seed: 2, Fleet: fleet, SampleInterval: 25 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	rep := Analyze(res, 500*time.Millisecond)
	if len(rep.Failovers) != 1 {
		t.Fatalf("%d failovers", len(rep.Failovers))
	}
	f := rep.Failovers[0]
	g.mu.Lock()
	rejected, cutBefore, cutMid := g.rejected502, g.cutBefore, g.cutMid
	g.mu.Unlock()
	t.Logf("server: %d rejected with 502, %d cut before a token, %d cut mid-stream; report: %+v", rejected, cutBefore, cutMid, f)
	if joinIDs(f.Killed) != "r1" || f.Inferred {
		t.Errorf("killed %v (inferred %v)", f.Killed, f.Inferred)
	}
	if rejected != 2 {
		t.Fatalf("the gateway routed %d requests to the dead replica, want 2", rejected)
	}
	if f.BeforeFirstToken != rejected+cutBefore || f.Midstream != cutMid {
		t.Errorf("report: %d before the first token, %d mid-stream; server caused %d+%d and %d",
			f.BeforeFirstToken, f.Midstream, rejected, cutBefore, cutMid)
	}
	nErr, byClass := errorsIn(res.Records)
	if f.Errors != nErr || byClass["http_502"] != rejected || byClass[ErrStreamCut]+byClass[ErrTransport] != cutBefore+cutMid {
		t.Errorf("failover counts %d errors %v; the run had %d: %v", f.Errors, f.ErrorsByClass, nErr, byClass)
	}
	if rep.All.Errors != nErr || rep.All.Midstream != cutMid {
		t.Errorf("all phases: %d errors, %d mid-stream", rep.All.Errors, rep.All.Midstream)
	}
	if f.LeftReadyMS == nil || f.RoutedAfter > rejected {
		t.Errorf("left ready set %v, %d requests routed to it after the kill", f.LeftReadyMS, f.RoutedAfter)
	}
	if len(f.Replacements) != 1 || f.Replacements[0].ID != "new-1" || f.Replacements[0].ReadyMS == nil || f.Replacements[0].ServingMS == nil {
		t.Fatalf("replacements %+v", f.Replacements)
	}
	if rp := f.Replacements[0]; *rp.ReadyMS < *rp.StartMS || rp.Share <= 0 {
		t.Errorf("replacement started %v, ready %v, share %v", *rp.StartMS, *rp.ReadyMS, rp.Share)
	}
	if f.After.Samples == 0 || f.Before.Samples == 0 {
		t.Errorf("no replica samples around the kill")
	}
	streams := 0
	for _, r := range res.Records {
		if !r.OK() {
			continue
		}
		if r.Stream {
			streams++
			if r.StageMS["gateway"] != 0.5 || r.Chunks != 6 || len(r.Gaps) != 5 || r.Completion != 6 {
				t.Fatalf("stream %d: stages %v, %d chunks, %d gaps, %d tokens", r.Index, r.StageMS, r.Chunks, len(r.Gaps), r.Completion)
			}
		} else if r.StageMS["upstream_ttft"] != 20.5 || r.Completion != 2 {
			t.Fatalf("request %d: stages %v (Server-Timing), %d tokens", r.Index, r.StageMS, r.Completion)
		}
		if r.Replica == "" || r.RequestID == "" || r.Attempts != 1 {
			t.Fatalf("request %d: replica %q id %q attempts %d", r.Index, r.Replica, r.RequestID, r.Attempts)
		}
	}
	if streams == 0 || rep.All.Stages["gateway"].N == 0 || rep.All.ITL.N == 0 || rep.All.TPOT.N == 0 || rep.All.OutputTokensPerS <= 0 {
		t.Fatalf("%d streams; gateway stage summary %+v", streams, rep.All.Stages["gateway"])
	}

	// The report survives JSON, every request included.
	raw, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(raw, &back); err != nil {
		t.Fatal(err)
	}
	if len(back.Requests) != len(res.Records) || back.Failovers[0].Errors != f.Errors || back.Events[0].At != rep.Events[0].At.Truncate(time.Microsecond) {
		t.Fatalf("JSON round trip: %d requests, %d errors", len(back.Requests), back.Failovers[0].Errors)
	}
	var text strings.Builder
	if err := rep.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"== failover: kill at", "left the gateway's ready set", "replacement new-1", "mid-stream", "== summary =="} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("text report lacks %q:\n%s", want, text.String())
		}
	}
}

// TestHooksRunCommands: a hook runs with the count in its environment, its
// printed ids become the event's replicas, and a hanging hook is stopped.
func TestHooksRunCommands(t *testing.T) {
	dir := t.TempDir()
	log := filepath.Join(dir, "hook.log")
	h := &Hooks{
		OnKill:     `echo "kill $TAILGATE_BENCH_COUNT $TAILGATE_BENCH_SIDE" >> ` + log + `; echo gpu-a gpu-b`,
		OnScaleOut: `sleep 30`,
		Timeout:    300 * time.Millisecond,
		Env:        []string{"TAILGATE_BENCH_SIDE=A"},
	}
	res, err := h.Kill(context.Background(), 2)
	if err != nil {
		t.Fatal(err)
	}
	if joinIDs(res.Replicas) != "gpu-a,gpu-b" {
		t.Errorf("hook reported %v", res.Replicas)
	}
	raw, _ := os.ReadFile(log)
	if string(raw) != "kill 2 A\n" {
		t.Errorf("hook saw %q", raw)
	}
	if _, err := h.ScaleOut(context.Background(), 1); err == nil || !strings.Contains(err.Error(), "timed out") {
		t.Errorf("a hook past its timeout returned %v", err)
	}
	if _, err := (&Hooks{}).Kill(context.Background(), 1); err == nil {
		t.Error("a missing hook is not an error")
	}
}

// TestRunWithHooksInfersKilledReplica: against a target whose hook prints
// nothing, the report works the killed replica out from the replica samples.
func TestRunWithHooksInfersKilledReplica(t *testing.T) {
	g := newFakeGateway(t, "r1", "r2")
	g.chunks, g.ttft = 1, 2*time.Millisecond
	dir := t.TempDir()
	trigger := filepath.Join(dir, "killed")
	// The hook only touches a file; the test kills r1 when it sees it.
	h := &Hooks{OnKill: "touch " + trigger, Timeout: 5 * time.Second}
	fleet := fleetFunc(func(ctx context.Context, n int) (ActionResult, error) {
		res, err := h.Kill(ctx, n)
		if _, serr := os.Stat(trigger); serr == nil {
			g.kill()
		}
		return res, err
	})
	res, err := Run(context.Background(), Config{Target: g.target(), Workload: smallWorkload(t, 0), Plan: mustPlan(t, "steady:300ms,kill:1,steady:300ms"),
		Rate: 50, Seed: 1, Fleet: fleet, SampleInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	rep := Analyze(res, 250*time.Millisecond)
	if f := rep.Failovers[0]; joinIDs(f.Killed) != "r1" || !f.Inferred || f.LeftReadyMS == nil {
		t.Fatalf("failover %+v", f)
	}
}

type fleetFunc func(ctx context.Context, n int) (ActionResult, error)

func (f fleetFunc) Kill(ctx context.Context, n int) (ActionResult, error) { return f(ctx, n) }
func (f fleetFunc) ScaleOut(ctx context.Context, n int) (ActionResult, error) {
	return ActionResult{}, ErrNoHook
}

func TestConfigValidate(t *testing.T) {
	w := smallWorkload(t, 0)
	plan := mustPlan(t, "steady:1s,kill:1,steady:1s")
	for name, c := range map[string]Config{
		"no rate or concurrency": {Target: Target{BaseURL: "http://x/v1"}, Workload: w, Plan: mustPlan(t, "steady:1s")},
		"both":                   {Target: Target{BaseURL: "http://x/v1"}, Workload: w, Plan: mustPlan(t, "steady:1s"), Rate: 1, Concurrency: 1},
		"kill without fleet":     {Target: Target{BaseURL: "http://x/v1"}, Workload: w, Plan: plan, Rate: 1},
		"bad URL":                {Target: Target{BaseURL: "x/v1"}, Workload: w, Plan: mustPlan(t, "steady:1s"), Rate: 1},
	} {
		if _, err := Run(context.Background(), c); err == nil {
			t.Errorf("%s: ran", name)
		}
	}
}
