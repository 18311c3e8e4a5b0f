package data

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
)

const keyCols = `k.id, k.prefix, k.hash, k.rpm, k.tpm, k.max_concurrency, k.models, k.created_at, k.revoked_at, k.expires_at, k.class,
	k.name, k.owner, k.note, k.last_used_at, k.prev_until,
	t.id, t.name, t.budget_tokens, t.budget_micros, t.budget_period, t.budget_alert_percent, t.created_at`

const keyFrom = ` FROM api_keys k JOIN tenants t ON t.id = k.tenant_id`

func scanKey(r rowScanner) (Key, error) {
	var k Key
	var models string
	var created, tCreated int64
	var revoked, expires, lastUsed, prevUntil sql.NullInt64
	err := r.Scan(&k.ID, &k.Prefix, &k.Hash, &k.RPM, &k.TPM, &k.MaxConcurrency, &models, &created, &revoked, &expires, &k.Class,
		&k.Name, &k.Owner, &k.Note, &lastUsed, &prevUntil,
		&k.Tenant.ID, &k.Tenant.Name, &k.Tenant.BudgetTokens, &k.Tenant.BudgetMicros, &k.Tenant.BudgetPeriod, &k.Tenant.BudgetAlertPercent, &tCreated)
	if err != nil {
		return Key{}, err
	}
	if models != "" {
		if err := json.Unmarshal([]byte(models), &k.Models); err != nil {
			return Key{}, fmt.Errorf("key %s: models: %w", k.ID, err)
		}
	}
	k.CreatedAt = fromMicros(created)
	k.RevokedAt = fromNullMicros(revoked)
	k.ExpiresAt = fromNullMicros(expires)
	k.LastUsedAt = fromNullMicros(lastUsed)
	k.PrevUntil = fromNullMicros(prevUntil)
	k.Tenant.CreatedAt = fromMicros(tCreated)
	return k, nil
}

func encodeModels(models []string) (string, error) {
	if len(models) == 0 {
		return "", nil
	}
	b, err := json.Marshal(models)
	return string(b), err
}

// keyClass is the stored form of a key's class: "" is standard.
func keyClass(c string) string {
	if c == "" {
		return "standard"
	}
	return c
}

func newKeyID() (string, error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	return "key_" + hex.EncodeToString(b[:]), nil
}

// ErrNameTaken: another active key of the tenant has that name.
var ErrNameTaken = errors.New("key name taken")

// CheckKeyName reports whether name can name a key: empty (no name), or at
// most 64 bytes of letters, digits and . _ - @.
func CheckKeyName(name string) error {
	if len(name) > 64 {
		return errors.New("key name is longer than 64 bytes")
	}
	for _, c := range name {
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '.', c == '_', c == '-', c == '@':
		default:
			return fmt.Errorf("key name %q: use letters, digits and . _ - @ only", name)
		}
	}
	return nil
}

// nameTaken turns a unique-index violation on the key's name into
// [ErrNameTaken].
func nameTaken(err error, name string) error {
	if err != nil && name != "" && isUniqueViolation(err) {
		return fmt.Errorf("%w: the tenant has an active key named %q (revoke it or pick another name)", ErrNameTaken, name)
	}
	return err
}

