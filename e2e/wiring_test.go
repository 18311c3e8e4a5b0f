package e2e

import (
	"encoding/json"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/e2e/testkit"
)

// TestWiringMistakesGetAHint: the commonest ways to wire a client or a
// worker to the wrong place are each answered with what was meant — in
// OpenAI's error shape with DESIGN.md's status — not a bare 404 or 503.
func TestWiringMistakesGetAHint(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the tailgate binary")
	}
	g := startGateway(t)
	w1 := g.startWorker("w1")
	g.waitReady("w1")
	public := strings.TrimSuffix(g.api, "/v1")
	chat := `{"model":"tailgate-sim","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`

	type mistake struct {
		name              string
		method, url, auth string
		body              string
		status            int
		code, param       string
		want              []string // in the message
	}
	ask := func(t *testing.T, m mistake) {
		t.Helper()
		req, _ := http.NewRequest(m.method, m.url, strings.NewReader(m.body))
		if m.auth != "" {
			req.Header.Set("Authorization", "Bearer "+m.auth)
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		var e struct {
			Error map[string]any `json:"error"`
		}
		if err := json.Unmarshal(raw, &e); err != nil || e.Error == nil {
			t.Fatalf("status %d, not OpenAI's error shape: %s", resp.StatusCode, raw)
		}
		for _, k := range []string{"message", "type", "param", "code"} {
			if _, ok := e.Error[k]; !ok {
				t.Errorf("error lacks %q: %s", k, raw)
			}
		}
		msg, _ := e.Error["message"].(string)
		code, _ := e.Error["code"].(string)
		param, _ := e.Error["param"].(string)
		if resp.StatusCode != m.status || code != m.code || param != m.param {
			t.Errorf("status %d code %q param %q, want %d %q %q: %s", resp.StatusCode, code, param, m.status, m.code, m.param, raw)
		}
		t.Logf("%d %s", resp.StatusCode, msg)
		for _, w := range m.want {
			if !strings.Contains(msg, w) {
				t.Errorf("the message does not say %q:\n  %s", w, msg)
			}
		}
	}
	for _, m := range []mistake{
		{name: "a base URL without /v1", method: "POST", url: public + "/chat/completions", auth: g.key, body: chat,
			status: 404, code: "not_found", want: []string{"under /v1", public + "/v1/chat/completions", "base URL to " + public + "/v1"}},
		{name: "a base URL with /v1 twice", method: "POST", url: g.api + "/v1/chat/completions", auth: g.key, body: chat,
			status: 404, code: "not_found", want: []string{public + "/v1/chat/completions"}},
		{name: "a model list without /v1", method: "GET", url: public + "/models", auth: g.key,
			status: 404, code: "not_found", want: []string{public + "/v1/models"}},
		{name: "the public API on the admin port", method: "POST", url: g.admin + "/v1/chat/completions", auth: g.key, body: chat,
			status: 404, code: "not_found", want: []string{"public listener", "not on this admin listener", g.api}},
		{name: "the public API without /v1 on the admin port", method: "POST", url: g.admin + "/chat/completions", auth: g.key, body: chat,
			status: 404, code: "not_found", want: []string{"public listener", g.api}},
		{name: "metrics on the public port", method: "GET", url: public + "/metrics", auth: g.token,
			status: 404, code: "not_found", want: []string{"admin listener", g.admin + "/metrics"}},
		{name: "the admin API on the public port", method: "GET", url: public + "/admin/v1/replicas", auth: g.token,
			status: 404, code: "not_found", want: []string{"admin listener", g.admin + "/admin/v1/replicas"}},
		{name: "a chat sent with GET", method: "GET", url: g.api + "/chat/completions", auth: g.key,
			status: 405, code: "method_not_allowed", want: []string{"POST"}},
		{name: "an unknown model", method: "POST", url: g.api + "/chat/completions", auth: g.key,
			body:   `{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}`,
			status: 404, code: "model_not_found", param: "model", want: []string{`"gpt-4o"`, `this key may use "tailgate-sim"`, "/v1/models"}},
		{name: "an unknown model by id", method: "GET", url: g.api + "/models/gpt-4o", auth: g.key,
			status: 404, code: "model_not_found", param: "model", want: []string{`"tailgate-sim"`, "/v1/models"}},
	} {
		t.Run(m.name, func(t *testing.T) { ask(t, m) })
	}

	t.Run("a worker pointed at the public port", func(t *testing.T) {
		dir := t.TempDir()
		g.approve("w9", dir)
		code, stderr := runToExit(t, 60*time.Second, "worker", "--gateway", public,
			"--cluster-token-file", filepath.Join(g.dir, "cluster.token"), "--engine", "sim", "--listen", "127.0.0.1:0",
			"--replica-id", "w9", "--data", dir, "--warmup", "0")
		if code != 1 {
			t.Errorf("exit status %d, want 1", code)
		}
		line := errorLine(t, stderr)
		for _, w := range []string{public, "404", "point --gateway at the gateway's admin listener", g.admin} {
			if !strings.Contains(line, w) {
				t.Errorf("error line lacks %q:\n  %s", w, line)
			}
		}
		if strings.Contains(stderr, "engine ready") && strings.Contains(stderr, "registered with gateway") {
			t.Errorf("the worker said it registered")
		}
		t.Logf("%s", line)
		if t.Failed() {
			t.Logf("stderr:\n%s", stderr)
		}
	})

	t.Run("a model whose only replica is out", func(t *testing.T) {
		if err := w1.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		testkit.WaitWithin(t, 30*time.Second, "w1 out", func() bool { s := g.state("w1"); return s == "draining" || s == "lost" })
		ask(t, mistake{method: "POST", url: g.api + "/chat/completions", auth: g.key, body: chat,
			status: 503, code: "no_replica", want: []string{`"tailgate-sim"`, "1 replica", "w1 "}})
	})
}
