package data

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"testing"
	"time"
)

type usageFixture struct {
	s      *Store
	acme   Tenant
	beta   Tenant
	k1, k2 Key // acme's keys
	k3     Key // beta's key
	t0     time.Time
	rows   []LedgerRow
}

func newUsageFixture(t *testing.T, e engineCase) *usageFixture {
	t.Helper()
	ctx := context.Background()
	f := &usageFixture{s: e.open(t), t0: time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)}
	var err error
	if f.acme, err = f.s.EnsureTenant(ctx, "acme"); err != nil {
		t.Fatal(err)
	}
	if f.beta, err = f.s.EnsureTenant(ctx, "beta"); err != nil {
		t.Fatal(err)
	}
	mk := func(tn Tenant, prefix string) Key {
		k, err := f.s.CreateKey(ctx, Key{Tenant: tn, Prefix: prefix, Hash: hashOf(prefix)})
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	f.k1, f.k2, f.k3 = mk(f.acme, "tg-k1"), mk(f.acme, "tg-k2"), mk(f.beta, "tg-k3")

	add := func(min int, tn Tenant, k Key, model string, p, c, hedge, cost int64) {
		f.rows = append(f.rows, LedgerRow{
			ID: fmt.Sprintf("r%03d", len(f.rows)), Time: f.t0.Add(time.Duration(min) * time.Minute),
			TenantID: tn.ID, KeyID: k.ID, Model: model, PromptTokens: p, CompletionTokens: c,
			HedgeOverheadTokens: hedge, CostMicros: cost, Status: 200, Outcome: "ok", Attempts: 1,
			Stages: UnknownStages(),
		})
	}
	add(0, f.acme, f.k1, "llama", 10, 20, 0, 100)
	add(1, f.acme, f.k1, "llama", 1, 2, 5, 10)
	add(2, f.acme, f.k1, "qwen", 3, 4, 0, 30)
	add(3, f.acme, f.k2, "llama", 5, 6, 0, 50)
	add(4, f.beta, f.k3, "llama", 7, 8, 0, 70)
	add(5, f.beta, f.k3, "llama", 9, 10, 0, 90)
	// A request rejected before auth: no tenant, no key.
	f.rows = append(f.rows, LedgerRow{ID: "anon", Time: f.t0.Add(6 * time.Minute), Status: 401, Outcome: "rejected", Error: "bad_key", Stages: UnknownStages()})

	// Insert out of order and in two transactions, one row twice.
	if err := f.s.InsertLedger(ctx, []LedgerRow{f.rows[4], f.rows[0], f.rows[6]}); err != nil {
		t.Fatal(err)
	}
	if err := f.s.InsertLedger(ctx, append(slices.Clone(f.rows[1:4]), f.rows[5], f.rows[0])); err != nil {
		t.Fatal(err)
	}
	return f
}

func TestUsageTotals(t *testing.T) {
	forEachEngine(t, func(t *testing.T, e engineCase) {
		f := newUsageFixture(t, e)
		ctx := context.Background()
		acmeK1Llama := UsageRow{Tenant: "acme", KeyID: f.k1.ID, KeyPrefix: "tg-k1", Model: "llama", Requests: 2, PromptTokens: 11, CompletionTokens: 22, CostMicros: 110}
		acmeK1Qwen := UsageRow{Tenant: "acme", KeyID: f.k1.ID, KeyPrefix: "tg-k1", Model: "qwen", Requests: 1, PromptTokens: 3, CompletionTokens: 4, CostMicros: 30}
		acmeK2Llama := UsageRow{Tenant: "acme", KeyID: f.k2.ID, KeyPrefix: "tg-k2", Model: "llama", Requests: 1, PromptTokens: 5, CompletionTokens: 6, CostMicros: 50}
		betaK3Llama := UsageRow{Tenant: "beta", KeyID: f.k3.ID, KeyPrefix: "tg-k3", Model: "llama", Requests: 2, PromptTokens: 16, CompletionTokens: 18, CostMicros: 160}
		anon := UsageRow{Rejected: 1} // refused: not a request of usage
		// Key ids are random, so put acme's expected rows in key-id order.
		acme := []UsageRow{acmeK1Llama, acmeK1Qwen, acmeK2Llama}
		if f.k2.ID < f.k1.ID {
			acme = []UsageRow{acmeK2Llama, acmeK1Llama, acmeK1Qwen}
		}

		for _, tc := range []struct {
			name   string
			filter UsageFilter
			want   []UsageRow
		}{
			{"all, duplicate id counted once", UsageFilter{}, append(append([]UsageRow{anon}, acme...), betaK3Llama)},
			{"one tenant", UsageFilter{Tenant: "beta"}, []UsageRow{betaK3Llama}},
			{"unknown tenant", UsageFilter{Tenant: "nobody"}, nil},
			{"since is inclusive", UsageFilter{Since: f.t0.Add(4 * time.Minute)}, []UsageRow{anon, betaK3Llama}},
			{"until is exclusive", UsageFilter{Tenant: "acme", Until: f.t0.Add(2 * time.Minute)}, []UsageRow{acmeK1Llama}},
			{"window", UsageFilter{Since: f.t0.Add(2 * time.Minute), Until: f.t0.Add(3 * time.Minute)}, []UsageRow{acmeK1Qwen}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				got, err := f.s.Usage(ctx, tc.filter)
				if err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(got, tc.want) {
					t.Errorf("Usage(%+v) =\n%+v\nwant\n%+v", tc.filter, got, tc.want)
				}
			})
		}
	})
}

