package data

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Backup writes a consistent copy of a SQLite database to path while the store
// (and any other process on the file) keeps writing: SQLite's VACUUM INTO
// reads one snapshot, so the copy holds every transaction committed before
// it started and none after, with the ledger and tenant spend agreeing. The
// copy is a compact, standalone database file (mode 0600: it holds key
// hashes and every tenant's usage); [Restore] puts it back.
//
// path may not be in the database's directory (see [Store.CheckBackupTarget]):
// a backup written over the live database, its -wal or -shm or a commit-log
// file would destroy what it copies. The copy is written to a temporary file
// beside path, synced and renamed into place, so path never holds half a
// backup; an existing file at path is replaced. The copy runs on a
// connection of its own: ledger writes go on meanwhile (WAL readers do not
// block the writer). On PostgreSQL it returns [ErrBackupPostgres], which
// says to use pg_dump.
func (s *Store) Backup(ctx context.Context, path string) error {
	if err := s.backup(ctx, path); err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	return nil
}

func (s *Store) backup(ctx context.Context, path string) (err error) {
	if s.closed.Load() {
		return errors.New("store closed")
	}
	if s.engine != engineSQLite {
		return ErrBackupPostgres
	}
	if err := s.CheckBackupTarget(path); err != nil {
		return err
	}
	dst, err := filepath.Abs(path)
	if err != nil {
		return err
	}
	// VACUUM INTO accepts an existing empty file; creating it first makes
	// it private and gives it a name no one else is writing.
	f, err := os.CreateTemp(filepath.Dir(dst), "."+filepath.Base(dst)+".tmp-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	if err := f.Close(); err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = os.Remove(tmp)
		}
	}()

	src, err := filepath.Abs(s.path)
	if err != nil {
		return err
	}
	// The read pool is query_only, which VACUUM INTO refuses, and the write
	// connection belongs to the ledger writer: a long copy there would stall
	// every ledger write.
	db, err := sql.Open("sqlite", dsn(src))
	if err != nil {
		return err
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	if _, err := db.ExecContext(ctx, `VACUUM INTO ?`, tmp); err != nil {
		return err
	}
	if err := db.Close(); err != nil {
		return err
	}
	if err := syncFile(tmp); err != nil {
		return err
	}
	if err := os.Rename(tmp, dst); err != nil {
		return err
	}
	return syncFile(filepath.Dir(dst)) // make the rename itself durable
}

// CheckBackupTarget returns an error if a backup written to path could
// touch the live database: path is in (or below) the directory of the
// database, which holds the database, its -wal and -shm files and its
// commit log, or is one of those files by another name (a hard link). Paths
// are compared after resolving relative parts and symbolic links, and
// directories and files as the same file system objects (os.SameFile), so
// no spelling of the path gets through.
func (s *Store) CheckBackupTarget(path string) error {
	if s.engine != engineSQLite {
		return nil
	}
	db, err := filepath.Abs(s.path)
	if err != nil {
		return err
	}
	return checkOutside(filepath.Dir(db), db, path, "write the backup somewhere else")
}

// checkOutside returns an error if path is in or below dir, or is the file
// db or one of its companions (-wal, -shm, commit-log files).
func checkOutside(dir, db, path, todo string) error {
	abs, err := filepath.Abs(path)
	if err != nil {
		return err
	}
	dirInfo, err := os.Stat(dir)
	if err != nil {
		return err
	}
	inside := fmt.Errorf("%s is inside %s, the directory of the live database (%s, its -wal, -shm and commit-log files): %s", path, dir, filepath.Base(db), todo)
	// Every directory from path's own up to the root: one that is dir
	// (through a symbolic link or a bind mount) contains path.
	for d := filepath.Dir(abs); ; d = filepath.Dir(d) {
		if fi, err := os.Stat(d); err == nil && os.SameFile(fi, dirInfo) {
			return inside
		}
		if d == filepath.Dir(d) {
			break
		}
	}
	// A symbolic link to a directory below dir.
	real, err1 := filepath.EvalSymlinks(filepath.Dir(abs))
	realDir, err2 := filepath.EvalSymlinks(dir)
	if err1 == nil && err2 == nil {
		if rel, err := filepath.Rel(realDir, real); err == nil && rel != ".." && !strings.HasPrefix(rel, "../") {
			return inside
		}
	}
	fi, err := os.Stat(abs)
	if err != nil {
		return nil // nothing there to be one of the database's files
	}
	for _, f := range append(companions(db), db+"-commits.lock") {
		if li, err := os.Stat(f); err == nil && os.SameFile(fi, li) {
			return fmt.Errorf("%s is %s, a file of the live database: %s", path, f, todo)
		}
	}
	return nil
}

// ErrBackupPostgres is Backup's answer on PostgreSQL, whose own tools copy a
// live database consistently.
var ErrBackupPostgres = errors.New("the database is PostgreSQL: back it up with pg_dump (e.g. pg_dump --format=custom --file=FILE URL), which takes a consistent snapshot while gateways keep writing")

func syncFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
