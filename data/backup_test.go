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

// TestBackupRefusesTheLiveDatabase: no spelling of a path into the
// database's directory — the file itself, its -wal, a commit-log file, a
// relative path, a symbolic link to the directory or below it, a hard link
// to the database — is taken as a backup target, and the database is intact
// after every refusal.
func TestBackupRefusesTheLiveDatabase(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "data")
	db := filepath.Join(dir, "tailgate.db")
	s := openAt(t, db)
	if _, err := s.EnsureTenant(ctx, "acme"); err != nil {
		t.Fatal(err)
	}
	w := s.NewLedgerWriter(LedgerConfig{}, nil)
	if _, err := w.OpenCommitLog(ctx); err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	other := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "sub"), 0o700); err != nil {
		t.Fatal(err)
	}
	for _, l := range [][2]string{{dir, "to-data"}, {filepath.Join(dir, "sub"), "to-sub"}} {
		if err := os.Symlink(l[0], filepath.Join(other, l[1])); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Link(db, filepath.Join(other, "hardlink.db")); err != nil {
		t.Fatal(err)
	}
	t.Chdir(other)
	logs, _ := filepath.Glob(db + "-commits-*")
	if len(logs) == 0 {
		t.Fatal("no commit-log file")
	}
	for _, target := range []string{
		db, db + "-wal", db + "-shm", logs[0], db + "-commits.lock", filepath.Join(dir, "copy.db"),
		filepath.Join(dir, "sub", "copy.db"), "to-data/tailgate.db", "to-sub/copy.db",
		"to-data/../to-data/copy.db", "hardlink.db",
	} {
		err := s.Backup(ctx, target)
		if err == nil || !strings.Contains(err.Error(), "live database") || !strings.Contains(err.Error(), "somewhere else") {
			t.Errorf("Backup(%s) = %v, want a refusal naming the live database and what to do", target, err)
		}
	}
	if err := w.Commit(ctx, streamRow("after", 1, OutcomeOK, 1, 1)); err != nil {
		t.Fatal(err)
	}
	if err := s.Backup(ctx, "copy.db"); err != nil {
		t.Fatalf("a backup outside the data directory: %v", err)
	}
}

// TestRestoreChecksWhatItPutsInPlace: Restore refuses while a gateway holds
// the database's commit log, and a file that is not a tailgate database at
// a schema version it knows; a backup is put in place and what it replaced
// kept beside it, under names SQLite still opens.
func TestRestoreChecksWhatItPutsInPlace(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "data")
	db := filepath.Join(dir, "tailgate.db")
	s := openAt(t, db)
	if _, err := s.EnsureTenant(ctx, "before"); err != nil {
		t.Fatal(err)
	}
	backup := filepath.Join(t.TempDir(), "copy.db")
	if err := s.Backup(ctx, backup); err != nil {
		t.Fatal(err)
	}
	if _, err := s.EnsureTenant(ctx, "after"); err != nil {
		t.Fatal(err)
	}
	w := s.NewLedgerWriter(LedgerConfig{}, nil)
	if _, err := w.OpenCommitLog(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := Restore(ctx, db, backup); !errors.Is(err, ErrDatabaseInUse) || !strings.Contains(err.Error(), "stop it first") {
		t.Fatalf("Restore under a running writer: %v, want ErrDatabaseInUse", err)
	}
	w.Close()

	junk := filepath.Join(t.TempDir(), "junk.db")
	if err := os.WriteFile(junk, []byte("not a database at all, not even close to one; "+strings.Repeat("x", 600)), 0o600); err != nil {
		t.Fatal(err)
	}
	newer := filepath.Join(t.TempDir(), "newer.db")
	n := openAt(t, newer)
	if _, err := n.write.Exec(`INSERT INTO schema_migrations (version, name, applied_at) VALUES (9999, '9999_future.sql', 0)`); err != nil {
		t.Fatal(err)
	}
	n.Close()
	for _, tc := range []struct{ file, want string }{
		{junk, "not a SQLite database"},
		{newer, "newer than this binary's"},
		{db, "a file of the database"},
		{filepath.Join(t.TempDir(), "missing.db"), "no such file"},
	} {
		if _, err := Restore(ctx, db, tc.file); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Restore(%s) = %v, want %q", filepath.Base(tc.file), err, tc.want)
		}
	}
	s.Close()

	r, err := Restore(ctx, db, backup)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Replaced) == 0 || !strings.HasPrefix(r.Replaced[0], db+".replaced-") || r.Version == 0 {
		t.Fatalf("Restore = %+v, want the replaced database kept as %s.replaced-TIME", r, db)
	}
	names := func(s *Store) []string {
		ts, err := s.Tenants(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, tn := range ts {
			out = append(out, tn.Name)
		}
		return out
	}
	if got := names(openAt(t, db)); strings.Join(got, ",") != "before" {
		t.Errorf("restored database has tenants %v, want the backup's", got)
	}
	if got := names(openAt(t, r.Replaced[0])); strings.Join(got, ",") != "after,before" && strings.Join(got, ",") != "before,after" {
		t.Errorf("the replaced database has tenants %v, want both", got)
	}
}
