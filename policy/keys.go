package policy

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/tailgate-dev/tailgate/data"
)

// SecretPrefix starts every API key secret.
const SecretPrefix = "tg-"

const (
	secretBytes = 32
	// secretLen is the length of a secret: the prefix and 32 random bytes
	// in unpadded base64url (43 characters).
	secretLen = len(SecretPrefix) + 43
	// displayLen is the length of a key's display prefix: SecretPrefix and
	// 8 characters (48 bits) — enough to tell keys apart, far too little to
	// guess the rest.
	displayLen = len(SecretPrefix) + 8
)

// NewSecret mints a new API key secret. prefix is its display prefix (safe
// to show and log) and hash its SHA-256, which is all that gets stored.
func NewSecret() (secret, prefix string, hash []byte, err error) {
	var b [secretBytes]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", "", nil, fmt.Errorf("random secret: %w", err)
	}
	secret = SecretPrefix + base64.RawURLEncoding.EncodeToString(b[:])
	return secret, secret[:displayLen], HashSecret(secret), nil
}

// HashSecret returns the SHA-256 of a secret, the form in which keys are
// stored and looked up.
func HashSecret(secret string) []byte {
	sum := sha256.Sum256([]byte(secret))
	return sum[:]
}

// IsSecret reports whether s has the shape of an API key's secret (as
// opposed to its id or display prefix), e.g. to refuse it where it would be
// logged, such as in a URL path.
func IsSecret(s string) bool { return wellFormed(s) }

// DisplayPrefix returns the display prefix of a string with the shape of a
// secret (what a key's prefix would be, safe to log), or "" for anything
// else, which is then logged not at all.
func DisplayPrefix(s string) string {
	if !wellFormed(s) {
		return ""
	}
	return s[:displayLen]
}

// wellFormed reports whether s has the shape of a secret minted by
// NewSecret, so garbage never reaches the cache or the database.
func wellFormed(s string) bool {
	if len(s) != secretLen || s[:len(SecretPrefix)] != SecretPrefix {
		return false
	}
	for i := len(SecretPrefix); i < len(s); i++ {
		switch c := s[i]; {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '-', c == '_':
		default:
			return false
		}
	}
	return true
}

// KeyOptions describes a key to create. Zero limits mean unlimited.
type KeyOptions struct {
	Tenant         string // created if it does not exist
	RPM            int64  // requests per minute
	TPM            int64  // tokens (prompt + completion) per minute
	MaxConcurrency int64  // requests in flight at once
	Models         []string
	// BudgetTokens and BudgetMicros, when not nil, set the tenant's budget
	// (0 = unlimited); nil leaves that part of the budget as it is.
	BudgetTokens, BudgetMicros *int64
	// ExpiresAt is when the key stops working (see [ParseExpiry]); zero
	// means never. It must be in the future.
	ExpiresAt time.Time
	// Class is the key's priority class, the highest its requests may run
	// as (a request may ask for a lower one); the zero value is standard.
	Class Class
	// Name (unique among the tenant's active keys; "" for none), Owner and
	// Note say whose key it is and what for.
	Name, Owner, Note string
	// BudgetPeriod and BudgetAlertPercent, when not nil, set the tenant's
	// budget period and soft threshold (see [BudgetChange]).
	BudgetPeriod       *string
	BudgetAlertPercent *int64
}

func (o *KeyOptions) validate() error {
	switch {
	case strings.TrimSpace(o.Tenant) == "":
		return errors.New("tenant name required")
	case o.RPM < 0, o.TPM < 0, o.MaxConcurrency < 0:
		return errors.New("negative limit")
	case o.BudgetTokens != nil && *o.BudgetTokens < 0, o.BudgetMicros != nil && *o.BudgetMicros < 0:
		return errors.New("negative budget")
	case !o.ExpiresAt.IsZero() && !o.ExpiresAt.After(time.Now()):
		return fmt.Errorf("expiry %s is not in the future: the key would never work", o.ExpiresAt.UTC().Format(time.RFC3339))
	case o.BudgetAlertPercent != nil && (*o.BudgetAlertPercent < 1 || *o.BudgetAlertPercent > 100):
		return errors.New("the budget alert percent must be 1 to 100")
	}
	if o.BudgetPeriod != nil {
		p := NormalizePeriod(*o.BudgetPeriod)
		if err := data.CheckBudgetPeriod(p); err != nil {
			return err
		}
		o.BudgetPeriod = &p
	}
	if err := data.CheckKeyName(o.Name); err != nil {
		return err
	}
	return validModels(o.Models)
}

