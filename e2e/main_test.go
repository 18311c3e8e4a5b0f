package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/tailgate-dev/tailgate/data/pgtest"
	"github.com/tailgate-dev/tailgate/e2e/testkit"
	"github.com/tailgate-dev/tailgate/serving/proc"
)

// The harness: TestMain builds the binary once; startProc runs it as a child
// process (its process group killed at the test's end, its stderr logged if
// the test failed); startUp, startGateway (with startWorker and startFleet)
// and startSim start the roles on loopback port 0 and wait until they are
// ready; tailgate, runToExit and runUntil run a command to its end.

// binPath is the tailgate binary built once for the end-to-end tests.
var binPath string

// announcePrefix starts the line `tailgate sim --announce` prints on stdout
// once it listens: the prefix, then the address.
const announcePrefix = "TAILGATE_LISTEN "

// startSim starts `tailgate sim` on a loopback port with the extra flags
// (sim knobs) and returns its host:port once it listens.
func startSim(t *testing.T, extra ...string) string {
	t.Helper()
	sim := startProc(t, "sim", true, append([]string{"sim", "--listen", "127.0.0.1:0", "--announce"}, extra...)...)
	var addr string
	sim.scanUntil(func(line string) bool {
		addr, _ = strings.CutPrefix(line, announcePrefix)
		return addr != ""
	})
	if addr == "" {
		t.Fatalf("the sim did not say where it listens; stderr:\n%s", sim.stderr.String())
	}
	return addr
}

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() { // the tests that start the binary skip themselves
		os.Exit(m.Run())
	}
	dir, err := os.MkdirTemp("", "tailgate-e2e")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binPath = filepath.Join(dir, "tailgate")
	build := exec.Command("go", "build", "-o", binPath, "..")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build tailgate:", err)
		os.Exit(1)
	}
	code := m.Run()
	pgtest.Stop()
	os.RemoveAll(dir)
	os.Exit(code)
}

// process is a running tailgate child process, the leader of its own
// process group: the group is killed when the test ends, and its stderr
// logged if the test failed.
type process struct {
	*proc.Process
	stderr  *testkit.Buffer
	stdout  chan string   // stdout lines for scanUntil; nil unless asked for
	scanned chan struct{} // closed once scanUntil no longer reads stdout
}

// startProc starts the binary with args; name labels its stderr in a failed
// test's log.
func startProc(t *testing.T, name string, withStdout bool, args ...string) *process {
	t.Helper()
	if binPath == "" {
		t.Fatal("the binary is not built with -short: skip this test when testing.Short()")
	}
	p := &process{stderr: &testkit.Buffer{}}
	cfg := proc.Config{Argv: append([]string{binPath}, args...), Stderr: proc.LineWriter(p.stderr, "")}
	if withStdout {
		p.stdout, p.scanned = make(chan string, 64), make(chan struct{})
		cfg.Stdout = func(line string) {
			select {
			case p.stdout <- line:
			case <-p.scanned: // the rest is not read
			}
		}
	}
	var err error
	if p.Process, err = proc.Start(cfg); err != nil {
		t.Fatal(err)
	}
	if withStdout {
		go func() {
			_ = p.Wait() // no line is forwarded after it returns
			close(p.stdout)
		}()
	}
	t.Cleanup(func() {
		_ = p.Stop(0)
		if t.Failed() {
			t.Logf("%s stderr:\n%s", name, p.stderr.String())
		}
	})
	return p
}

// scanUntil reads stdout lines until done says it has what it needs or
// stdout ends; later lines are dropped so the process never blocks on them.
func (p *process) scanUntil(done func(line string) bool) {
	defer close(p.scanned)
	for line := range p.stdout {
		if done(line) {
			return
		}
	}
}

// readToken reads a token or key file.
func readToken(t *testing.T, path string) string {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(raw))
}

// tailgate runs a CLI command of the binary and returns its stdout.
func tailgate(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command(binPath, args...).Output()
	if err != nil {
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("tailgate %v: %v\n%s", args, err, stderr)
	}
	return string(out)
}

// upProcess is a running `tailgate up`.
type upProcess struct {
	*process
	dir     string
	api     string // http://host:port/v1
	admin   string // http://host:port
	demoKey string
	uiToken string // the #token= of the dashboard link printed
}

var apiLine = regexp.MustCompile(`API\s+(http://\S+/v1)`)

var dashLine = regexp.MustCompile(`dashboard\s+(http://\S+)/ui/(?:#token=(\S+))?`)

func startUp(t *testing.T, extra ...string) *upProcess {
	t.Helper()
	return startUpIn(t, t.TempDir(), extra...)
}

