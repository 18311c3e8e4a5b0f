package load

import (
	"math"
	"reflect"
	"strings"
	"testing"
	"time"
)

func fraction(v float64) *float64 { return &v }

// TestOptionsValidate: each mistyped or conflicting option is refused with
// one line that names the flag at fault, and what is well formed passes.
func TestOptionsValidate(t *testing.T) {
	target := Side{Target: "http://gw:8080/v1"}
	withTarget := func(o Options) Options { o.A.Target = target.Target; return o }
	for _, tc := range []struct {
		name string
		opts Options
		want string // "" means valid
	}{
		{"a target is enough", Options{A: target}, ""},
		{"a scenario is enough", Options{Scenario: "failover"}, ""},
		{"scenario compare with B's worker flags", Options{Scenario: "failover", Compare: true, B: Side{WorkerArgs: "--sim-stall-prob 0.05"}}, ""},
		{"overhead compares by itself", Options{Scenario: "overhead", Compare: true}, ""},
		{"closed loop on a scenario", Options{Scenario: "burst", Concurrency: 4}, ""},
		{"kill against a target with a hook", withTarget(Options{Phases: "steady:1s,kill:1", OnKill: "true"}), ""},
		{"no streams at all", withTarget(Options{StreamFraction: fraction(0)}), ""},
		{"target-b implies compare", Options{A: target, B: Side{Target: "http://vllm:8000/v1"}}, ""},

		{"neither scenario nor target", Options{}, "give --scenario NAME"},
		{"scenario and target", Options{Scenario: "failover", A: target}, "give --scenario or --target, not both"},
		{"mistyped scenario", Options{Scenario: "failvoer"}, `unknown scenario "failvoer"`},
		{"hooks in a scenario", Options{Scenario: "failover", OnKill: "true"}, "--on-kill and --on-scaleout are for --target"},
		{"target-b in a scenario", Options{Scenario: "failover", B: target}, "--target-b is for comparing"},
		{"scenario compare without B", Options{Scenario: "failover", Compare: true}, "--b-gateway-args or --b-worker-args"},
		{"databases compares by itself", Options{Scenario: "databases", Compare: true, B: Side{GatewayArgs: "--hedge=false"}}, "compares SQLite (A) with PostgreSQL (B) by itself"},
		{"databases alone", Options{Scenario: "databases"}, ""},
		{"compare without target-b", withTarget(Options{Compare: true}), "--compare with --target needs --target-b"},
		{"fleet flags against a target", withTarget(Options{A: Side{WorkerArgs: "--sim-ttft 1s"}}), "--gateway-args and --worker-args configure"},
		{"too many replicas", Options{Scenario: "failover", Replicas: 33}, "--replicas 33: want 1 to 32"},
		{"negative replicas", Options{Scenario: "failover", Replicas: -1}, "--replicas -1"},
		{"rate and concurrency", withTarget(Options{Rate: 5, Concurrency: 2}), "give --rate (open loop) or --concurrency (closed loop), not both"},
		{"negative concurrency", withTarget(Options{Concurrency: -2}), "--concurrency must be at least 1"},
		{"negative rate", withTarget(Options{Rate: -1}), "--rate must be positive"},
		{"NaN rate", withTarget(Options{Rate: math.NaN()}), "--rate must be positive"},
		{"mistyped endpoint", withTarget(Options{Endpoint: "chats"}), `--endpoint "chats": want chat or completions`},
		{"negative timeout", withTarget(Options{Timeout: -time.Second}), "--timeout and --window must be positive"},
		{"negative window", withTarget(Options{Window: -time.Second}), "--timeout and --window must be positive"},
		{"sample interval under 10ms", withTarget(Options{SampleInterval: time.Millisecond}), "--sample-interval at least 10ms"},
		{"phase without a duration", withTarget(Options{Phases: "steady"}), `--phases: phase "steady"`},
		{"duration without a unit", withTarget(Options{Phases: "steady:30"}), `--phases: phase "steady:30"`},
		{"only actions", withTarget(Options{Phases: "kill:1", OnKill: "true"}), "--phases: "},
		{"kill without a hook", withTarget(Options{Phases: "steady:1s,kill:1"}), "the phases include kill: against --target it needs --on-kill CMD"},
		{"scaleout without a hook", withTarget(Options{Phases: "steady:1s,scaleout:1", OnKill: "true"}), "needs --on-scaleout CMD"},
		{"kill in overhead", Options{Scenario: "overhead", Phases: "steady:1s,kill:1,steady:1s"}, "scenario overhead has no workers to kill or scale out"},
		{"mistyped prompt length", withTarget(Options{PromptTokens: "lognormal:256"}), `--prompt-tokens "lognormal:256"`},
		{"mistyped output length", withTarget(Options{OutputTokens: "unifrom:1:9"}), `--output-tokens "unifrom:1:9"`},
		{"stream fraction above 1", withTarget(Options{StreamFraction: fraction(1.5)}), "--stream-fraction 1.5: want a number from 0 to 1"},
		{"target without a scheme", Options{A: Side{Target: "gw:8080/v1"}}, `--target "gw:8080/v1": want a base URL like http://host:8080/v1`},
		{"B target not http", Options{A: target, B: Side{Target: "ftp://vllm/v1"}}, `--target-b "ftp://vllm/v1"`},
		{"key and key file", Options{A: Side{Target: target.Target, Key: "k", KeyFile: "f"}}, "give --key or --key-file, not both"},
		{"B key and key file", Options{A: target, B: Side{Target: target.Target, Key: "k", KeyFile: "f"}}, "give --key-b or --key-file-b, not both"},
		{"admin without its token", Options{A: Side{Target: target.Target, Admin: "http://gw:8081"}}, "--admin needs --admin-token-file"},
		{"B admin without its token", Options{A: target, B: Side{Target: target.Target, Admin: "http://gw:8081"}}, "--admin-b needs --admin-token-file-b"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.opts.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want == "":
			case err == nil:
				t.Fatalf("accepted; want %q", tc.want)
			case !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n"):
				t.Fatalf("error %q; want one line with %q", err, tc.want)
			}
		})
	}
}

