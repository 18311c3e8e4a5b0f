package e2e

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/e2e/testkit"
	"github.com/tailgate-dev/tailgate/serving/proc"
)

// startIn starts argv (looked up in PATH when it has no slash, as a shell
// would) with dir as its working directory and env added to the
// environment; its stdout and stderr are gathered in one buffer. The
// process group gets SIGTERM when the test ends (up stops its workers),
// SIGKILL 10 s later.
func startIn(t *testing.T, dir string, env []string, argv ...string) (*proc.Process, *testkit.Buffer) {
	t.Helper()
	out := &testkit.Buffer{}
	p, err := proc.Start(proc.Config{
		Argv:   append([]string{"bash", "-c", `cd "$0" && exec "$@"`, dir}, argv...),
		Env:    env,
		Stdout: proc.LineWriter(out, ""), Stderr: proc.LineWriter(out, ""),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = p.Stop(10 * time.Second)
		if t.Failed() {
			t.Logf("%s output:\n%s", strings.Join(argv, " "), out.String())
		}
	})
	return p, out
}

// waitOutput polls out until match finds what it wants, for at most limit.
func waitOutput(t *testing.T, out *testkit.Buffer, limit time.Duration, what string, match func(string) bool) {
	t.Helper()
	for deadline := time.Now().Add(limit); !match(out.String()); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no %s after %v", what, limit)
		}
	}
}

// TestReleaseArchiveServesAStreamedAnswer builds the host's release archive
// with scripts/release.sh as a release is built, unpacks it in an empty
// directory, and uses it as a new user would: `./tailgate version` prints
// the stamped version, `./tailgate up` serves a streamed chat answer to
// the demo key. The times are logged (go test -v), never asserted.
func TestReleaseArchiveServesAStreamedAnswer(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a release archive and starts it")
	}
	const version = "v0.0.0-releasetest"
	out := t.TempDir()
	platform := runtime.GOOS + "/" + runtime.GOARCH
	build := exec.Command("../scripts/release.sh", "--only", platform, "--out", out)
	build.Env = append(os.Environ(), "VERSION="+version)
	var progress strings.Builder
	build.Stderr = &progress
	start := time.Now()
	stdout, err := build.Output()
	if err != nil {
		t.Fatalf("scripts/release.sh: %v\n%s", err, progress.String())
	}
	t.Logf("release archive built in %v", time.Since(start).Round(time.Millisecond))
	// Minutes of building are not silent: stderr says what builds and how
	// long it took; stdout is the version alone, for scripts.
	if got := strings.TrimSpace(string(stdout)); got != version {
		t.Errorf("stdout %q, want the version alone", got)
	}
	for _, want := range []string{"[1/1] " + platform + ": go build", "[1/1] " + platform + ": built ", "done: checksums"} {
		if !strings.Contains(progress.String(), want) {
			t.Errorf("progress on stderr lacks %q:\n%s", want, progress.String())
		}
	}

	name := fmt.Sprintf("tailgate_%s_%s_%s.tar.gz", version, runtime.GOOS, runtime.GOARCH)
	archive, err := os.ReadFile(filepath.Join(out, name))
	if err != nil {
		t.Fatal(err)
	}
	sums, err := os.ReadFile(filepath.Join(out, "tailgate_"+version+"_checksums.txt"))
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(archive)
	if want := hex.EncodeToString(sum[:]) + "  " + name + "\n"; string(sums) != want {
		t.Errorf("checksums file:\n%s\nwant\n%s", sums, want)
	}

	dir := t.TempDir()
	if msg, err := exec.Command("tar", "-xzf", filepath.Join(out, name), "-C", dir).CombinedOutput(); err != nil {
		t.Fatalf("tar: %v\n%s", err, msg)
	}
	for _, f := range []string{"tailgate", "README.md", "docs/commands.md"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Errorf("the archive lacks %s: %v", f, err)
		}
	}
	ver := exec.Command("./tailgate", "version")
	ver.Dir = dir
	got, err := ver.Output()
	if err != nil {
		t.Fatalf("./tailgate version: %v", err)
	}
	if first := strings.SplitN(string(got), "\n", 2)[0]; first != "tailgate "+version {
		t.Errorf("./tailgate version says %q, want %q", first, "tailgate "+version)
	}

	start = time.Now()
	_, log := startIn(t, dir, nil, "./tailgate", "up", "--data", "data", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0")
	var api string
	waitOutput(t, log, 60*time.Second, "API line from up", func(s string) bool {
		if m := apiLine.FindStringSubmatch(s); m != nil {
			api = m[1]
		}
		return api != ""
	})
	key := readToken(t, filepath.Join(dir, "data", "demo.key"))
	var body string
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		req, _ := http.NewRequest(http.MethodPost, api+"/chat/completions", strings.NewReader(
			`{"model":"tailgate-sim","stream":true,"messages":[{"role":"user","content":"Say hello"}]}`))
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if body = string(b); resp.StatusCode == 200 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no streamed answer within 60s; last: %v %s", err, body)
		}
	}
	if !strings.Contains(body, `"delta":{"content":`) || !strings.HasSuffix(body, "data: [DONE]\n\n") {
		t.Fatalf("not a streamed answer:\n%s", body)
	}
	t.Logf("from ./tailgate up to a streamed answer: %v", time.Since(start).Round(time.Millisecond))
}

