package data

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"tailgate/data/pgtest"
)

// TestGatewaysLedgerTransactionsDoNotDeadlock: two gateways on one
// PostgreSQL write ledger batches holding rows of the same tenants in
// opposite orders. Each row's trigger locks its tenant's spend row, so
// without one lock order the transactions deadlock and PostgreSQL aborts
// one — a failed commit, an answer withheld.
func TestGatewaysLedgerTransactionsDoNotDeadlock(t *testing.T) {
	db := pgtest.NewDatabase(t)
	a, b := openAt(t, db), openAt(t, db)
	ctx := context.Background()
	var ids [4]int64
	for i := range ids {
		tn, err := a.EnsureTenant(ctx, fmt.Sprintf("t%d", i))
		if err != nil {
			t.Fatal(err)
		}
		ids[i] = tn.ID
	}
	batch := func(gw string, round int, order []int64) []LedgerRow {
		rows := make([]LedgerRow, len(order))
		for i, tn := range order {
			rows[i] = streamRow(fmt.Sprintf("%s-%d-%d", gw, round, i), tn, OutcomeOK, 1, 1)
		}
		return rows
	}
	fwd := ids[:]
	rev := []int64{ids[3], ids[2], ids[1], ids[0]}
	for round := range 40 {
		var wg sync.WaitGroup
		errs := make([]error, 2)
		wg.Go(func() { errs[0] = a.InsertLedger(ctx, batch("a", round, fwd)) })
		wg.Go(func() { errs[1] = b.InsertLedger(ctx, batch("b", round, rev)) })
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("round %d, gateway %d: %v", round, i, err)
			}
		}
	}
	for _, tn := range ids {
		if sp := spendOf(t, a, tn); sp.Tokens != 2*2*40 {
			t.Errorf("tenant %d spent %d tokens, want %d", tn, sp.Tokens, 2*2*40)
		}
	}
}
