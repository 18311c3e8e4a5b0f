package data

import (
	"context"
	"crypto/rand"
	"database/sql"
	"database/sql/driver"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
)

// ledgerCols are the ledger's columns in the order InsertLedger binds them
// and the read queries select them (after the tenant name).
//
// Each column and index a row's insert pays for has a query that reads it.
// ledgerSelect (the admin API's request log) reads every column but two:
// attempt_log, read by fillAttempts, and gateway, read by ReapGateways
// (PostgreSQL). The indexes, as SQLite's EXPLAIN QUERY PLAN shows:
// ledger_ts serves FindRequests newest first (ORDER BY ts DESC, rowid
// DESC LIMIT, no sort) and Usage over a time range; ledger_tenant_ts
// FindRequests and Usage of one tenant, and LineBilled; the id's unique
// index the upsert's conflict target, FindRequests by id and
// fillAttempts; ledger_open (open rows only, so a final row's insert
// does not touch it) SettleOpen and ReapGateways.
var ledgerCols = [...]string{
	"id", "ts", "tenant_id", "key_id", "model", "upstream", "stream",
	"prompt_tokens", "completion_tokens", "hedge_overhead_tokens", "cost_micros",
	"status", "outcome", "error", "attempts", "hedged",
	"gateway_us", "connect_us", "upstream_ttft_us", "engine_queue_us",
	"engine_ttft_us", "network_us", "ttft_us", "total_us", "priority", "queue_us", "gateway",
	"attempt_log", "hold_us", "endpoint", "replay_of",
}

// ledgerChunks are the row counts of the prepared multi-row INSERTs. A batch
// of n rows is written greedily with the largest that fit, so any batch size
// needs at most a handful of statement executions beyond n/64 and nothing
// is prepared per batch. 64 rows × 30 columns stays far below SQLite's
// limit on bound parameters.
var ledgerChunks = [...]int{64, 16, 4, 1}

func (s *Store) prepareLedger() error {
	for i, n := range ledgerChunks {
		var err error
		if s.ledgerExact[i], err = s.write.Prepare(ledgerInsertSQL(n) + " RETURNING id"); err != nil {
			return fmt.Errorf("prepare ledger insert: %w", err)
		}
	}
	if s.engine == engineSQLite {
		var err error
		if s.eventsMark, err = s.write.Prepare(`SELECT COALESCE(MAX(rowid), 0) FROM ledger`); err != nil {
			return fmt.Errorf("prepare usage events: %w", err)
		}
		if s.eventsInsert, err = s.write.Prepare(usageEventsSQL); err != nil {
			return fmt.Errorf("prepare usage events: %w", err)
		}
	}
	if err := s.prepareSpend(); err != nil {
		return err
	}
	return nil
}

// usageEventsSQL writes, on SQLite, the usage events (migration 0020) of
// the final rows of a tenant a transaction inserted into the ledger: those
// above the largest rowid before its first ledger statement (SQLite's one
// writer gives a transaction's inserted rows the rowids above it, in the
// order they were inserted), one statement a transaction. Each is version
// 1 of its request: ledger rows are never deleted, so a row inserted had
// no event before. A row the transaction inserted open and then made final
// (a stream's open row and its final one in one batch) had its event from
// the update trigger, ledger_usage_event_update, and NOT EXISTS leaves it.
// So a transaction's events are those of its open rows made final, then
// those of its rows inserted final, in ledger order.
//
// Migration 0022 dropped the trigger that wrote these row by row (as a
// trigger program run for every final row): with this statement instead a
// final row costs the process 10–13 % less CPU at 200 rows a transaction,
// the writer's batch at 1000 answers a second (BenchmarkLedgerBatch
// rows=200, medians of 8 interleaved runs: 21.1 µs a row, 18.4 with it);
// at 50 rows a transaction the difference is within the noise. PostgreSQL
// keeps the trigger (see migrations/postgres/0022_usage_events_in_batches.sql).
const usageEventsSQL = `INSERT INTO usage_events (request_id, version, ts, tenant_id, key_id, model, endpoint,
	prompt_tokens, completion_tokens, cost_micros, status, outcome, replay_of)
SELECT l.id, 1, l.ts, l.tenant_id, l.key_id, l.model, l.endpoint,
	l.prompt_tokens, l.completion_tokens, l.cost_micros, l.status, l.outcome, l.replay_of
FROM ledger l
WHERE l.rowid > ? AND l.outcome <> '` + string(OutcomeOpen) + `' AND l.tenant_id <> 0
	AND NOT EXISTS (SELECT 1 FROM usage_events e WHERE e.request_id = l.id)
ORDER BY l.rowid`

