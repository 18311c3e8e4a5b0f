package policy

import (
	"context"
	"errors"
	"fmt"

	"github.com/tailgate-dev/tailgate/data"
)

// PrincipalForKey returns the principal of the key with id keyID, as
// [Gate.Authenticate] would for its secret, sharing that key's limiter state
// and its tenant's budget. It serves work that outlives the request that
// started it and runs without the secret: a batch's lines run as the key that
// created the batch. It reads the store on every call (no cache), so a
// revocation is seen at once; an unknown or revoked key is [ErrInvalidKey],
// an expired one an [*ExpiredKeyError].
func (g *Gate) PrincipalForKey(ctx context.Context, keyID string) (*Principal, error) {
	k, err := g.st.KeyByID(ctx, keyID)
	switch {
	case errors.Is(err, data.ErrNotFound):
		return nil, ErrInvalidKey
	case err != nil:
		return nil, fmt.Errorf("policy: look up key: %w", err)
	case k.Revoked():
		return nil, ErrInvalidKey
	}
	return g.unexpired(g.principal(k))
}
