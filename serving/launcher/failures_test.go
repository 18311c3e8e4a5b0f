package launcher

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/e2e/testkit"
)

// TestEngineThatRejectsItsArgumentsIsNotRestarted: a vLLM whose argument
// parser rejects its command line (exit status 2 and "vllm: error: …" on
// stderr) is started once, not again and again: the state stays failed
// with vLLM's own message and says what to do.
func TestEngineThatRejectsItsArgumentsIsNotRestarted(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		extra []string
		said  string
	}{
		{"removed flag", []string{"--disable-log-requests"}, "vllm: error: unrecognized arguments: --disable-log-requests"},
		{"flag without its value", []string{"--max-model-len"}, "vllm serve: error: argument --max-model-len: expected one argument"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := start(t, VLLMOptions{ExtraArgs: tt.extra}, nil, Config{StartFailures: 3, CannotStartBackoff: time.Hour})
			h.waitState("failed", 1)

			want := "engine rejected its command line (exit status 2): " + tt.said +
				"; not restarting: fix the engine's arguments (tailgate's --vllm-arg) and restart the worker"
			if state, reason := h.l.State(); state != "failed" || reason != want {
				t.Errorf("State = %q, %q; want failed, %q", state, reason, want)
			}
			// A restart would have come after the 50ms backoff.
			time.Sleep(500 * time.Millisecond)
			if n := h.count("start"); n != 1 || h.l.Restarts() != 0 {
				t.Errorf("%d starts, %d restarts; want 1 start and no restart", n, h.l.Restarts())
			}
			if got := h.stateNames(); !slices.Equal(got, []string{"starting", "failed"}) {
				t.Errorf("states = %q, want starting, failed", got)
			}
			// stderr is kept, the INFO line of its stdout log is not.
			wantLog := []string{"usage: vllm serve [model_tag] [options]", tt.said}
			if got := h.l.EngineLog(); !slices.Equal(got, wantLog) {
				t.Errorf("EngineLog = %q, want %q", got, wantLog)
			}
			if got := h.logs.logLines("engine rejected its command line; not restarting", "level=ERROR", tt.said); len(got) != 1 {
				t.Errorf("log lines saying the engine rejected its command line: %q", got)
			}
			if err := h.stop(); err != nil {
				t.Errorf("Run = %v, want nil", err)
			}
		})
	}
}

// TestExitStatus2WithoutArgparseErrorIsRestarted: exit status 2 alone is
// an ordinary crash; only argparse's error line makes it a command line
// the engine rejects.
func TestExitStatus2WithoutArgparseErrorIsRestarted(t *testing.T) {
	t.Parallel()
	l, err := New(testConfig(Config{
		Command: func(string) ([]string, []string, error) {
			return []string{"sh", "-c", "echo 'RuntimeError: CUDA error: out of memory' >&2; exit 2"}, nil, nil
		},
	}))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	defer func() { cancel(); <-done }()
	testkit.WaitFor(t, "a restart", func() bool { return l.Restarts() >= 1 })
}

// TestCannotStartUntilTheEngineIsReady: once the engine cannot start, a new
// try is no progress — the state stays failed while it runs — until the
// engine is ready; then its old error lines are gone.
func TestCannotStartUntilTheEngineIsReady(t *testing.T) {
	t.Parallel()
	h := start(t, VLLMOptions{Model: "org/nope"}, []string{"FAKE_VLLM_FAIL_STARTS=3"},
		Config{Model: "org/nope", StartFailures: 2, CannotStartBackoff: 100 * time.Millisecond})
	changes := h.waitState("ready", 1)

	names := h.stateNames()
	if want := []string{"starting", "failed", "starting", "failed", "failed", "failed", "failed", "warming", "ready"}; !slices.Equal(names, want) {
		t.Fatalf("states = %q, want %q", names, want)
	}
	const said = "engine exited while starting: exit status 1; last engine output: OSError: org/nope is not a local folder and is not a valid model identifier listed on 'https://huggingface.co/models'"
	wants := []string{
		`waiting for the engine to serve "org/nope"`,
		said + "; restarting in 50ms",
		`waiting for the engine to serve "org/nope"`,
		"engine cannot start: 2 starts in a row failed, the last: " + said + "; next try in 100ms",
		"engine cannot start: 2 starts in a row failed, the last: " + said + `; trying again: waiting for the engine to serve "org/nope"`,
		"engine cannot start: 3 starts in a row failed, the last: " + said + "; next try in 100ms",
		"engine cannot start: 3 starts in a row failed, the last: " + said + `; trying again: waiting for the engine to serve "org/nope"`,
	}
	for i, want := range wants {
		if changes[i].reason != want {
			t.Errorf("change %d (%s): reason %q, want %q", i+1, changes[i].state, changes[i].reason, want)
		}
	}
	if got := h.l.EngineLog(); got != nil {
		t.Errorf("EngineLog = %q once ready, want none", got)
	}
}

func TestErrorTailKeepsTheLastLines(t *testing.T) {
	t.Parallel()
	var tail errorTail
	if tail.snapshot() != nil || tail.lastSince(0) != "" {
		t.Fatal("an empty tail is not empty")
	}
	m := tail.mark()
	for i := range 25 {
		tail.add(strings.Repeat("x", i) + "é" + strings.Repeat("y", 600))
	}
	got := tail.snapshot()
	if len(got) != 20 || !strings.HasPrefix(got[0], strings.Repeat("x", 5)+"é") || !strings.HasPrefix(got[19], strings.Repeat("x", 24)+"é") {
		t.Fatalf("snapshot keeps %d lines: first %.30q last %.30q", len(got), got[0], got[len(got)-1])
	}
	for _, l := range got {
		if len(l) > 512 || !strings.HasSuffix(l, "y") {
			t.Fatalf("line of %d bytes ending %q: not cut at 512 bytes on a character boundary", len(l), l[len(l)-3:])
		}
	}
	if tail.lastSince(m) != got[19] {
		t.Errorf("lastSince = %.30q, want the newest line", tail.lastSince(m))
	}
	m = tail.mark()
	if tail.lastSince(m) != "" {
		t.Error("lastSince a fresh mark is not empty")
	}
	tail.reset()
	tail.add("after")
	if got := tail.snapshot(); !slices.Equal(got, []string{"after"}) || tail.lastSince(m) != "after" {
		t.Errorf("after reset: %q, lastSince %q", got, tail.lastSince(m))
	}
}

func TestLogsError(t *testing.T) {
	t.Parallel()
	for line, want := range map[string]bool{
		"ERROR 09-12 10:00:00 [core.py:700] EngineCore failed to start.":                 true,
		"(EngineCore_DP0 pid=4242) ERROR 09-12 10:00:00 [core.py:700] EngineCore failed": true,
		"CRITICAL 09-12 10:00:00 [launcher.py:99] out of memory":                         true,
		`time=2026-01-01T00:00:00Z level=ERROR msg="listen failed"`:                      true,
		"INFO 09-12 10:00:00 [api_server.py:1] vLLM API server version 0.11.0":           false,
		"WARNING 09-12 10:00:00 [config.py:1] ERROR handling is deprecated":              false,
	} {
		if got := logsError(line); got != want {
			t.Errorf("logsError(%q) = %v, want %v", line, got, want)
		}
	}
}
