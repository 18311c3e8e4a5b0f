package data

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/data/commitlog"
)

func okRow(id string, at time.Time, tn Tenant, k Key, model string, p, c, cost int64) LedgerRow {
	return LedgerRow{ID: id, Time: at, TenantID: tn.ID, KeyID: k.ID, Model: model, PromptTokens: p, CompletionTokens: c,
		CostMicros: cost, Status: 200, Outcome: OutcomeOK, Attempts: 1, Stages: UnknownStages()}
}

// A key's name is unique among its tenant's active keys: another tenant may
// use it, and a revoked key's name is free again. Owner and note are kept,
// and the name finds the key ("tenant/name").
func TestKeyNamesUniquePerTenant(t *testing.T) {
	forEachEngine(t, func(t *testing.T, e engineCase) {
		ctx := context.Background()
		s := e.open(t)
		acme, _ := s.EnsureTenant(ctx, "acme")
		beta, _ := s.EnsureTenant(ctx, "beta")
		k, err := s.CreateKey(ctx, Key{Tenant: acme, Prefix: "tg-a", Hash: hashOf("a"), Name: "bob-laptop", Owner: "bob@example.com", Note: "for the demo"})
		if err != nil {
			t.Fatal(err)
		}
		if k.Name != "bob-laptop" || k.Owner != "bob@example.com" || k.Note != "for the demo" {
			t.Fatalf("stored key %+v", k)
		}
		_, err = s.CreateKey(ctx, Key{Tenant: acme, Prefix: "tg-b", Hash: hashOf("b"), Name: "bob-laptop"})
		if !errors.Is(err, ErrNameTaken) {
			t.Fatalf("second bob-laptop of acme: %v, want ErrNameTaken", err)
		}
		if _, err := s.CreateKey(ctx, Key{Tenant: beta, Prefix: "tg-c", Hash: hashOf("c"), Name: "bob-laptop"}); err != nil {
			t.Fatalf("bob-laptop of another tenant: %v", err)
		}
		if _, err := s.CreateKey(ctx, Key{Tenant: acme, Prefix: "tg-d", Hash: hashOf("d"), Name: "bad name"}); err == nil {
			t.Fatal("a name with a space was stored")
		}
		// The name alone is ambiguous (two tenants); tenant/name is not.
		if _, err := s.RevokeKey(ctx, "bob-laptop", nil); !errors.Is(err, ErrAmbiguous) {
			t.Fatalf("revoke by a name two tenants use: %v, want ErrAmbiguous", err)
		}
		got, err := s.RevokeKey(ctx, "acme/bob-laptop", nil)
		if err != nil || got.ID != k.ID {
			t.Fatalf("revoke acme/bob-laptop: %+v, %v", got, err)
		}
		if _, err := s.CreateKey(ctx, Key{Tenant: acme, Prefix: "tg-e", Hash: hashOf("e"), Name: "bob-laptop"}); err != nil {
			t.Fatalf("reusing the name of a revoked key: %v", err)
		}
		// An edit cannot take a name in use either.
		other, err := s.CreateKey(ctx, Key{Tenant: acme, Prefix: "tg-f", Hash: hashOf("f")})
		if err != nil {
			t.Fatal(err)
		}
		name := "bob-laptop"
		if _, err := s.UpdateKey(ctx, other.ID, nil, KeyUpdate{Name: &name}); !errors.Is(err, ErrNameTaken) {
			t.Fatalf("renaming onto a taken name: %v, want ErrNameTaken", err)
		}
	})
}

