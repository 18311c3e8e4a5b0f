package e2e

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// runGPUCheck runs scripts/gpu-check.sh against the fake vllm with env
// added, and returns its exit status and output.
func runGPUCheck(t *testing.T, env ...string) (int, string) {
	t.Helper()
	vllm := buildFakeVLLM(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "../scripts/gpu-check.sh")
	cmd.Env = append(os.Environ(), append([]string{"TAILGATE=" + binPath, "VLLM_BINARY=" + vllm, "OUT=" + t.TempDir(),
		"MODEL=org/fake-model", "TOOL_CALL_PARSER=hermes", "BENCH_SECONDS=3", "DRAIN_TOKENS=200", "FAKE_VLLM_TPOT=10ms"}, env...)...)
	// The script's own trap stops `tailgate up`; a SIGTERM lets it run.
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 30 * time.Second
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	switch {
	case ctx.Err() != nil:
		t.Fatalf("gpu-check.sh still running after 2 minutes; output:\n%s", out)
	case errors.As(err, &exit):
		return exit.ExitCode(), string(out)
	case err != nil:
		t.Fatal(err)
	}
	return 0, string(out)
}

var checkLine = regexp.MustCompile(`(?m)^(PASS|FAIL|SKIP) (\S+)`)

// checks returns the verdict of each check the script printed.
func checks(out string) map[string]string {
	got := map[string]string{}
	for _, m := range checkLine.FindAllStringSubmatch(out, -1) {
		got[m[2]] = m[1]
	}
	return got
}

// TestGPUCheckScript runs the GPU acceptance script against the fake vLLM
// (the simulated engine behind vLLM's command line): every check passes on
// a working deployment, and a broken engine makes it print FAIL and exit 1.
func TestGPUCheckScript(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the tailgate binary")
	}
	t.Run("all checks pass", func(t *testing.T) {
		t.Parallel()
		code, out := runGPUCheck(t)
		if code != 0 || !strings.HasSuffix(out, "\n10 passed, 0 failed\n") {
			t.Fatalf("exit status %d, output:\n%s\nwant exit 0 and \"10 passed, 0 failed\" last", code, out)
		}
		want := []string{"ready", "warm-up", "stream-chat", "completion", "tool-call", "metrics", "abort", "drain", "sigkill", "bench"}
		got := checks(out)
		for _, name := range want {
			if got[name] != "PASS" {
				t.Errorf("check %s: %q, want PASS", name, got[name])
			}
		}
		if t.Failed() {
			t.Logf("output:\n%s", out)
		}
	})
	t.Run("an engine failing chat fails the run", func(t *testing.T) {
		t.Parallel()
		// Long enough for a loaded machine to start the fake engine; the
		// script reports the last telling reason, not the restart's wait.
		code, out := runGPUCheck(t, "FAKE_VLLM_CHAT_STATUS=500", "READY_TIMEOUT=20")
		if code != 1 || !strings.Contains(out, "\nFAIL ready (not ready within 20s: state ") ||
			!strings.Contains(out, "500 Internal Server Error") || !strings.HasSuffix(out, "\n0 passed, 1 failed\n") {
			t.Fatalf("exit status %d, output:\n%s\nwant exit 1, FAIL ready naming the 500, and \"0 passed, 1 failed\" last", code, out)
		}
	})
}
