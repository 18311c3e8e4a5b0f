package data

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// The spend a batch adds, summed in Go, is what the ledger's final rows
// add up to, whatever a batch mixes: tenants, keys, days, open rows and
// their final rows in one batch or across batches, rows refused, rows sent
// twice (a retried batch, a commit log recovered twice), open rows settled
// at start-up.
func TestSpendIsTheSumOfTheLedgersFinalRows(t *testing.T) {
	forEachEngine(t, func(t *testing.T, e engineCase) {
		ctx := context.Background()
		s := e.open(t)
		var tenants [3]Tenant
		var keys []Key
		for i := range tenants {
			tenants[i], _ = s.EnsureTenant(ctx, fmt.Sprintf("t%d", i))
			for j := range 2 {
				k, err := s.CreateKey(ctx, Key{Tenant: tenants[i], Prefix: fmt.Sprintf("tg-%d-%d", i, j), Hash: hashOf(fmt.Sprint(i, j))})
				if err != nil {
					t.Fatal(err)
				}
				keys = append(keys, k)
			}
		}
		rnd := rand.New(rand.NewPCG(1, 2))
		t0 := time.Date(2026, 11, 30, 23, 0, 0, 0, time.UTC) // batches cross a day
		row := func(id string) LedgerRow {
			k := keys[rnd.IntN(len(keys))]
			tn := k.Tenant
			r := okRow(id, t0.Add(time.Duration(rnd.IntN(7200))*time.Second), tn, k, "m", rnd.Int64N(100), rnd.Int64N(100), rnd.Int64N(1000))
			switch rnd.IntN(8) {
			case 0:
				r.Outcome, r.Status = OutcomeRejected, 429
			case 1:
				r.KeyID = "" // refused before its key was known
			}
			return r
		}
		var open []LedgerRow // stored open, not yet final
		var sent []LedgerRow // every final row sent, for resending
		for b := range 30 {
			var batch []LedgerRow
			for i := range 1 + rnd.IntN(40) {
				id := fmt.Sprintf("b%d-%d", b, i)
				switch c := rnd.IntN(10); {
				case c < 2:
					r := row(id)
					r.Outcome = OutcomeOpen
					batch = append(batch, r)
					if rnd.IntN(2) == 0 { // its final row in the same batch
						r.Outcome, r.CompletionTokens = OutcomeOK, r.CompletionTokens+5
						batch = append(batch, r)
						sent = append(sent, r)
					} else {
						open = append(open, r)
					}
				case c < 4 && len(open) > 5:
					r := open[0]
					open = open[1:]
					r.Outcome, r.CompletionTokens, r.CostMicros = OutcomeMidstream, r.CompletionTokens+3, r.CostMicros+7
					batch = append(batch, r)
					sent = append(sent, r)
				case c < 5 && len(sent) > 0:
					batch = append(batch, sent[rnd.IntN(len(sent))]) // again: skipped
				default:
					r := row(id)
					batch = append(batch, r)
					sent = append(sent, r)
				}
			}
			if err := s.InsertLedger(ctx, batch); err != nil {
				t.Fatal(err)
			}
		}
		if len(open) == 0 {
			t.Fatal("no open row left to settle")
		}
		settled, err := 0, error(nil)
		if s.Postgres() {
			// This gateway's open rows are settled once its lease ran out,
			// as after a crash.
			if _, err := s.write.ExecContext(ctx, `UPDATE gateways SET lease_until = 0`); err != nil {
				t.Fatal(err)
			}
			_, settled, err = s.ReapGateways(ctx)
		} else {
			settled, err = s.SettleOpen(ctx)
		}
		if err != nil || settled != len(open) {
			t.Fatalf("settled %d open rows (%v), want %d", settled, err, len(open))
		}
		checkEverySpendMatchesLedger(t, s)
	})
}

// checkEverySpendMatchesLedger compares the spend tables with sums over the
// ledger's final rows.
func checkEverySpendMatchesLedger(t *testing.T, s *Store) {
	t.Helper()
	ctx := context.Background()
	counted := `CASE WHEN outcome IN ('rejected', 'upstream_rejected') THEN 0 ELSE 1 END`
	for _, c := range []struct{ name, kept, sum string }{
		{"tenant_spend", `SELECT tenant_id, tokens, micros, 0 FROM tenant_spend WHERE tokens <> 0 OR micros <> 0 ORDER BY 1`,
			`SELECT tenant_id, SUM(prompt_tokens + completion_tokens), SUM(cost_micros), 0 FROM ledger
			WHERE outcome <> 'open' GROUP BY tenant_id
			HAVING SUM(prompt_tokens + completion_tokens) <> 0 OR SUM(cost_micros) <> 0 ORDER BY 1`},
		{"tenant_daily_spend", `SELECT tenant_id * 100000 + day, tokens, micros, requests FROM tenant_daily_spend ORDER BY 1`,
			`SELECT tenant_id * 100000 + ts / 86400000000, SUM(prompt_tokens + completion_tokens), SUM(cost_micros), SUM(` + counted + `)
			FROM ledger WHERE outcome <> 'open' GROUP BY tenant_id, ts / 86400000000 ORDER BY 1`},
		{"key_spend", `SELECT key_id, tokens, micros, requests FROM key_spend ORDER BY 1`,
			`SELECT key_id, SUM(prompt_tokens + completion_tokens), SUM(cost_micros), SUM(` + counted + `)
			FROM ledger WHERE outcome <> 'open' AND key_id <> '' GROUP BY key_id ORDER BY 1`},
	} {
		read := func(q string) []string {
			rows, err := s.read.QueryContext(ctx, q)
			if err != nil {
				t.Fatal(err)
			}
			defer rows.Close()
			var out []string
			for rows.Next() {
				var k string
				var a, b, r int64
				if err := rows.Scan(&k, &a, &b, &r); err != nil {
					t.Fatal(err)
				}
				out = append(out, fmt.Sprint(k, a, b, r))
			}
			return out
		}
		kept, sum := read(c.kept), read(c.sum)
		if fmt.Sprint(kept) != fmt.Sprint(sum) {
			t.Errorf("%s holds %v, the ledger's final rows sum to %v", c.name, kept, sum)
		}
	}
}
