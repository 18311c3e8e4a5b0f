package data

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestBackupIsConsistentUnderConcurrentWrites(t *testing.T) {
	s := openTestStore(t)
	ctx := context.Background()
	w := s.NewLedgerWriter(LedgerConfig{FlushInterval: time.Millisecond}, nil)
	ran := make(chan error, 1)
	go func() { ran <- w.Run(ctx) }()

	// Writers: plain rows, committed rows, and streams opened, updated and
	// finished, for three tenants, until told to stop.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var written atomic.Int64
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tn := int64(g%3 + 1)
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				id := fmt.Sprintf("g%d-%d", g, i)
				switch i % 3 {
				case 0:
					w.Add(streamRow(id, tn, OutcomeOK, 3, int64(i%7)))
				case 1:
					if err := w.Commit(ctx, streamRow(id, tn, OutcomeOK, 5, 1)); err != nil {
						t.Error(err)
						return
					}
				case 2:
					w.Open(streamRow(id, tn, OutcomeOpen, 2, 1))
					w.Open(streamRow(id, tn, OutcomeOpen, 2, 4))
					if i%4 != 0 { // some stay open
						w.Add(streamRow(id, tn, OutcomeOK, 2, 9))
					}
				}
				written.Add(1)
			}
		}()
	}

	dir := t.TempDir()
	var copies []string
	for i := range 3 {
		for n := written.Load(); written.Load() < n+200; {
			time.Sleep(time.Millisecond)
		}
		dst := filepath.Join(dir, fmt.Sprintf("backup-%d.db", i))
		if err := s.Backup(ctx, dst); err != nil {
			t.Fatal(err)
		}
		copies = append(copies, dst)
	}
	// An existing file is replaced, as a whole.
	if err := s.Backup(ctx, copies[len(copies)-1]); err != nil {
		t.Fatalf("Backup over an existing copy: %v", err)
	}
	close(stop)
	wg.Wait()
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-ran; err != nil {
		t.Fatal(err)
	}

	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != len(copies) {
		t.Errorf("backup directory holds %d files, want the %d copies and no leftovers", len(ents), len(copies))
	}
	var prev int
	for i, path := range copies {
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("%s has mode %v, want 0600", path, fi.Mode().Perm())
		}
		c := openAt(t, path)
		var check string
		if err := c.read.QueryRow(`PRAGMA integrity_check`).Scan(&check); err != nil || check != "ok" {
			t.Errorf("copy %d: integrity_check = %q, %v", i, check, err)
		}
		checkSpendMatchesLedger(t, c)
		rows, err := c.LedgerRows(ctx, UsageFilter{})
		if err != nil {
			t.Fatal(err)
		}
		if len(rows) == 0 || (i > 0 && len(rows) < prev) {
			t.Errorf("copy %d holds %d rows (the one before %d)", i, len(rows), prev)
		}
		prev = len(rows)
		// The copy is a working database: the gateway could start on it.
		if _, err := c.SettleOpen(ctx); err != nil {
			t.Errorf("copy %d: SettleOpen: %v", i, err)
		}
		checkSpendMatchesLedger(t, c)
	}
}

// TestBackupOnPostgresSaysToUsePgDump: VACUUM INTO is SQLite's; on
// PostgreSQL the store writes nothing and points at pg_dump.
func TestBackupOnPostgresSaysToUsePgDump(t *testing.T) {
	s := engineCases[1].open(t)
	dst := filepath.Join(t.TempDir(), "copy.db")
	err := s.Backup(context.Background(), dst)
	if !errors.Is(err, ErrBackupPostgres) || !strings.Contains(err.Error(), "pg_dump") {
		t.Fatalf("Backup on PostgreSQL = %v, want an error naming pg_dump", err)
	}
	if _, err := os.Stat(dst); !os.IsNotExist(err) {
		t.Errorf("Backup on PostgreSQL left %s (stat: %v)", dst, err)
	}
}
