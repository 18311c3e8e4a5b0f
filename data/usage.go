package data

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/tailgate-dev/tailgate/data/commitlog"
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

// Groupings of [UsageFilter.By].
const (
	UsageByDay    = "day"
	UsageByWeek   = "week"
	UsageByMonth  = "month"
	UsageByTenant = "tenant"
	UsageByKey    = "key"
	UsageByModel  = "model"
)

// CheckUsageBy reports whether by is a grouping of [UsageFilter.By].
func CheckUsageBy(by string) error {
	switch by {
	case "", UsageByDay, UsageByWeek, UsageByMonth, UsageByTenant, UsageByKey, UsageByModel:
		return nil
	}
	return fmt.Errorf("group by %q: want day, week, month, tenant, key or model", by)
}

// usageKey is what a usage total is grouped by: a UTC day (always, so
// weeks and months roll up from days), tenant, key and model.
type usageKey struct {
	day      int64
	tenantID int64
	keyID    string
	model    string
}

// Usage returns ledger totals for the rows f selects, grouped as f.By says,
// ordered by period, then tenant name, key id and model. Rows without a
// known tenant or key (requests rejected before auth) have "" there. Open
// rows (streams still running) are not counted, as they are not spend yet.
// Refused requests ([Outcome.Rejected]) count only in Rejected: whatever
// tokens their rows carry are not usage.
//
// On SQLite, rows still only in the ledger's commit log (committed, not yet
// in the database: a running gateway writes them with its next batch) are
// counted too, so the newest request is always there.
func (s *Store) Usage(ctx context.Context, f UsageFilter) ([]UsageRow, error) {
	if err := CheckUsageBy(f.By); err != nil {
		return nil, fmt.Errorf("usage: %w", err)
	}
	out, err := s.usage(ctx, f)
	if err != nil {
		return nil, fmt.Errorf("usage: %w", err)
	}
	return out, nil
}

func (s *Store) usage(ctx context.Context, f UsageFilter) ([]UsageRow, error) {
	logged, err := s.loggedRows()
	if err != nil {
		return nil, err
	}
	// One read transaction, one snapshot: a logged row is counted from the
	// log exactly when the ledger's totals do not have it.
	tx, err := s.read.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return nil, err
	}
	defer tx.Rollback()
	where, args := f.where()
	if where == "" {
		where = " WHERE "
	} else {
		where += " AND "
	}
	where += "l.outcome <> '" + string(OutcomeOpen) + "'"
	day := fmt.Sprintf("(l.ts / %d)", microsPerDay)
	rows, err := tx.QueryContext(ctx, `SELECT `+day+`, l.tenant_id, l.key_id, l.model,
			`+sumBigint(`CASE WHEN `+rejectedSQL+` THEN 0 ELSE 1 END`)+`,
			`+sumBigint(`CASE WHEN `+rejectedSQL+` THEN 0 ELSE l.prompt_tokens END`)+`,
			`+sumBigint(`CASE WHEN `+rejectedSQL+` THEN 0 ELSE l.completion_tokens END`)+`,
			`+sumBigint(`CASE WHEN `+rejectedSQL+` THEN 0 ELSE l.cost_micros END`)+`,
			`+sumBigint(`CASE WHEN `+rejectedSQL+` THEN 1 ELSE 0 END`)+`
		FROM ledger l`+where+`
		GROUP BY `+day+`, l.tenant_id, l.key_id, l.model`, args...)
	if err != nil {
		return nil, err
	}
	totals := make(map[usageKey]*UsageRow)
	for rows.Next() {
		var k usageKey
		u := new(UsageRow)
		if err := rows.Scan(&k.day, &k.tenantID, &k.keyID, &k.model,
			&u.Requests, &u.PromptTokens, &u.CompletionTokens, &u.CostMicros, &u.Rejected); err != nil {
			rows.Close()
			return nil, err
		}
		totals[k] = u
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	rows.Close()
	names, err := usageNames(ctx, tx)
	if err != nil {
		return nil, err
	}
	if len(logged) > 0 {
		if err := addLogged(ctx, tx, totals, logged, f, names); err != nil {
			return nil, err
		}
	}
	return groupUsage(totals, f.By, names), nil
}