// eventful reports whether rows hold a row that can be a usage event when
// inserted: a final row of a tenant.
func eventful(rows []LedgerRow) bool {
	for i := range rows {
		if rows[i].Outcome != OutcomeOpen && rows[i].TenantID != 0 {
			return true
		}
	}
	return false
}

// refreshCols are the billable figures of a row, the only ones that change
// while a stream runs: what a refresh of an open row writes.
var refreshCols = [...]string{"prompt_tokens", "completion_tokens", "hedge_overhead_tokens", "cost_micros"}

// ledgerRefreshSQL writes the billable figures of rows stored open, rows at
// once, to ledger_live (migration 0015), which holds an open row's figures
// apart from its wide ledger row until the row stops being open. With 500
// streams open the writer refreshes about 5,000 rows a second; as an UPDATE
// of the ledger row a refresh cost 3.3–4.2 µs a row and rewrote every page
// holding an open row, in the narrow table 2.3–2.5 µs (a temporary
// benchmark beside BenchmarkOpenRowRefresh, 500 open rows among 5,000, 300
// a transaction) and a few pages.
func ledgerRefreshSQL(rows int) string {
	one := "(" + strings.TrimSuffix(strings.Repeat("?,", 1+len(refreshCols)), ",") + ")"
	var b strings.Builder
	b.WriteString("INSERT INTO ledger_live (id, " + strings.Join(refreshCols[:], ", ") + ") VALUES ")
	for i := range rows {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(one)
	}
	b.WriteString(" ON CONFLICT (id) DO UPDATE SET ")
	for i, c := range refreshCols {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(c + " = excluded." + c)
	}
	return b.String()
}

// liveFigures is the SET list that gives an open row the figures its last
// refresh left in ledger_live (the row's own where there are none): what
// settling an open row bills. It names refreshCols, so a figure a refresh
// writes is one settling bills.
var liveFigures = func() string {
	set := make([]string, len(refreshCols))
	for i, c := range refreshCols {
		set[i] = fmt.Sprintf("%[1]s = COALESCE((SELECT v.%[1]s FROM ledger_live v WHERE v.id = ledger.id), %[1]s)", c)
	}
	return strings.Join(set, ", ")
}()

func ledgerInsertSQL(rows int) string {
	one := "(" + strings.TrimSuffix(strings.Repeat("?,", len(ledgerCols)), ",") + ")"
	var b strings.Builder
	b.WriteString("INSERT INTO ledger (" + strings.Join(ledgerCols[:], ", ") + ") VALUES ")
	for i := range rows {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(one)
	}
	// A row whose id is stored already replaces it only while the stored
	// row is open (a stream's provisional row, updated by a newer open row
	// or replaced by its final one); a final row is never overwritten. So
	// re-sending a batch after an ambiguous failure (a commit whose result
	// was lost) cannot bill a request twice, and a late open row cannot undo
	// a final one. Rows of one statement apply in order, so this holds
	// within a batch too. Spend counts a row when it is inserted final or
	// stops being open, never twice (see writeLedger and spend.go).
	b.WriteString(" ON CONFLICT (id) DO UPDATE SET ")
	for i, c := range ledgerCols[1:] {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(c + " = excluded." + c)
	}
	b.WriteString(" WHERE ledger.outcome = '" + string(OutcomeOpen) + "'")
	return b.String()
}

