package data

import (
	"bytes"
	"context"
	"errors"
	"regexp"
	"slices"
	"testing"
)

func TestCreateKeyAndLookupByHash(t *testing.T) {
	forEachEngine(t, func(t *testing.T, e engineCase) {
		s := e.open(t)
		ctx := context.Background()
		tn, err := s.EnsureTenant(ctx, "acme")
		if err != nil {
			t.Fatal(err)
		}
		if err := s.SetTenantBudget(ctx, tn.ID, 1000, 5_000_000); err != nil {
			t.Fatal(err)
		}

		created, err := s.CreateKey(ctx, Key{
			Tenant: Tenant{ID: tn.ID}, Prefix: "tg-3f9a1c2b", Hash: hashOf("s1"),
			RPM: 60, TPM: 10000, MaxConcurrency: 4, Models: []string{"llama", "qwen/Qwen2.5-7B"},
		})
		if err != nil {
			t.Fatal(err)
		}
		if !regexp.MustCompile(`^key_[0-9a-f]{16}$`).MatchString(created.ID) {
			t.Errorf("generated id %q, want key_ + 16 hex", created.ID)
		}
		if created.CreatedAt.IsZero() || created.Revoked() {
			t.Errorf("created key: CreatedAt %v, revoked %v", created.CreatedAt, created.Revoked())
		}
		if created.Tenant.Name != "acme" || created.Tenant.BudgetTokens != 1000 {
			t.Errorf("created key tenant = %+v, want acme with budget", created.Tenant)
		}

		got, err := s.KeyByHash(ctx, hashOf("s1"))
		if err != nil {
			t.Fatal(err)
		}
		if got.ID != created.ID || got.Prefix != "tg-3f9a1c2b" || !bytes.Equal(got.Hash, hashOf("s1")) ||
			got.RPM != 60 || got.TPM != 10000 || got.MaxConcurrency != 4 ||
			!slices.Equal(got.Models, []string{"llama", "qwen/Qwen2.5-7B"}) || !got.CreatedAt.Equal(created.CreatedAt) {
			t.Errorf("KeyByHash = %+v\nwant %+v", got, created)
		}
		if got.Tenant.BudgetTokens != 1000 || got.Tenant.BudgetMicros != 5_000_000 {
			t.Errorf("KeyByHash tenant budget = %d/%d, want 1000/5000000", got.Tenant.BudgetTokens, got.Tenant.BudgetMicros)
		}

		if _, err := s.KeyByHash(ctx, hashOf("nope")); !errors.Is(err, ErrNotFound) {
			t.Errorf("KeyByHash(unknown) err = %v, want ErrNotFound", err)
		}
		if _, err := s.CreateKey(ctx, Key{Tenant: tn, Prefix: "tg-x", Hash: hashOf("s1")}); err == nil {
			t.Error("second key with the same hash was accepted")
		}
		if _, err := s.CreateKey(ctx, Key{Tenant: Tenant{ID: 999}, Prefix: "tg-y", Hash: hashOf("s9")}); err == nil {
			t.Error("key for a missing tenant was accepted")
		}
		if _, err := s.CreateKey(ctx, Key{ID: "key_fixed", Tenant: tn, Prefix: "tg-z", Hash: hashOf("s2")}); err != nil {
			t.Errorf("CreateKey with a caller-chosen id: %v", err)
		}
	})
}

func TestKeysListsByTenantInCreationOrder(t *testing.T) {
	forEachEngine(t, func(t *testing.T, e engineCase) {
		s := e.open(t)
		ctx := context.Background()
		a, _ := s.EnsureTenant(ctx, "a")
		b, _ := s.EnsureTenant(ctx, "b")
		var ids []string
		for i, tn := range []Tenant{a, b, a, b, a} {
			k, err := s.CreateKey(ctx, Key{Tenant: tn, Prefix: "tg-" + string(rune('0'+i)), Hash: hashOf(string(rune('0' + i)))})
			if err != nil {
				t.Fatal(err)
			}
			ids = append(ids, k.ID)
		}
		for _, tc := range []struct {
			tenant string
			want   []string
		}{
			{"", ids},
			{"a", []string{ids[0], ids[2], ids[4]}},
			{"b", []string{ids[1], ids[3]}},
			{"nobody", nil},
		} {
			ks, err := s.Keys(ctx, tc.tenant)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, k := range ks {
				got = append(got, k.ID)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("Keys(%q) = %v, want %v", tc.tenant, got, tc.want)
			}
		}
	})
}

