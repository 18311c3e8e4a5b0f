package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/bench/load"
	"github.com/tailgate-dev/tailgate/e2e/testkit"
)

// TestBenchFlagsMapToOptions: each flag lands in its load.Options field,
// the negated booleans in their No…/Disable… fields, and --stream-fraction
// only when given (else the scenario's share applies).
func TestBenchFlagsMapToOptions(t *testing.T) {
	defaults := load.Options{Seed: 1, StartupTimeout: time.Minute, Endpoint: "chat", Timeout: 30 * time.Second,
		MaxInflight: 4096, HookTimeout: 2 * time.Minute, Window: 10 * time.Second, SampleInterval: 250 * time.Millisecond}
	zero := 0.0
	for _, tc := range []struct {
		args []string
		want func(o *load.Options)
	}{
		{[]string{"--scenario", "failover"}, func(o *load.Options) { o.Scenario = "failover" }},
		{[]string{"--target", "http://gw/v1", "--key", "k", "--key-file", "kf", "--admin", "http://gw:8081", "--admin-token-file", "at",
			"--admin-tenant", "team", "--model", "m", "--label", "L", "--gateway-args", "--g 1", "--worker-args", "--w 2"},
			func(o *load.Options) {
				o.A = load.Side{Label: "L", Target: "http://gw/v1", Key: "k", KeyFile: "kf", Admin: "http://gw:8081", AdminTokenFile: "at",
					Model: "m", GatewayArgs: "--g 1", WorkerArgs: "--w 2"}
				o.AdminTenant = "team"
			}},
		{[]string{"--compare", "--target-b", "http://b/v1", "--key-b", "k", "--key-file-b", "kf", "--admin-b", "http://b:8081",
			"--admin-token-file-b", "at", "--model-b", "m", "--label-b", "L", "--b-gateway-args", "--g 1", "--b-worker-args", "--w 2"},
			func(o *load.Options) {
				o.Compare = true
				o.B = load.Side{Label: "L", Target: "http://b/v1", Key: "k", KeyFile: "kf", Admin: "http://b:8081", AdminTokenFile: "at",
					Model: "m", GatewayArgs: "--g 1", WorkerArgs: "--w 2"}
			}},
		{[]string{"--replicas", "5", "--replace=false", "--replace-delay", "2s", "--keep", "--startup-timeout", "3m"},
			func(o *load.Options) {
				o.Replicas, o.NoReplace, o.ReplaceDelay, o.Keep, o.StartupTimeout = 5, true, 2*time.Second, true, 3*time.Minute
			}},
		{[]string{"--rate", "7.5", "--phases", "steady:1s", "--seed", "0", "--prompt-tokens", "8", "--output-tokens", "4",
			"--stream-fraction", "0", "--replay", "r.jsonl", "--endpoint", "completions", "--ignore-eos=false", "--timeout", "5s",
			"--keepalive=false", "--max-conns", "3", "--max-inflight", "9"},
			func(o *load.Options) {
				o.Rate, o.Phases, o.Seed, o.PromptTokens, o.OutputTokens, o.StreamFraction = 7.5, "steady:1s", 0, "8", "4", &zero
				o.Replay, o.Endpoint, o.NoIgnoreEOS, o.Timeout, o.DisableKeepAlive, o.MaxConns, o.MaxInflight = "r.jsonl", "completions", true, 5*time.Second, true, 3, 9
			}},
		{[]string{"--concurrency", "4", "--on-kill", "k", "--on-scaleout", "s", "--hook-timeout", "1s", "--json", "r.json", "--html", "r.html",
			"--window", "3s", "--sample-interval", "20ms", "--quiet"},
			func(o *load.Options) {
				o.Concurrency, o.OnKill, o.OnScaleOut, o.HookTimeout, o.JSONFile, o.HTMLFile = 4, "k", "s", time.Second, "r.json", "r.html"
				o.Window, o.SampleInterval = 3*time.Second, 20*time.Millisecond
			}},
	} {
		fs := newFlagSet("bench", benchSynopsis, io.Discard)
		var f benchFlags
		f.register(fs)
		if err := parseFlags(fs, tc.args); err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		got, err := f.options(fs)
		if err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		want := defaults
		tc.want(&want)
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%v:\n got %+v\nwant %+v", tc.args, got, want)
		}
	}
}