// TestOptionsDefaults: a zero field takes the scenario's value, then the
// command's default; a field that is set wins, 0 streams included.
func TestOptionsDefaults(t *testing.T) {
	type got struct {
		Replicas                          int
		Rate                              float64
		Concurrency                       int
		Phases, Prompt, Output, Model, EP string
		Streams                           float64
		Timeout, Window, Sample           time.Duration
	}
	for _, tc := range []struct {
		name string
		opts Options
		want got
	}{
		{"scenario", Options{Scenario: "failover"},
			got{3, 20, 0, "steady:10s,burst:5s:x3,kill:1,steady:15s,scaleout:1,steady:10s", "lognormal:256:0.5", "lognormal:32:0.5", "tailgate-sim", "chat", 0.7, 30 * time.Second, 10 * time.Second, 250 * time.Millisecond}},
		{"scenario, set fields win", Options{Scenario: "failover", Replicas: 2, Rate: 5, Phases: "steady:1s", PromptTokens: "8", OutputTokens: "4", StreamFraction: fraction(0), A: Side{Model: "m"}, Endpoint: "completions", Timeout: time.Second},
			got{2, 5, 0, "steady:1s", "8", "4", "m", "completions", 0, time.Second, 10 * time.Second, 250 * time.Millisecond}},
		{"scenario, closed loop", Options{Scenario: "burst", Concurrency: 3},
			got{2, 0, 3, "steady:10s,burst:10s:x3,steady:10s", "lognormal:256:0.5", "lognormal:32:0.5", "tailgate-sim", "chat", 0.7, 30 * time.Second, 10 * time.Second, 250 * time.Millisecond}},
		{"target", Options{A: Side{Target: "http://gw/v1"}},
			got{0, 10, 0, "steady:30s", "lognormal:256:0.5", "lognormal:64:0.5", "", "chat", 0.5, 30 * time.Second, 10 * time.Second, 250 * time.Millisecond}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := tc.opts.resolve()
			if err != nil {
				t.Fatal(err)
			}
			o := b.opts
			g := got{o.Replicas, o.Rate, o.Concurrency, o.Phases, o.PromptTokens, o.OutputTokens, o.A.Model, o.Endpoint,
				*o.StreamFraction, o.Timeout, o.Window, o.SampleInterval}
			if g != tc.want {
				t.Errorf("got  %+v\nwant %+v", g, tc.want)
			}
		})
	}
}

// TestOptionsSides: B borrows A's key and model against targets unless it
// has its own; in a scenario B's extra flags follow A's.
func TestOptionsSides(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts Options
		want []Side
	}{
		{"one target", Options{A: Side{Target: "http://a/v1", Key: "ka"}},
			[]Side{{Target: "http://a/v1", Key: "ka"}}},
		{"B borrows A's key file and model", Options{A: Side{Target: "http://a/v1", KeyFile: "a.key", Model: "m"}, B: Side{Target: "http://b/v1"}},
			[]Side{{Target: "http://a/v1", KeyFile: "a.key", Model: "m"}, {Target: "http://b/v1", KeyFile: "a.key", Model: "m"}}},
		{"B's own key and model", Options{A: Side{Target: "http://a/v1", Key: "ka", Model: "m"}, B: Side{Target: "http://b/v1", Key: "kb", Model: "n"}},
			[]Side{{Target: "http://a/v1", Key: "ka", Model: "m"}, {Target: "http://b/v1", Key: "kb", Model: "n"}}},
		{"scenario B appends its flags", Options{Scenario: "failover", Compare: true, A: Side{WorkerArgs: "--sim-ttft 80ms"}, B: Side{Label: "stalls", WorkerArgs: "--sim-stall-prob 0.05", Model: "ignored"}},
			[]Side{{WorkerArgs: "--sim-ttft 80ms", Model: "tailgate-sim"}, {Label: "stalls", WorkerArgs: "--sim-ttft 80ms --sim-stall-prob 0.05", Model: "tailgate-sim"}}},
		{"scenario without compare ignores B", Options{Scenario: "failover", B: Side{WorkerArgs: "--sim-stall-prob 0.05"}},
			[]Side{{Model: "tailgate-sim"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := tc.opts.resolve()
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(b.sides, tc.want) {
				t.Errorf("sides\n got %+v\nwant %+v", b.sides, tc.want)
			}
		})
	}
}