func validModels(models []string) error {
	for _, m := range models {
		if strings.TrimSpace(m) == "" {
			return errors.New("empty model name")
		}
	}
	return nil
}

// ParseExpiry reads a key's expiry as a user gives it: a time in RFC 3339
// ("2027-01-31T00:00:00Z"), a duration from now in days ("30d") or in Go's
// syntax ("720h", "90m"), or "never". "never" returns the zero time.
func ParseExpiry(s string, now time.Time) (time.Time, error) {
	s = strings.TrimSpace(s)
	if s == "never" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t.UTC(), nil
	}
	var d time.Duration
	if days, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.ParseFloat(days, 64)
		if err != nil || n <= 0 || n > 100*365 {
			return time.Time{}, fmt.Errorf("expiry %q: want a positive number of days up to 36500, e.g. 30d", s)
		}
		d = time.Duration(n * float64(24*time.Hour))
	} else {
		var err error
		if d, err = time.ParseDuration(s); err != nil || d <= 0 {
			return time.Time{}, fmt.Errorf("expiry %q: want a duration from now (30d, 720h), a time in RFC 3339 (2027-01-31T00:00:00Z) or never", s)
		}
	}
	return now.Add(d).UTC().Truncate(time.Second), nil
}

// CreateKey mints a secret and stores a key for it, creating the tenant if
// needed and applying the budget given in o. The secret is returned once
// and never stored.
func CreateKey(ctx context.Context, st *data.Store, o KeyOptions) (secret string, k data.Key, err error) {
	if err := o.validate(); err != nil {
		return "", data.Key{}, fmt.Errorf("create key: %w", err)
	}
	t, err := st.EnsureTenant(ctx, o.Tenant)
	if err != nil {
		return "", data.Key{}, fmt.Errorf("create key: tenant: %w", err)
	}
	if c := (BudgetChange{Tokens: o.BudgetTokens, Micros: o.BudgetMicros, Period: o.BudgetPeriod, AlertPercent: o.BudgetAlertPercent}); !c.empty() {
		if t, err = applyBudget(ctx, st, t, c); err != nil {
			return "", data.Key{}, fmt.Errorf("create key: %w", err)
		}
	}
	secret, prefix, hash, err := NewSecret()
	if err != nil {
		return "", data.Key{}, fmt.Errorf("create key: %w", err)
	}
	k, err = st.CreateKey(ctx, data.Key{
		Tenant:         t,
		Prefix:         prefix,
		Hash:           hash,
		RPM:            o.RPM,
		TPM:            o.TPM,
		MaxConcurrency: o.MaxConcurrency,
		Models:         o.Models,
		ExpiresAt:      o.ExpiresAt,
		Class:          o.Class.String(),
		Name:           o.Name,
		Owner:          o.Owner,
		Note:           o.Note,
	})
	if err != nil {
		return "", data.Key{}, fmt.Errorf("create key: %w", err)
	}
	return secret, k, nil
}

// RevokeKey revokes the key that ref names: its id, its display prefix or
// the secret itself. It returns data.ErrNotFound or data.ErrAmbiguous
// (wrapped) when ref names no key or several.
func RevokeKey(ctx context.Context, st *data.Store, ref string) (data.Key, error) {
	ref = strings.TrimSpace(ref)
	if ref == "" {
		return data.Key{}, errors.New("revoke key: empty key reference")
	}
	id, hash := keyRef(ref)
	k, err := st.RevokeKey(ctx, id, hash)
	if err != nil {
		// Never echo ref: it may be a secret.
		return data.Key{}, fmt.Errorf("revoke key: %w", err)
	}
	return k, nil
}