func TestTenantSpendMatchesLedger(t *testing.T) {
	forEachEngine(t, func(t *testing.T, e engineCase) {
		f := newUsageFixture(t, e)
		ctx := context.Background()
		got, err := f.s.TenantSpend(ctx)
		if err != nil {
			t.Fatal(err)
		}
		// Recompute from the rows as inserted (each id once); hedge overhead is
		// not billed.
		want := map[int64]Spend{}
		for _, r := range f.rows {
			sp := want[r.TenantID]
			sp.Tokens += r.PromptTokens + r.CompletionTokens
			sp.Micros += r.CostMicros
			want[r.TenantID] = sp
		}
		if len(got) != len(want) {
			t.Errorf("TenantSpend = %v, want %v", got, want)
		}
		for id, sp := range want {
			if got[id] != sp {
				t.Errorf("tenant %d spend = %+v, want %+v", id, got[id], sp)
			}
		}
		if got[f.acme.ID] != (Spend{Tokens: 51, Micros: 190}) {
			t.Errorf("acme spend = %+v, want 51 tokens / 190 micros", got[f.acme.ID])
		}

		// And it agrees with a scan of the ledger, however the rows got there.
		var tokens, micros int64
		if err := f.s.read.QueryRow(`SELECT SUM(prompt_tokens + completion_tokens), SUM(cost_micros) FROM ledger WHERE tenant_id = ?`, f.beta.ID).Scan(&tokens, &micros); err != nil {
			t.Fatal(err)
		}
		if got[f.beta.ID] != (Spend{tokens, micros}) {
			t.Errorf("beta spend = %+v, ledger scan says %d/%d", got[f.beta.ID], tokens, micros)
		}
	})
}

func TestRecentRequests(t *testing.T) {
	forEachEngine(t, func(t *testing.T, e engineCase) {
		f := newUsageFixture(t, e)
		ctx := context.Background()
		for _, tc := range []struct {
			name   string
			limit  int
			tenant string
			want   []string
		}{
			{"newest first", 3, "", []string{"anon", "r005", "r004"}},
			{"one tenant", 10, "acme", []string{"r003", "r002", "r001", "r000"}},
			{"default limit", 0, "beta", []string{"r005", "r004"}},
			{"unknown tenant", 5, "nobody", nil},
		} {
			t.Run(tc.name, func(t *testing.T) {
				rows, err := f.s.RecentRequests(ctx, tc.limit, tc.tenant)
				if err != nil {
					t.Fatal(err)
				}
				var ids []string
				for _, r := range rows {
					ids = append(ids, r.ID)
					wantTenant := map[int64]string{f.acme.ID: "acme", f.beta.ID: "beta", 0: ""}[r.TenantID]
					if r.Tenant != wantTenant {
						t.Errorf("row %s tenant name %q, want %q", r.ID, r.Tenant, wantTenant)
					}
				}
				if !slices.Equal(ids, tc.want) {
					t.Errorf("ids = %v, want %v", ids, tc.want)
				}
			})
		}
	})
}

