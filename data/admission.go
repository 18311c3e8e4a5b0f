package data

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
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
	// ApprovedCode is the approval code an approval binds (only the
	// worker whose key has it is admitted); AskedCode and Source are the
	// code and source address of the last refused registration.
	ApprovedCode, AskedCode, Source string
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
	// ErrReplicaTaken: the replica id has a live credential already (the
	// database holds one per id: another gateway issued it first).
	ErrReplicaTaken = errors.New("replica id has a live credential")
)

// maxPendingPerSource bounds the pending admissions one source address
// leaves, so that a box holding the cluster token cannot fill the list by
// asking under many names, and others' requests are still listed.
const maxPendingPerSource = 16

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

const admissionCols = `replica_id, state, address, peer, requested_at, updated_at, approved_code, asked_code, source`

func scanAdmission(r rowScanner) (Admission, error) {
	var a Admission
	var requested, updated int64
	if err := r.Scan(&a.ReplicaID, &a.State, &a.Address, &a.Peer, &requested, &updated, &a.ApprovedCode, &a.AskedCode, &a.Source); err != nil {
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

// Asked is a refused registration as [Store.NotePending] records it.
type Asked struct {
	Address, Peer string // the sidecar address and tailnet peer it gave
	Code          string // its approval code ("" for a worker that sent no key)
	Source        string // the address the request came from
}

// NotePending records that a worker asked to register replicaID and was
// refused for want of an admission: a new id becomes pending (unless its
// source has maxPendingPerSource pending already), a pending one keeps
// the latest request; an approved or revoked one is left as it is.
func (s *Store) NotePending(ctx context.Context, replicaID string, a Asked) error {
	t := toMicros(now())
	address, peer := a.Address, a.Peer
	err := s.writeTx(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `UPDATE worker_admissions SET address = ?, peer = ?, requested_at = ?, asked_code = ?, source = ?
			WHERE replica_id = ? AND state = ?`, address, peer, t, a.Code, a.Source, replicaID, AdmissionPending)
		if err != nil {
			return err
		}
		if n, _ := res.RowsAffected(); n > 0 {
			return nil
		}
		var pending int
		if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM worker_admissions WHERE state = ? AND source = ?`, AdmissionPending, a.Source).Scan(&pending); err != nil {
			return err
		}
		if pending >= maxPendingPerSource {
			return nil
		}
		_, err = tx.ExecContext(ctx, `INSERT INTO worker_admissions (replica_id, state, address, peer, requested_at, updated_at, asked_code, source)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (replica_id) DO NOTHING`, replicaID, AdmissionPending, address, peer, t, t, a.Code, a.Source)
		return err
	})
	if err != nil {
		return fmt.Errorf("note pending worker %s: %w", replicaID, err)
	}
	return nil
}

// ApproveWorker admits the worker asking to register a replica id and
// holding the key whose approval code is code (serving.ApprovalCode; the
// worker prints it while it waits): ref is the id, or the id of a worker
// credential issued for it (a revoked worker is let back by its worker id
// too). Another worker asking under the same id, with the cluster token
// alone, is not admitted. It returns the admission as it was before
// (State "" for an id never seen) and as it is now.
func (s *Store) ApproveWorker(ctx context.Context, ref, code string) (before, after Admission, err error) {
	if code == "" {
		return Admission{}, Admission{}, errors.New("approve worker: an approval binds the worker that asked: give the approval code it prints")
	}
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
		after.State, after.UpdatedAt, after.ApprovedCode = AdmissionApproved, now(), code
		if err := setAdmission(ctx, tx, id, AdmissionApproved, after.UpdatedAt); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, `UPDATE worker_admissions SET approved_code = ? WHERE replica_id = ?`, code, id)
		return err
	})
	if err != nil {
		return Admission{}, Admission{}, fmt.Errorf("approve worker %s: %w", ref, err)
	}
	return before, after, nil
}

// setAdmission sets replicaID's admission state at t, creating its row;
// the code an approval bound is cleared (ApproveWorker sets it after).
func setAdmission(ctx context.Context, tx *sql.Tx, replicaID, state string, t time.Time) error {
	_, err := tx.ExecContext(ctx, `INSERT INTO worker_admissions (replica_id, state, updated_at) VALUES (?, ?, ?)
		ON CONFLICT (replica_id) DO UPDATE SET state = excluded.state, updated_at = excluded.updated_at, approved_code = ''`,
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
	// Code is the approval code of the key the worker sent ("" for none):
	// an approved id admits only the worker whose code was approved.
	Code string
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
			var state, approved string
			switch err := tx.QueryRowContext(ctx, `SELECT state, approved_code FROM worker_admissions WHERE replica_id = ?`, w.ReplicaID).Scan(&state, &approved); {
			case errors.Is(err, sql.ErrNoRows):
			case err != nil:
				return err
			}
			switch {
			case state == AdmissionApproved && approved != "" && subtle.ConstantTimeCompare([]byte(approved), []byte(adm.Code)) == 1:
			case state == AdmissionApproved && adm.Open:
			case state == AdmissionRevoked:
				return ErrAdmissionRevoked
			case !adm.Open:
				return ErrNotApproved
			}
		}
		if err := setAdmission(ctx, tx, w.ReplicaID, AdmissionApproved, w.CreatedAt); err != nil {
			return err
		}
		// One live credential per replica id: the index refuses a second,
		// also one another gateway on the same database issues at once.
		if err := insertWorker(ctx, tx, w); err != nil {
			if isUniqueViolation(err) {
				return ErrReplicaTaken
			}
			return err
		}
		return nil
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
