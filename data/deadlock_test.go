package data

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/data/pgtest"
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

// TestLedgerCommitSurvivesALostLockRace: PostgreSQL aborts a ledger
// transaction that lost a race with another gateway's (here: a trigger
// raises serialization_failure on the first two inserts). The writer runs
// it again at once: the Commit succeeds, the ledger never counts as
// failing, nothing is logged as a failed write.
func TestLedgerCommitSurvivesALostLockRace(t *testing.T) {
	s := openAt(t, pgtest.NewDatabase(t))
	ctx := context.Background()
	// A sequence, because its count survives the aborted transactions.
	if _, err := s.write.ExecContext(ctx, `CREATE SEQUENCE race_seq;
		CREATE FUNCTION lose_race() RETURNS trigger AS $$
		BEGIN
			IF nextval('race_seq') <= 2 THEN
				RAISE EXCEPTION 'lost a lock race' USING ERRCODE = 'serialization_failure';
			END IF;
			RETURN NEW;
		END $$ LANGUAGE plpgsql;
		CREATE TRIGGER lose_race BEFORE INSERT ON ledger FOR EACH ROW EXECUTE FUNCTION lose_race();`); err != nil {
		t.Fatal(err)
	}
	rec := &recorder{}
	w := s.NewLedgerWriter(LedgerConfig{FlushInterval: time.Millisecond}, slog.New(rec))
	ran := make(chan error, 1)
	go func() { ran <- w.Run(ctx) }()
	if err := w.Commit(ctx, streamRow("raced", 1, OutcomeOK, 5, 5)); err != nil {
		t.Fatalf("Commit after two lost races: %v; want it run again and committed", err)
	}
	if h := w.Healthy(); h != nil {
		t.Errorf("Healthy = %v after a lost race", h)
	}
	if n := rec.count("ledger write failed, retrying; rows are kept"); n != 0 {
		t.Errorf("a lost race was logged as a failed write %d times", n)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	<-ran
	if r := rowByID(t, s, "raced"); r.Outcome != OutcomeOK {
		t.Errorf("row %+v, want it stored ok", r)
	}
}