func TestLedgerRowRoundTrip(t *testing.T) {
	forEachEngine(t, func(t *testing.T, e engineCase) {
		s := e.open(t)
		ctx := context.Background()
		tn, _ := s.EnsureTenant(ctx, "acme")
		ts := time.Date(2025, 3, 1, 12, 0, 0, 123456000, time.UTC)
		for _, tc := range []struct {
			name   string
			stages Stages
		}{
			{"every stage unknown is NULL", UnknownStages()},
			{"zero is a measurement, not NULL", Stages{}},
			{"mixed", Stages{Gateway: 1500 * time.Microsecond, Connect: -1, UpstreamTTFT: 80 * time.Millisecond,
				EngineQueue: -1, EngineTTFT: 70 * time.Millisecond, Network: 10 * time.Millisecond,
				TTFT: 81 * time.Millisecond, Total: 2 * time.Second}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				in := LedgerRow{
					ID: "req-" + tc.name, Time: ts, TenantID: tn.ID, KeyID: "key_x", Model: "llama",
					Upstream: "http://10.0.0.1:8000", Stream: true,
					PromptTokens: 1, CompletionTokens: 2, HedgeOverheadTokens: 3, CostMicros: 4,
					Status: 200, Outcome: "midstream_error", Error: "upstream_reset", Attempts: 2, Hedged: true,
					Stages: tc.stages,
				}
				if err := s.InsertLedger(ctx, []LedgerRow{in}); err != nil {
					t.Fatal(err)
				}
				rows, err := s.LedgerRows(ctx, UsageFilter{Since: ts, Until: ts.Add(time.Microsecond)})
				if err != nil {
					t.Fatal(err)
				}
				var got *LedgerRow
				for i := range rows {
					if rows[i].ID == in.ID {
						got = &rows[i]
					}
				}
				if got == nil {
					t.Fatalf("row %s not read back", in.ID)
				}
				want := in
				want.Tenant = "acme"
				if !got.Time.Equal(want.Time) {
					t.Errorf("Time = %v, want %v", got.Time, want.Time)
				}
				got.Time = want.Time
				if !reflect.DeepEqual(*got, want) {
					t.Errorf("read back\n%+v\nwant\n%+v", *got, want)
				}
				var nulls int
				if err := s.read.QueryRow(`SELECT `+isNull("gateway_us")+` + `+isNull("connect_us")+` + `+isNull("upstream_ttft_us")+` +
				`+isNull("engine_queue_us")+` + `+isNull("engine_ttft_us")+` + `+isNull("network_us")+` + `+isNull("ttft_us")+` + `+isNull("total_us")+`
				FROM ledger WHERE id = ?`, in.ID).Scan(&nulls); err != nil {
					t.Fatal(err)
				}
				wantNulls := 0
				for _, d := range []time.Duration{tc.stages.Gateway, tc.stages.Connect, tc.stages.UpstreamTTFT, tc.stages.EngineQueue,
					tc.stages.EngineTTFT, tc.stages.Network, tc.stages.TTFT, tc.stages.Total} {
					if d < 0 {
						wantNulls++
					}
				}
				if nulls != wantNulls {
					t.Errorf("%d NULL stage columns, want %d", nulls, wantNulls)
				}
			})
		}
	})
}

func TestInsertLedgerFillsMissingIDAndTime(t *testing.T) {
	forEachEngine(t, func(t *testing.T, e engineCase) {
		s := e.open(t)
		ctx := context.Background()
		before := time.Now().Add(-time.Second)
		if err := s.InsertLedger(ctx, []LedgerRow{{Stages: UnknownStages()}, {Stages: UnknownStages()}}); err != nil {
			t.Fatal(err)
		}
		rows, err := s.LedgerRows(ctx, UsageFilter{})
		if err != nil {
			t.Fatal(err)
		}
		if len(rows) != 2 || rows[0].ID == "" || rows[0].ID == rows[1].ID {
			t.Fatalf("rows = %+v, want two with distinct generated ids", rows)
		}
		if rows[0].Time.Before(before) {
			t.Errorf("Time = %v, want about now", rows[0].Time)
		}
	})
}

func TestInsertLedgerBatchSizes(t *testing.T) {
	forEachEngine(t, func(t *testing.T, e engineCase) {
		// Exercise every combination of the prepared multi-row statements.
		for _, n := range []int{1, 3, 4, 5, 63, 64, 65, 64 + 16 + 4 + 1, 1000} {
			t.Run(fmt.Sprint(n), func(t *testing.T) {
				s := e.open(t)
				rows := make([]LedgerRow, n)
				for i := range rows {
					rows[i] = LedgerRow{ID: fmt.Sprint(i), TenantID: 1, PromptTokens: 1, Stages: UnknownStages()}
				}
				if err := s.InsertLedger(context.Background(), rows); err != nil {
					t.Fatal(err)
				}
				sp, err := s.TenantSpend(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				if sp[1].Tokens != int64(n) {
					t.Errorf("%d rows inserted, spend says %d", n, sp[1].Tokens)
				}
			})
		}
	})
}

// isNull is 1 if the column is NULL, else 0, on both engines.
func isNull(col string) string { return "(CASE WHEN " + col + " IS NULL THEN 1 ELSE 0 END)" }