// InsertLedger writes rows in one transaction. A row whose ID is already in
// the ledger replaces the stored row only if that one is open
// ([OutcomeOpen]); otherwise it is silently skipped, which makes a retried
// batch harmless. A row with an empty ID gets a generated one, and a row
// with a zero Time is stamped with the current time. Negative stage
// durations are stored as NULL.
//
// Most callers want a [LedgerWriter], which batches rows from many requests.
func (s *Store) InsertLedger(ctx context.Context, rows []LedgerRow) error {
	if len(rows) == 0 {
		return nil
	}
	if _, err := s.insertLedger(ctx, rows); err != nil {
		return fmt.Errorf("insert ledger: %w", err)
	}
	return nil
}

// insertLedger is InsertLedger, and returns how many rows it inserted or
// changed (an open row replaced); rows it skipped, final already, are not
// counted.
func (s *Store) insertLedger(ctx context.Context, rows []LedgerRow) (changed int64, err error) {
	return s.writeLedger(ctx, rows, nil)
}

// writeLedger is insertLedger, and before rows, in the same transaction,
// it brings the billable figures of the stored open rows fresh up to date:
// each of fresh is a newer version of an open row stored already that
// differs from it in nothing else (the caller knows; see
// LedgerWriter.takeLocked). Rows of fresh are not counted in changed.
//
// Spend: a statement that inserted or changed each of its rows (its count
// of rows changed says so) skipped none, and its final rows are counted.
// One that skipped some (rows final already: a batch sent again after an
// ambiguous failure, a commit log recovered twice) says which only by
// returning the ids it changed, which costs about a microsecond a row; the
// transaction is then rolled back and written again with the statements
// that return them.
func (s *Store) writeLedger(ctx context.Context, rows, fresh []LedgerRow) (changed int64, err error) {
	changed, err = s.writeLedgerTx(ctx, rows, fresh, false)
	if errors.Is(err, errSkipped) {
		changed, err = s.writeLedgerTx(ctx, rows, fresh, true)
	}
	return changed, err
}

// errSkipped says a ledger statement skipped rows: the transaction is to
// be written again, exact.
var errSkipped = errors.New("ledger rows skipped")

// writeLedgerTx is writeLedger's transaction; exact tells which rows each
// ledger statement changed by the ids it returns, else it fails with
// errSkipped when a statement changed fewer rows than it was given.
func (s *Store) writeLedgerTx(ctx context.Context, rows, fresh []LedgerRow, exact bool) (changed int64, err error) {
	// The transaction runs on a connection of its own so that refreshOpen
	// can reach the driver under it (see refreshOpen).
	conn, err := s.write.Conn(ctx)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback()
	if err := s.refreshOpen(ctx, conn, fresh); err != nil {
		return 0, err
	}

	// SQLite: the rows this transaction inserts are those above mark
	// (usageEventsSQL); -1 when none of rows can be an event.
	mark := int64(-1)
	if s.eventsMark != nil && eventful(rows) {
		if err := tx.StmtContext(ctx, s.eventsMark).QueryRowContext(ctx).Scan(&mark); err != nil {
			return 0, err
		}
	}

	stamp := now()
	// Sized for this batch: the writer's transactions are mostly a few
	// rows, and the largest statement's arguments are 26 KiB.
	args := make([]any, 0, min(len(rows), ledgerChunks[0])*len(ledgerCols))
	ids := make([]string, 0, min(len(rows), ledgerChunks[0]))
	gateway := ""
	if s.engine == enginePostgres {
		gateway = s.instance // whose hold a final row's cost leaves
	}
	var spend spendDelta
	var scratch []byte // the attempt log's JSON, row after row
	for len(rows) > 0 {
		run := distinctRun(rows)
		rest := rows[len(run):]
		for i, n := range ledgerChunks {
			if len(run) < n {
				continue
			}
			var st *sql.Stmt // exact: ledgerExact's; else the driver's (insertRaw)
			if exact {
				st = tx.StmtContext(ctx, s.ledgerExact[i])
			}
			for len(run) >= n {
				args, ids = args[:0], ids[:0]
				for _, r := range run[:n] {
					var id string
					if args, id, err = appendLedgerArgs(args, &r, stamp, s.instance, &scratch); err != nil {
						return 0, err
					}
					ids = append(ids, id)
				}
				k, err := s.execLedger(ctx, conn, i, st, args, ids, run[:n], stamp, gateway, &spend)
				if err != nil {
					return 0, err
				}
				changed += k
				run = run[n:]
			}
		}
		rows = rest
	}
	if mark >= 0 {
		if _, err := tx.StmtContext(ctx, s.eventsInsert).ExecContext(ctx, mark); err != nil {
			return 0, err
		}
	}
	used, err := spend.apply(ctx, tx, &s.spend)
	if err != nil {
		return 0, err
	}
	if err := tx.Commit(); err != nil {
		return 0, err
	}
	s.spend.usedAt(used)
	return changed, nil
}