// usageNamesT are the names usage rows show: tenants by id, keys by id.
type usageNamesT struct {
	tenants  map[int64]string
	tenantID map[string]int64
	keys     map[string][2]string // prefix, name
}

func usageNames(ctx context.Context, tx *sql.Tx) (usageNamesT, error) {
	n := usageNamesT{tenants: map[int64]string{}, tenantID: map[string]int64{}, keys: map[string][2]string{}}
	rows, err := tx.QueryContext(ctx, `SELECT id, name FROM tenants`)
	if err != nil {
		return n, err
	}
	for rows.Next() {
		var id int64
		var name string
		if err := rows.Scan(&id, &name); err != nil {
			rows.Close()
			return n, err
		}
		n.tenants[id], n.tenantID[name] = name, id
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return n, err
	}
	rows, err = tx.QueryContext(ctx, `SELECT id, prefix, name FROM api_keys`)
	if err != nil {
		return n, err
	}
	defer rows.Close()
	for rows.Next() {
		var id, prefix, name string
		if err := rows.Scan(&id, &prefix, &name); err != nil {
			return n, err
		}
		n.keys[id] = [2]string{prefix, name}
	}
	return n, rows.Err()
}

// loggedRows returns the final rows in the ledger's commit log (SQLite),
// the last record of each id.
func (s *Store) loggedRows() ([]LedgerRow, error) {
	if s.engine != engineSQLite || s.path == "" {
		return nil, nil
	}
	base, err := s.commitLogBase()
	if err != nil {
		return nil, err
	}
	payloads, err := commitlog.Peek(base)
	if err != nil || len(payloads) == 0 {
		return nil, err
	}
	byID := make(map[string]int, len(payloads))
	var out []LedgerRow
	for _, p := range payloads {
		var r LedgerRow
		if err := json.Unmarshal(p, &r); err != nil || r.ID == "" || r.Outcome == OutcomeOpen {
			continue
		}
		if i, ok := byID[r.ID]; ok {
			out[i] = r
			continue
		}
		byID[r.ID] = len(out)
		out = append(out, r)
	}
	return out, nil
}

