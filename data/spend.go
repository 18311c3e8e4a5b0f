package data

import (
	"cmp"
	"context"
	"database/sql"
	"fmt"
	"maps"
	"slices"
)

// Spend is kept by the transactions that write ledger rows: a ledger
// statement returns the rows it inserted or changed (RETURNING), and the
// final ones among them — a row inserted final, or an open row made final —
// are summed per tenant, tenant and day, key, and gateway's hold, then
// written with one statement per total in the same transaction. A row the
// upsert skipped (final already: a retried batch, a commit log recovered
// twice) is not returned, so it is never counted twice; an open row is not
// spend until it is final. The totals: tenant_spend, tenant_daily_spend
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
// upserts and an update; a batch of one key's rows costs four statements
// here however many rows it holds.
//
// Lock order (PostgreSQL, gateways sharing a database): the totals are
// written table by table in the order of spendSQL, each table's rows in
// key order, after all of the transaction's ledger rows. Every transaction
// that writes them does so, so two cannot wait for each other.

// spendSQL are the statements that add a batch's totals, in the order they
// run (the lock order above).
var spendSQL = [...]string{
	spendDay: `INSERT INTO tenant_daily_spend (tenant_id, day, tokens, micros, requests) VALUES (?, ?, ?, ?, ?)
		ON CONFLICT (tenant_id, day) DO UPDATE SET tokens = tenant_daily_spend.tokens + excluded.tokens,
		micros = tenant_daily_spend.micros + excluded.micros, requests = tenant_daily_spend.requests + excluded.requests`,
	spendKey: `INSERT INTO key_spend (key_id, tokens, micros, requests) VALUES (?, ?, ?, ?)
		ON CONFLICT (key_id) DO UPDATE SET tokens = key_spend.tokens + excluded.tokens,
		micros = key_spend.micros + excluded.micros, requests = key_spend.requests + excluded.requests`,
	// The key's newest final row of the batch, unless the key was used
	// within the minute before it.
	spendLastUsed: `UPDATE api_keys SET last_used_at = ? WHERE id = ? AND COALESCE(last_used_at, 0) <= ?`,
	spendTenant: `INSERT INTO tenant_spend (tenant_id, tokens, micros) VALUES (?, ?, ?)
		ON CONFLICT (tenant_id) DO UPDATE SET tokens = tenant_spend.tokens + excluded.tokens,
		micros = tenant_spend.micros + excluded.micros`,
	spendHold: `UPDATE budget_holds SET tokens = GREATEST(tokens - ?, 0), micros = GREATEST(micros - ?, 0)
		WHERE gateway = ? AND tenant_id = ?`,
}

const (
	spendDay = iota
	spendKey
	spendLastUsed
	spendTenant
	spendHold
	spendStatements
)

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
// (the lock order), with the prepared statements st (in spendSQL's order;
// nil: prepared in tx).
func (d *spendDelta) apply(ctx context.Context, tx *sql.Tx, st *[spendStatements]*sql.Stmt) error {
	if d.tenants == nil {
		return nil
	}
	exec := func(i int, args ...any) error {
		var err error
		if st != nil && st[i] != nil {
			_, err = tx.StmtContext(ctx, st[i]).ExecContext(ctx, args...)
		} else {
			_, err = tx.ExecContext(ctx, spendSQL[i], args...)
		}
		if err != nil {
			return fmt.Errorf("add spend: %w", err)
		}
		return nil
	}
	for _, k := range sortedKeys(d.days, func(a, b tenantDay) int {
		return cmp.Or(cmp.Compare(a.tenant, b.tenant), cmp.Compare(a.day, b.day))
	}) {
		c := d.days[k]
		if err := exec(spendDay, k.tenant, k.day, c.tokens, c.micros, c.requests); err != nil {
			return err
		}
	}
	keys := sortedKeys(d.keys, cmp.Compare[string])
	for _, k := range keys {
		c := d.keys[k]
		if err := exec(spendKey, k, c.tokens, c.micros, c.requests); err != nil {
			return err
		}
	}
	for _, k := range keys {
		c := d.keys[k]
		if err := exec(spendLastUsed, c.last, k, c.last-lastUsedEvery); err != nil {
			return err
		}
	}
	for _, k := range sortedKeys(d.tenants, cmp.Compare[int64]) {
		t := d.tenants[k]
		if err := exec(spendTenant, k, t.Tokens, t.Micros); err != nil {
			return err
		}
	}
	for _, k := range sortedKeys(d.holds, func(a, b gatewayTenant) int {
		return cmp.Or(cmp.Compare(a.gateway, b.gateway), cmp.Compare(a.tenant, b.tenant))
	}) {
		h := d.holds[k]
		if err := exec(spendHold, h.Tokens, h.Micros, k.gateway, k.tenant); err != nil {
			return err
		}
	}
	return nil
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
	return n, d.apply(ctx, tx, nil)
}
