package e2e

import (
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"tailgate/e2e/testkit"
)

// TestStaticUpstreamGivenAsOpenAIBaseURL: `--upstream http://host:port/v1`,
// the form OpenAI clients take, serves like the server's root URL; an
// upstream that does not answer is logged with the reason (at WARN, not at
// every probe) instead of leaving only 404s to go by.
func TestStaticUpstreamGivenAsOpenAIBaseURL(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the tailgate binary")
	}
	sim := startProc(t, "sim", true, "sim", "--listen", "127.0.0.1:0", "--announce", "--sim-ttft", "1ms", "--sim-tpot", "0s")
	var simAddr string
	sim.scanUntil(func(line string) bool {
		simAddr, _ = strings.CutPrefix(line, announcePrefix)
		return simAddr != ""
	})
	if simAddr == "" {
		t.Fatal("the sim did not say where it listens")
	}
	dead := holdPort(t) // listens, never answers HTTP: the probe times out
	dir := t.TempDir()
	gw := startProc(t, "gateway", true, "gateway", "--data", dir, "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
		"--upstream", "http://"+simAddr+"/v1", "--upstream", "http://"+dead+"/v1/")
	var api string
	apiRE := regexp.MustCompile(`API (http://\S+)/v1`)
	gw.scanUntil(func(line string) bool {
		if m := apiRE.FindStringSubmatch(line); m != nil {
			api = m[1]
		}
		return api != ""
	})
	if api == "" {
		t.Fatal("the gateway printed no API address")
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		resp, err := http.Get(api + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("the upstream given as …/v1 never became ready")
		}
		time.Sleep(50 * time.Millisecond)
	}
	key := testkit.LastLine(tailgate(t, "keys", "create", "--data", dir, "--tenant", "acme"))
	req, _ := http.NewRequest(http.MethodPost, api+"/v1/chat/completions",
		strings.NewReader(`{"model":"tailgate-sim","max_tokens":3,"messages":[{"role":"user","content":"hi"}]}`))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("X-Tailgate-Replica") != simAddr {
		t.Fatalf("status %d from replica %q, want 200 from %s", resp.StatusCode, resp.Header.Get("X-Tailgate-Replica"), simAddr)
	}

	// The dead upstream: why it is not ready, once, not every second.
	time.Sleep(3 * time.Second)
	var warns []string
	for _, l := range strings.Split(gw.stderr.String(), "\n") {
		if strings.Contains(l, "replica probe failed") && strings.Contains(l, "replica="+dead) {
			warns = append(warns, l)
		}
	}
	if len(warns) != 1 || !strings.Contains(warns[0], "level=WARN") || !strings.Contains(warns[0], "url=http://"+dead+" ") ||
		!strings.Contains(warns[0], "err=") {
		t.Fatalf("want one WARN line saying why %s is not ready, got %d:\n%s", dead, len(warns), strings.Join(warns, "\n"))
	}
}
