package data

import (
	"context"
	"strings"
	"testing"
	"time"
)

// Migration 0013 on a ledger that has rows already: the daily and per-key
// totals and the last use are filled from them.
func TestKeyIdentityMigrationBackfills(t *testing.T) {
	forEachEngine(t, func(t *testing.T, e engineCase) {
		ctx := context.Background()
		s := e.open(t)
		acme, _ := s.EnsureTenant(ctx, "acme")
		k, _ := s.CreateKey(ctx, Key{Tenant: acme, Prefix: "tg-1", Hash: hashOf("1")})
		t0 := time.Date(2026, 11, 3, 10, 0, 0, 0, time.UTC)
		if err := s.InsertLedger(ctx, []LedgerRow{okRow("a", t0, acme, k, "m", 1, 2, 3), okRow("b", t0.Add(time.Hour), acme, k, "m", 4, 5, 6)}); err != nil {
			t.Fatal(err)
		}
		// Undo what the triggers kept, as if the rows predated 0013, and
		// run its backfill again.
		for _, q := range []string{`DELETE FROM tenant_daily_spend`, `DELETE FROM key_spend`, `UPDATE api_keys SET last_used_at = NULL`} {
			if _, err := s.write.ExecContext(ctx, q); err != nil {
				t.Fatal(err)
			}
		}
		ms, err := loadMigrations(s.engine)
		if err != nil {
			t.Fatal(err)
		}
		var backfill string
		for _, m := range ms {
			if m.version == 13 {
				_, backfill, _ = strings.Cut(m.sql, "-- What the ledger holds already.")
			}
		}
		if backfill == "" {
			t.Fatal("0013 has no backfill section")
		}
		if _, err := s.write.ExecContext(ctx, backfill); err != nil {
			t.Fatal(err)
		}
		spend, _ := s.KeySpend(ctx)
		day, _ := s.TenantPeriodSpend(ctx, acme.ID, PeriodStart(PeriodDaily, t0))
		got, _ := s.KeyByID(ctx, k.ID)
		if spend[k.ID] != (KeyTotal{Requests: 2, Spend: Spend{Tokens: 12, Micros: 9}}) || day != (Spend{Tokens: 12, Micros: 9}) ||
			!got.LastUsedAt.Equal(t0.Add(time.Hour)) {
			t.Fatalf("after the backfill: key %+v, day %+v, last used %v", spend[k.ID], day, got.LastUsedAt)
		}
	})
}
