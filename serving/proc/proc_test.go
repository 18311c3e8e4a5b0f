package proc

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// lines collects what a sink received.
type lines struct {
	mu  sync.Mutex
	got []string
	ch  chan string // every line, for waiting on one
}

func newLines() *lines { return &lines{ch: make(chan string, 100)} }

func (l *lines) sink(line string) {
	l.mu.Lock()
	l.got = append(l.got, line)
	l.mu.Unlock()
	l.ch <- line
}

func (l *lines) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.got)
}

// next returns the next line within 10s.
func (l *lines) next(t *testing.T) string {
	t.Helper()
	select {
	case line := <-l.ch:
		return line
	case <-time.After(10 * time.Second):
		t.Fatal("no output line within 10s")
		return ""
	}
}

// sh starts a shell script; the group is killed when the test ends.
func sh(t *testing.T, script string, out, errs *lines, grace time.Duration) *Process {
	t.Helper()
	cfg := Config{Argv: []string{"sh", "-c", script}, OutputGrace: grace}
	if out != nil {
		cfg.Stdout = out.sink
	}
	if errs != nil {
		cfg.Stderr = errs.sink
	}
	p, err := Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Stop(0) })
	return p
}

// waitReturns runs f and fails the test if it takes more than 10s.
func waitReturns(t *testing.T, what string, f func() error) error {
	t.Helper()
	res := make(chan error, 1)
	go func() { res <- f() }()
	select {
	case err := <-res:
		return err
	case <-time.After(10 * time.Second):
		t.Fatalf("%s did not return within 10s", what)
		return nil
	}
}

// gone reports whether pid no longer runs: no such process, or a zombie
// nobody reaped yet (PID 1 in some containers never does).
func gone(pid int) bool {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	s := string(raw)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && strings.HasPrefix(s[i+1:], " Z")
}

func waitGone(t *testing.T, what string, pid int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !gone(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("%s (pid %d) still runs", what, pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestOutputIsForwardedLineByLine(t *testing.T) {
	t.Parallel()
	out, errs := newLines(), newLines()
	p := sh(t, `printf 'one\n\n  \ntwo\r\nprogress 1\rprogress 2\rdone'; echo oops >&2; exit 3`, out, errs, 0)
	if err := waitReturns(t, "Wait", p.Wait); err == nil || err.Error() != "exit status 3" {
		t.Fatalf("Wait = %v, want exit status 3", err)
	}
	want := []string{"one", "two", "progress 1", "progress 2", "done"}
	if got := out.all(); !slices.Equal(got, want) {
		t.Errorf("stdout lines %q, want %q", got, want)
	}
	if got := errs.all(); !slices.Equal(got, []string{"oops"}) {
		t.Errorf("stderr lines %q, want [oops]", got)
	}
}

func TestLongLinesAreSplitAtMaxLine(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("x", MaxLine+10)
	out := newLines()
	p, err := Start(Config{Argv: []string{"sh", "-c", `printf %s "$LONG"`}, Env: []string{"LONG=" + long}, Stdout: out.sink})
	if err != nil {
		t.Fatal(err)
	}
	if err := waitReturns(t, "Wait", p.Wait); err != nil {
		t.Fatalf("Wait = %v", err)
	}
	var lens []int
	for _, line := range out.all() {
		lens = append(lens, len(line))
	}
	if !slices.Equal(lens, []int{MaxLine, 10}) {
		t.Errorf("a line of %d bytes came as lines of %v bytes, want [%d 10]", len(long), lens, MaxLine)
	}
}

func TestDoneAndErrReportTheExit(t *testing.T) {
	t.Parallel()
	tests := []struct {
		script string
		want   string
	}{
		{"exit 0", ""},
		{"exit 7", "exit status 7"},
		{"kill -KILL $$", "signal: killed"},
	}
	for _, tt := range tests {
		t.Run(tt.script, func(t *testing.T) {
			t.Parallel()
			p := sh(t, tt.script, nil, nil, 0)
			select {
			case <-p.Done():
			case <-time.After(10 * time.Second):
				t.Fatal("Done not closed within 10s")
			}
			got := ""
			if err := p.Err(); err != nil {
				got = err.Error()
			}
			if got != tt.want {
				t.Fatalf("Err = %q, want %q", got, tt.want)
			}
			if err := p.Signal(syscall.SIGTERM); !errors.Is(err, os.ErrProcessDone) {
				t.Errorf("Signal after exit = %v, want os.ErrProcessDone", err)
			}
		})
	}
}

func TestErrIsNilWhileRunning(t *testing.T) {
	t.Parallel()
	p := sh(t, "sleep 300", nil, nil, 0)
	if err := p.Err(); err != nil {
		t.Fatalf("Err = %v while the process runs", err)
	}
	select {
	case <-p.Done():
		t.Fatal("Done closed while the process runs")
	default:
	}
}

func TestEnvIsAddedToOurs(t *testing.T) {
	t.Setenv("PROC_TEST_INHERITED", "kept")
	out := newLines()
	p, err := Start(Config{Argv: []string{"sh", "-c", `echo "$PROC_TEST_INHERITED $PROC_TEST_ADDED"`},
		Env: []string{"PROC_TEST_ADDED=no", "PROC_TEST_ADDED=yes"}, Stdout: out.sink})
	if err != nil {
		t.Fatal(err)
	}
	if err := waitReturns(t, "Wait", p.Wait); err != nil {
		t.Fatal(err)
	}
	if got := out.all(); !slices.Equal(got, []string{"kept yes"}) {
		t.Fatalf("child saw %q, want [kept yes]", got)
	}
}

func TestStartRejectsWhatCannotRun(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		cfg  Config
		want string
	}{
		{"no argv", Config{}, "proc: Argv is required"},
		{"negative grace", Config{Argv: []string{"true"}, OutputGrace: -1}, "must not be negative"},
		{"missing executable", Config{Argv: []string{"/nonexistent/engine"}}, "fork/exec /nonexistent/engine: no such file or directory"},
		{"not on PATH", Config{Argv: []string{"tailgate-no-such-command"}}, `"tailgate-no-such-command": executable file not found`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := Start(tt.cfg); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Start = %v, want an error containing %q", err, tt.want)
			}
		})
	}
}

