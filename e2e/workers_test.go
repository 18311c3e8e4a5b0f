package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/e2e/testkit"
)

func TestWorkersRegisterServeAndExpireWhenKilled(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the tailgate binary")
	}
	g := startGateway(t, "--slow-start", "0") // both fresh replicas take requests at once
	w1 := g.startWorker("w1")
	g.startWorker("w2")
	g.waitReady("w1", "w2")
	for _, r := range g.replicas() {
		if r.Engine != "sim" || len(r.Models) != 1 || r.Models[0] != "tailgate-sim" {
			t.Fatalf("replica %+v", r)
		}
	}

	seen := map[string]bool{}
	for i := range 20 {
		code, h, body, err := g.chatDistinct(context.Background(), false, 5, i)
		if err != nil || code != 200 {
			t.Fatalf("request: %d %v %s", code, err, body)
		}
		seen[h.Get("X-Tailgate-Replica")] = true
		st := serverTimingMillis(h.Get("Server-Timing"))
		for _, stage := range []string{"gateway", "upstream_ttft", "engine_ttft", "network", "ttft", "total"} {
			if _, ok := st[stage]; !ok {
				t.Fatalf("Server-Timing %q lacks %s", h.Get("Server-Timing"), stage)
			}
		}
		// The stages add up: the engine's share and the network make the
		// upstream time; the gateway's part plus the upstream time fit in the TTFT.
		const slack = 0.01 // ms of rounding
		if d := st["engine_ttft"] + st["network"] - st["upstream_ttft"]; d > slack || d < -slack {
			t.Fatalf("engine_ttft + network != upstream_ttft: %v", st)
		}
		if st["gateway"]+st["upstream_ttft"] > st["ttft"]+slack || st["ttft"] > st["total"]+slack {
			t.Fatalf("stages do not add up: %v", st)
		}
	}
	if !seen["w1"] || !seen["w2"] {
		t.Fatalf("requests went to %v, want both workers", seen)
	}

	if err := w1.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	took := testkit.WaitWithin(t, 10*time.Second, "killed worker dropped from routing", func() bool {
		st := g.state("w1")
		return st == "lost" || st == "ejected"
	})
	// Listed as lost (not dropped), so the admin API, the dashboard and
	// alerts still see it.
	testkit.WaitWithin(t, 10*time.Second, "killed worker's lease expired", func() bool { return g.state("w1") == "lost" })
	t.Logf("killed worker out of routing after %v", took)
	for range 10 {
		code, h, _, err := g.chat(context.Background(), false, 3)
		if err != nil || code != 200 || h.Get("X-Tailgate-Replica") != "w2" {
			t.Fatalf("after the kill: %d %v via %q", code, err, h.Get("X-Tailgate-Replica"))
		}
	}
}

func TestWorkerDrainsOnSIGTERMWithoutFailingRequests(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the tailgate binary")
	}
	g := startGateway(t)
	w1 := g.startFleet(2, "--sim-tpot", "5ms")[0]
	l := startLoad(g, 6)
	time.Sleep(500 * time.Millisecond)
	if err := w1.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	sawDraining := false
	testkit.WaitWithin(t, 20*time.Second, "worker exits after draining", func() bool {
		if g.state("w1") == "draining" {
			sawDraining = true
		}
		select {
		case <-w1.Done():
			return true
		default:
			return false
		}
	})
	time.Sleep(300 * time.Millisecond)
	l.stop()
	if err := w1.Err(); err != nil {
		t.Fatalf("worker exited with %v", err)
	}
	if !sawDraining {
		t.Error("the gateway never showed the worker as draining")
	}
	if n := l.failedBeforeToken.Load() + l.failedMidStream.Load() + l.other.Load(); n != 0 {
		t.Fatalf("%d requests failed during the drain (%d ok):\n%s", n, l.ok.Load(), l.errors())
	}
	if !strings.Contains(w1.stderr.String(), "draining") {
		t.Errorf("worker did not log its drain:\n%s", w1.stderr.String())
	}
	t.Logf("%d requests, none failed", l.ok.Load())
}

func TestFailoverOnSIGKILLHasNoClientErrorsBeforeTheFirstToken(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the tailgate binary")
	}
	g := startGateway(t)
	victim := g.startFleet(3, "--sim-tpot", "3ms")[0]
	l := startLoad(g, 8)
	time.Sleep(time.Second)
	if err := victim.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	took := testkit.WaitWithin(t, 5*time.Second, "dead worker out of routing", func() bool { return g.state("w1") != "ready" })
	time.Sleep(2 * time.Second)
	l.stop()

	t.Logf("out of routing %v after the kill; ok %d, failed mid-stream %d, before first token %d, other %d",
		took, l.ok.Load(), l.failedMidStream.Load(), l.failedBeforeToken.Load(), l.other.Load())
	if n := l.failedBeforeToken.Load() + l.other.Load(); n != 0 {
		t.Fatalf("%d client-visible errors before the first token:\n%s", n, l.errors())
	}
	// New requests stopped going to the dead replica at its first failure:
	// only attempts already chosen for it (at most one per client) failed to
	// connect and were retried elsewhere.
	if n := g.metric("tailgate_retries_total", `class="not_sent"`); n > 8 {
		t.Fatalf("%v attempts were sent to the dead replica after it failed", n)
	}
}

