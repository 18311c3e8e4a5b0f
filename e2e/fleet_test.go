package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/e2e/testkit"
)

// fleetView is GET /admin/v1/fleet.
type fleetView struct {
	Provider string `json:"provider"`
	Models   []struct {
		Model                      string `json:"model"`
		Min, Max, Desired, Current int
		Draining, Failures         int
		NextRetry                  *time.Time `json:"next_retry"`
	} `json:"models"`
	Actions []struct {
		Kind, Replica, Reason, Outcome, Error string
	} `json:"actions"`
}

func (g *gatewayProcess) fleet() fleetView {
	g.t.Helper()
	req, _ := http.NewRequest(http.MethodGet, g.admin+"/admin/v1/fleet", nil)
	req.Header.Set("Authorization", "Bearer "+g.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		g.t.Fatal(err)
	}
	defer resp.Body.Close()
	var v fleetView
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		g.t.Fatal(err)
	}
	return v
}

// TestExecFleetReplacesAPreemptedWorkerAtOnce: a gateway whose fleet
// controller runs the operator's scripts (--fleet-exec-start/-stop) starts
// its min replica with the documented environment — the script starts a
// real worker with it, which joins by the join token. When that worker's
// preemption file appears, it drains: a request in flight there finishes,
// the controller starts a replacement while the old replica still drains,
// no client request fails, and the admin API lists the actions.
func TestExecFleetReplacesAPreemptedWorkerAtOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the tailgate binary")
	}
	dir := t.TempDir()
	envs := `env | grep -E '^(MODEL|REPLICA_ID|JOIN_TOKEN|GATEWAY_URL|CLUSTER_TOKEN_FILE)=' | sort > "` + dir + `/$1-$REPLICA_ID.env"` + "\n"
	start := filepath.Join(dir, "start")
	stop := filepath.Join(dir, "stop")
	// A start script that leaves a worker running sends its output to a
	// file: the gateway waits for the script's own output to close.
	writeScript(t, start, strings.ReplaceAll(envs, "$1", "start")+fmt.Sprintf(`TAILGATE_JOIN_TOKEN="$JOIN_TOKEN" %q worker --gateway "$GATEWAY_URL" \
  --cluster-token-file "$CLUSTER_TOKEN_FILE" --replica-id "$REPLICA_ID" --model "$MODEL" --engine sim \
  --listen 127.0.0.1:0 --data %q/"$REPLICA_ID" --sim-ttft 5ms --sim-tpot 5ms --warmup 1 \
  --preempt-file %q/"preempt-$REPLICA_ID" >%q/"$REPLICA_ID.log" 2>&1 &
echo $! >%q/"$REPLICA_ID.pid"
`, binPath, dir, dir, dir, dir))
	writeScript(t, stop, strings.ReplaceAll(envs, "$1", "stop")+`kill "$(cat "`+dir+`/$REPLICA_ID.pid")" 2>/dev/null || true`+"\n")
	cfg := filepath.Join(dir, "tailgate.yaml")
	if err := os.WriteFile(cfg, []byte("fleet:\n  models:\n    tailgate-sim: {min: 1, max: 1}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	g := startGateway(t, "--config", cfg, "--fleet-exec-start", start, "--fleet-exec-stop", stop)
	const first, second = "tailgate-sim-1", "tailgate-sim-2"
	g.waitReady(first)

	env := readEnv(t, filepath.Join(dir, "start-"+first+".env"))
	if env["MODEL"] != "tailgate-sim" || env["REPLICA_ID"] != first || env["GATEWAY_URL"] != g.admin ||
		env["CLUSTER_TOKEN_FILE"] != filepath.Join(g.dir, "cluster.token") || len(env["JOIN_TOKEN"]) < 20 {
		t.Fatalf("start script environment %v", env)
	}

	// A long stream in flight on the replica about to be preempted.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	long := make(chan string, 1)
	started := make(chan struct{})
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, g.api+"/chat/completions", strings.NewReader(
			`{"model":"tailgate-sim","stream":true,"max_tokens":800,"messages":[{"role":"user","content":"a long answer"}]}`))
		req.Header.Set("Authorization", "Bearer "+g.key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			close(started)
			long <- err.Error()
			return
		}
		defer resp.Body.Close()
		r := bufio.NewReader(resp.Body)
		_, _ = r.ReadString('\n')
		close(started)
		var rest strings.Builder
		_, _ = r.WriteTo(&rest)
		long <- resp.Header.Get("X-Tailgate-Replica") + " " + rest.String()
	}()
	<-started
	l := startLoad(g, 4)
	if err := os.WriteFile(filepath.Join(dir, "preempt-"+first), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	testkit.WaitWithin(t, 20*time.Second, "a replacement registered while the preempted replica drains", func() bool {
		return g.state(first) == "draining" && g.state(second) != "gone"
	})
	if r := g.replica(first).Reason; !strings.HasPrefix(r, "preempted: notice file") {
		t.Errorf("the preempted replica drains with reason %q, want preempted: notice file …", r)
	}
	g.waitReady(second)
	select {
	case got := <-long:
		if !strings.HasPrefix(got, first+" ") || !strings.HasSuffix(got, "data: [DONE]\n\n") {
			t.Errorf("the stream in flight on the preempted replica did not finish: %.300q", got)
		}
	case <-time.After(45 * time.Second):
		t.Fatal("the stream in flight on the preempted replica did not end")
	}
	testkit.WaitWithin(t, 20*time.Second, "the preempted replica stopped by the stop script", func() bool {
		_, err := os.Stat(filepath.Join(dir, "stop-"+first+".env"))
		return err == nil
	})
	time.Sleep(200 * time.Millisecond)
	l.stop()
	if n := l.failedBeforeToken.Load() + l.failedMidStream.Load() + l.other.Load(); n != 0 {
		t.Fatalf("%d requests failed through the preemption (%d ok):\n%s", n, l.ok.Load(), l.errors())
	}
	if env := readEnv(t, filepath.Join(dir, "stop-"+first+".env")); env["MODEL"] != "tailgate-sim" || env["REPLICA_ID"] != first || env["JOIN_TOKEN"] != "" {
		t.Errorf("stop script environment %v", env)
	}

	v := g.fleet()
	if v.Provider != "exec" || len(v.Models) != 1 || v.Models[0].Min != 1 || v.Models[0].Max != 1 || v.Models[0].Desired != 1 || v.Models[0].Current != 1 {
		t.Fatalf("fleet %+v, want exec, tailgate-sim min 1 max 1 desired 1 current 1", v)
	}
	type act struct{ kind, replica, reason, outcome string }
	var acts []act
	for _, a := range v.Actions {
		reason := a.Reason
		if a.Kind == "preempted" {
			reason, _, _ = strings.Cut(reason, ":")
		}
		acts = append(acts, act{a.Kind, a.Replica, reason, a.Outcome})
	}
	for _, want := range []act{{"start", first, "min", "ok"}, {"start", second, "preempted", "ok"}, {"preempted", first, "preempted", "ok"}} {
		if !slices.Contains(acts, want) {
			t.Errorf("fleet actions %v lack %v", acts, want)
		}
	}
	if n := g.metric("tailgate_fleet_actions_total", `action="preempted"`, `outcome="ok"`); n != 1 {
		t.Errorf("tailgate_fleet_actions_total{action=preempted,outcome=ok} = %v, want 1", n)
	}
	t.Logf("%d requests through the preemption, none failed", l.ok.Load())
}

func writeScript(t *testing.T, path, body string) {
	t.Helper()
	if err := os.WriteFile(path, []byte("#!/bin/sh\nset -e\n"+body), 0o700); err != nil {
		t.Fatal(err)
	}
}

// readEnv reads NAME=VALUE lines.
func readEnv(t *testing.T, path string) map[string]string {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for line := range strings.Lines(string(raw)) {
		k, v, _ := strings.Cut(strings.TrimSpace(line), "=")
		out[k] = v
	}
	return out
}
