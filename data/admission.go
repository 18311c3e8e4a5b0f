package data

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"
)

// A replica id's admission: what lets a worker that presents only the
// shared cluster token register it. An id is admitted by an operator
// (approved), or by a one-time join token bound to it (an invite); an id
// refused for want of either is kept as pending so the operator sees it;
// revoking a worker's credential revokes its id's admission too, which
// only an approval or an invite lifts.
const (
	AdmissionPending  = "pending"
	AdmissionApproved = "approved"
	AdmissionRevoked  = "revoked"
)

// Admission is a replica id's admission as stored.
type Admission struct {
	ReplicaID string
	State     string // AdmissionPending, AdmissionApproved or AdmissionRevoked
	// Address and Peer are those of the last refused registration, and
	// RequestedAt its time (zero if none was refused).
	Address, Peer string
	RequestedAt   time.Time
	UpdatedAt     time.Time // when State was last set
}

// Invite is a one-time join token as stored: only its hash.
type Invite struct {
	ID        string // "inv_" and 16 hex digits
	ReplicaID string // the only replica id it admits
	CreatedAt time.Time
	ExpiresAt time.Time
	UsedAt    time.Time // zero while unused
	WorkerID  string    // the credential it was exchanged for; "" while unused
}

// Errors of [Store.AdmitWorker].
var (
	// ErrNotApproved: the replica id was neither approved nor invited.
	ErrNotApproved = errors.New("replica id not approved")
	// ErrAdmissionRevoked: the replica id's worker was revoked; only an
	// approval or an invite lets it back.
	ErrAdmissionRevoked = errors.New("replica id revoked")
	// ErrInviteInvalid: the join token is unknown, used, expired, or bound
	// to another replica id; the error says which.
	ErrInviteInvalid = errors.New("join token not valid")
)

// maxPending bounds the pending admissions kept, so that a box holding the
// cluster token cannot fill the database by asking under many names.
const maxPending = 256

// CheckReplicaID reports whether id can name a replica: a short name
// without spaces or quotes.
func CheckReplicaID(id string) error {
	if id == "" || len(id) > 128 || strings.ContainsAny(id, " \t\r\n\"") {
		return errors.New("replica id must be a short name (at most 128 bytes) without spaces or quotes")
	}
	return nil
}

// JoinTokenPrefix starts every join token, so a log scanner or a person
// can tell one from a worker credential (tgw_) or an API key.
const JoinTokenPrefix = "tgj_"

func hashJoinToken(token string) []byte {
	h := sha256.Sum256([]byte(token))
	return h[:]
}

func randomHex(n int) (string, error) {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return hex.EncodeToString(b), nil
}