func TestRevokeKey(t *testing.T) {
	forEachEngine(t, func(t *testing.T, e engineCase) {
		ctx := context.Background()
		setup := func(t *testing.T) (*Store, []Key) {
			s := e.open(t)
			tn, err := s.EnsureTenant(ctx, "acme")
			if err != nil {
				t.Fatal(err)
			}
			var ks []Key
			for _, k := range []Key{
				{ID: "key_0000000000000001", Prefix: "tg-unique", Hash: hashOf("one")},
				{ID: "key_0000000000000002", Prefix: "tg-shared", Hash: hashOf("two")},
				{ID: "key_0000000000000003", Prefix: "tg-shared", Hash: hashOf("three")},
			} {
				k.Tenant = tn
				k, err := s.CreateKey(ctx, k)
				if err != nil {
					t.Fatal(err)
				}
				ks = append(ks, k)
			}
			return s, ks
		}

		for _, tc := range []struct {
			name    string
			ref     string
			hash    []byte
			want    string // id of the revoked key
			wantErr error
		}{
			{name: "by id", ref: "key_0000000000000002", want: "key_0000000000000002"},
			{name: "by unique prefix", ref: "tg-unique", want: "key_0000000000000001"},
			{name: "by shared prefix is ambiguous", ref: "tg-shared", wantErr: ErrAmbiguous},
			{name: "by secret's hash", ref: "sk-three-secret", hash: hashOf("three"), want: "key_0000000000000003"},
			{name: "by hash alone", hash: hashOf("one"), want: "key_0000000000000001"},
			{name: "unknown ref", ref: "tg-nope", hash: hashOf("nope"), wantErr: ErrNotFound},
			{name: "empty ref and no hash", wantErr: ErrNotFound},
		} {
			t.Run(tc.name, func(t *testing.T) {
				s, _ := setup(t)
				v0, _ := s.KeysVersion(ctx)
				got, err := s.RevokeKey(ctx, tc.ref, tc.hash)
				v1, _ := s.KeysVersion(ctx)
				if tc.wantErr != nil {
					if !errors.Is(err, tc.wantErr) {
						t.Fatalf("err = %v, want %v", err, tc.wantErr)
					}
					if v1 != v0 {
						t.Errorf("keys version moved %d → %d on a failed revoke", v0, v1)
					}
					all, _ := s.Keys(ctx, "")
					for _, k := range all {
						if k.Revoked() {
							t.Errorf("key %s revoked by a failed revoke", k.ID)
						}
					}
					return
				}
				if err != nil {
					t.Fatal(err)
				}
				if got.ID != tc.want || !got.Revoked() {
					t.Fatalf("revoked %s (revoked=%v), want %s", got.ID, got.Revoked(), tc.want)
				}
				if v1 <= v0 {
					t.Errorf("keys version %d → %d, want a bump", v0, v1)
				}
				all, _ := s.Keys(ctx, "")
				for _, k := range all {
					if k.Revoked() != (k.ID == tc.want) {
						t.Errorf("key %s revoked=%v", k.ID, k.Revoked())
					}
				}
				byHash, err := s.KeyByHash(ctx, got.Hash)
				if err != nil || !byHash.Revoked() {
					t.Errorf("KeyByHash after revoke = %+v, %v; want the revoked key", byHash, err)
				}

				again, err := s.RevokeKey(ctx, got.ID, nil)
				if err != nil {
					t.Fatalf("second revoke: %v", err)
				}
				if !again.RevokedAt.Equal(got.RevokedAt) {
					t.Errorf("second revoke moved RevokedAt %v → %v", got.RevokedAt, again.RevokedAt)
				}
			})
		}
	})
}

func TestKeysVersionBumps(t *testing.T) {
	forEachEngine(t, func(t *testing.T, e engineCase) {
		s := e.open(t)
		ctx := context.Background()
		tn, err := s.EnsureTenant(ctx, "acme")
		if err != nil {
			t.Fatal(err)
		}
		var k Key
		for _, tc := range []struct {
			name string
			op   func() error
			bump bool
		}{
			{"ensure tenant does not", func() error { _, err := s.EnsureTenant(ctx, "other"); return err }, false},
			{"create key does", func() error {
				var err error
				k, err = s.CreateKey(ctx, Key{Tenant: tn, Prefix: "tg-a", Hash: hashOf("a")})
				return err
			}, true},
			{"set budget does", func() error { return s.SetTenantBudget(ctx, tn.ID, 10, 20) }, true},
			{"revoke does", func() error { _, err := s.RevokeKey(ctx, k.ID, nil); return err }, true},
			{"revoking again does not", func() error { _, err := s.RevokeKey(ctx, k.ID, nil); return err }, false},
			{"ledger insert does not", func() error {
				return s.InsertLedger(ctx, []LedgerRow{{ID: "r", TenantID: tn.ID, Stages: UnknownStages()}})
			}, false},
		} {
			before, err := s.KeysVersion(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := tc.op(); err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
			after, err := s.KeysVersion(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if bumped := after > before; bumped != tc.bump {
				t.Errorf("%s: version %d → %d", tc.name, before, after)
			}
		}
	})
}

func TestTenants(t *testing.T) {
	forEachEngine(t, func(t *testing.T, e engineCase) {
		s := e.open(t)
		ctx := context.Background()
		a, err := s.EnsureTenant(ctx, "acme")
		if err != nil {
			t.Fatal(err)
		}
		again, err := s.EnsureTenant(ctx, "acme")
		if err != nil {
			t.Fatal(err)
		}
		if again.ID != a.ID || !again.CreatedAt.Equal(a.CreatedAt) {
			t.Errorf("EnsureTenant twice gave %+v then %+v", a, again)
		}
		b, _ := s.EnsureTenant(ctx, "beta")
		if err := s.SetTenantBudget(ctx, b.ID, 7, 8); err != nil {
			t.Fatal(err)
		}
		if err := s.SetTenantBudget(ctx, 999, 1, 1); !errors.Is(err, ErrNotFound) {
			t.Errorf("SetTenantBudget(missing) err = %v, want ErrNotFound", err)
		}
		if _, err := s.EnsureTenant(ctx, ""); err == nil {
			t.Error("EnsureTenant(\"\") succeeded")
		}

		ts, err := s.Tenants(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(ts) != 2 || ts[0].Name != "acme" || ts[1].Name != "beta" || ts[1].BudgetTokens != 7 || ts[1].BudgetMicros != 8 {
			t.Errorf("Tenants = %+v", ts)
		}
		got, err := s.TenantByName(ctx, "beta")
		if err != nil || got.BudgetTokens != 7 {
			t.Errorf("TenantByName(beta) = %+v, %v", got, err)
		}
		if _, err := s.TenantByName(ctx, "gamma"); !errors.Is(err, ErrNotFound) {
			t.Errorf("TenantByName(missing) err = %v, want ErrNotFound", err)
		}
	})
}
