package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"tailgate/e2e/testkit"
)

// gatewayProcess is a running `tailgate gateway` with its workers.
type gatewayProcess struct {
	*process
	t     *testing.T
	dir   string
	api   string // http://host:port/v1
	admin string // http://host:port
	key   string
	token string // admin token
	// uiToken is the #token= of the dashboard link printed.
	uiToken string
}

var gatewayLine = regexp.MustCompile(`API (http://\S+/v1)\s+admin (http://\S+)/ui/(?:#token=(\S+))?`)

func startGateway(t *testing.T, extra ...string) *gatewayProcess {
	t.Helper()
	return startGatewayIn(t, t.TempDir(), extra...)
}

// startGatewayIn starts a gateway on data directory dir, which may hold
// tokens already (a second gateway of a deployment shares the first's
// cluster token).
func startGatewayIn(t *testing.T, dir string, extra ...string) *gatewayProcess {
	t.Helper()
	g := &gatewayProcess{t: t, dir: dir, process: startProc(t, "gateway", true,
		append([]string{"gateway", "--data", dir, "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"}, extra...)...)}
	g.scanUntil(func(line string) bool {
		if m := gatewayLine.FindStringSubmatch(line); m != nil {
			g.api, g.admin, g.uiToken = m[1], m[2], m[3]
		}
		return g.api != ""
	})
	if g.api == "" {
		t.Fatalf("gateway printed no addresses; stderr:\n%s", g.stderr.String())
	}
	g.token = readToken(t, filepath.Join(g.dir, "admin.token"))
	g.key = testkit.LastLine(tailgate(t, "keys", "create", "--data", g.dir, "--tenant", "test"))
	return g
}

// startFleet starts workers w1..wn with the same extra flags and waits
// until all are ready.
func (g *gatewayProcess) startFleet(n int, extra ...string) []*process {
	g.t.Helper()
	var ws []*process
	var ids []string
	for i := 1; i <= n; i++ {
		id := fmt.Sprintf("w%d", i)
		ws = append(ws, g.startWorker(id, extra...))
		ids = append(ids, id)
	}
	g.waitReady(ids...)
	return ws
}

// startWorker approves replica id (`tailgate workers approve`) and starts
// `tailgate worker --engine sim` registering with g under it.
func (g *gatewayProcess) startWorker(id string, extra ...string) *process {
	g.t.Helper()
	tailgate(g.t, "workers", "approve", "--data", g.dir, id)
	return g.startUnapprovedWorker(id, extra...)
}

// startUnapprovedWorker starts a worker as startWorker does, without
// approving its replica id first.
func (g *gatewayProcess) startUnapprovedWorker(id string, extra ...string) *process {
	g.t.Helper()
	return startProc(g.t, "worker "+id, false, append([]string{"worker", "--gateway", g.admin,
		"--cluster-token-file", filepath.Join(g.dir, "cluster.token"),
		"--engine", "sim", "--listen", "127.0.0.1:0", "--replica-id", id, "--data", filepath.Join(g.dir, id),
		"--sim-ttft", "5ms", "--sim-tpot", "1ms", "--warmup", "1"}, extra...)...)
}

type replicaView struct {
	ID      string   `json:"id"`
	State   string   `json:"state"`
	Reason  string   `json:"reason"`
	Engine  string   `json:"engine"`
	Models  []string `json:"models"`
	Address string   `json:"address"`
	Worker  string   `json:"worker"` // the registering worker's credential id
	// EngineLog is the engine's last error lines, sent while not ready.
	EngineLog []string `json:"engine_log"`
}

