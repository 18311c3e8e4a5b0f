package data

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	_ "modernc.org/sqlite" // registers the "sqlite" driver
)

// readConns is the size of the read pool. Reads are short (key lookups,
// admin queries) and the machine is small; a few connections are enough for
// them never to wait on one another, and WAL lets them run beside the writer.
const readConns = 4

// Store is tailgate's database. Writes go through a single connection
// (SQLite has one writer anyway, and queueing in Go is cheaper than spinning
// on SQLITE_BUSY); reads use a separate pool so they never wait behind a
// batch of ledger inserts. Several Stores, in one process or several, may
// share a file.
type Store struct {
	path   string // the SQLite file, or the PostgreSQL URL without its password
	engine engine
	// readOnly is set by SetReadOnly: the commit log refuses appends too.
	readOnly atomic.Bool
	// instance names this process's use of a PostgreSQL database among
	// other gateways': it stamps the ledger rows written through the Store,
	// its lease and its budget holds. "" on SQLite (one gateway per file).
	instance string
	// book is the pool of budget reservations (PostgreSQL): short
	// transactions that must not wait behind a batch of ledger rows.
	book *sql.DB
	// leased is set once this instance holds a lease (see Store.Renew).
	leased atomic.Bool
	write  *sql.DB
	read   *sql.DB
	// ckpt is the checkpointer's connection; it runs until Close.
	ckpt               *sql.DB
	ckptStop, ckptDone chan struct{}
	// ledgerExact[i] inserts ledgerChunks[i] rows at once, returning the
	// ids it changed (the statement without RETURNING runs on the driver:
	// insertRaw).
	ledgerExact [len(ledgerChunks)]*sql.Stmt
	// eventsMark and eventsInsert write, on SQLite, the usage events of
	// the rows a ledger transaction inserts (usageEventsSQL); nil on
	// PostgreSQL.
	eventsMark, eventsInsert *sql.Stmt
	// live refreshes open rows' figures (refreshOpen) and inserts ledger
	// rows (insertRaw) on the driver.
	live liveRefresh
	// spend adds a batch's totals to spend (spend.go).
	spend spendStmts
	// polls are the read pool's prepared statements of the queries
	// gateways poll (see readStmt).
	pollMu sync.Mutex
	polls  map[string]*sql.Stmt

	// idemOwner owns this process's pending idempotency records on
	// SQLite (see IdemOwner).
	idemOnce  sync.Once
	idemOwner string

	closed    atomic.Bool // set once Close starts; lets writers stop retrying
	closeOnce sync.Once
	closeErr  error
}

// Open opens the database at location, and applies any migrations it has
// not seen yet. A location that is a postgres:// or postgresql:// URL (see
// [IsPostgres]) is a PostgreSQL database, which must exist; anything else is
// the path of a SQLite file, created with its parent directory (mode 0700)
// if needed.
func Open(location string) (*Store, error) {
	open := open
	if IsPostgres(location) {
		open = openPostgres
	}
	s, err := open(location)
	if err != nil {
		return nil, fmt.Errorf("open store: %w", err)
	}
	return s, nil
}

