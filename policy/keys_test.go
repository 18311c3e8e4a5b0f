package policy

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"strings"
	"testing"

	"github.com/tailgate-dev/tailgate/data"
)

func TestNewSecretShape(t *testing.T) {
	seen := make(map[string]bool)
	for range 100 {
		secret, prefix, hash, err := NewSecret()
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(secret, SecretPrefix) || len(secret) != 46 || !wellFormed(secret) {
			t.Fatalf("secret %q: want tg- and 43 base64url chars", secret)
		}
		if prefix != secret[:11] {
			t.Fatalf("prefix %q, want first 11 chars of the secret", prefix)
		}
		if sum := sha256.Sum256([]byte(secret)); !bytes.Equal(hash, sum[:]) || !bytes.Equal(HashSecret(secret), sum[:]) {
			t.Fatal("hash is not the secret's SHA-256")
		}
		if seen[secret] {
			t.Fatal("secret repeated")
		}
		seen[secret] = true
	}
}

func TestCreateKeyStoresKeyAndBudget(t *testing.T) {
	ctx := context.Background()
	st, _ := openStore(t)

	secret, k := createKey(t, st, KeyOptions{
		Tenant: "acme", RPM: 60, TPM: 1000, MaxConcurrency: 3, Models: []string{"m1", "m2"},
		BudgetTokens: ptr(5000), BudgetMicros: ptr(700),
	})
	got, err := st.KeyByHash(ctx, HashSecret(secret))
	if err != nil {
		t.Fatal(err)
	}
	if got.ID != k.ID || got.Prefix != secret[:11] || got.RPM != 60 || got.TPM != 1000 ||
		got.MaxConcurrency != 3 || len(got.Models) != 2 || got.Tenant.Name != "acme" {
		t.Fatalf("stored key %+v", got)
	}
	if got.Tenant.BudgetTokens != 5000 || got.Tenant.BudgetMicros != 700 {
		t.Fatalf("budget %d/%d, want 5000/700", got.Tenant.BudgetTokens, got.Tenant.BudgetMicros)
	}

	// A second key for the same tenant without a budget leaves it alone; one
	// that sets only tokens keeps the money budget.
	createKey(t, st, KeyOptions{Tenant: "acme"})
	createKey(t, st, KeyOptions{Tenant: "acme", BudgetTokens: ptr(9000)})
	tn, err := st.TenantByName(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	if tn.BudgetTokens != 9000 || tn.BudgetMicros != 700 {
		t.Fatalf("budget %d/%d, want 9000/700", tn.BudgetTokens, tn.BudgetMicros)
	}
	if ts, _ := st.Tenants(ctx); len(ts) != 1 {
		t.Fatalf("%d tenants, want 1", len(ts))
	}
}

func TestCreateKeyRejectsBadOptions(t *testing.T) {
	st, _ := openStore(t)
	for name, o := range map[string]KeyOptions{
		"no tenant":       {},
		"blank tenant":    {Tenant: "  "},
		"negative rpm":    {Tenant: "a", RPM: -1},
		"negative tpm":    {Tenant: "a", TPM: -1},
		"negative conc":   {Tenant: "a", MaxConcurrency: -1},
		"negative budget": {Tenant: "a", BudgetTokens: ptr(-1)},
		"negative micros": {Tenant: "a", BudgetMicros: ptr(-1)},
		"empty model":     {Tenant: "a", Models: []string{""}},
	} {
		if _, _, err := CreateKey(context.Background(), st, o); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

func TestRevokeKeyErrorsNeverEchoTheSecret(t *testing.T) {
	st, _ := openStore(t)
	secret, _, _, _ := NewSecret()
	_, err := RevokeKey(context.Background(), st, secret)
	if !errors.Is(err, data.ErrNotFound) {
		t.Fatalf("err = %v, want ErrNotFound", err)
	}
	if strings.Contains(err.Error(), secret) || strings.Contains(err.Error(), secret[:11]) {
		t.Fatalf("error %q leaks the secret", err)
	}
	if _, err := RevokeKey(context.Background(), st, " "); err == nil {
		t.Fatal("empty reference accepted")
	}
}

func TestRevokeKeyByPrefixShared(t *testing.T) {
	// Two keys with the same display prefix: the prefix is ambiguous, the
	// secret is not.
	ctx := context.Background()
	st, _ := openStore(t)
	tn, err := st.EnsureTenant(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	s1 := SecretPrefix + "AAAAAAAA" + strings.Repeat("b", 35)
	s2 := SecretPrefix + "AAAAAAAA" + strings.Repeat("c", 35)
	for _, s := range []string{s1, s2} {
		if _, err := st.CreateKey(ctx, data.Key{Tenant: tn, Prefix: s[:11], Hash: HashSecret(s)}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := RevokeKey(ctx, st, s1[:11]); !errors.Is(err, data.ErrAmbiguous) {
		t.Fatalf("err = %v, want ErrAmbiguous", err)
	}
	k, err := RevokeKey(ctx, st, s2)
	if err != nil || !k.Revoked() || !bytes.Equal(k.Hash, HashSecret(s2)) {
		t.Fatalf("revoke by secret: %+v, %v", k, err)
	}
}
