package data

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"time"
)

// Idempotency-Key records (migration 0019). A client that sends a
// generating request with an Idempotency-Key gets, for a retry with the same
// key and body within the retention window, the answer recorded the first
// time instead of a second run. The record is claimed before the request
// runs (state pending, owned by the gateway process running it), holds the
// answer once it is whole (done), and is removed if the run fails, so a
// retry runs it again. Gateways sharing a PostgreSQL database see each
// other's records; a pending record whose owner died (its lease ran out on
// PostgreSQL; on SQLite, one gateway per file, any owner but this process)
// is taken over by the retry that finds it.

// Idempotency record states.
const (
	IdemPending = "pending" // its request is running
	IdemDone    = "done"    // its answer is kept
	// IdemUnkept: its request was answered, but the answer was larger than
	// what is kept; a retry cannot be given it again.
	IdemUnkept = "unkept"
)

// IdemRecord is one Idempotency-Key record.
type IdemRecord struct {
	TenantID    int64
	Key         string
	Fingerprint string // hex SHA-256 of what the request asked
	RequestID   string // the request that ran (or runs) it
	State       string // IdemPending, IdemDone or IdemUnkept
	Owner       string // the gateway process running it (pending)
	Model       string
	Stream      bool
	Status      int
	ContentType string
	Body        []byte
	Created     time.Time
	Expires     time.Time
}

// IdemOwner is the id under which this Store's process owns the pending
// records it runs: the instance id on PostgreSQL, a random id per Open on
// SQLite.
func (s *Store) IdemOwner() string {
	if s.instance != "" {
		return s.instance
	}
	s.idemOnce.Do(func() {
		var b [6]byte
		_, _ = rand.Read(b[:])
		s.idemOwner = "proc_" + hex.EncodeToString(b[:])
	})
	return s.idemOwner
}

const idemCols = `tenant_id, idem_key, fingerprint, request_id, state, owner, model, stream, status, content_type, body, created_at, expires_at`