func TestHungWorkerIsEjectedAndReadmitted(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the tailgate binary")
	}
	g := startGateway(t)
	victim := g.startFleet(3, "--sim-tpot", "2ms")[0]
	l := startLoad(g, 6)
	time.Sleep(500 * time.Millisecond)
	if err := victim.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	took := testkit.WaitWithin(t, 3*time.Second, "a SIGSTOPped worker is ejected within 3s", func() bool { return g.state("w1") == "ejected" })
	t.Logf("ejected %v after SIGSTOP", took)
	time.Sleep(time.Second)
	if err := victim.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	back := testkit.WaitWithin(t, 5*time.Second, "re-admitted after SIGCONT", func() bool { return g.state("w1") == "ready" })
	t.Logf("re-admitted %v after SIGCONT", back)
	time.Sleep(500 * time.Millisecond)
	l.stop()
	if n := l.failedBeforeToken.Load() + l.other.Load(); n != 0 {
		t.Fatalf("%d requests failed before their first token (ok %d, mid-stream %d):\n%s",
			n, l.ok.Load(), l.failedMidStream.Load(), l.errors())
	}
	if g.metric("tailgate_ejections_total", `replica="w1"`) < 1 {
		t.Fatal("no ejection counted for the hung replica")
	}
}

// childPID finds the pid of up's worker child with the given replica id.
func childPID(t *testing.T, parent int, id string) int {
	t.Helper()
	// A Go process forks from any of its threads: look at every thread's children.
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", parent))
	if err != nil {
		t.Fatal(err)
	}
	var all []string
	for _, task := range tasks {
		raw, _ := os.ReadFile(task)
		all = append(all, strings.Fields(string(raw))...)
	}
	for _, f := range all {
		pid, _ := strconv.Atoi(f)
		cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if strings.Contains(string(cmdline), "--replica-id\x00"+id+"\x00") {
			return pid
		}
	}
	return 0
}

func TestUpReplacesAKilledWorker(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the tailgate binary")
	}
	p := startUp(t, "--replicas", "3", "--sim-ttft", "5ms", "--sim-tpot", "1ms", "--warmup", "1")
	g := &gatewayProcess{t: t, admin: p.admin, api: p.api, key: p.demoKey, token: readToken(t, filepath.Join(p.dir, "admin.token"))}
	g.waitReady("worker-1", "worker-2", "worker-3")
	before := ""
	for _, r := range g.replicas() {
		if r.ID == "worker-2" {
			before = r.Address
		}
	}
	pid := childPID(t, p.PID(), "worker-2")
	if pid == 0 {
		t.Fatal("no worker-2 child process found")
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testkit.WaitWithin(t, 10*time.Second, "killed worker out of routing", func() bool { return g.state("worker-2") != "ready" })
	testkit.WaitWithin(t, 30*time.Second, "replacement worker ready", func() bool {
		for _, r := range g.replicas() {
			if r.ID == "worker-2" && r.State == "ready" && r.Address != before {
				return true
			}
		}
		return false
	})
	code, _, _, err := g.chat(context.Background(), true, 5)
	if err != nil || code != 200 {
		t.Fatalf("after the replacement: %d %v", code, err)
	}
}

// TestRevokedWorkerLeavesRoutingAndStaysOut: the real worker binary gets
// a credential on its first heartbeat; revoking it over the admin API
// takes its replica out of routing, and its later heartbeats cannot bring
// it back. Its id stays its own meanwhile: another worker cannot take it.
func TestRevokedWorkerLeavesRoutingAndStaysOut(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the tailgate binary")
	}
	g := startGateway(t, "--slow-start", "0")
	g.startFleet(1)
	worker := ""
	for _, r := range g.replicas() {
		if r.ID == "w1" {
			worker = r.Worker
		}
	}
	if !strings.HasPrefix(worker, "wkr_") {
		t.Fatalf("w1 registered without a worker id: %q", worker)
	}
	req, _ := http.NewRequest(http.MethodDelete, g.admin+"/admin/v1/workers/"+worker, nil)
	req.Header.Set("Authorization", "Bearer "+g.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("revoke: %d", resp.StatusCode)
	}
	// Three heartbeats later it is still out.
	time.Sleep(3 * time.Second)
	if st := g.state("w1"); st != "gone" {
		t.Fatalf("revoked worker is back in the registry as %q", st)
	}
	code, _, _, err := g.chat(context.Background(), false, 3)
	if err == nil && code == 200 {
		t.Fatal("a request was served with the only worker revoked")
	}
}
