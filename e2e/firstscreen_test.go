package e2e

import (
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/creack/pty"

	"github.com/tailgate-dev/tailgate/e2e/testkit"
)

// readyLine is the line up prints once every replica is ready.
var readyLine = regexp.MustCompile(`ready: 2/2 replicas — API (http://\S+/v1) — dashboard (http://\S+/ui/) — key: (\S+demo\.key)\r?\n`)

// TestUpFirstScreenOnATerminal: `up` on a terminal of 40 rows shows its
// banner, one progress line while the replicas come up, then the ready
// line with the API and dashboard URLs and the key's path — all on the
// first screen, with none of the log's INFO records between them (those
// are in DIR/up.log).
func TestUpFirstScreenOnATerminal(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the tailgate binary")
	}
	dir := t.TempDir()
	cmd := exec.Command(binPath, "up", "--data", dir, "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
		"--replicas", "2", "--sim-ttft", "5ms", "--sim-tpot", "1ms")
	const rows, cols = 40, 120
	term, err := pty.StartWithSize(cmd, &pty.Winsize{Rows: rows, Cols: cols})
	if err != nil {
		t.Fatal(err)
	}
	var out testkit.Buffer
	copied := make(chan struct{})
	go func() { _, _ = io.Copy(&out, term); close(copied) }()
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // the session pty.Start made: up and its workers
		_ = cmd.Wait()
		term.Close()
		<-copied
		if t.Failed() {
			t.Logf("the terminal got:\n%q", out.String())
		}
	})
	testkit.WaitWithin(t, 90*time.Second, "the ready line", func() bool { return readyLine.MatchString(out.String()) })
	raw := out.String()
	m := readyLine.FindStringSubmatch(raw)
	raw = raw[:strings.Index(raw, m[0])+len(m[0])] // the first screen: up to the ready line

	screen := render(raw, cols)
	if len(screen) > rows {
		t.Errorf("banner to ready line takes %d rows of a %d-row terminal", len(screen), rows)
	}
	text := strings.Join(screen, "\n")
	for _, want := range []string{"SIMULATED", "API        " + m[1], m[2], m[3], "log        " + filepath.Join(dir, "up.log")} {
		if !strings.Contains(text, want) {
			t.Errorf("the first screen does not show %q", want)
		}
	}
	if !strings.Contains(raw, "starting replicas: ") {
		t.Error("no progress line while the replicas came up")
	}
	if strings.Contains(text, "starting replicas: ") {
		t.Error("the progress line stayed on the screen after the ready line replaced it")
	}
	if strings.Contains(text, "level=INFO") {
		t.Error("INFO log records on the terminal without --verbose")
	}
	log, err := os.ReadFile(filepath.Join(dir, "up.log"))
	if err != nil || !strings.Contains(string(log), `msg="replica state"`) || !strings.Contains(string(log), `msg="simulated engine serving`) {
		t.Errorf("DIR/up.log does not hold the whole log (%v):\n%s", err, log)
	}
	if t.Failed() {
		t.Logf("the first screen (%d rows):\n%s", len(screen), text)
	}
}

// render is what a terminal of cols columns shows after out: the rows,
// with carriage returns, erased lines and wrapped long lines as a terminal
// has them.
func render(out string, cols int) []string {
	var rows []string
	var line []rune
	col := 0
	flush := func() {
		for len(line) > cols {
			rows = append(rows, string(line[:cols]))
			line = line[cols:]
		}
		rows = append(rows, string(line))
		line, col = nil, 0
	}
	for i := 0; i < len(out); {
		switch {
		case strings.HasPrefix(out[i:], "\x1b[K"):
			line = line[:min(col, len(line))]
			i += 3
			continue
		case out[i] == '\r':
			col = 0
		case out[i] == '\n':
			flush()
		default:
			r := []rune(out[i:])[0]
			if col < len(line) {
				line[col] = r
			} else {
				line = append(line, r)
			}
			col++
			i += len(string(r))
			continue
		}
		i++
	}
	if len(line) > 0 {
		flush()
	}
	return rows
}

// TestPipedUpKeepsItsStructuredLog: with stderr a pipe (systemd, a
// container, `| tee`), up's stderr stays the structured log — no progress
// line, no terminal control codes, the readiness records — its stdout ends
// with the ready line, and each replica's move to ready is logged once.
func TestPipedUpKeepsItsStructuredLog(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the tailgate binary")
	}
	dir := t.TempDir()
	p := startProc(t, "tailgate up", true, "up", "--data", dir, "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
		"--replicas", "2", "--sim-ttft", "5ms", "--sim-tpot", "1ms")
	bound := time.AfterFunc(90*time.Second, func() { _ = p.Stop(0) })
	defer bound.Stop()
	var ready string
	p.scanUntil(func(line string) bool {
		if strings.HasPrefix(line, "ready: ") {
			ready = line + "\n"
		}
		return ready != ""
	})
	if !readyLine.MatchString(ready) {
		t.Fatalf("stdout has no ready line; stderr:\n%s", p.stderr.String())
	}
	if err := p.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.Done():
	case <-time.After(40 * time.Second):
		t.Fatal("up did not stop within 40s of SIGTERM")
	}
	log := p.stderr.String()
	if strings.ContainsAny(log, "\r\x1b") || strings.Contains(log, "starting replicas:") {
		t.Error("the piped log has a progress line or terminal control codes")
	}
	if !strings.Contains(log, `msg="replicas ready" ready=2 of=2`) {
		t.Error("the piped log lacks the readiness record")
	}
	if _, err := os.Stat(filepath.Join(dir, "up.log")); err == nil {
		t.Error("a piped up wrote up.log: its log is stderr")
	}
	toReady := 0
	for _, line := range strings.Split(strings.TrimRight(log, "\n"), "\n") {
		if what := checkTextLine(line); what != "" {
			t.Errorf("%s:\n  %s", what, line)
		}
		if strings.Contains(line, `msg="replica state"`) && strings.Contains(line, "replica=worker-1") &&
			(strings.Contains(line, "to=ready") || strings.Contains(line, "state=ready")) {
			toReady++
		}
	}
	if toReady != 1 {
		t.Errorf("worker-1's move to ready is logged %d times, want once", toReady)
	}
	if t.Failed() {
		t.Logf("up's stderr:\n%s", log)
	}
}