func open(path string) (_ *Store, err error) {
	if path == "" {
		return nil, errors.New("empty path")
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Dir(abs), 0o700); err != nil {
		return nil, err
	}
	// Create the file ourselves so that it (and the -wal and -shm files
	// SQLite derives from its mode) is private: it holds key hashes and
	// every tenant's usage. An existing file keeps its mode.
	f, err := os.OpenFile(abs, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	if err := f.Close(); err != nil {
		return nil, err
	}
	s := &Store{path: path}
	defer func() {
		if err != nil {
			s.Close()
		}
	}()

	// _txlock=immediate: every write transaction takes the write lock at
	// BEGIN, so busy_timeout covers it. A deferred transaction that reads
	// first and upgrades later can fail with SQLITE_BUSY at once when
	// another process writes in between, whatever the timeout.
	//
	// temp_store(MEMORY): the statement journal of a ledger insert (a
	// multi-row upsert needs one) stays in memory; on a
	// file it was about one pwrite call in nine of the gateway's.
	//
	// wal_autocheckpoint(0): the writer never checkpoints (copies the WAL
	// into the database and fsyncs it) at the end of a commit — a request
	// waiting for its ledger row would wait for that too. The checkpointer
	// goroutine does it beside the writer instead (PASSIVE: it never blocks
	// a writer or a reader).
	s.write, err = sql.Open("sqlite", dsn(abs, "_pragma=journal_mode(WAL)", "_pragma=synchronous(NORMAL)",
		"_pragma=journal_size_limit(67108864)", "_pragma=wal_autocheckpoint(0)", "_pragma=temp_store(MEMORY)", "_txlock=immediate"))
	if err != nil {
		return nil, err
	}
	s.write.SetMaxOpenConns(1)
	s.write.SetMaxIdleConns(1)
	if err := migrateSQLite(s.write); err != nil {
		return nil, err
	}
	if err := s.prepareLedger(); err != nil {
		return nil, err
	}

	// Readers are query_only: a bug that writes through the read pool fails
	// loudly instead of racing the single writer.
	s.read, err = sql.Open("sqlite", dsn(abs, "_pragma=query_only(1)"))
	if err != nil {
		return nil, err
	}
	s.read.SetMaxOpenConns(readConns)
	s.read.SetMaxIdleConns(readConns)
	if err := s.read.Ping(); err != nil {
		return nil, err
	}
	s.ckpt, err = sql.Open("sqlite", dsn(abs))
	if err != nil {
		return nil, err
	}
	s.ckpt.SetMaxOpenConns(1)
	s.ckptStop, s.ckptDone = make(chan struct{}), make(chan struct{})
	go s.checkpoints(checkpointEvery)
	return s, nil
}

// migrateSQLite migrates a SQLite file, trying again for a while when it is
// busy: two processes opening a new file at once (say `keys create` while
// the gateway starts) can find it locked without waiting — switching a new
// file to WAL takes an exclusive lock the busy timeout does not cover.
func migrateSQLite(db *sql.DB) error {
	deadline := time.Now().Add(10 * time.Second)
	for backoff := 5 * time.Millisecond; ; backoff = min(2*backoff, 200*time.Millisecond) {
		err := migrate(context.Background(), db, engineSQLite)
		if err == nil || !strings.HasPrefix(sqliteCode(err), "SQLITE_BUSY") || time.Now().After(deadline) {
			return err
		}
		time.Sleep(backoff)
	}
}

// checkpointEvery is how often the checkpointer copies the WAL back into
// the database.
const checkpointEvery = 500 * time.Millisecond

// checkpoints runs PASSIVE checkpoints until Close; a failed one is simply
// tried again at the next tick (the WAL keeps every row meanwhile).
func (s *Store) checkpoints(every time.Duration) {
	defer close(s.ckptDone)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-s.ckptStop:
			return
		case <-t.C:
			_, _ = s.ckpt.Exec(`PRAGMA wal_checkpoint(PASSIVE)`)
		}
	}
}

// dsn builds a modernc DSN for the file at abs. The path is URI-escaped so
// that '?', '#' and '%' in a directory name cannot be taken for parameters.
func dsn(abs string, params ...string) string {
	u := url.URL{Path: filepath.ToSlash(abs)}
	q := "?_pragma=busy_timeout(5000)&_pragma=foreign_keys(1)"
	for _, p := range params {
		q += "&" + p
	}
	return "file:" + u.EscapedPath() + q
}

// Path returns the path the store was opened with: the SQLite file, or the
// PostgreSQL URL without its password.
func (s *Store) Path() string { return s.path }

// Postgres reports whether the store is a PostgreSQL database.
func (s *Store) Postgres() bool { return s.engine == enginePostgres }

// Close closes the store. It is safe to call more than once; later calls
// return the first call's result. A [LedgerWriter] must be closed first.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		s.closed.Store(true)
		var errs []error
		if s.ckptStop != nil {
			close(s.ckptStop)
			<-s.ckptDone
		}
		if s.ckpt != nil {
			errs = append(errs, s.ckpt.Close())
		}
		s.live.mu.Lock()
		errs = append(errs, s.live.closeLocked())
		s.live.mu.Unlock()
		for _, st := range append(s.ledgerExact[:], s.eventsMark, s.eventsInsert) {
			if st != nil {
				errs = append(errs, st.Close())
			}
		}
		errs = append(errs, s.spend.close()...)
		s.pollMu.Lock()
		for _, st := range s.polls {
			errs = append(errs, st.Close())
		}
		s.polls = nil
		s.pollMu.Unlock()
		if s.read != nil {
			errs = append(errs, s.read.Close())
		}
		if s.book != nil {
			errs = append(errs, s.book.Close())
		}
		if s.write != nil {
			errs = append(errs, s.write.Close())
		}
		if err := errors.Join(errs...); err != nil {
			s.closeErr = fmt.Errorf("close store: %w", err)
		}
	})
	return s.closeErr
}

// writeTx runs fn in one write transaction (BEGIN IMMEDIATE) and commits it
// if fn returns nil.
func (s *Store) writeTx(ctx context.Context, fn func(tx *sql.Tx) error) error {
	tx, err := s.write.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		_ = tx.Rollback()
		return err
	}
	return tx.Commit()
}