// TestBenchRejectsBadFlags: a bad invocation fails before anything starts,
// with one line naming the flag at fault and exit status 1 (2 for a flag
// the command does not know, or an argument it does not take).
func TestBenchRejectsBadFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "give --scenario NAME"},
		{[]string{"--scenario", "nope"}, `unknown scenario "nope"`},
		{[]string{"--scenario", "failover", "--target", "http://x/v1"}, "give --scenario or --target, not both"},
		{[]string{"--target", "http://x/v1", "--rate", "1", "--concurrency", "2"}, "give --rate (open loop) or --concurrency (closed loop), not both"},
		{[]string{"--target", "http://x/v1", "--rate", "0", "--concurrency", "2"}, "give --rate (open loop) or --concurrency (closed loop), not both"},
		{[]string{"--target", "http://x/v1", "--concurrency", "0"}, "--concurrency must be at least 1"},
		{[]string{"--target", "http://x/v1", "--model", "m", "--phases", "steady:1s,kill:1"}, "--on-kill CMD"},
		{[]string{"--target", "http://x/v1", "--compare"}, "--compare with --target needs --target-b"},
		{[]string{"--scenario", "failover", "--compare"}, "--b-gateway-args or --b-worker-args"},
		{[]string{"--scenario", "overhead", "--phases", "steady:1s,kill:1,steady:1s"}, "scenario overhead has no workers"},
		{[]string{"--target", "http://x/v1", "--phases", "steady"}, "--phases: "},
		{[]string{"--scenario", "failover", "--replicas", "0"}, "--replicas 0: want 1 to 32"},
		{[]string{"--target", "http://x/v1", "--endpoint="}, `--endpoint "": want chat or completions`},
		{[]string{"--target", "http://x/v1", "--timeout", "0"}, "--timeout and --window must be positive"},
		{[]string{"--target", "http://x/v1", "--sample-interval", "0"}, "--sample-interval at least 10ms"},
		{[]string{"--target", "x:8000/v1", "--model", "m"}, `--target "x:8000/v1"`},
		{[]string{"--target", "http://x/v1", "--model", "m", "--stream-fraction", "2"}, "--stream-fraction 2"},
	} {
		var stdout, stderr bytes.Buffer
		err := run(context.Background(), append([]string{"bench"}, tc.args...), &stdout, &stderr)
		switch {
		case err == nil:
			t.Errorf("bench %v ran", tc.args)
		case errors.Is(err, errUsage):
			t.Errorf("bench %v: a usage error (exit 2), want %q (exit 1)", tc.args, tc.want)
		case !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n"):
			t.Errorf("bench %v: %q, want one line with %q", tc.args, err, tc.want)
		}
	}
	if err := run(context.Background(), []string{"bench", "--no-such-flag"}, io.Discard, io.Discard); !errors.Is(err, errUsage) {
		t.Errorf("an unknown flag: %v, want a usage error (exit 2)", err)
	}
	var usage bytes.Buffer
	err := run(context.Background(), []string{"bench", "--target", "http://x/v1", "stray"}, io.Discard, &usage)
	if last := testkit.LastLine(usage.String()); !errors.Is(err, errUsage) || last != `tailgate bench: unexpected argument "stray": bench takes flags only` {
		t.Errorf("a stray argument: %v, last line %q; want a usage error (exit 2) naming it", err, last)
	}
	var stdout bytes.Buffer
	if err := run(context.Background(), []string{"bench", "--scenario", "list"}, &stdout, io.Discard); err != nil || !strings.Contains(stdout.String(), "failover") {
		t.Errorf("--scenario list: %v\n%s", err, stdout.String())
	}
}
