package data

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/data/commitlog"
)

// commitLogChild, when set, makes the test binary the gateway that dies:
// it commits rows through a writer with a commit log and SIGKILLs itself.
const commitLogChild = "TAILGATE_COMMITLOG_CHILD"

func init() {
	path := os.Getenv(commitLogChild)
	if path == "" {
		return
	}
	s, err := Open(path)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	ctx := context.Background()
	tn, err := s.EnsureTenant(ctx, "acme")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	// A batch interval of an hour: nothing reaches SQLite by itself.
	w := s.NewLedgerWriter(LedgerConfig{FlushInterval: time.Hour}, nil)
	if _, err := w.OpenCommitLog(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	go w.Run(ctx)
	for i := range 50 {
		row := LedgerRow{ID: fmt.Sprintf("req_%d", i), Time: time.Now(), TenantID: tn.ID, Model: "m",
			PromptTokens: 10, CompletionTokens: 5, CostMicros: 7, Status: 200, Outcome: OutcomeOK,
			AttemptLog: []Attempt{{N: 1, Replica: "a", Role: "first", Outcome: AttemptWon, PromptTokens: 10, CompletionTokens: 5}}}
		if err := w.Commit(ctx, row); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
	}
	// A record torn by the death: it never returned from Commit.
	torn := commitlog.AppendRecord(nil, []byte(`{"ID":"torn"}`))
	f, err := os.OpenFile(fmt.Sprintf("%s-commits-%d", path, w.clog.Gen()), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	_, _ = f.Write(torn[:len(torn)-3])
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {}
}

// TestCommittedRowsSurviveAKillBeforeTheirTransaction: Commit returns once
// its row is appended to the commit log, before any SQLite transaction
// holds it (the writer of a process that then dies wrote none); the next
// writer on the database writes the logged rows first — once each, the
// tenant's spend counted once, the torn record at the end ignored — and
// removes the log.
func TestCommittedRowsSurviveAKillBeforeTheirTransaction(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tailgate.db")
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), commitLogChild+"="+path)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("child: %v (want killed): %s", err, out)
	}

	s := openAt(t, path)
	ctx := context.Background()
	if rows, err := s.LedgerRows(ctx, UsageFilter{}); err != nil || len(rows) != 0 {
		t.Fatalf("before recovery SQLite holds %d rows (err %v); want 0: Commit returned before any transaction", len(rows), err)
	}
	w := s.NewLedgerWriter(LedgerConfig{}, nil)
	n, err := w.OpenCommitLog(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	if n != 50 {
		t.Errorf("recovered %d rows, want 50", n)
	}
	checkExactlyOnce(t, countIDs(t, path), 50)
	spend, err := s.TenantSpend(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, sp := range spend {
		if sp.Tokens != 50*15 || sp.Micros != 50*7 {
			t.Errorf("tenant spend %+v, want %d tokens and %d micros", sp, 50*15, 50*7)
		}
	}
	rows, err := s.LedgerRows(ctx, UsageFilter{})
	if err != nil {
		t.Fatal(err)
	}
	var log string
	if err := s.read.QueryRowContext(ctx, `SELECT attempt_log FROM ledger WHERE id = 'req_7'`).Scan(&log); err != nil || !strings.Contains(log, `"replica":"a"`) {
		t.Errorf("recovered row's attempt log %q (%v), want the one attempt on a", log, err)
	}
	if left, _ := filepath.Glob(path + "-commits-*"); len(left) != 1 {
		t.Errorf("commit-log files after recovery: %v, want only the new writer's", left)
	}

	// Recovering the same rows again (a crash between their insert and the
	// removal of the file) bills nothing twice, and counts none as
	// recovered: they were in SQLite already.
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	again := s.NewLedgerWriter(LedgerConfig{}, nil)
	writeLog(t, path+"-commits-100", logBytesOf(rows))
	if n, err := again.OpenCommitLog(ctx); err != nil || n != 0 {
		t.Fatalf("second recovery: %d rows recovered (%v), want 0: every row was in SQLite already", n, err)
	}
	defer again.Close()
	if spend, _ := s.TenantSpend(ctx); len(spend) != 1 {
		t.Fatalf("spend %v", spend)
	} else {
		for _, sp := range spend {
			if sp.Tokens != 50*15 {
				t.Errorf("after recovering the rows twice, spend %d tokens, want %d", sp.Tokens, 50*15)
			}
		}
	}
}

// TestCommitLogFilesGoOnceTheirRowsAreInSQLite: the log does not grow with
// the traffic: a file past its size is left for a new one and removed once
// its rows are in SQLite, and a clean Close leaves no file.
func TestCommitLogFilesGoOnceTheirRowsAreInSQLite(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tailgate.db")
	s := openAt(t, path)
	ctx := context.Background()
	tn, err := s.EnsureTenant(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	w := s.NewLedgerWriter(LedgerConfig{FlushInterval: time.Millisecond}, nil)
	if _, err := w.openCommitLog(ctx, commitlog.Config{Rotate: 4 << 10}); err != nil {
		t.Fatal(err)
	}
	ran := make(chan error, 1)
	go func() { ran <- w.Run(ctx) }()
	for i := range 400 {
		row := LedgerRow{ID: fmt.Sprintf("req_%d", i), Time: time.Now(), TenantID: tn.ID, Model: "m", PromptTokens: 1, Status: 200, Outcome: OutcomeOK}
		if err := w.Commit(ctx, row); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	// Many files were started (the rows take ~40 KiB), one is left.
	if files, _ := filepath.Glob(path + "-commits-*"); len(files) != 1 || w.clog.Gen() < 5 {
		t.Errorf("after a flush, commit-log files %v (file %d being appended to), want only that one, the fifth or later", files, w.clog.Gen())
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-ran; err != nil {
		t.Fatal(err)
	}
	if files, _ := filepath.Glob(path + "-commits-*"); len(files) != 0 {
		t.Errorf("after Close, commit-log files %v, want none", files)
	}
	checkExactlyOnce(t, countIDs(t, path), 400)
}

// TestCommitLogHasOneOwner: a second writer on the same SQLite file (a
// second gateway) does not share the log — it is told, and its Commits wait
// for their transactions.
func TestCommitLogHasOneOwner(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tailgate.db")
	ctx := context.Background()
	w1 := openAt(t, path).NewLedgerWriter(LedgerConfig{}, nil)
	if _, err := w1.OpenCommitLog(ctx); err != nil {
		t.Fatal(err)
	}
	defer w1.Close()
	w2 := openAt(t, path).NewLedgerWriter(LedgerConfig{}, nil)
	defer w2.Close()
	if _, err := w2.OpenCommitLog(ctx); !errors.Is(err, ErrCommitLogLocked) {
		t.Fatalf("second OpenCommitLog: %v, want ErrCommitLogLocked", err)
	}
	if w2.clog != nil {
		t.Error("the second writer uses a commit log")
	}
}

// TestLoggedRowsWaitForOtherRows pins LoggedInterval: a Commit's row in the
// commit log (durable already) waits for company instead of a transaction
// of its own each FlushInterval, and any row that may not wait as long
// takes it along within FlushInterval.
func TestLoggedRowsWaitForOtherRows(t *testing.T) {
	s := openTestStore(t)
	ctx := context.Background()
	w := s.NewLedgerWriter(LedgerConfig{FlushInterval: time.Millisecond, LoggedInterval: time.Hour}, nil)
	if _, err := w.OpenCommitLog(ctx); err != nil {
		t.Fatal(err)
	}
	ran := make(chan error, 1)
	go func() { ran <- w.Run(ctx) }()

	if err := w.Commit(ctx, streamRow("a", 1, OutcomeOK, 10, 5)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	if n := w.txs.Load(); n != 0 {
		t.Fatalf("%d transactions with only a logged row queued, want it held (0)", n)
	}
	if u, err := s.Usage(ctx, UsageFilter{}); err != nil || len(u) != 1 || u[0].Requests != 1 {
		t.Errorf("usage with the row only in the commit log: %+v (%v), want its request", u, err)
	}
	w.Add(streamRow("b", 1, OutcomeOK, 10, 5)) // not logged: takes a along
	waitTxs(t, w, 1)
	for _, id := range []string{"a", "b"} {
		if n := countRowsWithID(t, s, id); n != 1 {
			t.Errorf("%s stored %d times after the first transaction, want 1", id, n)
		}
	}
	// A new open row does not wait for it either.
	if err := w.Commit(ctx, streamRow("c", 1, OutcomeOK, 10, 5)); err != nil {
		t.Fatal(err)
	}
	w.Open(streamRow("d", 1, OutcomeOpen, 10, 1))
	waitTxs(t, w, 2)
	if n := countRowsWithID(t, s, "c"); n != 1 {
		t.Errorf("c stored %d times, want 1", n)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-ran; err != nil {
		t.Fatal(err)
	}
	checkSpendMatchesLedger(t, s)
}
