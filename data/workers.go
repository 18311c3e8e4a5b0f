package data

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// Worker is a worker's credential as stored: the secret itself is never
// stored, only its hash.
type Worker struct {
	ID        string // "wkr_" and 16 hex digits
	ReplicaID string // the replica id it was issued for
	Address   string // the sidecar address it was issued for
	// Peer is the tailnet identity of the worker's node in mesh mode
	// ("" outside it).
	Peer      string
	Hash      []byte
	CreatedAt time.Time
	RevokedAt time.Time // zero while active
}

// Revoked reports whether the credential was revoked.
func (w Worker) Revoked() bool { return !w.RevokedAt.IsZero() }

const workerCols = `id, replica_id, address, peer, hash, created_at, revoked_at`

func scanWorker(r rowScanner) (Worker, error) {
	var w Worker
	var created int64
	var revoked sql.NullInt64
	if err := r.Scan(&w.ID, &w.ReplicaID, &w.Address, &w.Peer, &w.Hash, &created, &revoked); err != nil {
		return Worker{}, err
	}
	w.CreatedAt = fromMicros(created)
	w.RevokedAt = fromNullMicros(revoked)
	return w, nil
}

// CreateWorker stores a credential for w's replica id and address with
// w.Hash, generating its id and setting CreatedAt.
func (s *Store) CreateWorker(ctx context.Context, w Worker) (Worker, error) {
	if len(w.Hash) == 0 || w.ReplicaID == "" || w.Address == "" {
		return Worker{}, errors.New("create worker: replica id, address and hash are required")
	}
	w, err := newWorker(w)
	if err != nil {
		return Worker{}, fmt.Errorf("create worker: %w", err)
	}
	err = s.writeTx(ctx, func(tx *sql.Tx) error { return insertWorker(ctx, tx, w) })
	if err != nil {
		return Worker{}, fmt.Errorf("create worker: %w", err)
	}
	return w, nil
}

// newWorker gives w a fresh id and sets CreatedAt.
func newWorker(w Worker) (Worker, error) {
	id, err := randomHex(8)
	if err != nil {
		return Worker{}, err
	}
	w.ID, w.CreatedAt, w.RevokedAt = "wkr_"+id, now(), time.Time{}
	return w, nil
}

func insertWorker(ctx context.Context, tx *sql.Tx, w Worker) error {
	_, err := tx.ExecContext(ctx, `INSERT INTO worker_credentials (id, replica_id, address, peer, hash, created_at)
		VALUES (?, ?, ?, ?, ?, ?)`, w.ID, w.ReplicaID, w.Address, w.Peer, w.Hash, toMicros(w.CreatedAt))
	return err
}

// WorkerByHash returns the credential whose secret hashes to hash, or
// [ErrNotFound]. Revoked ones are returned too: check [Worker.Revoked].
func (s *Store) WorkerByHash(ctx context.Context, hash []byte) (Worker, error) {
	w, err := scanWorker(s.read.QueryRowContext(ctx, `SELECT `+workerCols+` FROM worker_credentials WHERE hash = ?`, hash))
	if errors.Is(err, sql.ErrNoRows) {
		err = ErrNotFound
	}
	if err != nil {
		return Worker{}, fmt.Errorf("worker by hash: %w", err)
	}
	return w, nil
}

// Workers returns every credential, revoked ones included, oldest first.
func (s *Store) Workers(ctx context.Context) ([]Worker, error) {
	rows, err := s.read.QueryContext(ctx, `SELECT `+workerCols+` FROM worker_credentials ORDER BY created_at, rowid`)
	if err != nil {
		return nil, fmt.Errorf("workers: %w", err)
	}
	defer rows.Close()
	var ws []Worker
	for rows.Next() {
		w, err := scanWorker(rows)
		if err != nil {
			return nil, fmt.Errorf("workers: %w", err)
		}
		ws = append(ws, w)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("workers: %w", err)
	}
	return ws, nil
}

// RevokeWorker revokes the credential with id ref, or else every active
// credential issued for replica id ref, and returns the one revoked (the
// newest, when an id had several); revoking a revoked credential returns
// it unchanged. The replica id's admission is revoked with it: until an
// approval or an invite, the id cannot be registered again. No match is
// [ErrNotFound].
func (s *Store) RevokeWorker(ctx context.Context, ref string) (Worker, error) {
	var out Worker
	err := s.writeTx(ctx, func(tx *sql.Tx) error {
		w, err := scanWorker(tx.QueryRowContext(ctx, `SELECT `+workerCols+` FROM worker_credentials WHERE id = ?`, ref))
		if errors.Is(err, sql.ErrNoRows) {
			w, err = scanWorker(tx.QueryRowContext(ctx, `SELECT `+workerCols+` FROM worker_credentials
				WHERE replica_id = ? AND revoked_at IS NULL ORDER BY created_at DESC LIMIT 1`, ref))
		}
		if errors.Is(err, sql.ErrNoRows) {
			return ErrNotFound
		}
		if err != nil || w.Revoked() {
			out = w
			return err
		}
		w.RevokedAt = now()
		out = w
		// Every live credential of the id: the index allows one, but a
		// database migrated from before it may have held more.
		if _, err = tx.ExecContext(ctx, `UPDATE worker_credentials SET revoked_at = ? WHERE (id = ? OR replica_id = ?) AND revoked_at IS NULL`,
			toMicros(w.RevokedAt), w.ID, w.ReplicaID); err != nil {
			return err
		}
		// The id stays out: the cluster token alone cannot register it again.
		return setAdmission(ctx, tx, w.ReplicaID, AdmissionRevoked, w.RevokedAt)
	})
	if err != nil {
		return Worker{}, fmt.Errorf("revoke worker %s: %w", ref, err)
	}
	return out, nil
}

// ActiveWorkerFor returns the active credential issued for replica id, or
// [ErrNotFound]: a replica id belongs to one worker until its credential is
// revoked.
func (s *Store) ActiveWorkerFor(ctx context.Context, replicaID string) (Worker, error) {
	w, err := scanWorker(s.read.QueryRowContext(ctx, `SELECT `+workerCols+` FROM worker_credentials
		WHERE replica_id = ? AND revoked_at IS NULL ORDER BY created_at DESC LIMIT 1`, replicaID))
	if errors.Is(err, sql.ErrNoRows) {
		err = ErrNotFound
	}
	if err != nil {
		return Worker{}, fmt.Errorf("worker for replica %s: %w", replicaID, err)
	}
	return w, nil
}

// MoveWorker records that the worker with credential id now serves at
// address (a restarted worker's sidecar may listen on another port).
func (s *Store) MoveWorker(ctx context.Context, id, address string) error {
	err := s.writeTx(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `UPDATE worker_credentials SET address = ? WHERE id = ?`, address, id)
		return err
	})
	if err != nil {
		return fmt.Errorf("move worker %s: %w", id, err)
	}
	return nil
}
