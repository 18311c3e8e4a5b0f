package e2e

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// textPair is one key=value of slog's text form.
var textPair = regexp.MustCompile(`(?:^| )("(?:[^"\\]|\\.)*"|[^ ="]+)=("(?:[^"\\]|\\.)*"|[^ ]*)`)

// checkTextLine reports what is wrong with a log line in slog's text form:
// a record nested in the message, or a key given twice.
func checkTextLine(line string) string {
	if !strings.HasPrefix(line, "time=") {
		return "not a log record"
	}
	seen := map[string]bool{}
	for _, m := range textPair.FindAllStringSubmatch(line, -1) {
		key, val := m[1], m[2]
		if seen[key] {
			return "key " + key + " twice"
		}
		seen[key] = true
		if key == "msg" && (strings.Contains(val, "time=") || strings.Contains(val, "level=")) {
			return "a record nested in the message"
		}
	}
	return ""
}

// stopUp sends SIGTERM to up and waits for it to exit cleanly.
func stopUp(t *testing.T, p *upProcess) {
	t.Helper()
	if err := p.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.Done():
	case <-time.After(40 * time.Second):
		t.Fatal("up did not stop within 40s of SIGTERM")
	}
	if err := p.Err(); err != nil {
		t.Fatalf("up exited with %v", err)
	}
}

// TestUpLogIsOneFlatLog: what `up` writes to stderr over a start, a
// request and a clean stop is one log: each line one record (the workers'
// and their engines' records are not nested in another's message, nor
// prefixed), each key once, and a clean stop reports no unreachable
// gateway.
func TestUpLogIsOneFlatLog(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the tailgate binary")
	}
	p := startUp(t, "--replicas", "1", "--sim-ttft", "1ms", "--sim-tpot", "0s")
	req, _ := http.NewRequest(http.MethodPost, p.api+"/chat/completions",
		strings.NewReader(`{"model":"tailgate-sim","max_tokens":3,"messages":[{"role":"user","content":"hi"}]}`))
	req.Header.Set("Authorization", "Bearer "+p.demoKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	stopUp(t, p)

	log := p.stderr.String()
	sawEngine := false
	for _, line := range strings.Split(strings.TrimRight(log, "\n"), "\n") {
		if what := checkTextLine(line); what != "" {
			t.Errorf("%s:\n  %s", what, line)
		}
		if strings.Contains(line, "unreachable") {
			t.Errorf("a clean stop reported something unreachable:\n  %s", line)
		}
		if strings.Contains(line, `msg="simulated engine serving`) {
			sawEngine = strings.Contains(line, "replica=worker-1") && strings.Contains(line, "engine=sim") && strings.Contains(line, "level=INFO")
		}
	}
	if !sawEngine {
		t.Error("the engine's own line is not in up's log as a record of its own, with its replica and engine")
	}
	if t.Failed() {
		t.Logf("up's stderr:\n%s", log)
	}
}

// TestUpJSONLogIsJSON: with --log-format json every line up writes, its
// workers' and engines' included, is one JSON record.
func TestUpJSONLogIsJSON(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the tailgate binary")
	}
	p := startUp(t, "--replicas", "1", "--sim-ttft", "1ms", "--log-format", "json")
	stopUp(t, p)
	n := 0
	for _, line := range strings.Split(strings.TrimRight(p.stderr.String(), "\n"), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Errorf("not a JSON record: %s", line)
			continue
		}
		if msg, _ := rec["msg"].(string); strings.HasPrefix(msg, "{") || strings.Contains(msg, "level=") {
			t.Errorf("a record nested in the message: %s", line)
		}
		n++
	}
	if n < 10 {
		t.Errorf("only %d records", n)
	}
}

// TestEngineTracebackIsAnError: a Python traceback on the engine's stderr
// (vLLM failing to start) is logged at ERROR, each line, never at INFO;
// vLLM's own INFO lines stay INFO.
func TestEngineTracebackIsAnError(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the tailgate binary")
	}
	dir := t.TempDir()
	fake := filepath.Join(dir, "vllm")
	script := `#!/bin/sh
echo "INFO 09-12 10:00:00 [api_server.py:1] vLLM API server version 0.10.1"
echo "Traceback (most recent call last):" >&2
echo '  File "/usr/bin/vllm", line 8, in <module>' >&2
echo "    sys.exit(main())" >&2
echo "ValueError: model 'no-such-model' not found" >&2
exit 1
`
	if err := os.WriteFile(fake, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	token := filepath.Join(dir, "cluster.token")
	if err := os.WriteFile(token, []byte(testClusterToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startProc(t, "worker", false, "worker", "--data", filepath.Join(dir, "w"), "--engine", "vllm", "--model", "no-such-model",
		"--vllm-binary", fake, "--gateway", "http://127.0.0.1:9", "--cluster-token-file", token, "--listen", "127.0.0.1:0")
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(p.stderr.String(), "not found") && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond)
	_ = p.Stop(5 * time.Second)
	log := p.stderr.String()
	// The engine's own lines, as the worker forwards them.
	want := map[string]string{
		`msg="Traceback (most recent call last):"`: "level=ERROR",
		`msg="    sys.exit(main())"`:               "level=ERROR",
		`msg="ValueError: model 'no-such-model'`:   "level=ERROR",
		`msg="INFO 09-12 10:00:00`:                 "level=INFO",
	}
	for what, level := range want {
		found := false
		for _, line := range strings.Split(log, "\n") {
			if strings.Contains(line, what) {
				found = true
				if !strings.Contains(line, level) {
					t.Errorf("want %s:\n  %s", level, line)
				}
				if what := checkTextLine(line); what != "" {
					t.Errorf("%s:\n  %s", what, line)
				}
			}
		}
		if !found {
			t.Errorf("no line with %q", what)
		}
	}
	if t.Failed() {
		t.Logf("worker's stderr:\n%s", log)
	}
}