func (g *gatewayProcess) replicas() []replicaView {
	g.t.Helper()
	req, _ := http.NewRequest(http.MethodGet, g.admin+"/admin/v1/replicas", nil)
	req.Header.Set("Authorization", "Bearer "+g.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		g.t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Data []replicaView `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		g.t.Fatal(err)
	}
	return out.Data
}

func (g *gatewayProcess) state(id string) string {
	for _, r := range g.replicas() {
		if r.ID == id {
			return r.State
		}
	}
	return "gone"
}

func (g *gatewayProcess) waitReady(ids ...string) {
	g.t.Helper()
	testkit.WaitWithin(g.t, 30*time.Second, fmt.Sprintf("replicas %v ready", ids), func() bool {
		for _, id := range ids {
			if g.state(id) != "ready" {
				return false
			}
		}
		return true
	})
}

// chat sends one chat request for the sim model and returns status,
// headers and body.
func (g *gatewayProcess) chat(ctx context.Context, stream bool, maxTokens int) (int, http.Header, string, error) {
	return g.chatBody(ctx, fmt.Sprintf(`{"model":"tailgate-sim","stream":%v,"max_tokens":%d,"messages":[{"role":"user","content":"hello there"}]}`, stream, maxTokens))
}

// chatBody posts body to /v1/chat/completions with the test's key.
func (g *gatewayProcess) chatBody(ctx context.Context, body string) (int, http.Header, string, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, g.api+"/chat/completions", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+g.key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, "", err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(raw), err
}

// serverTimingMillis parses a Server-Timing header.
func serverTimingMillis(h string) map[string]float64 {
	out := map[string]float64{}
	for _, part := range strings.Split(h, ",") {
		name, dur, ok := strings.Cut(strings.TrimSpace(part), ";dur=")
		if !ok {
			continue
		}
		if v, err := strconv.ParseFloat(dur, 64); err == nil {
			out[name] = v
		}
	}
	return out
}

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
	for range 20 {
		code, h, body, err := g.chat(context.Background(), false, 5)
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

// clientLoad is n clients sending mixed requests until stopped; it counts
// outcomes.
type clientLoad struct {
	stopped atomic.Bool
	wg      sync.WaitGroup

	ok, failedBeforeToken, failedMidStream, other atomic.Int64
	byReplica                                     sync.Map // replica → *atomic.Int64
	errs                                          sync.Map
}

// startLoad starts clients sending to g.
func startLoad(g *gatewayProcess, clients int) *clientLoad {
	l := &clientLoad{}
	for c := range clients {
		l.wg.Go(func() {
			for i := 0; !l.stopped.Load() && i < 10000; i++ {
				stream := (c+i)%2 == 0
				code, h, body, err := g.chat(context.Background(), stream, 20)
				switch {
				case err == nil && code == 200 && (!stream || strings.HasSuffix(body, "data: [DONE]\n\n")):
					l.ok.Add(1)
					v, _ := l.byReplica.LoadOrStore(h.Get("X-Tailgate-Replica"), new(atomic.Int64))
					v.(*atomic.Int64).Add(1)
				case err == nil && code == 200 && strings.Contains(body, `"content":"`):
					l.failedMidStream.Add(1)
				case err == nil && code != 200, err == nil && code == 200 && stream:
					l.failedBeforeToken.Add(1)
					l.errs.Store(fmt.Sprintf("%d %s", code, strings.TrimSpace(body)), true)
				default:
					l.other.Add(1)
					l.errs.Store(fmt.Sprint(err), true)
				}
			}
		})
	}
	return l
}

// stop stops the clients and waits for them.
func (l *clientLoad) stop() {
	l.stopped.Store(true)
	l.wg.Wait()
}

func (l *clientLoad) errors() string {
	var out []string
	l.errs.Range(func(k, _ any) bool { out = append(out, k.(string)); return len(out) < 5 })
	return strings.Join(out, "\n")
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

// metric returns the sum of a Prometheus counter's series whose labels
// contain every filter (e.g. `class="not_sent"`).
func (g *gatewayProcess) metric(name string, filters ...string) float64 {
	g.t.Helper()
	req, _ := http.NewRequest(http.MethodGet, g.admin+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+g.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		g.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var sum float64
	for _, line := range strings.Split(string(raw), "\n") {
		if !strings.HasPrefix(line, name) || strings.HasPrefix(line, "#") {
			continue
		}
		match := true
		for _, f := range filters {
			if !strings.Contains(line, f) {
				match = false
			}
		}
		if fields := strings.Fields(line); match && len(fields) == 2 {
			v, _ := strconv.ParseFloat(fields[1], 64)
			sum += v
		}
	}
	return sum
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