// CreateInvite stores a join token for replicaID that admits one
// registration before ttl has passed, and returns the invite and the
// token; only the token's hash is stored, so it cannot be shown again.
func (s *Store) CreateInvite(ctx context.Context, replicaID string, ttl time.Duration) (Invite, string, error) {
	if err := CheckReplicaID(replicaID); err != nil {
		return Invite{}, "", fmt.Errorf("create invite: %w", err)
	}
	if ttl <= 0 {
		return Invite{}, "", errors.New("create invite: the expiry must be positive")
	}
	id, err := randomHex(8)
	if err != nil {
		return Invite{}, "", fmt.Errorf("create invite: %w", err)
	}
	secret, err := randomHex(32)
	if err != nil {
		return Invite{}, "", fmt.Errorf("create invite: %w", err)
	}
	token := JoinTokenPrefix + secret
	inv := Invite{ID: "inv_" + id, ReplicaID: replicaID, CreatedAt: now()}
	inv.ExpiresAt = inv.CreatedAt.Add(ttl)
	err = s.writeTx(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO worker_invites (id, replica_id, hash, created_at, expires_at)
			VALUES (?, ?, ?, ?, ?)`, inv.ID, inv.ReplicaID, hashJoinToken(token), toMicros(inv.CreatedAt), toMicros(inv.ExpiresAt))
		return err
	})
	if err != nil {
		return Invite{}, "", fmt.Errorf("create invite: %w", err)
	}
	return inv, token, nil
}

const admissionCols = `replica_id, state, address, peer, requested_at, updated_at`

func scanAdmission(r rowScanner) (Admission, error) {
	var a Admission
	var requested, updated int64
	if err := r.Scan(&a.ReplicaID, &a.State, &a.Address, &a.Peer, &requested, &updated); err != nil {
		return Admission{}, err
	}
	if requested != 0 {
		a.RequestedAt = fromMicros(requested)
	}
	a.UpdatedAt = fromMicros(updated)
	return a, nil
}

// AdmissionOf returns replicaID's admission, or [ErrNotFound] for an id
// never seen.
func (s *Store) AdmissionOf(ctx context.Context, replicaID string) (Admission, error) {
	a, err := scanAdmission(s.read.QueryRowContext(ctx, `SELECT `+admissionCols+` FROM worker_admissions WHERE replica_id = ?`, replicaID))
	if errors.Is(err, sql.ErrNoRows) {
		err = ErrNotFound
	}
	if err != nil {
		return Admission{}, fmt.Errorf("admission of %s: %w", replicaID, err)
	}
	return a, nil
}

// PendingWorkers returns the replica ids waiting for an operator, the
// longest waiting first.
func (s *Store) PendingWorkers(ctx context.Context) ([]Admission, error) {
	rows, err := s.read.QueryContext(ctx, `SELECT `+admissionCols+` FROM worker_admissions
		WHERE state = ? ORDER BY updated_at, replica_id`, AdmissionPending)
	if err != nil {
		return nil, fmt.Errorf("pending workers: %w", err)
	}
	defer rows.Close()
	var as []Admission
	for rows.Next() {
		a, err := scanAdmission(rows)
		if err != nil {
			return nil, fmt.Errorf("pending workers: %w", err)
		}
		as = append(as, a)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("pending workers: %w", err)
	}
	return as, nil
}

// NotePending records that a worker asked to register replicaID from
// address (and tailnet peer) and was refused for want of an admission: a
// new id becomes pending (unless maxPending are already), a pending one
// keeps the latest address and time; an approved or revoked one is left
// as it is.
func (s *Store) NotePending(ctx context.Context, replicaID, address, peer string) error {
	t := toMicros(now())
	err := s.writeTx(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `UPDATE worker_admissions SET address = ?, peer = ?, requested_at = ?
			WHERE replica_id = ? AND state = ?`, address, peer, t, replicaID, AdmissionPending)
		if err != nil {
			return err
		}
		if n, _ := res.RowsAffected(); n > 0 {
			return nil
		}
		var pending int
		if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM worker_admissions WHERE state = ?`, AdmissionPending).Scan(&pending); err != nil {
			return err
		}
		if pending >= maxPending {
			return nil
		}
		_, err = tx.ExecContext(ctx, `INSERT INTO worker_admissions (replica_id, state, address, peer, requested_at, updated_at)
			VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (replica_id) DO NOTHING`, replicaID, AdmissionPending, address, peer, t, t)
		return err
	})
	if err != nil {
		return fmt.Errorf("note pending worker %s: %w", replicaID, err)
	}
	return nil
}

// ApproveWorker admits a replica id: ref is the id, or the id of a worker
// credential issued for it (a revoked worker is let back by its worker id
// too). It returns the admission as it was before (State "" for an id
// never seen) and as it is now.
func (s *Store) ApproveWorker(ctx context.Context, ref string) (before, after Admission, err error) {
	err = s.writeTx(ctx, func(tx *sql.Tx) error {
		id := ref
		var rid string
		switch err := tx.QueryRowContext(ctx, `SELECT replica_id FROM worker_credentials WHERE id = ?`, ref).Scan(&rid); {
		case err == nil:
			id = rid
		case !errors.Is(err, sql.ErrNoRows):
			return err
		}
		if err := CheckReplicaID(id); err != nil {
			return err
		}
		switch a, err := scanAdmission(tx.QueryRowContext(ctx, `SELECT `+admissionCols+` FROM worker_admissions WHERE replica_id = ?`, id)); {
		case err == nil:
			before = a
		case errors.Is(err, sql.ErrNoRows):
			before = Admission{ReplicaID: id}
		default:
			return err
		}
		after = before
		after.State, after.UpdatedAt = AdmissionApproved, now()
		return setAdmission(ctx, tx, id, AdmissionApproved, after.UpdatedAt)
	})
	if err != nil {
		return Admission{}, Admission{}, fmt.Errorf("approve worker %s: %w", ref, err)
	}
	return before, after, nil
}

// setAdmission sets replicaID's admission state at t, creating its row.
func setAdmission(ctx context.Context, tx *sql.Tx, replicaID, state string, t time.Time) error {
	_, err := tx.ExecContext(ctx, `INSERT INTO worker_admissions (replica_id, state, updated_at) VALUES (?, ?, ?)
		ON CONFLICT (replica_id) DO UPDATE SET state = excluded.state, updated_at = excluded.updated_at`,
		replicaID, state, toMicros(t))
	return err
}

