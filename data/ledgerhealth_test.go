package data

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestLedgerWriterFailsClosedWhenTheDatabaseIsFullAndRecovers(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tailgate.db")
	s := openAt(t, path)
	ctx := context.Background()
	rec := &recorder{}
	w := s.NewLedgerWriter(LedgerConfig{BatchSize: 8, FlushInterval: time.Millisecond}, slog.New(rec))
	ran := make(chan error, 1)
	go func() { ran <- w.Run(ctx) }()

	var pages int64
	if err := s.read.QueryRow(`PRAGMA page_count`).Scan(&pages); err != nil {
		t.Fatal(err)
	}
	if err := s.SetMaxPageCount(pages); err != nil {
		t.Fatal(err)
	}
	pad := strings.Repeat("x", 300)
	row := func(i int) LedgerRow {
		r := streamRow(fmt.Sprintf("r-%d", i), 1, OutcomeOK, 1, 1)
		r.Upstream = pad // fills pages fast
		return r
	}
	// Commit until the database is full: the row that does not fit is the
	// first whose Commit fails, and it fails with why. A failed Commit's row
	// is given back to its caller (who records what happened instead), so
	// the rows to find at the end are those committed or given to Add.
	var n int
	given := map[string]bool{}
	for ; ; n++ {
		if n > 10000 {
			t.Fatal("the database never filled up")
		}
		err := w.Commit(ctx, row(n))
		if err == nil {
			if h := w.Healthy(); h != nil {
				t.Fatalf("Healthy = %v after a committed row", h)
			}
			continue
		}
		if !errors.Is(err, ErrLedgerUnavailable) || !strings.Contains(err.Error(), "SQLITE_FULL") {
			t.Fatalf("Commit on a full database: %v; want ErrLedgerUnavailable saying SQLITE_FULL", err)
		}
		given[row(n).ID] = true
		n++
		break
	}
	h := w.Healthy()
	if !errors.Is(h, ErrLedgerUnavailable) || !strings.Contains(h.Error(), "SQLITE_FULL") {
		t.Fatalf("Healthy on a full database = %v; want ErrLedgerUnavailable saying SQLITE_FULL", h)
	}
	// While it is full, Commit says so at once and gives its row back; rows
	// given to Add are kept.
	for range 20 {
		if err := w.Commit(ctx, row(n)); !errors.Is(err, ErrLedgerUnavailable) {
			t.Fatalf("Commit while full = %v, want ErrLedgerUnavailable", err)
		}
		given[row(n).ID] = true
		n++
		w.Add(row(n))
		n++
	}
	for rec.count("ledger write failed, retrying; rows are kept") == 0 {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond) // several more failed attempts

	// Space returns: the writer gets through by itself.
	if err := s.SetMaxPageCount(1 << 30); err != nil {
		t.Fatal(err)
	}
	fctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := w.Flush(fctx); err != nil {
		t.Fatalf("Flush after space returned: %v", err)
	}
	if h := w.Healthy(); h != nil {
		t.Errorf("Healthy after recovery = %v", h)
	}
	if err := w.Commit(ctx, row(n)); err != nil {
		t.Errorf("Commit after recovery: %v", err)
	}
	n++
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-ran; err != nil {
		t.Fatal(err)
	}
	if got := rec.count("ledger write failed, retrying; rows are kept"); got != 1 {
		t.Errorf("failure logged %d times in one streak, want once", got)
	}
	if got := rec.count("ledger still unavailable, retrying; rows are kept"); got != 0 {
		t.Errorf("repeated the failure %d times within %v", got, unavailableLogEvery)
	}
	if got := rec.count("ledger writes recovered"); got != 1 {
		t.Errorf("recovery logged %d times, want once", got)
	}
	stored := countIDs(t, path)
	for id := range given {
		if stored[id] != 0 {
			t.Errorf("row %s stored although its Commit failed (its caller was told it was not)", id)
		}
	}
	kept := n - len(given)
	checkExactlyOnce(t, stored, kept)
	if sp := spendOf(t, s, 1); sp.Tokens != int64(2*kept) {
		t.Errorf("spend %d tokens, want %d: every kept row billed once", sp.Tokens, 2*kept)
	}
}

func TestLedgerWriterBacklogBounds(t *testing.T) {
	forEachEngine(t, func(t *testing.T, e engineCase) {
		s := e.open(t)
		ctx := context.Background()
		// No Run at first: rows pile up exactly as they would behind a stalled
		// disk.
		w := s.NewLedgerWriter(LedgerConfig{MaxBacklog: 10, Buffer: 20}, nil)
		id := 0
		add := func() { w.Add(streamRow(fmt.Sprintf("r-%d", id), 1, OutcomeOK, 1, 0)); id++ }
		for range 10 {
			add()
		}
		if h := w.Healthy(); h != nil {
			t.Fatalf("Healthy at the soft bound = %v", h)
		}
		add()
		if h := w.Healthy(); !errors.Is(h, ErrLedgerUnavailable) || !strings.Contains(h.Error(), "backlog") {
			t.Fatalf("Healthy above the soft bound = %v, want ErrLedgerUnavailable about the backlog", h)
		}
		for w.Backlog() < 20 {
			add()
		}
		// At the hard cap, Add waits for room; Open does not.
		added := make(chan struct{})
		go func() {
			defer close(added)
			add()
		}()
		opened := make(chan struct{})
		go func() {
			defer close(opened)
			w.Open(streamRow("stream", 1, OutcomeOpen, 1, 0))
		}()
		select {
		case <-opened:
		case <-time.After(10 * time.Second):
			t.Fatal("Open blocked at the hard cap")
		}
		select {
		case <-added:
			t.Fatal("Add beyond the hard cap returned before there was room")
		case <-time.After(20 * time.Millisecond):
		}

		ran := make(chan error, 1)
		go func() { ran <- w.Run(ctx) }()
		<-added
		if err := w.Flush(ctx); err != nil {
			t.Fatal(err)
		}
		if h := w.Healthy(); h != nil {
			t.Errorf("Healthy once drained = %v", h)
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		if err := <-ran; err != nil {
			t.Fatal(err)
		}
		rows, err := s.LedgerRows(ctx, UsageFilter{})
		if err != nil {
			t.Fatal(err)
		}
		if len(rows) != id+1 {
			t.Errorf("%d rows stored, want %d: none dropped", len(rows), id+1)
		}
	})
}

func BenchmarkLedgerWriterHealthy(b *testing.B) {
	s := openTestStore(b)
	w := s.NewLedgerWriter(LedgerConfig{}, nil)
	defer w.Close()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if w.Healthy() != nil {
				b.Fatal("unhealthy")
			}
		}
	})
}
