package data

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// UsageEvent is one version of a final ledger row of a tenant's request,
// as exported to billing systems (migration 0020). Its identity is
// (RequestID, Version) and never changes: a row's first final form is
// version 1, and a final row whose billed figures change later gets the
// next version, a new event, while the earlier one stays as it was. Open
// rows and rows of no tenant are not exported.
type UsageEvent struct {
	// Seq is the event's place in the export, increasing in the order the
	// events were committed (see [Store.UsageEvents]).
	Seq       int64
	RequestID string
	Version   int64
	// Time is when the request started (the ledger row's time): when the
	// usage happened, the same for every version.
	Time     time.Time
	TenantID int64
	Tenant   string // the tenant's name
	KeyID    string
	Model    string
	Endpoint string // the public path, e.g. /v1/chat/completions ("" when the row names none)

	PromptTokens     int64
	CompletionTokens int64
	CostMicros       int64
	Status           int
	Outcome          Outcome
	// ReplayOf is the request whose recorded answer this one replayed
	// (Idempotency-Key); "" for a request that ran.
	ReplayOf string
}

// MaxUsageEvents is the most events one [Store.UsageEvents] call returns.
const MaxUsageEvents = 5000

// usageSeqLockID is the PostgreSQL advisory lock that makes numbering
// usage events a single-writer step across gateways.
const usageSeqLockID = usageLockBase + 1

const usageLockBase = migrateLockID + 0x100

// UsageEvents returns up to limit events (1 to [MaxUsageEvents]) whose Seq
// is above after, in Seq order. Reading from the same after again returns
// the same events, and events committed later always come after every
// event returned: a consumer that keeps the last Seq it got and asks from
// there misses none and sees none twice.
//
// On SQLite an event's Seq is drawn in the transaction that writes its
// ledger row, and SQLite commits one write transaction at a time, so Seqs
// are in commit order. On PostgreSQL, where gateways commit concurrently,
// events are written without a Seq and numbered here first, in one
// transaction under an advisory lock, from the largest Seq committed: one
// sequencer at a time, so every Seq it gives is above any a reader could
// have seen already.
func (s *Store) UsageEvents(ctx context.Context, after int64, limit int) ([]UsageEvent, error) {
	if limit <= 0 || limit > MaxUsageEvents {
		limit = MaxUsageEvents
	}
	if s.engine == enginePostgres {
		if _, err := s.sequenceUsageEvents(ctx, max(limit, 500)); err != nil {
			return nil, fmt.Errorf("usage events: number: %w", err)
		}
	}
	rows, err := s.read.QueryContext(ctx, `SELECT e.seq, e.request_id, e.version, e.ts, e.tenant_id, COALESCE(t.name, ''),
		e.key_id, e.model, e.endpoint, e.prompt_tokens, e.completion_tokens, e.cost_micros, e.status, e.outcome, e.replay_of
		FROM usage_events e LEFT JOIN tenants t ON t.id = e.tenant_id
		WHERE e.seq > ? ORDER BY e.seq LIMIT ?`, after, limit)
	if err != nil {
		return nil, fmt.Errorf("usage events: %w", err)
	}
	defer rows.Close()
	var out []UsageEvent
	for rows.Next() {
		var e UsageEvent
		var ts int64
		if err := rows.Scan(&e.Seq, &e.RequestID, &e.Version, &ts, &e.TenantID, &e.Tenant, &e.KeyID, &e.Model, &e.Endpoint,
			&e.PromptTokens, &e.CompletionTokens, &e.CostMicros, &e.Status, &e.Outcome, &e.ReplayOf); err != nil {
			return nil, fmt.Errorf("usage events: %w", err)
		}
		e.Time = fromMicros(ts)
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("usage events: %w", err)
	}
	return out, nil
}

// sequenceUsageEvents numbers up to n events written without a Seq
// (PostgreSQL), in the order they were written, and returns how many it
// numbered.
//
// The advisory lock makes it the only sequencer until it commits; the
// statements after it see every sequencer that committed before (READ
// COMMITTED takes a snapshot per statement), so MAX(seq) is the largest
// Seq any reader can have seen, and the Seqs given here are above it. A
// reader's snapshot either has all of them or none.
func (s *Store) sequenceUsageEvents(ctx context.Context, n int) (int64, error) {
	var numbered int64
	err := s.writeTx(ctx, func(tx *sql.Tx) error {
		var pending bool
		// Most calls find nothing to do: skip the lock then.
		if err := tx.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM usage_events WHERE seq IS NULL)`).Scan(&pending); err != nil || !pending {
			return err
		}
		if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock(?)`, int64(usageSeqLockID)); err != nil {
			return err
		}
		var top int64
		if err := tx.QueryRowContext(ctx, `SELECT COALESCE(MAX(seq), 0) FROM usage_events`).Scan(&top); err != nil {
			return err
		}
		res, err := tx.ExecContext(ctx, `UPDATE usage_events u SET seq = ?::BIGINT + p.n
			FROM (SELECT request_id, version, row_number() OVER (ORDER BY written) AS n
				FROM usage_events WHERE seq IS NULL ORDER BY written LIMIT ?) p
			WHERE u.request_id = p.request_id AND u.version = p.version`, top, n)
		if err != nil {
			return err
		}
		numbered, err = res.RowsAffected()
		return err
	})
	return numbered, err
}