// execLedger runs one ledger statement of ledgerChunks[i] rows with args,
// for rows (whose ids are ids, generated where a row had none), and adds
// the final rows it inserted or changed to spend. It returns how many rows
// it inserted or changed. With exact, a ledgerExact statement on the
// transaction, it counts the rows by the ids st returns; else (st nil) it
// runs the statement on the driver under conn (insertRaw) and fails with
// errSkipped if it did not change every row.
func (s *Store) execLedger(ctx context.Context, conn *sql.Conn, i int, st *sql.Stmt, args []any, ids []string, rows []LedgerRow,
	stamp time.Time, gateway string, spend *spendDelta) (int64, error) {
	exact := st != nil
	count := func(r *LedgerRow) {
		if r.Outcome == OutcomeOpen {
			return
		}
		ts := r.Time
		if ts.IsZero() {
			ts = stamp
		}
		spend.add(r.TenantID, r.KeyID, gateway, toMicros(ts), r.PromptTokens+r.CompletionTokens, r.CostMicros, r.Outcome)
	}
	if !exact {
		n, err := s.insertRaw(ctx, conn, i, args)
		if err != nil {
			return 0, err
		}
		if n < int64(len(rows)) {
			return 0, errSkipped
		}
		for i := range rows {
			count(&rows[i])
		}
		return n, nil
	}
	res, err := st.QueryContext(ctx, args...)
	if err != nil {
		return 0, err
	}
	defer res.Close()
	var changed int64
	var id sql.RawBytes
	next := 0 // rows come back in the statement's order, as a rule
	for res.Next() {
		if err := res.Scan(&id); err != nil {
			return 0, err
		}
		changed++
		j := next
		for j < len(ids) && ids[j] != string(id) {
			j++
		}
		if j == len(ids) {
			j = 0
			for j < next && ids[j] != string(id) {
				j++
			}
			if j == next {
				return 0, fmt.Errorf("ledger statement returned id %q it was not given", id)
			}
		}
		next = j + 1
		count(&rows[j])
	}
	if err := res.Err(); err != nil {
		return 0, err
	}
	return changed, res.Close()
}