// A rotated key keeps its id, name and limits under a new secret; its old
// secret is found (Rotated, PrevUntil the grace's end) until the next
// rotation, and with no grace not at all.
func TestRotateKeyKeepsIdentity(t *testing.T) {
	forEachEngine(t, func(t *testing.T, e engineCase) {
		ctx := context.Background()
		s := e.open(t)
		acme, _ := s.EnsureTenant(ctx, "acme")
		k, err := s.CreateKey(ctx, Key{Tenant: acme, Prefix: "tg-old", Hash: hashOf("old"), Name: "ci", RPM: 7})
		if err != nil {
			t.Fatal(err)
		}
		v0, _ := s.KeysVersion(ctx)
		until := time.Now().Add(time.Hour).UTC().Truncate(time.Microsecond)
		r, err := s.RotateKey(ctx, "ci", nil, hashOf("new"), "tg-new", until)
		if err != nil {
			t.Fatal(err)
		}
		if r.ID != k.ID || r.Name != "ci" || r.RPM != 7 || r.Prefix != "tg-new" || !r.PrevUntil.Equal(until) {
			t.Fatalf("rotated key %+v", r)
		}
		if v1, _ := s.KeysVersion(ctx); v1 == v0 {
			t.Fatal("rotation did not bump the keys version")
		}
		cur, err := s.KeyByHash(ctx, hashOf("new"))
		if err != nil || cur.ID != k.ID || cur.Rotated {
			t.Fatalf("new secret: %+v, %v", cur, err)
		}
		old, err := s.KeyByHash(ctx, hashOf("old"))
		if err != nil || old.ID != k.ID || !old.Rotated || !old.PrevUntil.Equal(until) {
			t.Fatalf("old secret in its grace: %+v, %v", old, err)
		}
		if _, err := s.RotateKey(ctx, k.ID, nil, hashOf("newer"), "tg-newer", time.Time{}); err != nil {
			t.Fatal(err)
		}
		for _, secret := range []string{"old", "new"} {
			if _, err := s.KeyByHash(ctx, hashOf(secret)); !errors.Is(err, ErrNotFound) {
				t.Fatalf("secret %q after a rotation without grace: %v, want ErrNotFound", secret, err)
			}
		}
	})
}

// last_used_at follows the key's ledger rows, moved at most once a minute;
// key_spend counts each key's final rows (refused ones not as requests), so
// keys list shows per-key spend.
func TestKeyLastUsedAndSpend(t *testing.T) {
	forEachEngine(t, func(t *testing.T, e engineCase) {
		ctx := context.Background()
		s := e.open(t)
		acme, _ := s.EnsureTenant(ctx, "acme")
		k1, _ := s.CreateKey(ctx, Key{Tenant: acme, Prefix: "tg-1", Hash: hashOf("1")})
		k2, _ := s.CreateKey(ctx, Key{Tenant: acme, Prefix: "tg-2", Hash: hashOf("2")})
		t0 := time.Date(2026, 11, 3, 10, 0, 0, 0, time.UTC)
		lastUsed := func() time.Time {
			k, err := s.KeyByID(ctx, k1.ID)
			if err != nil {
				t.Fatal(err)
			}
			return k.LastUsedAt
		}
		if !lastUsed().IsZero() {
			t.Fatal("a new key has a last-used time")
		}
		steps := []struct {
			after time.Duration
			want  time.Duration
		}{{0, 0}, {30 * time.Second, 0}, {59 * time.Second, 0}, {61 * time.Second, 61 * time.Second}, {90 * time.Second, 61 * time.Second}, {3 * time.Minute, 3 * time.Minute}}
		for i, st := range steps {
			if err := s.InsertLedger(ctx, []LedgerRow{okRow(fmt.Sprint("u", i), t0.Add(st.after), acme, k1, "m", 10, 5, 100)}); err != nil {
				t.Fatal(err)
			}
			if got := lastUsed(); !got.Equal(t0.Add(st.want)) {
				t.Fatalf("after a row at +%v: last used %v, want +%v", st.after, got, st.want)
			}
		}
		rej := okRow("rej", t0, acme, k2, "m", 0, 0, 0)
		rej.Outcome, rej.Status = OutcomeRejected, 429
		open := okRow("open", t0, acme, k2, "m", 3, 3, 30)
		open.Outcome = OutcomeOpen
		if err := s.InsertLedger(ctx, []LedgerRow{okRow("k2", t0, acme, k2, "m", 1, 2, 3), rej, open}); err != nil {
			t.Fatal(err)
		}
		spend, err := s.KeySpend(ctx)
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]KeyTotal{
			k1.ID: {Requests: int64(len(steps)), Spend: Spend{Tokens: 15 * int64(len(steps)), Micros: 100 * int64(len(steps))}},
			k2.ID: {Requests: 1, Spend: Spend{Tokens: 3, Micros: 3}},
		}
		if spend[k1.ID] != want[k1.ID] || spend[k2.ID] != want[k2.ID] {
			t.Fatalf("key spend %+v, want %+v", spend, want)
		}
		// The open row counts once it is final.
		open.Outcome = OutcomeOK
		if err := s.InsertLedger(ctx, []LedgerRow{open}); err != nil {
			t.Fatal(err)
		}
		if spend, _ = s.KeySpend(ctx); spend[k2.ID] != (KeyTotal{Requests: 2, Spend: Spend{Tokens: 9, Micros: 33}}) {
			t.Fatalf("key spend after the stream settled: %+v", spend[k2.ID])
		}
	})
}

