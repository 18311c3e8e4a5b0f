package data

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"
)

// TestKeyExpiryAndEdit: a key's expiry is stored and read back; an edit
// changes only the fields it names, bumps the keys version (so gateways
// reload) and can clear the model list and the expiry; a revoked key cannot
// be edited.
func TestKeyExpiryAndEdit(t *testing.T) {
	forEachEngine(t, func(t *testing.T, e engineCase) {
		ctx := context.Background()
		s := e.open(t)
		tn, err := s.EnsureTenant(ctx, "acme")
		if err != nil {
			t.Fatal(err)
		}
		exp := time.Date(2027, 1, 31, 0, 0, 0, 0, time.UTC)
		k, err := s.CreateKey(ctx, Key{Tenant: tn, Prefix: "tg-edit", Hash: hashOf("e1"), RPM: 60, TPM: 1000,
			MaxConcurrency: 2, Models: []string{"llama"}, ExpiresAt: exp})
		if err != nil {
			t.Fatal(err)
		}
		if got, _ := s.KeyByHash(ctx, hashOf("e1")); !got.ExpiresAt.Equal(exp) {
			t.Fatalf("stored expiry %v, want %v", got.ExpiresAt, exp)
		}
		if !k.ExpiredAt(exp) || k.ExpiredAt(exp.Add(-time.Microsecond)) {
			t.Errorf("ExpiredAt wrong around %v", exp)
		}

		v0, _ := s.KeysVersion(ctx)
		rpm := int64(5)
		got, err := s.UpdateKey(ctx, "tg-edit", nil, KeyUpdate{RPM: &rpm})
		if err != nil {
			t.Fatal(err)
		}
		if got.RPM != 5 || got.TPM != 1000 || got.MaxConcurrency != 2 || !slices.Equal(got.Models, []string{"llama"}) || !got.ExpiresAt.Equal(exp) {
			t.Fatalf("after editing rpm only: %+v", got)
		}
		if v1, _ := s.KeysVersion(ctx); v1 <= v0 {
			t.Errorf("keys version %d after an edit, was %d", v1, v0)
		}

		none, never := []string{}, time.Time{}
		if got, err = s.UpdateKey(ctx, k.ID, nil, KeyUpdate{Models: &none, ExpiresAt: &never}); err != nil {
			t.Fatal(err)
		}
		if len(got.Models) != 0 || !got.ExpiresAt.IsZero() || got.RPM != 5 {
			t.Fatalf("after clearing models and expiry: %+v", got)
		}
		if reread, _ := s.KeyByID(ctx, k.ID); len(reread.Models) != 0 || !reread.ExpiresAt.IsZero() {
			t.Fatalf("read back: %+v", reread)
		}

		if _, err := s.UpdateKey(ctx, "tg-nosuch", nil, KeyUpdate{RPM: &rpm}); !errors.Is(err, ErrNotFound) {
			t.Errorf("edit of an unknown key: %v", err)
		}
		if _, err := s.RevokeKey(ctx, k.ID, nil); err != nil {
			t.Fatal(err)
		}
		if _, err := s.UpdateKey(ctx, k.ID, nil, KeyUpdate{RPM: &rpm}); !errors.Is(err, ErrRevoked) {
			t.Errorf("edit of a revoked key: %v, want ErrRevoked", err)
		}
	})
}

// TestUsageCountsRejectedApart: refused requests (by the gateway or by an
// engine) are counted in Rejected and add nothing to requests, tokens or
// cost, even when their rows carry tokens.
func TestUsageCountsRejectedApart(t *testing.T) {
	forEachEngine(t, func(t *testing.T, e engineCase) {
		ctx := context.Background()
		s := e.open(t)
		tn, err := s.EnsureTenant(ctx, "acme")
		if err != nil {
			t.Fatal(err)
		}
		k, err := s.CreateKey(ctx, Key{Tenant: tn, Prefix: "tg-u", Hash: hashOf("u")})
		if err != nil {
			t.Fatal(err)
		}
		t0 := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
		row := func(id string, o Outcome, status int, p, c, cost int64) LedgerRow {
			return LedgerRow{ID: id, Time: t0, TenantID: tn.ID, KeyID: k.ID, Model: "llama", Status: status, Outcome: o,
				PromptTokens: p, CompletionTokens: c, CostMicros: cost, Stages: UnknownStages()}
		}
		if err := s.InsertLedger(ctx, []LedgerRow{
			row("ok1", OutcomeOK, 200, 10, 20, 300),
			row("ok2", OutcomeUpstreamError, 502, 1, 0, 10),
			row("rej1", OutcomeRejected, 429, 7, 0, 70),
			row("rej2", OutcomeRejected, 403, 0, 0, 0),
			row("rej3", OutcomeUpstreamRejected, 400, 5, 0, 50),
		}); err != nil {
			t.Fatal(err)
		}
		got, err := s.Usage(ctx, UsageFilter{})
		if err != nil {
			t.Fatal(err)
		}
		want := []UsageRow{{Tenant: "acme", KeyID: k.ID, KeyPrefix: "tg-u", Model: "llama",
			Requests: 2, PromptTokens: 11, CompletionTokens: 20, CostMicros: 310, Rejected: 3}}
		if !slices.Equal(got, want) {
			t.Fatalf("Usage =\n%+v\nwant\n%+v", got, want)
		}
	})
}
