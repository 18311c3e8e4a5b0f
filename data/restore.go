package data

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/tailgate-dev/tailgate/data/commitlog"
)

// ErrDatabaseInUse says a gateway holds the database's commit log: it runs
// on the database, and Restore will not replace the file under it.
var ErrDatabaseInUse = errors.New("a gateway is running on the database")

// Restored says what Restore did.
type Restored struct {
	Version int // schema version of the database put in place
	// Replaced are the files that were moved aside, where they are now: the
	// database (name.replaced-TIME), then its -wal, -shm and commit-log
	// files (named after it, so SQLite still opens it whole). Empty when
	// there was no database.
	Replaced []string
}

// Restore puts the SQLite database file backup (a copy made by
// [Store.Backup]) in place of the database at db. No gateway may run on db:
// Restore holds the lock a gateway holds on its commit log for the whole
// time, and returns an error wrapping [ErrDatabaseInUse] if it is taken.
// backup must be a tailgate database (it passes SQLite's quick_check and
// has a schema version this binary knows; an older one is migrated at the
// gateway's next start) and no file of the live database.
//
// Nothing is deleted: the database replaced, its -wal and -shm files and
// any commit-log files (rows a gateway that died had not written yet) are
// renamed to db.replaced-TIME (and -wal, -shm, -commits-N after it). The
// backup is copied to a temporary file beside db, synced, and renamed into
// place.
func Restore(ctx context.Context, db, backup string) (Restored, error) {
	r, err := restore(ctx, db, backup)
	if err != nil {
		return r, fmt.Errorf("restore: %w", err)
	}
	return r, nil
}

func restore(ctx context.Context, db, backup string) (Restored, error) {
	db, err := filepath.Abs(db)
	if err != nil {
		return Restored{}, err
	}
	if err := os.MkdirAll(filepath.Dir(db), 0o700); err != nil {
		return Restored{}, err
	}
	release, err := commitlog.Hold(db + "-commits")
	if errors.Is(err, commitlog.ErrLocked) {
		return Restored{}, fmt.Errorf("%w (it holds %s): stop it first", ErrDatabaseInUse, db+"-commits.lock")
	}
	if err != nil {
		return Restored{}, err
	}
	defer release()

	fi, err := os.Stat(backup)
	if err != nil {
		return Restored{}, err
	}
	if !fi.Mode().IsRegular() {
		return Restored{}, fmt.Errorf("%s is not a regular file", backup)
	}
	for _, f := range companions(db) {
		if li, err := os.Stat(f); err == nil && os.SameFile(fi, li) {
			return Restored{}, fmt.Errorf("%s is %s, a file of the database it would replace: give a backup made by `tailgate backup`", backup, f)
		}
	}
	version, err := checkBackup(ctx, backup)
	if err != nil {
		return Restored{}, err
	}

	tmp, err := copyBeside(backup, db)
	if err != nil {
		return Restored{}, err
	}
	defer os.Remove(tmp) // gone by then if renamed into place

	r := Restored{Version: version}
	if _, err := os.Stat(db); err == nil {
		aside := db + ".replaced-" + now().Format("20060102T150405.000000Z")
		for _, f := range companions(db) {
			if _, err := os.Lstat(f); err != nil {
				continue
			}
			to := aside + strings.TrimPrefix(f, db)
			if err := os.Rename(f, to); err != nil {
				return r, err
			}
			r.Replaced = append(r.Replaced, to)
		}
	}
	if err := os.Rename(tmp, db); err != nil {
		return r, err
	}
	return r, syncFile(filepath.Dir(db))
}

// companions returns db and the files beside it that belong to it: its -wal
// and -shm and its commit-log files (not the commit log's lock).
func companions(db string) []string {
	fs := []string{db, db + "-wal", db + "-shm"}
	logs, _ := filepath.Glob(db + "-commits-*")
	return append(fs, logs...)
}