// UsageSinkState is a usage webhook's delivery state (table usage_sinks).
type UsageSinkState struct {
	URL         string
	After       int64 // the Seq of the last event the sink acknowledged
	Holder      string
	LeaseUntil  time.Time // zero: released
	DeliveredAt time.Time // the last acknowledged delivery (zero: none yet)
	LastError   string    // the last failed delivery's error, "" once one succeeds
}

// ErrSinkLeased is returned by [Store.ClaimUsageSink] while another holder's
// lease on the sink is live.
var ErrSinkLeased = errors.New("usage sink leased by another gateway")

// ClaimUsageSink takes or renews holder's lease on the sink at url until
// now+ttl, creating the sink's state (cursor 0, before every event) on
// first use, and returns its state. While another holder's lease is live it
// returns [ErrSinkLeased]: one gateway at a time delivers to a sink.
func (s *Store) ClaimUsageSink(ctx context.Context, url, holder string, ttl time.Duration) (UsageSinkState, error) {
	t := now()
	var st UsageSinkState
	err := s.writeTx(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `INSERT INTO usage_sinks (url) VALUES (?) ON CONFLICT (url) DO NOTHING`, url); err != nil {
			return err
		}
		res, err := tx.ExecContext(ctx, `UPDATE usage_sinks SET holder = ?, lease_until = ?
			WHERE url = ? AND (holder = ? OR lease_until < ?)`, holder, toMicros(t.Add(ttl)), url, holder, toMicros(t))
		if err != nil {
			return err
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return ErrSinkLeased
		}
		var lease, delivered int64
		err = tx.QueryRowContext(ctx, `SELECT url, after_seq, holder, lease_until, delivered_at, last_error FROM usage_sinks WHERE url = ?`, url).
			Scan(&st.URL, &st.After, &st.Holder, &lease, &delivered, &st.LastError)
		if lease != 0 {
			st.LeaseUntil = fromMicros(lease)
		}
		if delivered != 0 {
			st.DeliveredAt = fromMicros(delivered)
		}
		return err
	})
	if err != nil && !errors.Is(err, ErrSinkLeased) {
		return UsageSinkState{}, fmt.Errorf("claim usage sink: %w", err)
	}
	return st, err
}

// AckUsageSink records that the sink at url acknowledged every event up to
// Seq after, if holder still holds its lease (false: it does not, and
// nothing changed). The cursor only moves forward.
func (s *Store) AckUsageSink(ctx context.Context, url, holder string, after int64) (bool, error) {
	res, err := s.write.ExecContext(ctx, `UPDATE usage_sinks SET after_seq = ?, delivered_at = ?, last_error = ''
		WHERE url = ? AND holder = ? AND after_seq <= ?`, after, toMicros(now()), url, holder, after)
	if err != nil {
		return false, fmt.Errorf("ack usage sink: %w", err)
	}
	n, err := res.RowsAffected()
	return n > 0, err
}

// FailUsageSink records a failed delivery's error for the sink at url.
func (s *Store) FailUsageSink(ctx context.Context, url, holder, msg string) error {
	if _, err := s.write.ExecContext(ctx, `UPDATE usage_sinks SET last_error = ? WHERE url = ? AND holder = ?`, msg, url, holder); err != nil {
		return fmt.Errorf("usage sink error: %w", err)
	}
	return nil
}

// ReleaseUsageSink ends holder's lease on the sink at url, so that another
// gateway (or this one restarted) takes it at once.
func (s *Store) ReleaseUsageSink(ctx context.Context, url, holder string) error {
	if _, err := s.write.ExecContext(ctx, `UPDATE usage_sinks SET lease_until = 0 WHERE url = ? AND holder = ?`, url, holder); err != nil {
		return fmt.Errorf("release usage sink: %w", err)
	}
	return nil
}

// UsageSinks returns the delivery state of every usage webhook the database
// has seen, by URL.
func (s *Store) UsageSinks(ctx context.Context) ([]UsageSinkState, error) {
	rows, err := s.read.QueryContext(ctx, `SELECT url, after_seq, holder, lease_until, delivered_at, last_error FROM usage_sinks ORDER BY url`)
	if err != nil {
		return nil, fmt.Errorf("usage sinks: %w", err)
	}
	defer rows.Close()
	var out []UsageSinkState
	for rows.Next() {
		var st UsageSinkState
		var lease, delivered int64
		if err := rows.Scan(&st.URL, &st.After, &st.Holder, &lease, &delivered, &st.LastError); err != nil {
			return nil, fmt.Errorf("usage sinks: %w", err)
		}
		if lease != 0 {
			st.LeaseUntil = fromMicros(lease)
		}
		if delivered != 0 {
			st.DeliveredAt = fromMicros(delivered)
		}
		out = append(out, st)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("usage sinks: %w", err)
	}
	return out, nil
}