// bumpKeysVersion must run inside the transaction that changes keys or
// budgets, so a reader never sees the change without the new version.
func bumpKeysVersion(ctx context.Context, tx *sql.Tx) error {
	_, err := tx.ExecContext(ctx, `UPDATE meta SET v = v + 1 WHERE k = 'keys_version'`)
	return err
}

// KeysVersion returns a counter that every key or tenant-budget change bumps
// in the same transaction. A gateway polls it (it is one indexed row) to
// notice changes made by another process, such as `tailgate keys revoke`.
func (s *Store) KeysVersion(ctx context.Context) (int64, error) {
	st, err := s.readStmt(ctx, `SELECT v FROM meta WHERE k = 'keys_version'`)
	if err != nil {
		return 0, fmt.Errorf("keys version: %w", err)
	}
	var v int64
	if err := st.QueryRowContext(ctx).Scan(&v); err != nil {
		return 0, fmt.Errorf("keys version: %w", err)
	}
	return v, nil
}

// readStmt returns q prepared on the read pool, preparing it the first time
// it is asked for; the statements stay until Close. It is for the queries a
// gateway polls every few hundred milliseconds (KeysVersion, the batch
// executor's): run as text, SQLite compiled each again every time, 0.4 % of
// a gateway's CPU at 1000 requests a second (the lead's perf profile of
// 2026-12-07: 175 of 41,488 samples under DB.QueryContext, 94 of them in
// sqlite3_prepare_v2).
func (s *Store) readStmt(ctx context.Context, q string) (*sql.Stmt, error) {
	s.pollMu.Lock()
	defer s.pollMu.Unlock()
	if st, ok := s.polls[q]; ok {
		return st, nil
	}
	if s.closed.Load() {
		return nil, errors.New("store closed")
	}
	st, err := s.read.PrepareContext(ctx, q)
	if err != nil {
		return nil, err
	}
	if s.polls == nil {
		s.polls = make(map[string]*sql.Stmt)
	}
	s.polls[q] = st
	return st, nil
}

// Times are stored as unix microseconds; the zero time is stored as NULL
// where a column allows it.

func toMicros(t time.Time) int64 { return t.UnixMicro() }

func fromMicros(us int64) time.Time { return time.UnixMicro(us).UTC() }

func fromNullMicros(us sql.NullInt64) time.Time {
	if !us.Valid {
		return time.Time{}
	}
	return fromMicros(us.Int64)
}

// nullMicros stores t, the zero time as NULL.
func nullMicros(t time.Time) sql.NullInt64 {
	if t.IsZero() {
		return sql.NullInt64{}
	}
	return sql.NullInt64{Int64: toMicros(t), Valid: true}
}

// now is the current time at the precision the database keeps, so a value
// returned by a write compares equal to the same value read back.
func now() time.Time { return time.Now().UTC().Truncate(time.Microsecond) }

// SetMaxPageCount limits the database to n pages (SQLite's max_page_count,
// on the writing connection, until the store is closed); a write that would
// grow it further fails with SQLITE_FULL. It cannot shrink the limit below
// the current size (SQLite keeps the current size then). Tests use it to
// fill the database without a small disk.
func (s *Store) SetMaxPageCount(n int64) error {
	if s.engine != engineSQLite {
		return fmt.Errorf("set max page count: %w", ErrNotSQLite)
	}
	if n <= 0 {
		return fmt.Errorf("set max page count: %d is not positive", n)
	}
	var got int64
	// A pragma takes no bound parameters; n is an integer.
	if err := s.write.QueryRow(fmt.Sprintf(`PRAGMA max_page_count = %d`, n)).Scan(&got); err != nil {
		return fmt.Errorf("set max page count: %w", err)
	}
	return nil
}

// SetReadOnly makes SQLite refuse every write from now on (on) or again
// allows them, as a file system remounted read-only would — for drills and
// tests of the ledger failing under load.
func (s *Store) SetReadOnly(on bool) error {
	if s.engine != engineSQLite {
		return fmt.Errorf("set read-only: %w", ErrNotSQLite)
	}
	if _, err := s.write.Exec(fmt.Sprintf(`PRAGMA query_only = %t`, on)); err != nil {
		return fmt.Errorf("set read-only: %w", err)
	}
	s.readOnly.Store(on)
	return nil
}

// pageCount returns how many pages the database has.
func (s *Store) pageCount(ctx context.Context) (int64, error) {
	var n int64
	err := s.read.QueryRowContext(ctx, `PRAGMA page_count`).Scan(&n)
	return n, err
}