// refreshOpen writes fresh's billable figures to ledger_live inside the
// transaction open on conn. With 500 streams open that is about 8,000 rows
// a second, and through database/sql each statement's arguments became a
// new []driver.NamedValue (40 bytes an argument): 2.3 MB of garbage a
// second, which the collector let pile up between collections as resident
// memory the streams seemed to hold. The statements therefore run on the
// driver itself (sql.Conn.Raw), prepared once per driver connection, with
// one argument slice the writer keeps (liveRefresh).
func (s *Store) refreshOpen(ctx context.Context, conn *sql.Conn, fresh []LedgerRow) error {
	if len(fresh) == 0 {
		return nil
	}
	return conn.Raw(func(dc any) error {
		lr := &s.live
		lr.mu.Lock()
		defer lr.mu.Unlock()
		lr.use(dc)
		for i, n := range ledgerChunks {
			for len(fresh) >= n {
				st, err := lr.stmt(ctx, dc, i, n)
				if err != nil {
					return err
				}
				args := lr.args[:0]
				for _, r := range fresh[:n] {
					args = append(args,
						driver.NamedValue{Ordinal: len(args) + 1, Value: r.ID},
						driver.NamedValue{Ordinal: len(args) + 2, Value: r.PromptTokens},
						driver.NamedValue{Ordinal: len(args) + 3, Value: r.CompletionTokens},
						driver.NamedValue{Ordinal: len(args) + 4, Value: r.HedgeOverheadTokens},
						driver.NamedValue{Ordinal: len(args) + 5, Value: r.CostMicros})
				}
				lr.args = args
				_, err = st.ExecContext(ctx, args)
				clear(args) // hold no row's id until the next refresh
				if err != nil {
					return err
				}
				fresh = fresh[n:]
			}
		}
		return nil
	})
}

// insertRaw runs the ledger insert of ledgerChunks[i] rows with args on
// the driver connection under conn, inside the transaction open on it, and
// returns the rows it changed. Through database/sql each execution
// converted every argument again and made a new []driver.NamedValue for
// them (31 a row); here the statements are prepared once per driver
// connection and the argument slice is kept (liveRefresh), as for
// refreshOpen.
func (s *Store) insertRaw(ctx context.Context, conn *sql.Conn, i int, args []any) (changed int64, err error) {
	err = conn.Raw(func(dc any) error {
		lr := &s.live
		lr.mu.Lock()
		defer lr.mu.Unlock()
		lr.use(dc)
		st, err := lr.prepared(ctx, dc, &lr.inserts[i], ledgerInsertSQL, ledgerChunks[i])
		if err != nil {
			return err
		}
		nv := lr.insertArgs[:0]
		for j, a := range args {
			nv = append(nv, driver.NamedValue{Ordinal: j + 1, Value: a})
		}
		lr.insertArgs = nv
		res, err := st.ExecContext(ctx, nv)
		clear(nv) // hold no row's values until the next insert
		if err != nil {
			return err
		}
		changed, err = res.RowsAffected()
		return err
	})
	return changed, err
}

// liveRefresh is the state of refreshOpen and insertRaw: their
// statements, prepared on the driver connection conn, and their argument
// slices.
type liveRefresh struct {
	mu         sync.Mutex
	conn       any
	stmts      [len(ledgerChunks)]driver.Stmt // refreshOpen's
	args       []driver.NamedValue
	inserts    [len(ledgerChunks)]driver.Stmt // insertRaw's
	insertArgs []driver.NamedValue
}

// use makes dc the driver connection lr's statements are prepared on,
// closing those of the one before.
func (lr *liveRefresh) use(dc any) {
	if lr.conn != dc {
		lr.closeLocked()
		lr.conn = dc
	}
}

// stmt returns the statement refreshing ledgerChunks[i] (n) rows on the
// driver connection dc, preparing it the first time.
func (lr *liveRefresh) stmt(ctx context.Context, dc any, i, n int) (driver.StmtExecContext, error) {
	return lr.prepared(ctx, dc, &lr.stmts[i], ledgerRefreshSQL, n)
}