// checkBackup returns the schema version of the tailgate database at path,
// or an error that says why it is not one this binary can take.
func checkBackup(ctx context.Context, path string) (int, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return 0, err
	}
	// immutable: read the file as it is, creating no -wal or -shm beside it.
	db, err := sql.Open("sqlite", dsn(abs, "mode=ro", "immutable=1"))
	if err != nil {
		return 0, err
	}
	defer db.Close()
	var check string
	if err := db.QueryRowContext(ctx, `PRAGMA quick_check`).Scan(&check); err != nil {
		return 0, fmt.Errorf("%s is not a SQLite database: %w", path, err)
	}
	if check != "ok" {
		return 0, fmt.Errorf("%s is a damaged SQLite database (quick_check: %s)", path, check)
	}
	var version sql.NullInt64
	if err := db.QueryRowContext(ctx, `SELECT MAX(version) FROM schema_migrations`).Scan(&version); err != nil || !version.Valid {
		return 0, fmt.Errorf("%s is not a tailgate database (it has no schema version): give a file made by `tailgate backup`", path)
	}
	ms, err := loadMigrations(engineSQLite)
	if err != nil {
		return 0, err
	}
	if newest := ms[len(ms)-1].version; version.Int64 > int64(newest) {
		return 0, fmt.Errorf("%s has schema version %d, newer than this binary's %d: restore it with the tailgate that made it", path, version.Int64, newest)
	}
	for _, table := range []string{"tenants", "api_keys", "ledger"} {
		if _, err := db.ExecContext(ctx, `SELECT 1 FROM `+table+` LIMIT 1`); err != nil {
			return 0, fmt.Errorf("%s is not a tailgate database (no %s table): give a file made by `tailgate backup`", path, table)
		}
	}
	return int(version.Int64), nil
}

// copyBeside copies src to a new private file in dst's directory, synced,
// and returns its name.
func copyBeside(src, dst string) (_ string, err error) {
	in, err := os.Open(src)
	if err != nil {
		return "", err
	}
	defer in.Close()
	out, err := os.CreateTemp(filepath.Dir(dst), "."+filepath.Base(dst)+".restore-*")
	if err != nil {
		return "", err
	}
	defer func() {
		if err != nil {
			out.Close()
			os.Remove(out.Name())
		}
	}()
	if _, err := io.Copy(out, in); err != nil {
		return "", err
	}
	if err := out.Sync(); err != nil {
		return "", err
	}
	return out.Name(), out.Close()
}

// AdoptReplicaID gives replicaID to the worker holding the credential whose
// hash is held (nil: one with no credential yet): an active credential for
// the id that is not that one — one a restored database brought from
// another box, whose worker is not here — is revoked and returned (zero
// [Worker] when there was none to revoke). The id's admission is left
// revoked as [Store.RevokeWorker] leaves it: approve it again to let the
// worker register.
func (s *Store) AdoptReplicaID(ctx context.Context, replicaID string, held []byte) (Worker, error) {
	w, err := s.ActiveWorkerFor(ctx, replicaID)
	if errors.Is(err, ErrNotFound) {
		return Worker{}, nil
	}
	if err != nil {
		return Worker{}, fmt.Errorf("adopt %s: %w", replicaID, err)
	}
	if held != nil && string(w.Hash) == string(held) {
		return Worker{}, nil
	}
	w, err = s.RevokeWorker(ctx, w.ID)
	if err != nil {
		return Worker{}, fmt.Errorf("adopt %s: %w", replicaID, err)
	}
	return w, nil
}

// ForgetWorkers revokes every active worker credential, as a database
// restored on a new box, or copied to start a second region, wants when
// its workers start fresh: their replica ids are free for new workers once
// approved (`tailgate workers approve`) or invited. It returns the
// credentials it revoked.
func (s *Store) ForgetWorkers(ctx context.Context) ([]Worker, error) {
	ws, err := s.Workers(ctx)
	if err != nil {
		return nil, fmt.Errorf("forget workers: %w", err)
	}
	var out []Worker
	for _, w := range ws {
		if w.Revoked() {
			continue
		}
		if w, err = s.RevokeWorker(ctx, w.ID); err != nil {
			return out, fmt.Errorf("forget workers: %w", err)
		}
		out = append(out, w)
	}
	return out, nil
}
