package load

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"
)

// Scenario is a ready-made benchmark run on a fleet the bench starts itself.
type Scenario struct {
	Name  string
	About string
	// Replicas is the number of simulated replicas started.
	Replicas int
	// Static makes the replicas plain `tailgate sim` engines behind
	// --upstream (no workers, so no kill or scaleout), and compares the
	// gateway with calling the engine directly.
	Static bool
	// Databases compares one gateway on SQLite (A) with two gateways on
	// one PostgreSQL (B) at the same rate, and checks both ledgers against
	// what the clients received (needs [Options.Postgres]).
	Databases      bool
	Rate           float64
	Phases         string
	Prompt, Output string
	StreamFraction float64
	// SimArgs are the simulated engine's knobs for every replica.
	SimArgs []string
	// Fleet runs the gateway's fleet controller (`tailgate up --fleet-*`)
	// instead of the bench starting Replicas workers; its Max is Replicas
	// (--replicas). nil: the bench starts the workers.
	Fleet *FleetBounds
}

// Scenarios returns the built-in scenarios.
func Scenarios() []Scenario {
	return []Scenario{
		{
			Name:     "failover",
			About:    "3 workers; steady load, a burst, one worker SIGKILLed (a replacement is started), a scale-out",
			Replicas: 3, Rate: 20, Phases: "steady:10s,burst:5s:x3,kill:1,steady:15s,scaleout:1,steady:10s",
			Prompt: "lognormal:256:0.5", Output: "lognormal:32:0.5", StreamFraction: 0.7,
			SimArgs: []string{"--sim-ttft", "40ms", "--sim-tpot", "4ms", "--sim-max-seqs", "4"},
		},
		{
			Name:     "coldstart",
			About:    "from zero replicas: requests held while the fleet controller starts one (engine load --sim-start-delay 20s), then put to sleep after 4s idle and woken (--sim-wake-delay 1s); first token vs ready and vs wake, errors, the hold stage, scale-down after 20s idle",
			Replicas: 1, Fleet: &FleetBounds{Min: 0, Idle: 20 * time.Second, SleepAfter: 4 * time.Second}, Rate: 2, Phases: "steady:30s,idle:10s,steady:10s,idle:30s",
			Prompt: "lognormal:256:0.5", Output: "lognormal:32:0.5", StreamFraction: 0.7,
			SimArgs: coldstartSimArgs,
		},
		{
			Name:     "burst",
			About:    "2 workers; a burst at 3x the steady rate, near the replicas' capacity",
			Replicas: 2, Rate: 15, Phases: "steady:10s,burst:10s:x3,steady:10s",
			Prompt: "lognormal:256:0.5", Output: "lognormal:32:0.5", StreamFraction: 0.7,
			SimArgs: []string{"--sim-ttft", "40ms", "--sim-tpot", "4ms", "--sim-max-seqs", "4"},
		},
		{
			Name:     "scaleout",
			About:    "1 busy worker, then a second one: how soon it takes traffic and the queue drains",
			Replicas: 1, Rate: 20, Phases: "steady:10s,scaleout:1,steady:15s",
			Prompt: "lognormal:256:0.5", Output: "lognormal:32:0.5", StreamFraction: 0.7,
			SimArgs: []string{"--sim-ttft", "40ms", "--sim-tpot", "4ms", "--sim-max-seqs", "4"},
		},
		{
			Name:     "fanout",
			About:    "documents of 4–8 parts sent at once, slowest part decides: monolithic vs decomposed vs decomposed+hedge, streamed, JSON and Batch API (--sweep-hedge: the hedge threshold procedure)",
			Replicas: 4, Rate: 6, Phases: "300 documents per arm",
			SimArgs: fanoutSimArgs,
		},
		{
			Name:     "priority",
			About:    "interactive requests alone, then beside a 2,000-line Batch API job: interactive p99 must stay within --max-ratio (1.2) of alone",
			Replicas: priorityReplicas, Rate: 20, Phases: "30s alone, 30s with the batch",
			SimArgs: prioritySimArgs,
		},
		{
			Name:     "multiturn",
			About:    "agent-like conversations of growing context, once per gateway --affinity mode (off, prefix, session): follow-up TTFT, prefix-cache hits per replica, load imbalance",
			Replicas: multiturnReplicas, Phases: "20s per mode, 24 conversations at once",
			SimArgs: multiturnSimArgs,
		},
		{
			Name:     "databases",
			About:    "what PostgreSQL adds: 1 gateway on SQLite vs 2 gateways on one throwaway PostgreSQL (requests alternating), a key with limits and a tenant budget; ledgers checked against the answers",
			Replicas: 2, Databases: true, Rate: 200, Phases: "steady:20s",
			Prompt: "64", Output: "16", StreamFraction: 0.5,
			SimArgs: []string{"--sim-ttft", "10ms", "--sim-tpot", "1ms", "--sim-max-seqs", "1024"},
		},
		{
			Name:     "geo",
			About:    "3 regions (a gateway each, on one PostgreSQL), 3 sources each behind its own tailgate edge, links with delay and jitter; one region killed: TTFT per source and region, time until no request goes there, added p99, errors",
			Replicas: geoReplicas, Rate: geoRate * 3, Phases: geoPhases,
			SimArgs: geoSimArgs,
		},
		{
			Name:     "overhead",
			About:    "what the gateway adds: the same load through the gateway and straight to an instant engine",
			Replicas: 1, Static: true, Rate: 100, Phases: "steady:15s",
			Prompt: "64", Output: "16", StreamFraction: 0.5,
			SimArgs: []string{"--sim-ttft", "0s", "--sim-tpot", "0s", "--sim-max-seqs", "4096"},
		},
	}
}

// LookupScenario returns the built-in scenario with that name.
func LookupScenario(name string) (Scenario, bool) {
	for _, s := range Scenarios() {
		if s.Name == name {
			return s, true
		}
	}
	return Scenario{}, false
}

// WriteScenarios writes a table of the built-in scenarios.
func WriteScenarios(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SCENARIO\tREPLICAS\tRATE\tPHASES\tWHAT")
	for _, s := range Scenarios() {
		fmt.Fprintf(tw, "%s\t%d\t%g/s\t%s\t%s\n", s.Name, s.Replicas, s.Rate, s.Phases, s.About)
	}
	return tw.Flush()
}
