package data

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
)

// DefaultRecentLimit is how many rows RecentRequests returns for limit <= 0.
const DefaultRecentLimit = 100

// sumBigint is SUM(expr) as a 64-bit integer on both engines (PostgreSQL's
// SUM of a BIGINT is a NUMERIC). The sums select and group the same way on
// both: every selected column is grouped, as PostgreSQL requires.
func sumBigint(expr string) string { return "CAST(SUM(" + expr + ") AS BIGINT)" }

// where builds the WHERE clause for f over the ledger aliased l. The tenant is
// matched by id through a subquery so that the (tenant_id, ts) index serves
// it; Since is inclusive and Until exclusive.
func (f UsageFilter) where() (string, []any) {
	var conds []string
	var args []any
	if f.Tenant != "" {
		conds = append(conds, `l.tenant_id = (SELECT id FROM tenants WHERE name = ?)`)
		args = append(args, f.Tenant)
	}
	if !f.Since.IsZero() {
		conds = append(conds, `l.ts >= ?`)
		args = append(args, toMicros(f.Since))
	}
	if !f.Until.IsZero() {
		conds = append(conds, `l.ts < ?`)
		args = append(args, toMicros(f.Until))
	}
	if len(conds) == 0 {
		return "", nil
	}
	return " WHERE " + strings.Join(conds, " AND "), args
}

// Usage returns ledger totals per (tenant, key, model) for the rows f
// selects, ordered by tenant name, key id and model. Rows without a known
// tenant or key (requests rejected before auth) have "" there. Open rows
// (streams still running) are not counted, as they are not spend yet.
// Refused requests ([Outcome.Rejected]) count only in Rejected: whatever
// tokens their rows carry are not usage.
func (s *Store) Usage(ctx context.Context, f UsageFilter) ([]UsageRow, error) {
	where, args := f.where()
	if where == "" {
		where = " WHERE "
	} else {
		where += " AND "
	}
	where += "l.outcome <> '" + string(OutcomeOpen) + "'"
	rows, err := s.read.QueryContext(ctx, `SELECT COALESCE(t.name, ''), l.key_id, COALESCE(k.prefix, ''), l.model,
			`+sumBigint(`CASE WHEN `+rejectedSQL+` THEN 0 ELSE 1 END`)+`,
			`+sumBigint(`CASE WHEN `+rejectedSQL+` THEN 0 ELSE l.prompt_tokens END`)+`,
			`+sumBigint(`CASE WHEN `+rejectedSQL+` THEN 0 ELSE l.completion_tokens END`)+`,
			`+sumBigint(`CASE WHEN `+rejectedSQL+` THEN 0 ELSE l.cost_micros END`)+`,
			`+sumBigint(`CASE WHEN `+rejectedSQL+` THEN 1 ELSE 0 END`)+`
		FROM ledger l
		LEFT JOIN tenants t ON t.id = l.tenant_id
		LEFT JOIN api_keys k ON k.id = l.key_id`+where+`
		GROUP BY l.tenant_id, l.key_id, l.model, t.name, k.prefix
		ORDER BY 1, 2, 4`, args...)
	if err != nil {
		return nil, fmt.Errorf("usage: %w", err)
	}
	defer rows.Close()
	var out []UsageRow
	for rows.Next() {
		var u UsageRow
		if err := rows.Scan(&u.Tenant, &u.KeyID, &u.KeyPrefix, &u.Model,
			&u.Requests, &u.PromptTokens, &u.CompletionTokens, &u.CostMicros, &u.Rejected); err != nil {
			return nil, fmt.Errorf("usage: %w", err)
		}
		out = append(out, u)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("usage: %w", err)
	}
	return out, nil
}

