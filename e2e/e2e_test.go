package e2e

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"tailgate/data/pgtest"
	"tailgate/e2e/testkit"
	"tailgate/serving/proc"
)

// binPath is the tailgate binary built once for the end-to-end tests.
var binPath string

// announcePrefix starts the line `tailgate sim --announce` prints on stdout
// once it listens: the prefix, then the address.
const announcePrefix = "TAILGATE_LISTEN "

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
	dir := t.TempDir()
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

func TestUpServesStreamingChatWithDemoKey(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the tailgate binary")
	}
	p := startUp(t, "--replicas", "2", "--sim-ttft", "5ms", "--sim-tpot", "1ms")
	req, _ := http.NewRequest(http.MethodPost, p.api+"/chat/completions", strings.NewReader(
		`{"model":"tailgate-sim","stream":true,"messages":[{"role":"user","content":"Say hello"}]}`))
	req.Header.Set("Authorization", "Bearer "+p.demoKey)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || !strings.Contains(string(body), `"delta":{"content":`) || !strings.HasSuffix(string(body), "data: [DONE]\n\n") {
		t.Fatalf("status %d body:\n%s", resp.StatusCode, body)
	}
	if !strings.Contains(p.stderr.String(), "simulated") {
		t.Fatal("up does not say plainly that it serves simulated output")
	}
}

func TestKeysCLIAgainstRunningGateway(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the tailgate binary")
	}
	p := startUp(t, "--replicas", "1", "--sim-ttft", "1ms", "--sim-tpot", "0s")
	secret := testkit.LastLine(tailgate(t, "keys", "create", "--data", p.dir, "--tenant", "team-a", "--rpm", "600"))
	client := p.client(secret)
	ctx := context.Background()
	params := openai.ChatCompletionNewParams{Model: "tailgate-sim", MaxTokens: openai.Int(3),
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hello")}}
	if _, err := client.Chat.Completions.New(ctx, params); err != nil {
		t.Fatalf("a key created by the CLI while the gateway runs is not accepted at once: %v", err)
	}
	list := tailgate(t, "keys", "list", "--data", p.dir, "--tenant", "team-a")
	if !strings.Contains(list, secret[:11]) || strings.Contains(list, secret) {
		t.Fatalf("keys list shows prefix? secret? :\n%s", list)
	}
	tailgate(t, "keys", "revoke", "--data", p.dir, secret[:11])
	revoked := time.Now()
	for {
		_, err := client.Chat.Completions.New(ctx, params)
		var apiErr *openai.Error
		if err != nil && asAPIError(err, &apiErr) && apiErr.StatusCode == 401 {
			break
		}
		if time.Since(revoked) > time.Second {
			t.Fatalf("revoked key still works %v after `keys revoke` (err %v)", time.Since(revoked), err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func asAPIError(err error, target **openai.Error) bool {
	e, ok := err.(*openai.Error)
	if ok {
		*target = e
	}
	return ok
}

// TestLedgerExactAfterSIGTERMDuringLoad: every request a client saw complete
// is in the ledger with the usage the client saw, none more, after a clean
// stop in the middle of load.
func TestLedgerExactAfterSIGTERMDuringLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the tailgate binary")
	}
	p := startUp(t, "--replicas", "2", "--sim-ttft", "20ms", "--sim-tpot", "2ms")
	client := p.client(p.demoKey)
	var (
		wg                    sync.WaitGroup
		stop                  atomic.Bool
		completed, sumP, sumC atomic.Int64
	)
	for w := range 8 {
		wg.Go(func() {
			for i := 0; !stop.Load() && i < 500; i++ {
				ctx := context.Background()
				content := fmt.Sprintf("worker %d request %d", w, i)
				params := openai.ChatCompletionNewParams{Model: "tailgate-sim", MaxTokens: openai.Int(int64(3 + i%10)),
					Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(content)}}
				var u openai.CompletionUsage
				if i%2 == 0 {
					resp, err := client.Chat.Completions.New(ctx, params)
					if err != nil {
						return // the gateway is gone
					}
					u = resp.Usage
				} else {
					params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
					s := client.Chat.Completions.NewStreaming(ctx, params)
					var acc openai.ChatCompletionAccumulator
					for s.Next() {
						acc.AddChunk(s.Current())
					}
					if s.Err() != nil || acc.Usage.TotalTokens == 0 {
						return
					}
					u = acc.Usage
				}
				completed.Add(1)
				sumP.Add(u.PromptTokens)
				sumC.Add(u.CompletionTokens)
			}
		})
	}
	// Let load build up, then stop the gateway in the middle of it.
	deadline := time.Now().Add(20 * time.Second)
	for completed.Load() < 100 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if err := p.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.Done():
	case <-time.After(40 * time.Second):
		t.Fatal("tailgate up did not stop within 40s of SIGTERM")
	}
	stop.Store(true)
	wg.Wait()
	if err := p.Err(); err != nil {
		t.Fatalf("up exited with %v\n%s", err, p.stderr.String())
	}

	var usage []struct {
		Tenant           string `json:"tenant"`
		Requests         int64  `json:"requests"`
		PromptTokens     int64  `json:"prompt_tokens"`
		CompletionTokens int64  `json:"completion_tokens"`
	}
	if err := json.Unmarshal([]byte(tailgate(t, "usage", "--data", p.dir, "--json")), &usage); err != nil {
		t.Fatal(err)
	}
	var req, pt, ct int64
	for _, u := range usage {
		req += u.Requests
		pt += u.PromptTokens
		ct += u.CompletionTokens
	}
	t.Logf("clients completed %d requests (%d+%d tokens); ledger: %d requests (%d+%d)", completed.Load(), sumP.Load(), sumC.Load(), req, pt, ct)
	if completed.Load() < 100 {
		t.Fatalf("only %d requests completed before the stop", completed.Load())
	}
	if pt != sumP.Load() || ct != sumC.Load() {
		t.Fatalf("ledger tokens %d+%d, clients received %d+%d", pt, ct, sumP.Load(), sumC.Load())
	}
}
