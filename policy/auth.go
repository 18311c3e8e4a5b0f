package policy

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/tailgate-dev/tailgate/data"
)

// ErrInvalidKey is returned for a secret that is malformed, unknown or
// revoked. It deliberately does not say which.
var ErrInvalidKey = errors.New("invalid api key")

// ErrRevokedKey is returned for a key that exists but was revoked. It
// matches [ErrInvalidKey] under errors.Is, and clients are told only that
// (as for an unknown key); it exists so that the gateway can count and log
// revocations apart.
var ErrRevokedKey error = revokedKeyError{}

type revokedKeyError struct{}

func (revokedKeyError) Error() string { return "api key revoked" }

// Is makes a revoked key an invalid key to callers that do not care why.
func (revokedKeyError) Is(target error) bool { return target == ErrInvalidKey }

// ExpiredKeyError is returned for a key that exists and was not revoked but
// has expired. Unlike an unknown key it may say so: only the holder of the
// secret learns it. It matches [ErrInvalidKey] under errors.Is.
type ExpiredKeyError struct {
	ExpiresAt time.Time
	// Rotated says the secret is the one a key had before it was rotated,
	// and ExpiresAt when its grace ended.
	Rotated bool
}

func (e *ExpiredKeyError) Error() string {
	if e.Rotated {
		return "api key was rotated; its old secret stopped working at " + e.ExpiresAt.UTC().Format(time.RFC3339)
	}
	return "api key expired at " + e.ExpiresAt.UTC().Format(time.RFC3339)
}

// Is makes an expired key an invalid key to callers that do not care why.
func (e *ExpiredKeyError) Is(target error) bool { return target == ErrInvalidKey }

// Principal is an authenticated key: who is calling and under which limits.
// Principals are shared between requests and must not be modified.
type Principal struct {
	KeyID     string
	KeyPrefix string // display prefix, safe to log
	TenantID  int64
	Tenant    string
	// Limits; 0 means unlimited.
	RPM, TPM, MaxConcurrency int64
	// Models the key may use; empty means all.
	Models []string
	// ExpiresAt is when the key stops working; zero means never.
	ExpiresAt time.Time
	// Class is the key's priority class: the highest its requests run as.
	Class Class
	// Rotated says the secret is the key's previous one, which works only
	// until ExpiresAt (the rotation's grace).
	Rotated bool

	// Resolved once per cache fill so that admission skips the map lookups.
	// Nil in a Principal built by hand; Admit then looks them up.
	key    *keyState
	tenant *tenantState
}

// Allows reports whether the principal may use model.
func (p *Principal) Allows(model string) bool {
	return len(p.Models) == 0 || slices.Contains(p.Models, model)
}

// entry is a cached authentication result; p is nil for a key that does not
// exist or is revoked (revoked says which).
type entry struct {
	sum     [sha256.Size]byte
	gen     uint64
	p       *Principal
	revoked bool
}

// refused is the error of an entry without a principal.
func (e *entry) refused() error {
	if e.revoked {
		return ErrRevokedKey
	}
	return ErrInvalidKey
}

// Authenticate resolves a secret to its principal. It returns ErrInvalidKey
// for a malformed or unknown secret, [ErrRevokedKey] (which is an
// ErrInvalidKey too) for a revoked one, an [*ExpiredKeyError] for an
// expired one, and another error only when the store could not be asked. Results, good and bad, are cached until the
// store's key version changes, so a cache hit touches neither SQLite nor the
// heap.
func (g *Gate) Authenticate(ctx context.Context, secret string) (*Principal, error) {
	if !wellFormed(secret) {
		return nil, ErrInvalidKey
	}
	var buf [secretLen]byte
	copy(buf[:], secret)
	sum := sha256.Sum256(buf[:])
	// The hash is uniformly random already; its first 8 bytes index the
	// cache and the full hash is compared on a hit.
	ck := binary.LittleEndian.Uint64(sum[:8])
	gen := g.gen.Load()
	if e, ok := g.cache.Get(ck); ok && e.gen == gen && e.sum == sum {
		if e.p == nil {
			return nil, e.refused()
		}
		return g.unexpired(e.p)
	}
	return g.lookup(ctx, ck, sum, gen)
}

// unexpired returns p, or an [*ExpiredKeyError] once its key has expired.
// Expiry is checked on every use, not when the key was cached: a key
// expires at its time even while no change bumps the keys version.
func (g *Gate) unexpired(p *Principal) (*Principal, error) {
	if !p.ExpiresAt.IsZero() && !g.now().Before(p.ExpiresAt) {
		return nil, &ExpiredKeyError{ExpiresAt: p.ExpiresAt, Rotated: p.Rotated}
	}
	return p, nil
}

// lookup asks the store and caches the answer under gen, the generation
// read before the question was asked: if the cache is dropped meanwhile, the
// answer is stale on arrival and will not be served.
func (g *Gate) lookup(ctx context.Context, ck uint64, sum [sha256.Size]byte, gen uint64) (*Principal, error) {
	k, err := g.st.KeyByHash(ctx, sum[:])
	switch {
	case errors.Is(err, data.ErrNotFound):
	case err != nil:
		return nil, fmt.Errorf("policy: look up key: %w", err)
	}
	e := &entry{sum: sum, gen: gen, revoked: err == nil && k.Revoked()}
	if err == nil && !e.revoked {
		e.p = g.principal(k)
		// A tenant whose budget period changed since the last poll (a key
		// made a moment ago with a new period) is counted by it at once.
		if err := g.syncPeriod(ctx, e.p.tenant, k.Tenant.ID, k.Tenant.BudgetPeriod, g.now()); err != nil {
			return nil, fmt.Errorf("policy: look up key: %w", err)
		}
	}
	// Set is applied asynchronously; wait so that the next request with
	// this secret hits.
	if g.cache.Set(ck, e, 1) {
		g.cache.Wait()
	}
	if e.p == nil {
		return nil, e.refused()
	}
	return g.unexpired(e.p)
}

// principal builds the Principal of a stored key, bound to the key's and
// tenant's limiter and budget state.
func (g *Gate) principal(k data.Key) *Principal {
	exp := k.ExpiresAt
	if k.Rotated && (exp.IsZero() || k.PrevUntil.Before(exp)) {
		// The old secret of a rotated key: it works until the grace ends
		// (a zero PrevUntil, no grace left, has ended long ago).
		exp = k.PrevUntil
		if exp.IsZero() {
			exp = time.Unix(0, 0)
		}
	}
	return &Principal{
		Rotated:        k.Rotated,
		KeyID:          k.ID,
		KeyPrefix:      k.Prefix,
		TenantID:       k.Tenant.ID,
		Tenant:         k.Tenant.Name,
		RPM:            k.RPM,
		TPM:            k.TPM,
		MaxConcurrency: k.MaxConcurrency,
		Models:         slices.Clip(k.Models),
		ExpiresAt:      exp,
		Class:          StoredClass(k.Class),
		key:            g.keyFor(k.ID),
		tenant:         g.tenantFor(k.Tenant.ID, k.Tenant.Name, k.Tenant.BudgetTokens, k.Tenant.BudgetMicros),
	}
}