// ClaimIdempotency records rec (pending, owned by this process) unless a
// live record of its tenant and key exists: then it returns that one and
// false. An expired record is replaced. A pending record whose owner is
// dead is not taken here (see [Store.TakeOverIdempotency]).
func (s *Store) ClaimIdempotency(ctx context.Context, rec IdemRecord) (existing *IdemRecord, claimed bool, err error) {
	rec.State, rec.Owner = IdemPending, s.IdemOwner()
	for range 3 {
		res, err := s.write.ExecContext(ctx, `INSERT INTO idempotency (`+idemCols+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
			ON CONFLICT (tenant_id, idem_key) DO NOTHING`,
			rec.TenantID, rec.Key, rec.Fingerprint, rec.RequestID, rec.State, rec.Owner, rec.Model, boolInt(rec.Stream),
			int64(rec.Status), rec.ContentType, rec.Body, toMicros(rec.Created), toMicros(rec.Expires))
		if err != nil {
			return nil, false, fmt.Errorf("claim idempotency key: %w", err)
		}
		if n, _ := res.RowsAffected(); n == 1 {
			return nil, true, nil
		}
		got, err := s.Idempotency(ctx, rec.TenantID, rec.Key)
		if errors.Is(err, ErrNotFound) {
			continue // removed meanwhile: claim again
		}
		if err != nil {
			return nil, false, err
		}
		if got.Expires.After(rec.Created) {
			return got, false, nil
		}
		// Expired: it is no longer the key's.
		if _, err := s.write.ExecContext(ctx, `DELETE FROM idempotency WHERE tenant_id = ? AND idem_key = ? AND request_id = ?`,
			rec.TenantID, rec.Key, got.RequestID); err != nil {
			return nil, false, fmt.Errorf("claim idempotency key: %w", err)
		}
	}
	return nil, false, fmt.Errorf("claim idempotency key: %w", ErrAmbiguous)
}

// Idempotency returns the record of tenant's key, or ErrNotFound.
func (s *Store) Idempotency(ctx context.Context, tenant int64, key string) (*IdemRecord, error) {
	var r IdemRecord
	var stream, status, created, expires int64
	err := s.write.QueryRowContext(ctx, `SELECT `+idemCols+` FROM idempotency WHERE tenant_id = ? AND idem_key = ?`, tenant, key).Scan(
		&r.TenantID, &r.Key, &r.Fingerprint, &r.RequestID, &r.State, &r.Owner, &r.Model, &stream, &status, &r.ContentType, &r.Body, &created, &expires)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("idempotency record: %w", err)
	}
	r.Stream, r.Status = stream != 0, int(status)
	r.Created, r.Expires = fromMicros(created), fromMicros(expires)
	return &r, nil
}

// FinishIdempotency keeps the answer of the pending record of tenant's key
// that requestID runs: state IdemDone with its answer, or IdemUnkept (no
// body) when body is nil; model is the answer's, for its replays' rows. It does nothing if the record is no longer that
// request's.
func (s *Store) FinishIdempotency(ctx context.Context, tenant int64, key, requestID, model string, status int, ctype string, body []byte) error {
	state := IdemDone
	if body == nil {
		state = IdemUnkept
	}
	_, err := s.write.ExecContext(ctx, `UPDATE idempotency SET state = ?, owner = '', model = ?, status = ?, content_type = ?, body = ?
		WHERE tenant_id = ? AND idem_key = ? AND request_id = ?`, state, model, int64(status), ctype, body, tenant, key, requestID)
	if err != nil {
		return fmt.Errorf("finish idempotency record: %w", err)
	}
	return nil
}

// ReleaseIdempotency removes the record of tenant's key that requestID
// runs (its run failed: a retry runs it again).
func (s *Store) ReleaseIdempotency(ctx context.Context, tenant int64, key, requestID string) error {
	if _, err := s.write.ExecContext(ctx, `DELETE FROM idempotency WHERE tenant_id = ? AND idem_key = ? AND request_id = ?`,
		tenant, key, requestID); err != nil {
		return fmt.Errorf("release idempotency record: %w", err)
	}
	return nil
}

// IdemOwnerAlive reports whether owner, the owner of a pending record, is
// still running it: this process, or on PostgreSQL a gateway whose lease is
// live. On SQLite (one gateway per file) any other owner died.
func (s *Store) IdemOwnerAlive(ctx context.Context, owner string) (bool, error) {
	if owner == s.IdemOwner() {
		return true, nil
	}
	if s.engine != enginePostgres {
		return false, nil
	}
	var n int
	if err := s.book.QueryRowContext(ctx, `SELECT COUNT(*) FROM gateways WHERE id = ? AND lease_until >= ?`, owner, toMicros(now())).Scan(&n); err != nil {
		return false, fmt.Errorf("idempotency owner: %w", err)
	}
	return n > 0, nil
}

// TakeOverIdempotency makes the pending record of tenant's key that the dead
// request prev ran this process's, run by requestID; false if it is no
// longer prev's (another retry took it first).
func (s *Store) TakeOverIdempotency(ctx context.Context, tenant int64, key, prev, requestID string) (bool, error) {
	res, err := s.write.ExecContext(ctx, `UPDATE idempotency SET request_id = ?, owner = ? WHERE tenant_id = ? AND idem_key = ? AND request_id = ? AND state = ?`,
		requestID, s.IdemOwner(), tenant, key, prev, IdemPending)
	if err != nil {
		return false, fmt.Errorf("take over idempotency record: %w", err)
	}
	n, _ := res.RowsAffected()
	return n == 1, nil
}

// BilledTokens returns the tokens the ledger row of request id bills (an
// open row's as its last refresh left them), 0 if it has no row.
func (s *Store) BilledTokens(ctx context.Context, id string) (int64, error) {
	var n sql.NullInt64
	err := s.write.QueryRowContext(ctx, `SELECT COALESCE(v.prompt_tokens, l.prompt_tokens) + COALESCE(v.completion_tokens, l.completion_tokens)
		FROM ledger l LEFT JOIN ledger_live v ON v.id = l.id AND l.outcome = 'open' WHERE l.id = ?`, id).Scan(&n)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("billed tokens: %w", err)
	}
	return n.Int64, nil
}

// SweepIdempotency removes the records that expired by now and, of each
// tenant with more than maxPerTenant (0: no bound), its oldest finished
// ones beyond that; it returns how many it removed.
func (s *Store) SweepIdempotency(ctx context.Context, now time.Time, maxPerTenant int) (int64, error) {
	res, err := s.write.ExecContext(ctx, `DELETE FROM idempotency WHERE expires_at <= ?`, toMicros(now))
	if err != nil {
		return 0, fmt.Errorf("sweep idempotency records: %w", err)
	}
	n, _ := res.RowsAffected()
	if maxPerTenant <= 0 {
		return n, nil
	}
	rows, err := s.write.QueryContext(ctx, `SELECT tenant_id FROM idempotency GROUP BY tenant_id HAVING COUNT(*) > ?`, maxPerTenant)
	if err != nil {
		return n, fmt.Errorf("sweep idempotency records: %w", err)
	}
	var over []int64
	for rows.Next() {
		var t int64
		if err := rows.Scan(&t); err != nil {
			rows.Close()
			return n, fmt.Errorf("sweep idempotency records: %w", err)
		}
		over = append(over, t)
	}
	rows.Close()
	for _, t := range over {
		// The newest maxPerTenant stay; pending records always do.
		res, err := s.write.ExecContext(ctx, `DELETE FROM idempotency WHERE tenant_id = ? AND state <> ? AND created_at < (
			SELECT created_at FROM idempotency WHERE tenant_id = ? ORDER BY created_at DESC LIMIT 1 OFFSET ?)`,
			t, IdemPending, t, maxPerTenant-1)
		if err != nil {
			return n, fmt.Errorf("sweep idempotency records: %w", err)
		}
		k, _ := res.RowsAffected()
		n += k
	}
	return n, nil
}
