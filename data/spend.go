package data

import (
	"cmp"
	"context"
	"database/sql"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// Spend is kept by the transactions that write ledger rows: the final rows
// a ledger statement inserted or changed — a row inserted final, or an open
// row made final — are summed per tenant, tenant and day, key, and
// gateway's hold, then written in the same transaction: on SQLite an upsert
// of many totals per table (spendChunks), on PostgreSQL one script of all
// of them (applyScript). A row the upsert skipped (final already: a retried
// batch, a commit log recovered twice) is never counted twice (see
// writeLedger); an open row is not spend until it is final. The totals: tenant_spend, tenant_daily_spend
// (day = ts / 86400000000), key_spend (rows refused as rejected or
// upstream_rejected count their tokens and cost but not as requests), the
// key's last_used_at (the batch's newest row of the key, moved at most once
// a minute), and on PostgreSQL the writing gateway's budget hold, less the
// rows' tokens and cost and never below zero (for amounts that are not
// negative, the batch's sum taken at once leaves what row by row would), so
// that spend plus holds never counts a request twice.
//
// Why in Go rather than in triggers (as migrations 0001 to 0013 had it,
// until 0021): a trigger runs its statements for every final row, three
// upserts and an update; a batch costs three upserts here (more only past
// 16 keys or tenants), a key's last use once a minute.
//
// Lock order (PostgreSQL, gateways sharing a database): the totals are
// written table by table in the order of spendSQL, each table's rows in
// key order, after all of the transaction's ledger rows. Every transaction
// that writes them does so, so two cannot wait for each other.

// spendTable is a spend total: its table, the columns that key it and the
// sums a batch adds to it.
type spendTable struct {
	name       string
	keys, sums []string
}

// spendTables are the totals a batch adds, in the order they are written
// (the lock order above); a key's last_used_at and, on PostgreSQL, the
// holds follow them.
var spendTables = [...]spendTable{
	spendDay:    {"tenant_daily_spend", []string{"tenant_id", "day"}, []string{"tokens", "micros", "requests"}},
	spendKey:    {"key_spend", []string{"key_id"}, []string{"tokens", "micros", "requests"}},
	spendTenant: {"tenant_spend", []string{"tenant_id"}, []string{"tokens", "micros"}},
}

const (
	spendDay = iota
	spendKey
	spendTenant
)

// spendChunks are the row counts of the prepared upserts of each total, as
// ledgerChunks are the ledger's: a batch's totals of one table take a
// statement or a few, whatever the keys and tenants it touches.
var spendChunks = [...]int{16, 4, 1}

// sql is the upsert of rows totals into t, in key order.
func (t spendTable) sql(rows int) string {
	cols := append(slices.Clone(t.keys), t.sums...)
	one := "(" + strings.TrimSuffix(strings.Repeat("?, ", len(cols)), ", ") + ")"
	var b strings.Builder
	b.WriteString("INSERT INTO " + t.name + " (" + strings.Join(cols, ", ") + ") VALUES ")
	for i := range rows {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(one)
	}
	b.WriteString(" ON CONFLICT (" + strings.Join(t.keys, ", ") + ") DO UPDATE SET ")
	for i, c := range t.sums {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(c + " = " + t.name + "." + c + " + excluded." + c)
	}
	return b.String()
}

const (
	// lastUsedSQL moves a key's last use to its newest final row of the
	// batch, unless the key was used within the minute before it.
	lastUsedSQL = `UPDATE api_keys SET last_used_at = ? WHERE id = ? AND COALESCE(last_used_at, 0) <= ?`
	holdSQL     = `UPDATE budget_holds SET tokens = GREATEST(tokens - ?, 0), micros = GREATEST(micros - ?, 0)
		WHERE gateway = ? AND tenant_id = ?`
)

// spendStmts are the prepared statements that write spend.
type spendStmts struct {
	upsert   [len(spendTables)][len(spendChunks)]*sql.Stmt
	lastUsed *sql.Stmt
	hold     *sql.Stmt // PostgreSQL only

	// lastUsed is, per key, a time its last_used_at is known to be at or
	// past (it only ever moves forward): the time this store last set it
	// to. A batch whose newest row of the key is within the minute after
	// it would not move it, and skips the statement: a key in steady use
	// costs one a minute, not one a batch.
	mu   sync.Mutex
	used map[string]int64
}

func (s *Store) prepareSpend() error {
	st := &s.spend
	for i, t := range spendTables {
		for j, n := range spendChunks {
			p, err := s.write.Prepare(t.sql(n))
			if err != nil {
				return fmt.Errorf("prepare spend: %w", err)
			}
			st.upsert[i][j] = p
		}
	}
	var err error
	if st.lastUsed, err = s.write.Prepare(lastUsedSQL); err != nil {
		return fmt.Errorf("prepare spend: %w", err)
	}
	if s.engine == enginePostgres { // SQLite's one gateway holds no budget in the database
		if st.hold, err = s.write.Prepare(holdSQL); err != nil {
			return fmt.Errorf("prepare spend: %w", err)
		}
	}
	st.used = make(map[string]int64)
	return nil
}

// close closes the statements.
func (st *spendStmts) close() []error {
	var errs []error
	for _, t := range st.upsert {
		for _, p := range t {
			if p != nil {
				errs = append(errs, p.Close())
			}
		}
	}
	for _, p := range []*sql.Stmt{st.lastUsed, st.hold} {
		if p != nil {
			errs = append(errs, p.Close())
		}
	}
	return errs
}

// lastUsedEvery is how often a key's last_used_at moves at most (µs).
const lastUsedEvery = 60_000_000

type tenantDay struct{ tenant, day int64 }

type gatewayTenant struct {
	gateway string
	tenant  int64
}

// counted is a total of final rows.
type counted struct {
	tokens, micros, requests int64
	last                     int64 // the newest row's time (µs), for last_used_at
}

// spendDelta is what the final rows a transaction wrote add to spend.
type spendDelta struct {
	tenants map[int64]Spend
	days    map[tenantDay]counted
	keys    map[string]counted
	holds   map[gatewayTenant]Spend
}

// add counts one final row. gateway is the row's ("" for none, and on
// SQLite, whose one gateway holds no budget in the database).
func (d *spendDelta) add(tenant int64, key, gateway string, ts, tokens, micros int64, outcome Outcome) {
	if d.tenants == nil {
		d.tenants = make(map[int64]Spend)
		d.days = make(map[tenantDay]counted)
		d.keys = make(map[string]counted)
	}
	var req int64 = 1
	if outcome == OutcomeRejected || outcome == OutcomeUpstreamRejected {
		req = 0
	}
	t := d.tenants[tenant]
	t.Tokens += tokens
	t.Micros += micros
	d.tenants[tenant] = t
	day := tenantDay{tenant, ts / microsPerDay}
	c := d.days[day]
	c.tokens, c.micros, c.requests = c.tokens+tokens, c.micros+micros, c.requests+req
	d.days[day] = c
	if key != "" {
		c, ok := d.keys[key]
		if !ok || ts > c.last {
			c.last = ts
		}
		c.tokens, c.micros, c.requests = c.tokens+tokens, c.micros+micros, c.requests+req
		d.keys[key] = c
	}
	if gateway != "" {
		if d.holds == nil {
			d.holds = make(map[gatewayTenant]Spend)
		}
		k := gatewayTenant{gateway, tenant}
		h := d.holds[k]
		h.Tokens += tokens
		h.Micros += micros
		d.holds[k] = h
	}
}

// apply writes d in tx, table by table and each table's rows in key order
// (the lock order). It returns the last uses it set, to be noted with
// usedAt once tx committed.
func (d *spendDelta) apply(ctx context.Context, tx *sql.Tx, st *spendStmts) (map[string]int64, error) {
	if d.tenants == nil {
		return nil, nil
	}
	if st.hold != nil {
		return d.applyScript(ctx, tx, st)
	}
	var args []any
	upsert := func(table int, n int, row func(i int) []any) error {
		for i := 0; i < n; {
			for j, c := range spendChunks {
				if n-i < c {
					continue
				}
				args = args[:0]
				for k := range c {
					args = append(args, row(i+k)...)
				}
				if _, err := tx.StmtContext(ctx, st.upsert[table][j]).ExecContext(ctx, args...); err != nil {
					return fmt.Errorf("add spend to %s: %w", spendTables[table].name, err)
				}
				i += c
				break
			}
		}
		return nil
	}
	days := sortedKeys(d.days, func(a, b tenantDay) int {
		return cmp.Or(cmp.Compare(a.tenant, b.tenant), cmp.Compare(a.day, b.day))
	})
	if err := upsert(spendDay, len(days), func(i int) []any {
		c := d.days[days[i]]
		return []any{days[i].tenant, days[i].day, c.tokens, c.micros, c.requests}
	}); err != nil {
		return nil, err
	}
	keys := sortedKeys(d.keys, cmp.Compare[string])
	if err := upsert(spendKey, len(keys), func(i int) []any {
		c := d.keys[keys[i]]
		return []any{keys[i], c.tokens, c.micros, c.requests}
	}); err != nil {
		return nil, err
	}
	var used map[string]int64
	st.mu.Lock()
	for _, k := range keys {
		if at, ok := st.used[k]; ok && d.keys[k].last-lastUsedEvery < at {
			delete(d.keys, k) // would not move: no statement
		}
	}
	st.mu.Unlock()
	for _, k := range keys {
		c, ok := d.keys[k]
		if !ok {
			continue
		}
		res, err := tx.StmtContext(ctx, st.lastUsed).ExecContext(ctx, c.last, k, c.last-lastUsedEvery)
		if err != nil {
			return nil, fmt.Errorf("note last use of key %s: %w", k, err)
		}
		if n, err := res.RowsAffected(); err == nil && n > 0 {
			if used == nil {
				used = make(map[string]int64)
			}
			used[k] = c.last
		}
	}
	tenants := sortedKeys(d.tenants, cmp.Compare[int64])
	if err := upsert(spendTenant, len(tenants), func(i int) []any {
		t := d.tenants[tenants[i]]
		return []any{tenants[i], t.Tokens, t.Micros}
	}); err != nil {
		return nil, err
	}
	for _, k := range sortedKeys(d.holds, func(a, b gatewayTenant) int {
		return cmp.Or(cmp.Compare(a.gateway, b.gateway), cmp.Compare(a.tenant, b.tenant))
	}) {
		h := d.holds[k]
		if _, err := tx.StmtContext(ctx, st.hold).ExecContext(ctx, h.Tokens, h.Micros, k.gateway, k.tenant); err != nil {
			return nil, fmt.Errorf("take spend out of holds: %w", err)
		}
	}
	return used, nil
}

// applyScript is apply on PostgreSQL: the same statements, in the same
// order, sent as one script with their values written in (the simple
// query protocol runs a script's statements in order, in one round trip).
// A statement a round trip cost the writer's transaction five or more
// round trips a batch where the triggers had cost none, and under load an
// open row then reached the database later than a killed gateway's
// stream had run. A key's last use is noted as set without knowing that it
// moved (a script returns one result): with several gateways on one
// database it may lag a key's newest use by up to two minutes instead of
// one.
func (d *spendDelta) applyScript(ctx context.Context, tx *sql.Tx, st *spendStmts) (map[string]int64, error) {
	var b strings.Builder
	values := func(t spendTable, n int, row func(i int, b *strings.Builder)) {
		if n == 0 {
			return
		}
		cols := append(slices.Clone(t.keys), t.sums...)
		b.WriteString("INSERT INTO " + t.name + " (" + strings.Join(cols, ", ") + ") VALUES ")
		for i := range n {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteByte('(')
			row(i, &b)
			b.WriteByte(')')
		}
		b.WriteString(" ON CONFLICT (" + strings.Join(t.keys, ", ") + ") DO UPDATE SET ")
		for i, c := range t.sums {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString(c + " = " + t.name + "." + c + " + excluded." + c)
		}
		b.WriteString(";\n")
	}
	ints := func(b *strings.Builder, vs ...int64) {
		for i, v := range vs {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString(strconv.FormatInt(v, 10))
		}
	}
	days := sortedKeys(d.days, func(a, b tenantDay) int {
		return cmp.Or(cmp.Compare(a.tenant, b.tenant), cmp.Compare(a.day, b.day))
	})
	values(spendTables[spendDay], len(days), func(i int, b *strings.Builder) {
		c := d.days[days[i]]
		ints(b, days[i].tenant, days[i].day, c.tokens, c.micros, c.requests)
	})
	keys := sortedKeys(d.keys, cmp.Compare[string])
	values(spendTables[spendKey], len(keys), func(i int, b *strings.Builder) {
		c := d.keys[keys[i]]
		b.WriteString(quoteLiteral(keys[i]) + ", ")
		ints(b, c.tokens, c.micros, c.requests)
	})
	var used map[string]int64
	st.mu.Lock()
	for _, k := range keys {
		c := d.keys[k]
		if at, ok := st.used[k]; ok && c.last-lastUsedEvery < at {
			continue
		}
		b.WriteString("UPDATE api_keys SET last_used_at = " + strconv.FormatInt(c.last, 10) + " WHERE id = " + quoteLiteral(k) +
			" AND COALESCE(last_used_at, 0) <= " + strconv.FormatInt(c.last-lastUsedEvery, 10) + ";\n")
		if used == nil {
			used = make(map[string]int64)
		}
		used[k] = c.last
	}
	st.mu.Unlock()
	tenants := sortedKeys(d.tenants, cmp.Compare[int64])
	values(spendTables[spendTenant], len(tenants), func(i int, b *strings.Builder) {
		t := d.tenants[tenants[i]]
		ints(b, tenants[i], t.Tokens, t.Micros)
	})
	for _, k := range sortedKeys(d.holds, func(a, b gatewayTenant) int {
		return cmp.Or(cmp.Compare(a.gateway, b.gateway), cmp.Compare(a.tenant, b.tenant))
	}) {
		h := d.holds[k]
		b.WriteString("UPDATE budget_holds SET tokens = GREATEST(tokens - " + strconv.FormatInt(h.Tokens, 10) +
			", 0), micros = GREATEST(micros - " + strconv.FormatInt(h.Micros, 10) + ", 0) WHERE gateway = " +
			quoteLiteral(k.gateway) + " AND tenant_id = " + strconv.FormatInt(k.tenant, 10) + ";\n")
	}
	if _, err := tx.ExecContext(ctx, b.String()); err != nil {
		return nil, fmt.Errorf("add spend: %w", err)
	}
	return used, nil
}

// quoteLiteral is s as a PostgreSQL string literal (standard_conforming_strings,
// the default: a backslash is itself, a quote is doubled).
func quoteLiteral(s string) string {
	return "'" + strings.ReplaceAll(s, "'", "''") + "'"
}

// usedAt notes the last uses a committed transaction set (apply's result).
func (st *spendStmts) usedAt(used map[string]int64) {
	if len(used) == 0 {
		return
	}
	st.mu.Lock()
	for k, at := range used {
		if at > st.used[k] {
			st.used[k] = at
		}
	}
	st.mu.Unlock()
}

func sortedKeys[K comparable, V any](m map[K]V, cmp func(a, b K) int) []K {
	if len(m) == 1 {
		for k := range m {
			return []K{k}
		}
	}
	return slices.SortedFunc(maps.Keys(m), cmp)
}

// settledSpend is the RETURNING list of a statement that makes open rows
// final (settling them): what spendDelta.add needs of each.
const settledSpend = ` RETURNING tenant_id, key_id, gateway, ts, prompt_tokens + completion_tokens, cost_micros, outcome`

// settleRows runs q, an UPDATE of open ledger rows to final ones ending in
// settledSpend, in tx, adds the rows it changed to spend, and returns how
// many there were.
func (s *Store) settleRows(ctx context.Context, tx *sql.Tx, q string, args ...any) (int, error) {
	rows, err := tx.QueryContext(ctx, q, args...)
	if err != nil {
		return 0, err
	}
	defer rows.Close()
	var d spendDelta
	n := 0
	for rows.Next() {
		var tenant, ts, tokens, micros int64
		var key, gateway string
		var outcome Outcome
		if err := rows.Scan(&tenant, &key, &gateway, &ts, &tokens, &micros, &outcome); err != nil {
			return 0, err
		}
		if s.engine != enginePostgres {
			gateway = ""
		}
		d.add(tenant, key, gateway, ts, tokens, micros, outcome)
		n++
	}
	if err := rows.Err(); err != nil {
		return 0, err
	}
	if err := rows.Close(); err != nil {
		return 0, err
	}
	// The last uses it sets are not noted (settling is rare, and its
	// commit is its caller's).
	_, err = d.apply(ctx, tx, &s.spend)
	return n, err
}
