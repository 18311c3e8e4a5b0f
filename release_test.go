package main

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"tailgate/serving/proc"
)

// startIn starts argv (looked up in PATH when it has no slash, as a shell
// would) with dir as its working directory and env added to the
// environment; its stdout and stderr are gathered in one buffer. The
// process group gets SIGTERM when the test ends (up stops its workers),
// SIGKILL 10 s later.
func startIn(t *testing.T, dir string, env []string, argv ...string) (*proc.Process, *syncBuffer) {
	t.Helper()
	out := &syncBuffer{}
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
func waitOutput(t *testing.T, out *syncBuffer, limit time.Duration, what string, match func(string) bool) {
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
	build := exec.Command("scripts/release.sh", "--only", platform, "--out", out)
	build.Env = append(os.Environ(), "VERSION="+version)
	start := time.Now()
	if msg, err := build.CombinedOutput(); err != nil {
		t.Fatalf("scripts/release.sh: %v\n%s", err, msg)
	}
	t.Logf("release archive built in %v", time.Since(start).Round(time.Millisecond))

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