// CreateKey stores k for the tenant k.Tenant.ID. It generates k.ID if empty,
// sets k.CreatedAt, bumps the keys version, and returns the key as stored,
// with its tenant filled. RevokedAt is ignored: a new key is active; a zero
// ExpiresAt never expires. A name another active key of the tenant has is
// [ErrNameTaken].
func (s *Store) CreateKey(ctx context.Context, k Key) (Key, error) {
	switch {
	case k.Tenant.ID == 0:
		return Key{}, errors.New("create key: no tenant")
	case len(k.Hash) == 0:
		return Key{}, errors.New("create key: no hash")
	case k.Prefix == "":
		return Key{}, errors.New("create key: no prefix")
	}
	if err := CheckKeyName(k.Name); err != nil {
		return Key{}, fmt.Errorf("create key: %w", err)
	}
	if k.ID == "" {
		id, err := newKeyID()
		if err != nil {
			return Key{}, fmt.Errorf("create key: %w", err)
		}
		k.ID = id
	}
	models, err := encodeModels(k.Models)
	if err != nil {
		return Key{}, fmt.Errorf("create key: %w", err)
	}
	var out Key
	err = s.writeTx(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `INSERT INTO api_keys
			(id, tenant_id, prefix, hash, rpm, tpm, max_concurrency, models, created_at, expires_at, class, name, owner, note)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
			k.ID, k.Tenant.ID, k.Prefix, k.Hash, k.RPM, k.TPM, k.MaxConcurrency, models, toMicros(now()),
			nullMicros(k.ExpiresAt), keyClass(k.Class), k.Name, k.Owner, k.Note); err != nil {
			return nameTaken(err, k.Name)
		}
		var err error
		out, err = changedKey(ctx, tx, k.ID)
		return err
	})
	if err != nil {
		return Key{}, fmt.Errorf("create key: %w", err)
	}
	return out, nil
}

// KeyByHash returns the key whose secret hashes to hash, with its tenant,
// or [ErrNotFound]. Revoked keys are returned too: check [Key.Revoked]. A
// key found by the secret it had before its last rotation is returned with
// Rotated set: that secret works only until PrevUntil (the caller checks
// the time, by its clock).
func (s *Store) KeyByHash(ctx context.Context, hash []byte) (Key, error) {
	k, err := scanKey(s.read.QueryRowContext(ctx, `SELECT `+keyCols+keyFrom+` WHERE k.hash = ?`, hash))
	if errors.Is(err, sql.ErrNoRows) {
		k, err = scanKey(s.read.QueryRowContext(ctx, `SELECT `+keyCols+keyFrom+` WHERE k.prev_hash = ?`, hash))
		k.Rotated = err == nil
	}
	if errors.Is(err, sql.ErrNoRows) {
		err = ErrNotFound
	}
	if err != nil {
		return Key{}, fmt.Errorf("key by hash: %w", err)
	}
	return k, nil
}

// Keys returns the keys of the named tenant ("" = every tenant), revoked ones
// included, in order of creation. An unknown tenant has no keys.
func (s *Store) Keys(ctx context.Context, tenant string) ([]Key, error) {
	q := `SELECT ` + keyCols + keyFrom
	var args []any
	if tenant != "" {
		q += ` WHERE t.name = ?`
		args = append(args, tenant)
	}
	q += ` ORDER BY k.created_at, k.rowid`
	rows, err := s.read.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("keys: %w", err)
	}
	defer rows.Close()
	var ks []Key
	for rows.Next() {
		k, err := scanKey(rows)
		if err != nil {
			return nil, fmt.Errorf("keys: %w", err)
		}
		ks = append(ks, k)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("keys: %w", err)
	}
	return ks, nil
}

// RevokeKey revokes one key, found by the first of these that matches:
// its id equal to ref, its hash equal to hash (the caller hashes a secret it
// was given; nil skips this), or its display prefix equal to ref
// ([ErrAmbiguous] if several keys share it). Revoking a revoked key returns
// it unchanged. A revocation bumps the keys version. No match is
// [ErrNotFound].
func (s *Store) RevokeKey(ctx context.Context, ref string, hash []byte) (Key, error) {
	var out Key
	err := s.writeTx(ctx, func(tx *sql.Tx) error {
		k, err := findKey(ctx, tx, ref, hash)
		if err != nil {
			return err
		}
		if k.Revoked() {
			out = k
			return nil
		}
		if _, err := tx.ExecContext(ctx, `UPDATE api_keys SET revoked_at = ? WHERE id = ?`, toMicros(now()), k.ID); err != nil {
			return err
		}
		out, err = changedKey(ctx, tx, k.ID)
		return err
	})
	if err != nil {
		return Key{}, fmt.Errorf("revoke key: %w", err)
	}
	return out, nil
}

// KeyUpdate is an edit of a key: nil fields stay as they are.
type KeyUpdate struct {
	RPM, TPM, MaxConcurrency *int64
	// Models replaces the key's model list; an empty list allows every model.
	Models *[]string
	// ExpiresAt sets when the key expires; the zero time means never.
	ExpiresAt *time.Time
	// Class sets the key's priority class ("" means standard).
	Class *string
	// Name, Owner and Note replace the key's ("" clears them).
	Name, Owner, Note *string
}

// UpdateKey applies u to the key that ref or hash names (as [Store.RevokeKey]
// finds it) and bumps the keys version, so running gateways apply the new
// limits within their poll interval. A revoked key cannot be edited
// ([ErrRevoked]). It returns the key as stored.
func (s *Store) UpdateKey(ctx context.Context, ref string, hash []byte, u KeyUpdate) (Key, error) {
	var out Key
	err := s.writeTx(ctx, func(tx *sql.Tx) error {
		k, err := findKey(ctx, tx, ref, hash)
		if err != nil {
			return err
		}
		if k.Revoked() {
			return ErrRevoked
		}
		set := func(dst *int64, src *int64) {
			if src != nil {
				*dst = *src
			}
		}
		set(&k.RPM, u.RPM)
		set(&k.TPM, u.TPM)
		set(&k.MaxConcurrency, u.MaxConcurrency)
		if u.Models != nil {
			k.Models = *u.Models
		}
		if u.ExpiresAt != nil {
			k.ExpiresAt = *u.ExpiresAt
		}
		if u.Class != nil {
			k.Class = keyClass(*u.Class)
		}
		for _, f := range []struct{ dst, src *string }{{&k.Name, u.Name}, {&k.Owner, u.Owner}, {&k.Note, u.Note}} {
			if f.src != nil {
				*f.dst = *f.src
			}
		}
		if err := CheckKeyName(k.Name); err != nil {
			return err
		}
		models, err := encodeModels(k.Models)
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `UPDATE api_keys SET rpm = ?, tpm = ?, max_concurrency = ?, models = ?, expires_at = ?, class = ?,
			name = ?, owner = ?, note = ?
			WHERE id = ?`, k.RPM, k.TPM, k.MaxConcurrency, models, nullMicros(k.ExpiresAt), k.Class, k.Name, k.Owner, k.Note, k.ID); err != nil {
			return nameTaken(err, k.Name)
		}
		out, err = changedKey(ctx, tx, k.ID)
		return err
	})
	if err != nil {
		return Key{}, fmt.Errorf("update key: %w", err)
	}
	return out, nil
}

// findKey resolves RevokeKey's and UpdateKey's reference. The id and hash are unique, so they
// are tried before the prefix, which a user types and may share, and then
// the name of an active key ("tenant/name", or the name alone when one
// tenant has it).
func findKey(ctx context.Context, tx *sql.Tx, ref string, hash []byte) (Key, error) {
	if ref != "" {
		k, err := scanKey(tx.QueryRowContext(ctx, `SELECT `+keyCols+keyFrom+` WHERE k.id = ?`, ref))
		if err == nil || !errors.Is(err, sql.ErrNoRows) {
			return k, err
		}
	}
	if len(hash) > 0 {
		k, err := scanKey(tx.QueryRowContext(ctx, `SELECT `+keyCols+keyFrom+` WHERE k.hash = ?`, hash))
		if err == nil || !errors.Is(err, sql.ErrNoRows) {
			return k, err
		}
	}
	if ref == "" {
		return Key{}, ErrNotFound
	}
	rows, err := tx.QueryContext(ctx, `SELECT `+keyCols+keyFrom+` WHERE k.prefix = ? LIMIT 2`, ref)
	if err != nil {
		return Key{}, err
	}
	defer rows.Close()
	var found []Key
	for rows.Next() {
		k, err := scanKey(rows)
		if err != nil {
			return Key{}, err
		}
		found = append(found, k)
	}
	if err := rows.Err(); err != nil {
		return Key{}, err
	}
	if len(found) == 0 {
		if found, err = keysByName(ctx, tx, ref); err != nil {
			return Key{}, err
		}
	}
	switch len(found) {
	case 0:
		return Key{}, ErrNotFound
	case 1:
		return found[0], nil
	default:
		return Key{}, fmt.Errorf("prefix %q: %w", ref, ErrAmbiguous)
	}
}

// KeyByID returns the key with that id, with its tenant, or [ErrNotFound].
// Revoked keys are returned too: check [Key.Revoked]. Work that runs on
// after its request (a batch) uses it to find its key again.
func (s *Store) KeyByID(ctx context.Context, id string) (Key, error) {
	k, err := scanKey(s.read.QueryRowContext(ctx, `SELECT `+keyCols+keyFrom+` WHERE k.id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		err = ErrNotFound
	}
	if err != nil {
		return Key{}, fmt.Errorf("key %s: %w", id, err)
	}
	return k, nil
}