// prepared returns *slot, the statement query(n) on the driver connection
// dc, preparing it the first time.
func (lr *liveRefresh) prepared(ctx context.Context, dc any, slot *driver.Stmt, query func(int) string, n int) (driver.StmtExecContext, error) {
	if *slot == nil {
		p, ok := dc.(driver.ConnPrepareContext)
		if !ok {
			return nil, fmt.Errorf("prepare ledger statement: the driver connection %T cannot prepare with a context", dc)
		}
		st, err := p.PrepareContext(ctx, query(n))
		if err != nil {
			return nil, fmt.Errorf("prepare ledger statement: %w", err)
		}
		*slot = st
	}
	st, ok := (*slot).(driver.StmtExecContext)
	if !ok {
		return nil, fmt.Errorf("ledger statement: the driver statement %T cannot execute with a context", *slot)
	}
	return st, nil
}

// closeLocked closes the statements of the driver connection refreshOpen
// and insertRaw used last (one the pool has replaced, or, from
// Store.Close, the last).
func (lr *liveRefresh) closeLocked() error {
	var errs []error
	for _, sts := range []*[len(ledgerChunks)]driver.Stmt{&lr.stmts, &lr.inserts} {
		for i, st := range sts {
			if st != nil {
				errs = append(errs, st.Close())
				sts[i] = nil
			}
		}
	}
	lr.conn = nil
	return errors.Join(errs...)
}

// distinctRun returns the longest head of rows in which no ID repeats. A
// batch may hold a stream's open row and then its final one; SQLite applies
// one statement's rows in order, but PostgreSQL refuses an upsert that
// touches a row twice, so such rows go in separate statements, in order.
// Rows with no ID yet get distinct ones.
func distinctRun(rows []LedgerRow) []LedgerRow {
	if len(rows) < 2 {
		return rows
	}
	seen := make(map[string]struct{}, min(len(rows), ledgerChunks[0]))
	for i, r := range rows {
		if r.ID == "" {
			continue
		}
		if _, dup := seen[r.ID]; dup {
			return rows[:i]
		}
		seen[r.ID] = struct{}{}
	}
	return rows
}

// appendLedgerArgs appends r's columns to args, and returns the row's id
// (generated if r has none). scratch is attemptLogArg's. The values are
// the driver's own types (int64, string, nil): database/sql converts any
// other, a named string type such as Outcome, by reflection.
func appendLedgerArgs(args []any, r *LedgerRow, stamp time.Time, gateway string, scratch *[]byte) ([]any, string, error) {
	log := attemptLogArg(r, scratch)
	id := r.ID
	if id == "" {
		var b [8]byte
		if _, err := rand.Read(b[:]); err != nil {
			return nil, "", err
		}
		id = "req_" + hex.EncodeToString(b[:])
	}
	ts := r.Time
	if ts.IsZero() {
		ts = stamp
	}
	st := &r.Stages
	return append(args,
		id, toMicros(ts), r.TenantID, r.KeyID, r.Model, r.Upstream, boolInt(r.Stream),
		r.PromptTokens, r.CompletionTokens, r.HedgeOverheadTokens, r.CostMicros,
		int64(r.Status), string(r.Outcome), string(r.Error), int64(r.Attempts), boolInt(r.Hedged),
		stageArg(st.Gateway), stageArg(st.Connect), stageArg(st.UpstreamTTFT), stageArg(st.EngineQueue),
		stageArg(st.EngineTTFT), stageArg(st.Network), stageArg(st.TTFT), stageArg(st.Total),
		r.Priority, stageArg(r.QueueWait), gateway, log, stageArg(st.Hold), r.Endpoint, r.ReplayOf,
	), id, nil
}

func boolInt(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// stageArg maps a stage duration to its column: microseconds, or NULL when
// negative (unknown).
func stageArg(d time.Duration) any {
	if d < 0 {
		return nil
	}
	return d.Microseconds()
}

func stageFromNull(v sql.NullInt64) time.Duration {
	if !v.Valid {
		return -1
	}
	return time.Duration(v.Int64) * time.Microsecond
}