// startUpIn starts `tailgate up` on data directory dir, which may be
// prepared already (tailgate init, keys).
func startUpIn(t *testing.T, dir string, extra ...string) *upProcess {
	t.Helper()
	p := &upProcess{dir: dir, process: startProc(t, "tailgate up", true,
		append([]string{"up", "--data", dir, "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"}, extra...)...)}
	p.scanUntil(func(line string) bool {
		if m := apiLine.FindStringSubmatch(line); m != nil {
			p.api = m[1]
		}
		if m := dashLine.FindStringSubmatch(line); m != nil {
			p.admin, p.uiToken = m[1], m[2]
		}
		return p.api != "" && p.admin != ""
	})
	if p.api == "" {
		t.Fatalf("up printed no API address; stderr:\n%s", p.stderr.String())
	}
	p.demoKey = readToken(t, filepath.Join(p.dir, "demo.key"))
	for _, f := range []string{"admin.token", "cluster.token", "demo.key"} {
		st, err := os.Stat(filepath.Join(p.dir, f))
		if err != nil || st.Mode().Perm() != 0o600 {
			t.Fatalf("%s: %v mode %v, want 0600", f, err, st.Mode().Perm())
		}
	}
	// Wait until a replica is ready.
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(strings.TrimSuffix(p.api, "/v1") + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no ready replica after 30s; stderr:\n%s", p.stderr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	return p
}

func (p *upProcess) client(key string) openai.Client {
	return openai.NewClient(option.WithBaseURL(p.api), option.WithAPIKey(key), option.WithMaxRetries(0))
}

// runToExit runs the binary with args until it exits, at most within, and
// returns its exit status and stderr.
func runToExit(t *testing.T, within time.Duration, args ...string) (int, string) {
	t.Helper()
	code, stderr, ran := runUntil(t, within, args...)
	if !ran {
		t.Fatalf("still running after %v; stderr:\n%s", within, stderr)
	}
	return code, stderr
}

// runUntil is runToExit that reports a run still going after within
// (false) instead of failing.
func runUntil(t *testing.T, within time.Duration, args ...string) (int, string, bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), within)
	defer cancel()
	cmd := exec.CommandContext(ctx, binPath, args...)
	cmd.WaitDelay = 5 * time.Second
	var stderr testkit.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	if ctx.Err() != nil {
		return 0, stderr.String(), false
	}
	if ee, ok := errors.AsType[*exec.ExitError](err); ok {
		return ee.ExitCode(), stderr.String(), true
	}
	if err != nil {
		t.Fatal(err)
	}
	return 0, stderr.String(), true
}

// holdPort listens on a loopback port for the test's duration and returns
// its address.
func holdPort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln.Addr().String()
}

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

// startWorker approves replica id for the worker it starts (`tailgate
// workers approve --code`, the code of the key in the worker's --data,
// DIR/ID) and starts `tailgate worker --engine sim` registering with g
// under it.
func (g *gatewayProcess) startWorker(id string, extra ...string) *process {
	g.t.Helper()
	g.approve(id, filepath.Join(g.dir, id))
	return g.startUnapprovedWorker(id, extra...)
}

// approve approves replica id for the worker whose --data is workerDir.
func (g *gatewayProcess) approve(id, workerDir string) string {
	g.t.Helper()
	code := testkit.LastLine(tailgate(g.t, "workers", "code", "--worker-data", workerDir))
	return tailgate(g.t, "workers", "approve", "--data", g.dir, id, "--code", code)
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

func (g *gatewayProcess) replicas() []replicaView { return replicasAs[replicaView](g) }

// replicasAs reads the gateway's GET /admin/v1/replicas into T, the fields a
// test looks at.
func replicasAs[T any](g *gatewayProcess) []T {
	g.t.Helper()
	req, _ := http.NewRequest(http.MethodGet, g.admin+"/admin/v1/replicas", nil)
	req.Header.Set("Authorization", "Bearer "+g.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		g.t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Data []T `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		g.t.Fatal(err)
	}
	return out.Data
}

func (g *gatewayProcess) replica(id string) replicaView {
	for _, r := range g.replicas() {
		if r.ID == id {
			return r
		}
	}
	return replicaView{ID: id, State: "gone"}
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

// chatDistinct is chat with a prompt of its own (conversation i): the
// gateway's default affinity keeps requests of one prompt prefix on one
// replica while load allows, so a test that wants requests spread over
// replicas sends different prompts, as different users would.
func (g *gatewayProcess) chatDistinct(ctx context.Context, stream bool, maxTokens, i int) (int, http.Header, string, error) {
	return g.chatBody(ctx, fmt.Sprintf(`{"model":"tailgate-sim","stream":%v,"max_tokens":%d,"messages":[{"role":"user","content":"hello there, this is conversation %d"}]}`, stream, maxTokens, i))
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

// served returns how many requests l saw answered by replica id.
func (l *clientLoad) served(id string) int64 {
	if v, ok := l.byReplica.Load(id); ok {
		return v.(*atomic.Int64).Load()
	}
	return 0
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

// usageTotals is what `tailgate usage --data DIR --json` counts over every
// tenant, key and model: requests, prompt and completion tokens.
func usageTotals(t *testing.T, dir string) (requests, prompt, completion int64) {
	t.Helper()
	var rows []struct {
		Requests         int64 `json:"requests"`
		PromptTokens     int64 `json:"prompt_tokens"`
		CompletionTokens int64 `json:"completion_tokens"`
	}
	if err := json.Unmarshal([]byte(tailgate(t, "usage", "--data", dir, "--json")), &rows); err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		requests, prompt, completion = requests+r.Requests, prompt+r.PromptTokens, completion+r.CompletionTokens
	}
	return requests, prompt, completion
}
