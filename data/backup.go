package data

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// Backup writes a consistent copy of a SQLite database to path while the store
// (and any other process on the file) keeps writing: SQLite's VACUUM INTO
// reads one snapshot, so the copy holds every transaction committed before
// it started and none after, with the ledger and tenant spend agreeing. The
// copy is a compact, standalone database file (mode 0600: it holds key
// hashes and every tenant's usage); restore it by stopping the gateway and
// putting it in place of DIR/tailgate.db, with no -wal or -shm file beside.
//
// The copy is written to a temporary file beside path, synced and renamed
// into place, so path never holds half a backup; an existing file at path
// is replaced. The copy runs on a connection of its own: ledger writes go
// on meanwhile (WAL readers do not block the writer). On PostgreSQL it
// returns [ErrBackupPostgres], which says to use pg_dump.
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
