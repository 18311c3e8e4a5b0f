package main

import (
	"io"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// A worker config file's flags come first, so the command line's win, and
// its comments and blank lines are skipped; --config and --config=FILE both
// work.
func TestWorkerConfigFileFlagsComeFirst(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tuned-worker.conf")
	if err := os.WriteFile(path, []byte("# written by tailgate tune\n\n--engine=sim\n--sim-max-seqs=8\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"--gateway", "http://g:8081", "--config", path, "--sim-max-seqs=4"},
		{"--gateway", "http://g:8081", "--config=" + path, "--sim-max-seqs=4"},
	} {
		got, err := withWorkerConfig(args)
		want := []string{"--engine=sim", "--sim-max-seqs=8", "--gateway", "http://g:8081", "--sim-max-seqs=4"}
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("withWorkerConfig(%q) = %q, %v; want %q", args, got, err, want)
		}
	}
	if _, err := withWorkerConfig([]string{"--config", filepath.Join(t.TempDir(), "missing")}); err == nil {
		t.Error("a missing config file: no error")
	}
	bad := filepath.Join(t.TempDir(), "bad.conf")
	if err := os.WriteFile(bad, []byte("engine sim\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := withWorkerConfig([]string{"--config", bad}); err == nil {
		t.Error("a line that is not a flag: no error")
	}
}

// The cheapest candidate that held the target wins: fewest GPUs first, then
// the highest rate held; one that held nothing never wins.
func TestChooseCandidateFewestGPUsThenHighestRate(t *testing.T) {
	failed := &tuneCandidate{name: "failed", gpus: 1}
	two := &tuneCandidate{name: "tp2", gpus: 2, held: 20}
	low := &tuneCandidate{name: "one-low", gpus: 1, held: 5}
	high := &tuneCandidate{name: "one-high", gpus: 1, held: 10}
	if got := chooseCandidate([]*tuneCandidate{failed, two, low, high}); got != high {
		t.Errorf("chose %v, want one-high", got.name)
	}
	if got := chooseCandidate([]*tuneCandidate{failed}); got != nil {
		t.Errorf("chose %v with nothing passing, want none", got.name)
	}
}

// The search space's knobs turn the simulator's flags with --engine sim and
// vLLM's otherwise, replacing the base's value of the same flag.
func TestTuneCandidatesTurnTheEnginesFlags(t *testing.T) {
	space, err := parseSpace([]string{"max-num-seqs=1,8", "max-num-batched-tokens=512"})
	if err != nil {
		t.Fatal(err)
	}
	cs := candidates([]string{"--engine=sim", "--sim-max-seqs=1"}, "sim", space, 8)
	if len(cs) != 3 || !slices.Equal(cs[2].args, []string{"--engine=sim", "--sim-max-seqs=8", "--sim-max-num-batched-tokens=512"}) {
		t.Fatalf("sim candidates: %d, last %q", len(cs), cs[len(cs)-1].args)
	}
	cs = candidates([]string{"--engine=vllm"}, "vllm", space, 2)
	if len(cs) != 2 || !slices.Equal(cs[1].args, []string{"--engine=vllm", "--max-num-seqs=1", "--max-num-batched-tokens=512"}) {
		t.Fatalf("vllm candidates (at most 2): %d, last %q", len(cs), cs[len(cs)-1].args)
	}
	if _, err := parseSpace([]string{"gpu-memory-utilization=0.9"}); err == nil {
		t.Error("an unknown knob: no error")
	}
}

// --engine-priority-scheduling, from the command line or a line of the
// --config file, starts vLLM with --scheduling-policy priority and the sim
// with --sim-scheduling-policy priority.
func TestEnginePriorityFlagReachesTheEngine(t *testing.T) {
	path := filepath.Join(t.TempDir(), "worker.conf")
	if err := os.WriteFile(path, []byte("--engine-priority-scheduling\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for engine, want := range map[string][]string{"vllm": {"--scheduling-policy", "priority"}, "sim": {"--sim-scheduling-policy", "priority"}} {
		args, err := withWorkerConfig([]string{"--config", path, "--engine", engine, "--model", "m", "--vllm-binary", "/bin/sh"})
		if err != nil {
			t.Fatal(err)
		}
		var wf workerFlags
		fs := newFlagSet("worker", "", io.Discard)
		wf.register(fs)
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		cmd, err := wf.engineCommand("m")
		if err != nil {
			t.Fatal(err)
		}
		argv, _, err := cmd("/run/e.sock")
		if err != nil {
			t.Fatal(err)
		}
		i := slices.Index(argv, want[0])
		if i < 0 || i+1 >= len(argv) || argv[i+1] != want[1] || !wf.enginePriority {
			t.Errorf("%s engine argv %q: want %q", engine, argv, want)
		}
	}
}