// freePort returns a loopback port nobody listens on now.
func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	return port
}

// TestREADMEFiveMinuteWalk runs the README's five-minute walk as written:
// each shell block of the section in order, in an empty directory with the
// built binary first on PATH — `tailgate up` and `tailgate worker` in the
// background (the walk's other terminals), the rest to completion — and
// checks what each step promises. The one change: the walk's ports
// (127.0.0.1:8080, :8081 and :9000) become free ports, and `tailgate up`
// is given them as --listen and --admin-listen, so the test can run beside
// anything else. The block for a real GPU box (--engine vllm) is not run;
// TestDocumentedCommandLinesAreTrue checks its flags.
func TestREADMEFiveMinuteWalk(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the tailgate binary")
	}
	raw, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(raw)
	start := strings.Index(readme, "\n## Five minutes with tailgate")
	end := strings.Index(readme[start+1:], "\n## ")
	if start < 0 || end < 0 {
		t.Fatal("the README has no five-minute walk")
	}
	var blocks []string
	for _, m := range walkFence.FindAllStringSubmatch(readme[start:start+1+end], -1) {
		if m[1] == "sh" && !strings.Contains(m[2], "--engine vllm") {
			blocks = append(blocks, m[2])
		}
	}
	if len(blocks) != 7 {
		t.Fatalf("the walk has %d shell blocks to run; this test knows 7 (up, a chat, a key, an invite, a worker, replicas, usage)", len(blocks))
	}
	api, admin, worker := freePort(t), freePort(t), freePort(t)
	ports := strings.NewReplacer("127.0.0.1:8080", "127.0.0.1:"+api, "127.0.0.1:8081", "127.0.0.1:"+admin, "127.0.0.1:9000", "127.0.0.1:"+worker)
	dir := t.TempDir()
	env := []string{"PATH=" + filepath.Dir(binPath) + string(os.PathListSeparator) + os.Getenv("PATH")}
	sh := func(block string) string {
		t.Helper()
		cmd := exec.Command("bash", "-e", "-o", "pipefail", "-c", block)
		cmd.Dir, cmd.Env = dir, append(os.Environ(), env...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s\n%v\n%s", block, err, out)
		}
		return string(out)
	}
	healthy := func() bool {
		resp, err := http.Get("http://127.0.0.1:" + api + "/healthz")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil && resp.StatusCode == 200
	}

	for i, block := range blocks {
		block = ports.Replace(block)
		switch {
		case strings.HasPrefix(block, "tailgate up"):
			line := strings.TrimSpace(block) + " --listen 127.0.0.1:" + api + " --admin-listen 127.0.0.1:" + admin
			startIn(t, dir, env, "bash", "-c", "exec "+line)
			for deadline := time.Now().Add(90 * time.Second); !healthy(); time.Sleep(100 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("%s: no ready replica within 90s", line)
				}
			}
		case strings.HasPrefix(block, "tailgate worker "): // not `tailgate workers invite`, which runs to completion
			startIn(t, dir, env, "bash", "-c", "exec "+strings.TrimSpace(block))
		case strings.Contains(block, "/admin/v1/replicas"):
			var list struct {
				Data []struct{ ID, State string }
			}
			for deadline := time.Now().Add(90 * time.Second); ; time.Sleep(250 * time.Millisecond) {
				out := sh(block)
				if err := json.Unmarshal([]byte(out), &list); err != nil {
					t.Fatalf("step %d: %v\n%s", i, err, out)
				}
				if slices.ContainsFunc(list.Data, func(r struct{ ID, State string }) bool { return r.ID == "gpu-a" && r.State == "ready" }) {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("the worker gpu-a is not ready within 90s:\n%s", out)
				}
			}
		default:
			out := sh(block)
			var want []string
			switch {
			case strings.Contains(block, "curl -N"):
				want = []string{`"delta":{"content":`, "data: [DONE]"}
			case strings.Contains(block, "keys create"):
				want = []string{`"choices"`, `"content"`}
			case strings.Contains(block, "tailgate usage"):
				want = []string{"teammate", "demo"}
			case strings.Contains(block, "workers invite"):
				if tok := readToken(t, filepath.Join(dir, "gpu-a.join")); !strings.HasPrefix(tok, "tgj_") {
					t.Fatalf("the invite wrote %q", tok)
				}
			default:
				t.Fatalf("this test does not know the walk's step %d:\n%s", i, block)
			}
			for _, w := range want {
				if !strings.Contains(out, w) {
					t.Errorf("step %d:\n%s\nsaid:\n%s\nwant %s in it", i, block, out, w)
				}
			}
		}
	}
}

// walkFence is a fenced code block of the README (its language, its text).
var walkFence = regexp.MustCompile("(?ms)^```([a-z]*)\n(.*?)^```")