// A grandchild that inherited the output pipes keeps them open after the
// leader exited: Wait must still return, and Stop must kill it.
func TestWaitDoesNotHangOnAGrandchildHoldingTheOutput(t *testing.T) {
	t.Parallel()
	out := newLines()
	p := sh(t, `sleep 300 & echo $!; exit 4`, out, nil, 100*time.Millisecond)
	grandchild, err := strconv.Atoi(out.next(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := waitReturns(t, "Wait", p.Wait); err == nil || err.Error() != "exit status 4" {
		t.Fatalf("Wait = %v, want exit status 4", err)
	}
	if gone(grandchild) {
		t.Fatal("the grandchild died with the leader; the test shows nothing")
	}
	if err := waitReturns(t, "Stop", func() error { return p.Stop(time.Minute) }); err == nil || err.Error() != "exit status 4" {
		t.Fatalf("Stop = %v, want the leader's exit status 4", err)
	}
	waitGone(t, "grandchild in the group", grandchild)
}

func TestStopEndsTheGroupWithSIGTERM(t *testing.T) {
	t.Parallel()
	out := newLines()
	// The shell records the SIGTERM; its child must get one too.
	p := sh(t, `trap 'echo term; exit 0' TERM; sleep 300 & echo $!; wait`, out, nil, 0)
	grandchild, err := strconv.Atoi(out.next(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := waitReturns(t, "Stop", func() error { return p.Stop(time.Minute) }); err != nil {
		t.Fatalf("Stop = %v, want the clean exit of a shell that handled SIGTERM", err)
	}
	if got := out.all(); !slices.Equal(got[1:], []string{"term"}) {
		t.Errorf("output after start %q, want [term]", got[1:])
	}
	waitGone(t, "child in the group", grandchild)
}

func TestStopKillsWhatIgnoresSIGTERMAfterGrace(t *testing.T) {
	t.Parallel()
	out := newLines()
	p := sh(t, `trap '' TERM; echo ready; while :; do sleep 0.05; done`, out, nil, 0)
	if line := out.next(t); line != "ready" {
		t.Fatalf("first line %q", line)
	}
	const grace = 300 * time.Millisecond
	began := time.Now()
	err := waitReturns(t, "Stop", func() error { return p.Stop(grace) })
	if took := time.Since(began); took < grace {
		t.Errorf("Stop returned after %s, before the grace of %s", took, grace)
	}
	if err == nil || err.Error() != "signal: killed" {
		t.Fatalf("Stop = %v, want signal: killed", err)
	}
}

func TestStopTwiceAndConcurrentlyGivesOneResult(t *testing.T) {
	t.Parallel()
	p := sh(t, "sleep 300", nil, nil, 0)
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Go(func() { errs[i] = p.Stop(0) })
	}
	wg.Wait()
	errs = append(errs, p.Stop(time.Minute))
	for i, err := range errs {
		if err == nil || err.Error() != "signal: killed" {
			t.Errorf("Stop call %d = %v, want signal: killed", i+1, err)
		}
	}
}

func TestSignalReachesTheLeaderOnly(t *testing.T) {
	t.Parallel()
	out := newLines()
	p := sh(t, `sleep 300 & echo $!; wait`, out, nil, 0)
	grandchild, err := strconv.Atoi(out.next(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-p.Done()
	if gone(grandchild) {
		t.Fatal("Signal reached the leader's child too")
	}
	_ = p.Stop(0)
	waitGone(t, "child in the group after Stop", grandchild)
}

func TestLineWriterWritesWholePrefixedLines(t *testing.T) {
	t.Parallel()
	var b strings.Builder
	sink := LineWriter(&b, "[w1] ")
	var wg sync.WaitGroup
	for i := range 50 {
		wg.Go(func() { sink(fmt.Sprintf("line %d", i)) })
	}
	wg.Wait()
	got := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
	if len(got) != 50 {
		t.Fatalf("%d lines, want 50", len(got))
	}
	for _, line := range got {
		if !strings.HasPrefix(line, "[w1] line ") {
			t.Fatalf("line %q", line)
		}
	}
}
