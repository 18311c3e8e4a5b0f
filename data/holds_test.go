package data

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/tailgate-dev/tailgate/data/pgtest"
)

// Two gateways on one PostgreSQL reserve the same tenant's budget at once:
// together they never hold more than it, and each final ledger row moves
// its cost from its gateway's hold into spend.
func TestReserveBudgetSharedByTwoGateways(t *testing.T) {
	ctx := context.Background()
	url := pgtest.NewDatabase(t)
	a, b := openAt(t, url), openAt(t, url)
	if a.Instance() == b.Instance() || a.Instance() == "" {
		t.Fatalf("instances %q and %q: want two distinct ids", a.Instance(), b.Instance())
	}
	tn, err := a.EnsureTenant(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	const budget, each = 1000, 30
	if err := a.SetTenantBudget(ctx, tn.ID, budget, 0); err != nil {
		t.Fatal(err)
	}
	var granted atomic.Int64
	var wg sync.WaitGroup
	for _, s := range []*Store{a, b, a, b, a, b} {
		wg.Go(func() {
			for range 20 {
				c, err := s.ReserveBudget(ctx, tn.ID, each, 0)
				if err != nil {
					t.Error(err)
					return
				}
				if c.OK {
					granted.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if got := granted.Load(); got != budget/each {
		t.Fatalf("%d reservations of %d granted on a budget of %d, want %d", got, each, budget, budget/each)
	}
	// A's final row of 25 tokens takes them out of A's hold into spend; A
	// releases the 5 it reserved beyond them.
	row := streamRow("req_a1", tn.ID, OutcomeOK, 10, 15)
	if err := a.InsertLedger(ctx, []LedgerRow{row}); err != nil {
		t.Fatal(err)
	}
	if err := a.ReleaseBudget(ctx, tn.ID, 5, 0); err != nil {
		t.Fatal(err)
	}
	held, err := a.BudgetHeld(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := held[tn.ID].Tokens, int64(budget/each*each-each); got != want {
		t.Fatalf("held %d tokens after one request settled, want %d", got, want)
	}
	if sp := spendOf(t, a, tn.ID); sp.Tokens != 25 {
		t.Fatalf("spent %d tokens, want 25", sp.Tokens)
	}
}

// A gateway that starts settles only the open rows of gateways whose lease
// ran out, never those of a gateway still running; reaping a dead gateway
// bills its open rows and drops its holds.
func TestSettleOpenSparesRunningGateways(t *testing.T) {
	ctx := context.Background()
	url := pgtest.NewDatabase(t)
	alive, dead := openAt(t, url), openAt(t, url)
	tn, err := alive.EnsureTenant(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	if err := alive.SetTenantBudget(ctx, tn.ID, 1000, 0); err != nil {
		t.Fatal(err)
	}
	for _, s := range []*Store{alive, dead} {
		if _, err := s.SettleOpen(ctx); err != nil {
			t.Fatal(err)
		}
		if c, err := s.ReserveBudget(ctx, tn.ID, 100, 0); err != nil || !c.OK {
			t.Fatalf("reserve: %+v %v", c, err)
		}
		if err := s.InsertLedger(ctx, []LedgerRow{streamRow("req_"+s.Instance(), tn.ID, OutcomeOpen, 5, 7)}); err != nil {
			t.Fatal(err)
		}
	}
	// The dead one's stream went on to 20 tokens: a refresh of its figures,
	// as its ledger writer writes it, is what a reap must bill.
	if _, err := dead.writeLedger(ctx, nil, []LedgerRow{streamRow("req_"+dead.Instance(), tn.ID, OutcomeOpen, 5, 20)}); err != nil {
		t.Fatal(err)
	}
	// A third gateway starts while both run: nothing of theirs is settled.
	third := openAt(t, url)
	if n, err := third.SettleOpen(ctx); err != nil || n != 0 {
		t.Fatalf("SettleOpen beside two running gateways settled %d rows (%v), want 0", n, err)
	}
	if got := rowByID(t, alive, "req_"+alive.Instance()).Outcome; got != OutcomeOpen {
		t.Fatalf("a running gateway's stream row is %q, want open", got)
	}
	// The dead one stops renewing; its lease runs out.
	if _, err := alive.write.Exec(`UPDATE gateways SET lease_until = 0 WHERE id = ?`, dead.Instance()); err != nil {
		t.Fatal(err)
	}
	gws, rows, err := third.ReapGateways(ctx)
	if err != nil || gws != 1 || rows != 1 {
		t.Fatalf("reaped %d gateways, %d rows (%v); want 1, 1", gws, rows, err)
	}
	if got := rowByID(t, alive, "req_"+dead.Instance()); got.Outcome != OutcomeInterrupted || got.CompletionTokens != 20 {
		t.Fatalf("the dead gateway's stream row is %q with %d tokens, want interrupted with its last refresh's 20", got.Outcome, got.CompletionTokens)
	}
	if got := rowByID(t, alive, "req_"+alive.Instance()).Outcome; got != OutcomeOpen {
		t.Fatalf("the running gateway's stream row is %q after the reap, want open", got)
	}
	held, err := alive.BudgetHeld(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := held[tn.ID].Tokens; got != 100 {
		t.Fatalf("held %d tokens after the reap, want the running gateway's 100", got)
	}
	if sp := spendOf(t, alive, tn.ID); sp.Tokens != 25 {
		t.Fatalf("spent %d tokens, want the interrupted stream's 25", sp.Tokens)
	}
	checkSpendMatchesLedger(t, alive)
}

// Two gateways on one PostgreSQL see the same unfinished batch: one claims
// it and the other neither lists nor claims it while the claimant's lease
// lasts; once that lease has run out (the gateway died) the other takes it
// over, and the first finds it lost. A clean stop gives the claim up at
// once.
func TestBatchRunByOneGatewayUntilItsLeaseEnds(t *testing.T) {
	ctx := context.Background()
	url := pgtest.NewDatabase(t)
	a, b := openAt(t, url), openAt(t, url)
	bt, _ := newTestBatch(t, a, "batch_shared")
	listed := func(s *Store) bool {
		ids, err := s.UnfinishedBatches(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return slices.Contains(ids, bt.ID)
	}
	claim := func(s *Store) bool {
		ok, err := s.ClaimBatch(ctx, bt.ID)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	if !listed(a) || !listed(b) {
		t.Fatal("an unclaimed batch is not listed for both gateways")
	}
	if !claim(a) || !claim(a) {
		t.Fatal("gateway A cannot claim (and keep) an unclaimed batch")
	}
	if claim(b) || listed(b) {
		t.Fatal("gateway B claims or lists a batch gateway A runs under a live lease")
	}
	// A dies: its lease runs out.
	if _, err := a.write.ExecContext(ctx, `UPDATE gateways SET lease_until = 0 WHERE id = ?`, a.Instance()); err != nil {
		t.Fatal(err)
	}
	if !listed(b) || !claim(b) {
		t.Fatal("gateway B does not take over the batch of a gateway whose lease ran out")
	}
	if _, err := a.Renew(ctx); err != nil {
		t.Fatal(err)
	}
	if claim(a) {
		t.Fatal("gateway A, back after its lease ran out, still claims the batch B took over")
	}
	if err := b.ReleaseBatches(ctx); err != nil {
		t.Fatal(err)
	}
	if !claim(a) {
		t.Fatal("a batch B gave up on a clean stop is not free for A")
	}
}
