package data

import (
	"context"
	"database/sql"
	"embed"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"
)

// Migrations are files named NNNN_description.sql, applied in order of NNNN,
// each in its own transaction together with its row in schema_migrations.
// A migration, once released, is never edited: add a new one.
//
// There is one list of migrations, migrations/*.sql, run as it is on SQLite.
// On PostgreSQL a file of the same name in migrations/postgres replaces it
// where SQLite's text cannot run there: every migration up to 0007 has one,
// because SQLite's INTEGER is 64 bits and PostgreSQL's is 32 (times are
// microseconds), INTEGER PRIMARY KEY is SQLite's auto-increment, BLOB is
// BYTEA, triggers are PL/pgSQL functions, and the queries' ORDER BY rowid
// needs the column PostgreSQL does not add by itself. A new migration
// written in the subset both engines share (BIGINT, TEXT, plain ALTER TABLE)
// needs no variant.
//
//go:embed migrations/*.sql migrations/postgres/*.sql
var migrationFS embed.FS

type migration struct {
	version int
	name    string
	sql     string
}

func loadMigrations(e engine) ([]migration, error) {
	ms, err := loadMigrationDir("migrations")
	if err != nil || e != enginePostgres {
		return ms, err
	}
	pg, err := loadMigrationDir("migrations/postgres")
	if err != nil {
		return nil, err
	}
	byName := make(map[string]int, len(ms))
	for i, m := range ms {
		byName[m.name] = i
	}
	for _, v := range pg {
		i, ok := byName[v.name]
		if !ok {
			return nil, fmt.Errorf("migration postgres/%s replaces no migration of the same name", v.name)
		}
		ms[i] = v
	}
	return ms, nil
}

func loadMigrationDir(dir string) ([]migration, error) {
	names, err := fs.Glob(migrationFS, dir+"/*.sql")
	if err != nil {
		return nil, err
	}
	var ms []migration
	for _, n := range names {
		base := path.Base(n)
		num, _, ok := strings.Cut(base, "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || v <= 0 {
			return nil, fmt.Errorf("migration %s: name must start with a positive number and '_'", base)
		}
		b, err := migrationFS.ReadFile(n)
		if err != nil {
			return nil, err
		}
		ms = append(ms, migration{version: v, name: base, sql: string(b)})
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].version < ms[j].version })
	for i := 1; i < len(ms); i++ {
		if ms[i].version == ms[i-1].version {
			return nil, fmt.Errorf("migrations %s and %s share a version", ms[i-1].name, ms[i].name)
		}
	}
	return ms, nil
}

// migrate applies every migration db has not recorded yet. Two processes may
// open a new file at once: each migration's transaction takes the write lock
// at BEGIN and re-checks schema_migrations under it, so each migration runs
// exactly once.
//
// On PostgreSQL a session advisory lock, held on one connection for the whole
// run, does what SQLite's write lock does.
func migrate(ctx context.Context, db *sql.DB, e engine) error {
	ms, err := loadMigrations(e)
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	conn, err := db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	defer conn.Close()
	if e == enginePostgres {
		if _, err := conn.ExecContext(ctx, `SELECT pg_advisory_lock(?)`, int64(migrateLockID)); err != nil {
			return fmt.Errorf("migrate: lock: %w", err)
		}
		defer conn.ExecContext(context.Background(), `SELECT pg_advisory_unlock(?)`, int64(migrateLockID))
	}
	if _, err := conn.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
		version    BIGINT PRIMARY KEY,
		name       TEXT   NOT NULL,
		applied_at BIGINT NOT NULL
	)`); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}

	var newest int
	if err := conn.QueryRowContext(ctx, `SELECT COALESCE(MAX(version), 0) FROM schema_migrations`).Scan(&newest); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	if len(ms) > 0 && newest > ms[len(ms)-1].version {
		return fmt.Errorf("migrate: database schema version %d is newer than this binary's (%d)", newest, ms[len(ms)-1].version)
	}

	for _, m := range ms {
		if m.version <= newest {
			continue
		}
		if err := applyMigration(ctx, conn, m); err != nil {
			return fmt.Errorf("migrate %s: %w", m.name, err)
		}
	}
	return nil
}

// txBeginner is a *sql.DB or a *sql.Conn.
type txBeginner interface {
	BeginTx(ctx context.Context, opts *sql.TxOptions) (*sql.Tx, error)
}

func applyMigration(ctx context.Context, db txBeginner, m migration) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()

	var n int
	if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM schema_migrations WHERE version = ?`, m.version).Scan(&n); err != nil {
		return err
	}
	if n > 0 {
		return nil // another process got here first
	}
	if _, err := tx.ExecContext(ctx, m.sql); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)`,
		m.version, m.name, toMicros(now())); err != nil {
		return err
	}
	return tx.Commit()
}