// keyRef splits a user's reference to a key into what the store looks up:
// a secret is looked up by its hash, anything else as an id or a prefix.
func keyRef(ref string) (string, []byte) {
	if wellFormed(ref) {
		return "", HashSecret(ref)
	}
	return ref, nil
}

// EditKey changes the limits, models or expiry of the key that ref names
// (its id, display prefix or secret); nil fields of u stay as they are, an
// empty model list allows every model and a zero expiry never expires. A
// running gateway applies the edit within its poll interval. It returns
// data.ErrNotFound, data.ErrAmbiguous or data.ErrRevoked (wrapped) when ref
// names no key, several, or a revoked one.
func EditKey(ctx context.Context, st *data.Store, ref string, u data.KeyUpdate) (data.Key, error) {
	ref = strings.TrimSpace(ref)
	switch {
	case ref == "":
		return data.Key{}, errors.New("edit key: empty key reference")
	case u.RPM != nil && *u.RPM < 0, u.TPM != nil && *u.TPM < 0, u.MaxConcurrency != nil && *u.MaxConcurrency < 0:
		return data.Key{}, errors.New("edit key: negative limit")
	case u.RPM == nil && u.TPM == nil && u.MaxConcurrency == nil && u.Models == nil && u.ExpiresAt == nil && u.Class == nil &&
		u.Name == nil && u.Owner == nil && u.Note == nil:
		return data.Key{}, errors.New("edit key: nothing to change")
	}
	if u.Class != nil {
		c, err := ParseClass(*u.Class)
		if err != nil {
			return data.Key{}, fmt.Errorf("edit key: %w", err)
		}
		name := c.String()
		u.Class = &name
	}
	if u.Models != nil {
		if err := validModels(*u.Models); err != nil {
			return data.Key{}, fmt.Errorf("edit key: %w", err)
		}
	}
	id, hash := keyRef(ref)
	k, err := st.UpdateKey(ctx, id, hash, u)
	if err != nil {
		return data.Key{}, fmt.Errorf("edit key: %w", err) // never echo ref: it may be a secret
	}
	return k, nil
}

// DefaultRotateGrace is how long a rotated key's old secret keeps working
// unless the rotation says otherwise: a day, for every client to pick up
// the new one.
const DefaultRotateGrace = 24 * time.Hour

// RotateKey gives the key that ref names (its id, display prefix, name or
// secret) a new secret, keeping its id, name, tenant and limits, and
// returns the new secret (shown once) and the key. The old secret keeps
// working for grace after now (0: it stops at once), then is refused; a
// running gateway accepts the new one within its poll interval. It returns
// data.ErrNotFound, data.ErrAmbiguous or data.ErrRevoked (wrapped) when ref
// names no key, several, or a revoked one.
func RotateKey(ctx context.Context, st *data.Store, ref string, grace time.Duration, now time.Time) (string, data.Key, error) {
	ref = strings.TrimSpace(ref)
	switch {
	case ref == "":
		return "", data.Key{}, errors.New("rotate key: empty key reference")
	case grace < 0:
		return "", data.Key{}, errors.New("rotate key: negative grace")
	}
	secret, prefix, hash, err := NewSecret()
	if err != nil {
		return "", data.Key{}, fmt.Errorf("rotate key: %w", err)
	}
	// With no grace the old secret is kept too, ending now: a client still
	// sending it is told the key was rotated (rotated_api_key), not that
	// the secret is unknown.
	until := now.Add(grace).UTC()
	id, oldHash := keyRef(ref)
	k, err := st.RotateKey(ctx, id, oldHash, hash, prefix, until)
	if err != nil {
		return "", data.Key{}, err // data's error says "rotate key"; never echo ref
	}
	return secret, k, nil
}