// A period's spend counts the rows whose time is in it, from the daily
// totals.
func TestTenantPeriodSpend(t *testing.T) {
	forEachEngine(t, func(t *testing.T, e engineCase) {
		ctx := context.Background()
		s := e.open(t)
		acme, _ := s.EnsureTenant(ctx, "acme")
		k, _ := s.CreateKey(ctx, Key{Tenant: acme, Prefix: "tg-1", Hash: hashOf("1")})
		nov30 := time.Date(2026, 11, 30, 23, 59, 59, 0, time.UTC)
		dec1 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
		if err := s.InsertLedger(ctx, []LedgerRow{okRow("a", nov30, acme, k, "m", 10, 0, 1), okRow("b", dec1, acme, k, "m", 20, 0, 2)}); err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct {
			since time.Time
			want  Spend
		}{
			{PeriodStart(PeriodMonthly, nov30), Spend{30, 3}},
			{PeriodStart(PeriodMonthly, dec1), Spend{20, 2}},
			{PeriodStart(PeriodDaily, nov30), Spend{30, 3}},
			{time.Time{}, Spend{30, 3}},
		} {
			got, err := s.TenantPeriodSpend(ctx, acme.ID, c.since)
			if err != nil || got != c.want {
				t.Errorf("spend since %v: %+v, %v; want %+v", c.since, got, err, c.want)
			}
		}
		// An alert is claimed once per period and threshold.
		for i, want := range []bool{true, false} {
			if ok, err := s.ClaimBudgetAlert(ctx, acme.ID, dec1, 80); err != nil || ok != want {
				t.Fatalf("claim %d: %v, %v; want %v", i, ok, err, want)
			}
		}
		if ok, _ := s.ClaimBudgetAlert(ctx, acme.ID, dec1.AddDate(0, 1, 0), 80); !ok {
			t.Fatal("the next period's alert was taken already")
		}
	})
}