// addLogged adds to totals the logged rows f selects that the ledger has no
// final row for yet.
func addLogged(ctx context.Context, tx *sql.Tx, totals map[usageKey]*UsageRow, logged []LedgerRow, f UsageFilter, names usageNamesT) error {
	in := make(map[string]bool, len(logged))
	for chunk := range slices.Chunk(logged, 256) {
		args := make([]any, len(chunk))
		for i, r := range chunk {
			args[i] = r.ID
		}
		rows, err := tx.QueryContext(ctx, `SELECT id FROM ledger WHERE outcome <> '`+string(OutcomeOpen)+`' AND id IN (`+
			strings.TrimSuffix(strings.Repeat("?,", len(chunk)), ",")+`)`, args...)
		if err != nil {
			return err
		}
		for rows.Next() {
			var id string
			if err := rows.Scan(&id); err != nil {
				rows.Close()
				return err
			}
			in[id] = true
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
	}
	for _, r := range logged {
		switch {
		case in[r.ID],
			f.Tenant != "" && r.TenantID != names.tenantID[f.Tenant],
			!f.Since.IsZero() && r.Time.Before(f.Since),
			!f.Until.IsZero() && !r.Time.Before(f.Until):
			continue
		}
		k := usageKey{day: dayOf(r.Time), tenantID: r.TenantID, keyID: r.KeyID, model: r.Model}
		u := totals[k]
		if u == nil {
			u = new(UsageRow)
			totals[k] = u
		}
		if r.Outcome.Rejected() {
			u.Rejected++
			continue
		}
		u.Requests++
		u.PromptTokens += r.PromptTokens
		u.CompletionTokens += r.CompletionTokens
		u.CostMicros += r.CostMicros
	}
	return nil
}

// groupUsage rolls the daily totals up as by says, in order.
func groupUsage(totals map[usageKey]*UsageRow, by string, names usageNamesT) []UsageRow {
	type gk struct {
		period   time.Time
		tenantID int64
		keyID    string
		model    string
	}
	groups := make(map[gk]*UsageRow)
	for k, u := range totals {
		var g gk
		switch by {
		case UsageByDay:
			g.period = fromMicros(k.day * microsPerDay)
		case UsageByWeek:
			g.period = PeriodStart(PeriodWeekly, fromMicros(k.day*microsPerDay))
		case UsageByMonth:
			g.period = PeriodStart(PeriodMonthly, fromMicros(k.day*microsPerDay))
		case UsageByTenant:
			g.tenantID = k.tenantID
		case UsageByKey:
			g.tenantID, g.keyID = k.tenantID, k.keyID
		case UsageByModel:
			g.model = k.model
		default:
			g.tenantID, g.keyID, g.model = k.tenantID, k.keyID, k.model
		}
		r := groups[g]
		if r == nil {
			r = &UsageRow{Period: g.period, Tenant: names.tenants[g.tenantID], KeyID: g.keyID, Model: g.model}
			if g.keyID != "" {
				r.KeyPrefix, r.KeyName = names.keys[g.keyID][0], names.keys[g.keyID][1]
			}
			groups[g] = r
		}
		r.Requests += u.Requests
		r.PromptTokens += u.PromptTokens
		r.CompletionTokens += u.CompletionTokens
		r.CostMicros += u.CostMicros
		r.Rejected += u.Rejected
	}
	out := make([]UsageRow, 0, len(groups))
	for _, r := range groups {
		out = append(out, *r)
	}
	slices.SortFunc(out, func(a, b UsageRow) int {
		return cmp.Or(a.Period.Compare(b.Period), cmp.Compare(a.Tenant, b.Tenant), cmp.Compare(a.KeyID, b.KeyID), cmp.Compare(a.Model, b.Model))
	})
	return out
}

// TenantSpend returns, per tenant id, the prompt+completion tokens and the
// cost of every final ledger row (hedge overhead is not billed, so not
// counted; open rows count once they are final or settled). It reads a
// total that the transactions writing ledger rows keep up to date
// (spend.go), so it costs the same however long the ledger grows.
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

// ledgerSelect reads ledger rows; an open row's figures are its last
// refresh's (ledger_live), when it had one.
const ledgerSelect = `SELECT COALESCE(t.name, ''), l.id, l.ts, l.tenant_id, l.key_id, l.model, l.upstream, l.stream,
	COALESCE(v.prompt_tokens, l.prompt_tokens), COALESCE(v.completion_tokens, l.completion_tokens),
	COALESCE(v.hedge_overhead_tokens, l.hedge_overhead_tokens), COALESCE(v.cost_micros, l.cost_micros),
	l.status, l.outcome, l.error, l.attempts, l.hedged,
	l.gateway_us, l.connect_us, l.upstream_ttft_us, l.engine_queue_us,
	l.engine_ttft_us, l.network_us, l.ttft_us, l.total_us, l.priority, l.queue_us, l.hold_us, l.replay_of
	FROM ledger l LEFT JOIN tenants t ON t.id = l.tenant_id
	LEFT JOIN ledger_live v ON v.id = l.id AND l.outcome = 'open'`

func scanLedger(r rowScanner) (LedgerRow, error) {
	var l LedgerRow
	var ts int64
	var stages [10]sql.NullInt64
	err := r.Scan(&l.Tenant, &l.ID, &ts, &l.TenantID, &l.KeyID, &l.Model, &l.Upstream, &l.Stream,
		&l.PromptTokens, &l.CompletionTokens, &l.HedgeOverheadTokens, &l.CostMicros,
		&l.Status, &l.Outcome, &l.Error, &l.Attempts, &l.Hedged,
		&stages[0], &stages[1], &stages[2], &stages[3], &stages[4], &stages[5], &stages[6], &stages[7], &l.Priority, &stages[8], &stages[9], &l.ReplayOf)
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