// TenantSpend returns, per tenant id, the prompt+completion tokens and the
// cost of every final ledger row (hedge overhead is not billed, so not
// counted; open rows count once they are final or settled). It reads a
// total that triggers keep up to date, so it costs the same however long
// the ledger grows.
func (s *Store) TenantSpend(ctx context.Context) (map[int64]Spend, error) {
	rows, err := s.read.QueryContext(ctx, `SELECT tenant_id, tokens, micros FROM tenant_spend`)
	if err != nil {
		return nil, fmt.Errorf("tenant spend: %w", err)
	}
	defer rows.Close()
	out := make(map[int64]Spend)
	for rows.Next() {
		var id int64
		var sp Spend
		if err := rows.Scan(&id, &sp.Tokens, &sp.Micros); err != nil {
			return nil, fmt.Errorf("tenant spend: %w", err)
		}
		out[id] = sp
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("tenant spend: %w", err)
	}
	return out, nil
}

const ledgerSelect = `SELECT COALESCE(t.name, ''), l.id, l.ts, l.tenant_id, l.key_id, l.model, l.upstream, l.stream,
	l.prompt_tokens, l.completion_tokens, l.hedge_overhead_tokens, l.cost_micros,
	l.status, l.outcome, l.error, l.attempts, l.hedged,
	l.gateway_us, l.connect_us, l.upstream_ttft_us, l.engine_queue_us,
	l.engine_ttft_us, l.network_us, l.ttft_us, l.total_us, l.priority, l.queue_us, l.hold_us
	FROM ledger l LEFT JOIN tenants t ON t.id = l.tenant_id`

func scanLedger(r rowScanner) (LedgerRow, error) {
	var l LedgerRow
	var ts int64
	var stages [10]sql.NullInt64
	err := r.Scan(&l.Tenant, &l.ID, &ts, &l.TenantID, &l.KeyID, &l.Model, &l.Upstream, &l.Stream,
		&l.PromptTokens, &l.CompletionTokens, &l.HedgeOverheadTokens, &l.CostMicros,
		&l.Status, &l.Outcome, &l.Error, &l.Attempts, &l.Hedged,
		&stages[0], &stages[1], &stages[2], &stages[3], &stages[4], &stages[5], &stages[6], &stages[7], &l.Priority, &stages[8], &stages[9])
	if err != nil {
		return LedgerRow{}, err
	}
	l.Time = fromMicros(ts)
	l.Stages = Stages{
		Gateway:      stageFromNull(stages[0]),
		Connect:      stageFromNull(stages[1]),
		UpstreamTTFT: stageFromNull(stages[2]),
		EngineQueue:  stageFromNull(stages[3]),
		EngineTTFT:   stageFromNull(stages[4]),
		Network:      stageFromNull(stages[5]),
		TTFT:         stageFromNull(stages[6]),
		Total:        stageFromNull(stages[7]),
		Hold:         stageFromNull(stages[9]),
	}
	l.QueueWait = stageFromNull(stages[8])
	return l, nil
}

func (s *Store) queryLedger(ctx context.Context, q string, args ...any) ([]LedgerRow, error) {
	rows, err := s.read.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []LedgerRow
	for rows.Next() {
		l, err := scanLedger(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, l)
	}
	return out, rows.Err()
}

// RecentRequests returns up to limit ledger rows (DefaultRecentLimit if
// limit <= 0), newest first, of the named tenant ("" = all), with the
// tenant name filled.
func (s *Store) RecentRequests(ctx context.Context, limit int, tenant string) ([]LedgerRow, error) {
	if limit <= 0 {
		limit = DefaultRecentLimit
	}
	where, args := UsageFilter{Tenant: tenant}.where()
	out, err := s.queryLedger(ctx, ledgerSelect+where+` ORDER BY l.ts DESC, l.rowid DESC LIMIT ?`, append(args, limit)...)
	if err != nil {
		return nil, fmt.Errorf("recent requests: %w", err)
	}
	return out, nil
}

// LedgerRows returns every ledger row f selects, oldest first, with the
// tenant name filled. It loads them all into memory: it is meant for tests
// and exports, not for the request path.
func (s *Store) LedgerRows(ctx context.Context, f UsageFilter) ([]LedgerRow, error) {
	where, args := f.where()
	out, err := s.queryLedger(ctx, ledgerSelect+where+` ORDER BY l.ts, l.rowid`, args...)
	if err != nil {
		return nil, fmt.Errorf("ledger rows: %w", err)
	}
	return out, nil
}