func TestPeriodBoundaries(t *testing.T) {
	at := time.Date(2026, 11, 5, 13, 4, 5, 0, time.UTC) // a Thursday
	for _, c := range []struct {
		period     string
		start, end time.Time
	}{
		{PeriodDaily, time.Date(2026, 11, 5, 0, 0, 0, 0, time.UTC), time.Date(2026, 11, 6, 0, 0, 0, 0, time.UTC)},
		{PeriodWeekly, time.Date(2026, 11, 2, 0, 0, 0, 0, time.UTC), time.Date(2026, 11, 9, 0, 0, 0, 0, time.UTC)},
		{PeriodMonthly, time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC), time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)},
		{PeriodNone, time.Time{}, time.Time{}},
	} {
		if s, e := PeriodStart(c.period, at), PeriodEnd(c.period, at); !s.Equal(c.start) || !e.Equal(c.end) {
			t.Errorf("%q: [%v, %v), want [%v, %v)", c.period, s, e, c.start, c.end)
		}
	}
	// A Monday starts its own week; a Sunday is in the week before.
	if got := PeriodStart(PeriodWeekly, time.Date(2026, 11, 8, 23, 0, 0, 0, time.UTC)); got.Day() != 2 {
		t.Errorf("Sunday's week starts %v", got)
	}
	if got := PeriodStart(PeriodWeekly, time.Date(2026, 11, 9, 0, 0, 0, 0, time.UTC)); got.Day() != 9 {
		t.Errorf("Monday's week starts %v", got)
	}
	now := time.Date(2026, 11, 20, 12, 0, 0, 0, time.UTC)
	for in, want := range map[string]time.Time{
		"7d":                   now.AddDate(0, 0, -7),
		"36h":                  now.Add(-36 * time.Hour),
		"2026-11-01":           time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC),
		"2026-11-01T10:00:00Z": time.Date(2026, 11, 1, 10, 0, 0, 0, time.UTC),
	} {
		if got, err := ParseUsageTime(in, now); err != nil || !got.Equal(want) {
			t.Errorf("ParseUsageTime(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	if _, err := ParseUsageTime("last week", now); err == nil {
		t.Error("ParseUsageTime accepted \"last week\"")
	}
}

// Usage groups by calendar period and by one dimension, between since and
// until.
func TestUsageByPeriod(t *testing.T) {
	forEachEngine(t, func(t *testing.T, e engineCase) {
		ctx := context.Background()
		s := e.open(t)
		acme, _ := s.EnsureTenant(ctx, "acme")
		beta, _ := s.EnsureTenant(ctx, "beta")
		ka, _ := s.CreateKey(ctx, Key{Tenant: acme, Prefix: "tg-a", Hash: hashOf("a"), Name: "laptop"})
		kb, _ := s.CreateKey(ctx, Key{Tenant: beta, Prefix: "tg-b", Hash: hashOf("b")})
		day := func(m time.Month, d, h int) time.Time { return time.Date(2026, m, d, h, 0, 0, 0, time.UTC) }
		rows := []LedgerRow{
			okRow("1", day(10, 31, 23), acme, ka, "llama", 1, 1, 10), // Saturday, October
			okRow("2", day(11, 1, 0), acme, ka, "llama", 2, 2, 20),   // Sunday, same week, November
			okRow("3", day(11, 2, 9), acme, ka, "qwen", 3, 3, 30),    // Monday: a new week
			okRow("4", day(11, 2, 10), beta, kb, "llama", 4, 4, 40),
			okRow("5", day(12, 1, 0), beta, kb, "qwen", 5, 5, 50),
		}
		if err := s.InsertLedger(ctx, rows); err != nil {
			t.Fatal(err)
		}
		type g struct {
			period string
			who    string
			req    int64
			cost   int64
		}
		view := func(rs []UsageRow) []g {
			var out []g
			for _, r := range rs {
				p := ""
				if !r.Period.IsZero() {
					p = r.Period.Format(time.DateOnly)
				}
				out = append(out, g{p, r.Tenant + "|" + r.KeyName + "|" + r.Model, r.Requests, r.CostMicros})
			}
			return out
		}
		for _, c := range []struct {
			f    UsageFilter
			want []g
		}{
			{UsageFilter{By: UsageByDay, Since: day(11, 1, 0), Until: day(12, 1, 0)},
				[]g{{"2026-11-01", "||", 1, 20}, {"2026-11-02", "||", 2, 70}}},
			{UsageFilter{By: UsageByWeek},
				[]g{{"2026-10-26", "||", 2, 30}, {"2026-11-02", "||", 2, 70}, {"2026-11-30", "||", 1, 50}}},
			{UsageFilter{By: UsageByMonth},
				[]g{{"2026-10-01", "||", 1, 10}, {"2026-11-01", "||", 3, 90}, {"2026-12-01", "||", 1, 50}}},
			{UsageFilter{By: UsageByTenant}, []g{{"", "acme||", 3, 60}, {"", "beta||", 2, 90}}},
			{UsageFilter{By: UsageByKey, Tenant: "acme"}, []g{{"", "acme|laptop|", 3, 60}}},
			{UsageFilter{By: UsageByModel, Until: day(12, 1, 0)}, []g{{"", "||llama", 3, 70}, {"", "||qwen", 1, 30}}},
		} {
			got, err := s.Usage(ctx, c.f)
			if err != nil {
				t.Fatal(err)
			}
			if fmt.Sprint(view(got)) != fmt.Sprint(c.want) {
				t.Errorf("usage %+v:\n got %v\nwant %v", c.f, view(got), c.want)
			}
		}
		if _, err := s.Usage(ctx, UsageFilter{By: "year"}); err == nil {
			t.Error("usage by year was accepted")
		}
	})
}

// A row committed to the commit log and not yet written to SQLite is in
// usage at once — and once it is in SQLite too, it counts once.
func TestUsageReadsCommitLog(t *testing.T) {
	ctx := context.Background()
	s := openTestStore(t)
	acme, _ := s.EnsureTenant(ctx, "acme")
	k, _ := s.CreateKey(ctx, Key{Tenant: acme, Prefix: "tg-a", Hash: hashOf("a")})
	base, err := s.commitLogBase()
	if err != nil {
		t.Fatal(err)
	}
	l, err := commitlog.Open(base, commitlog.Config{}, func(string, [][]byte) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	old := okRow("old", time.Now().Add(-time.Minute), acme, k, "m", 1, 1, 1)
	newest := okRow("newest", time.Now(), acme, k, "m", 10, 10, 10)
	if err := s.InsertLedger(ctx, []LedgerRow{old}); err != nil {
		t.Fatal(err)
	}
	for _, r := range []LedgerRow{old, newest} {
		if _, err := l.Append(appendRecord(nil, &r)); err != nil {
			t.Fatal(err)
		}
	}
	total := func() int64 {
		rows, err := s.Usage(ctx, UsageFilter{Tenant: "acme"})
		if err != nil {
			t.Fatal(err)
		}
		var n int64
		for _, r := range rows {
			n += r.Requests
		}
		return n
	}
	if n := total(); n != 2 {
		t.Fatalf("usage counts %d requests with one only in the commit log, want 2", n)
	}
	if err := s.InsertLedger(ctx, []LedgerRow{newest}); err != nil {
		t.Fatal(err)
	}
	if n := total(); n != 2 {
		t.Fatalf("usage counts %d requests once the logged row is in SQLite too, want 2", n)
	}
}