// Admit says what admits a new replica id in [Store.AdmitWorker].
type Admit struct {
	// JoinToken, when set, is what admits it: an unused, unexpired invite
	// for this replica id, which the registration uses up.
	JoinToken string
	// Open admits an id the operator has not decided on (never seen, or
	// pending): the gateway runs with open registration, or the tailnet
	// peer is on its allow list. A revoked id stays out even so.
	Open bool
}

// AdmitWorker stores the first credential of a worker (as [Store.CreateWorker])
// if its replica id is admitted — by adm's join token, by an approval, or by
// adm.Open — all in one transaction, so that an invite is used once even by
// gateways sharing the database. It fails with an error wrapping
// [ErrInviteInvalid], [ErrAdmissionRevoked] or [ErrNotApproved] otherwise.
func (s *Store) AdmitWorker(ctx context.Context, w Worker, adm Admit) (Worker, error) {
	if len(w.Hash) == 0 || w.ReplicaID == "" || w.Address == "" {
		return Worker{}, errors.New("admit worker: replica id, address and hash are required")
	}
	w, err := newWorker(w)
	if err != nil {
		return Worker{}, fmt.Errorf("admit worker: %w", err)
	}
	err = s.writeTx(ctx, func(tx *sql.Tx) error {
		if adm.JoinToken != "" {
			if err := useInvite(ctx, tx, adm.JoinToken, w); err != nil {
				return err
			}
		} else {
			var state string
			switch err := tx.QueryRowContext(ctx, `SELECT state FROM worker_admissions WHERE replica_id = ?`, w.ReplicaID).Scan(&state); {
			case errors.Is(err, sql.ErrNoRows):
			case err != nil:
				return err
			}
			switch {
			case state == AdmissionApproved:
			case state == AdmissionRevoked:
				return ErrAdmissionRevoked
			case !adm.Open:
				return ErrNotApproved
			}
		}
		if err := setAdmission(ctx, tx, w.ReplicaID, AdmissionApproved, w.CreatedAt); err != nil {
			return err
		}
		return insertWorker(ctx, tx, w)
	})
	if err != nil {
		return Worker{}, fmt.Errorf("admit worker %s: %w", w.ReplicaID, err)
	}
	return w, nil
}

// useInvite marks token's invite used by w, or says why it cannot be.
func useInvite(ctx context.Context, tx *sql.Tx, token string, w Worker) error {
	var (
		id, replica string
		expires     int64
		used        sql.NullInt64
	)
	err := tx.QueryRowContext(ctx, `SELECT id, replica_id, expires_at, used_at FROM worker_invites WHERE hash = ?`,
		hashJoinToken(token)).Scan(&id, &replica, &expires, &used)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return fmt.Errorf("%w: no invite has this join token", ErrInviteInvalid)
	case err != nil:
		return err
	case used.Valid:
		return fmt.Errorf("%w: invite %s was used %s", ErrInviteInvalid, id, fromMicros(used.Int64).Format(time.RFC3339))
	case replica != w.ReplicaID:
		return fmt.Errorf("%w: invite %s is for replica id %q, not %q", ErrInviteInvalid, id, replica, w.ReplicaID)
	case !now().Before(fromMicros(expires)):
		return fmt.Errorf("%w: invite %s expired %s", ErrInviteInvalid, id, fromMicros(expires).Format(time.RFC3339))
	}
	res, err := tx.ExecContext(ctx, `UPDATE worker_invites SET used_at = ?, worker_id = ? WHERE id = ? AND used_at IS NULL`,
		toMicros(w.CreatedAt), w.ID, id)
	if err != nil {
		return err
	}
	if n, err := res.RowsAffected(); err != nil || n != 1 {
		return fmt.Errorf("%w: invite %s was used just now", ErrInviteInvalid, id)
	}
	return nil
}

// Invites returns every invite, used and expired ones included, oldest
// first.
func (s *Store) Invites(ctx context.Context) ([]Invite, error) {
	rows, err := s.read.QueryContext(ctx, `SELECT id, replica_id, created_at, expires_at, used_at, worker_id
		FROM worker_invites ORDER BY created_at, id`)
	if err != nil {
		return nil, fmt.Errorf("invites: %w", err)
	}
	defer rows.Close()
	var out []Invite
	for rows.Next() {
		var inv Invite
		var created, expires int64
		var used sql.NullInt64
		if err := rows.Scan(&inv.ID, &inv.ReplicaID, &created, &expires, &used, &inv.WorkerID); err != nil {
			return nil, fmt.Errorf("invites: %w", err)
		}
		inv.CreatedAt, inv.ExpiresAt, inv.UsedAt = fromMicros(created), fromMicros(expires), fromNullMicros(used)
		out = append(out, inv)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("invites: %w", err)
	}
	return out, nil
}