// keysByName returns up to two active keys that ref names: "tenant/name",
// or a name alone (any tenant's).
func keysByName(ctx context.Context, tx *sql.Tx, ref string) ([]Key, error) {
	q, args := ` WHERE k.name = ? AND k.revoked_at IS NULL`, []any{ref}
	if tenant, name, ok := strings.Cut(ref, "/"); ok {
		q, args = ` WHERE t.name = ? AND k.name = ? AND k.revoked_at IS NULL`, []any{tenant, name}
	}
	if args[len(args)-1] == "" {
		return nil, nil
	}
	rows, err := tx.QueryContext(ctx, `SELECT `+keyCols+keyFrom+q+` LIMIT 2`, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var found []Key
	for rows.Next() {
		k, err := scanKey(rows)
		if err != nil {
			return nil, err
		}
		found = append(found, k)
	}
	return found, rows.Err()
}

// RotateKey gives the key that ref or hash names (as [Store.RevokeKey]
// finds it) a new secret — hash and display prefix — keeping its id, name,
// tenant and limits. The secret it had stays known as the key's previous
// one ([Key.Rotated] from KeyByHash) with graceUntil as its end, which the
// caller enforces by its clock (a zero graceUntil: it stops now); a secret
// older than that, kept from an earlier rotation, stops now. It bumps the keys version, so running gateways
// accept the new secret at once and drop the old one at graceUntil. A
// revoked key cannot be rotated ([ErrRevoked]).
func (s *Store) RotateKey(ctx context.Context, ref string, hash []byte, newHash []byte, newPrefix string, graceUntil time.Time) (Key, error) {
	if len(newHash) == 0 || newPrefix == "" {
		return Key{}, errors.New("rotate key: no new secret")
	}
	var out Key
	err := s.writeTx(ctx, func(tx *sql.Tx) error {
		k, err := findKey(ctx, tx, ref, hash)
		if err != nil {
			return err
		}
		if k.Revoked() {
			return ErrRevoked
		}
		var prevHash []byte
		var prevUntil sql.NullInt64
		if !graceUntil.IsZero() {
			prevHash, prevUntil = k.Hash, sql.NullInt64{Int64: toMicros(graceUntil), Valid: true}
		}
		if _, err := tx.ExecContext(ctx, `UPDATE api_keys SET hash = ?, prefix = ?, prev_hash = ?, prev_until = ? WHERE id = ?`,
			newHash, newPrefix, prevHash, prevUntil, k.ID); err != nil {
			return err
		}
		out, err = changedKey(ctx, tx, k.ID)
		return err
	})
	if err != nil {
		return Key{}, fmt.Errorf("rotate key: %w", err)
	}
	return out, nil
}

// KeyTotal is what a key's requests used over its life, from the ledger's
// final rows; refused requests are not counted in Requests.
type KeyTotal struct {
	Requests int64
	Spend
}

// KeySpend returns each key's totals, by key id, from a running total the
// ledger writer keeps (spend.go; it costs the same however long the ledger
// grows).
// Keys never used are missing.
func (s *Store) KeySpend(ctx context.Context) (map[string]KeyTotal, error) {
	rows, err := s.read.QueryContext(ctx, `SELECT key_id, requests, tokens, micros FROM key_spend`)
	if err != nil {
		return nil, fmt.Errorf("key spend: %w", err)
	}
	defer rows.Close()
	out := make(map[string]KeyTotal)
	for rows.Next() {
		var id string
		var t KeyTotal
		if err := rows.Scan(&id, &t.Requests, &t.Tokens, &t.Micros); err != nil {
			return nil, fmt.Errorf("key spend: %w", err)
		}
		out[id] = t
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("key spend: %w", err)
	}
	return out, nil
}

// changedKey tells running gateways that the keys changed (they reload
// within a second) and reads key id back as the change left it.
func changedKey(ctx context.Context, tx *sql.Tx, id string) (Key, error) {
	if err := bumpKeysVersion(ctx, tx); err != nil {
		return Key{}, err
	}
	return scanKey(tx.QueryRowContext(ctx, `SELECT `+keyCols+keyFrom+` WHERE k.id = ?`, id))
}
