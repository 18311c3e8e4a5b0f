package data

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"
)

func eventIDs(evs []UsageEvent) []string {
	out := make([]string, len(evs))
	for i, e := range evs {
		out[i] = fmt.Sprintf("%s.v%d", e.RequestID, e.Version)
	}
	return out
}

func allUsageEvents(t *testing.T, s *Store, after int64) []UsageEvent {
	t.Helper()
	evs, err := s.UsageEvents(context.Background(), after, MaxUsageEvents)
	if err != nil {
		t.Fatal(err)
	}
	return evs
}

// TestUsageEventsAreFinalRowsByVersion: a final row is one event (version
// 1) however it became final — inserted final, or an open row replaced by
// its final one; an open row, a row of no tenant and a final row sent again
// are none; a final row whose billed figures are corrected is a second
// event (version 2) beside the first, which stays as it was. Reading from
// the same cursor twice gives the same events.
func TestUsageEventsAreFinalRowsByVersion(t *testing.T) {
	forEachEngine(t, func(t *testing.T, e engineCase) {
		s := e.open(t)
		ctx := context.Background()
		tn, err := s.EnsureTenant(ctx, "acme")
		if err != nil {
			t.Fatal(err)
		}
		a := streamRow("req_a", tn.ID, OutcomeOK, 10, 5)
		a.Endpoint = "/v1/chat/completions"
		open := streamRow("req_b", tn.ID, OutcomeOpen, 7, 1)
		anon := streamRow("req_anon", 0, OutcomeRejected, 0, 0)
		if err := s.InsertLedger(ctx, []LedgerRow{a, open, anon}); err != nil {
			t.Fatal(err)
		}
		if got := eventIDs(allUsageEvents(t, s, 0)); !slices.Equal(got, []string{"req_a.v1"}) {
			t.Fatalf("events after one final and one open row: %v, want [req_a.v1]", got)
		}
		final := streamRow("req_b", tn.ID, OutcomeOK, 7, 9)
		resent := a
		resent.CompletionTokens = 99 // a final row is never overwritten
		if err := s.InsertLedger(ctx, []LedgerRow{final, resent}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.write.ExecContext(ctx, `UPDATE ledger SET cost_micros = 1 WHERE id = 'req_a'`); err != nil {
			t.Fatal(err)
		}
		first := allUsageEvents(t, s, 0)
		want := []string{"req_a.v1", "req_b.v1", "req_a.v2"}
		if got := eventIDs(first); !slices.Equal(got, want) {
			t.Fatalf("events: %v, want %v", got, want)
		}
		if again := allUsageEvents(t, s, 0); !slices.Equal(again, first) {
			t.Errorf("the same cursor read twice gave\n%+v\nthen\n%+v", first, again)
		}
		if rest := allUsageEvents(t, s, first[0].Seq); !slices.Equal(rest, first[1:]) {
			t.Errorf("from the first event's cursor: %v, want %v", eventIDs(rest), want[1:])
		}
		v1, b, v2 := first[0], first[1], first[2]
		if v1.CostMicros != 15 || v1.CompletionTokens != 5 || v1.Endpoint != "/v1/chat/completions" || v1.Tenant != "acme" || v1.KeyID != "key_test" {
			t.Errorf("version 1 of req_a: %+v, want the row as first written", v1)
		}
		if v2.CostMicros != 1 || !v2.Time.Equal(v1.Time) {
			t.Errorf("version 2 of req_a: %+v, want the corrected cost at the request's time", v2)
		}
		if b.CompletionTokens != 9 || b.Outcome != OutcomeOK {
			t.Errorf("req_b: %+v, want its final row's figures", b)
		}
		if !(v1.Seq < b.Seq && b.Seq < v2.Seq) {
			t.Errorf("seqs %d, %d, %d are not increasing", v1.Seq, b.Seq, v2.Seq)
		}
	})
}

// TestSettledOpenRowIsAUsageEvent: a stream a crash left open, settled as
// interrupted at start-up, is exported at what its client had received.
func TestSettledOpenRowIsAUsageEvent(t *testing.T) {
	s := openTestStore(t)
	ctx := context.Background()
	tn, err := s.EnsureTenant(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	open := streamRow("req_cut", tn.ID, OutcomeOpen, 4, 1)
	if err := s.InsertLedger(ctx, []LedgerRow{open}); err != nil {
		t.Fatal(err)
	}
	open.CompletionTokens, open.CostMicros = 30, 34
	if _, err := s.writeLedger(ctx, nil, []LedgerRow{open}); err != nil { // a refresh
		t.Fatal(err)
	}
	if n, err := s.SettleOpen(ctx); err != nil || n != 1 {
		t.Fatalf("SettleOpen: %d, %v", n, err)
	}
	evs := allUsageEvents(t, s, 0)
	if len(evs) != 1 || evs[0].RequestID != "req_cut" || evs[0].Version != 1 ||
		evs[0].Outcome != OutcomeInterrupted || evs[0].CompletionTokens != 30 || evs[0].CostMicros != 34 {
		t.Fatalf("events: %+v, want req_cut v1 interrupted at 30 completion tokens", evs)
	}
}

// TestUsageEventsMissNoneWhileGatewaysWrite: gateways write ledger rows
// concurrently (two Stores on one database: two gateways on PostgreSQL, a
// gateway and the CLI on SQLite) while a consumer polls from its last
// cursor, through either store. Every event arrives exactly once, in
// increasing Seq: no event commits behind a cursor a consumer already
// passed.
func TestUsageEventsMissNoneWhileGatewaysWrite(t *testing.T) {
	forEachEngine(t, func(t *testing.T, e engineCase) {
		loc := e.newDB(t)
		a, b := openAt(t, loc), openAt(t, loc)
		ctx := context.Background()
		tn, err := a.EnsureTenant(ctx, "acme")
		if err != nil {
			t.Fatal(err)
		}
		const writers, rounds, perBatch = 4, 25, 3
		var wg sync.WaitGroup
		errs := make(chan error, writers)
		for w := range writers {
			s := []*Store{a, b}[w%2]
			wg.Go(func() {
				for r := range rounds {
					rows := make([]LedgerRow, perBatch)
					for i := range rows {
						rows[i] = streamRow(fmt.Sprintf("req_%d_%d_%d", w, r, i), tn.ID, OutcomeOK, 1, 1)
					}
					if err := s.InsertLedger(ctx, rows); err != nil {
						errs <- err
						return
					}
				}
			})
		}
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()

		seen := make(map[string]int)
		var after int64
		poll := func(i int) int {
			evs, err := []*Store{a, b}[i%2].UsageEvents(ctx, after, 7)
			if err != nil {
				t.Fatal(err)
			}
			for _, ev := range evs {
				if ev.Seq <= after {
					t.Fatalf("event %s has seq %d, not after the cursor %d", ev.RequestID, ev.Seq, after)
				}
				after = ev.Seq
				seen[ev.RequestID]++
			}
			return len(evs)
		}
		for i := 0; ; i++ {
			select {
			case <-done:
				for poll(i) > 0 {
					i++
				}
				close(errs)
				for err := range errs {
					t.Fatal(err)
				}
				if len(seen) != writers*rounds*perBatch {
					t.Fatalf("consumer saw %d events, want %d", len(seen), writers*rounds*perBatch)
				}
				for id, n := range seen {
					if n != 1 {
						t.Errorf("%s seen %d times", id, n)
					}
				}
				return
			default:
				poll(i)
			}
		}
	})
}

// TestUsageSinkLeaseIsOneHolderAtATime: one holder delivers to a sink; its
// acknowledgements move the cursor, another holder's are refused until the
// lease is released or runs out, and the cursor survives them all.
func TestUsageSinkLeaseIsOneHolderAtATime(t *testing.T) {
	forEachEngine(t, func(t *testing.T, e engineCase) {
		s := e.open(t)
		ctx := context.Background()
		const url = "http://127.0.0.1:9/usage"
		st, err := s.ClaimUsageSink(ctx, url, "x", time.Minute)
		if err != nil || st.After != 0 {
			t.Fatalf("first claim: %+v, %v", st, err)
		}
		if ok, err := s.AckUsageSink(ctx, url, "x", 42); err != nil || !ok {
			t.Fatalf("ack by the holder: %v, %v", ok, err)
		}
		if _, err := s.ClaimUsageSink(ctx, url, "y", time.Minute); !errors.Is(err, ErrSinkLeased) {
			t.Fatalf("claim while x holds it: %v, want ErrSinkLeased", err)
		}
		if ok, _ := s.AckUsageSink(ctx, url, "y", 50); ok {
			t.Fatal("a holder without the lease moved the cursor")
		}
		if err := s.ReleaseUsageSink(ctx, url, "x"); err != nil {
			t.Fatal(err)
		}
		st, err = s.ClaimUsageSink(ctx, url, "y", time.Minute)
		if err != nil || st.After != 42 {
			t.Fatalf("claim after release: %+v, %v; want the cursor at 42", st, err)
		}
		if ok, _ := s.AckUsageSink(ctx, url, "x", 60); ok {
			t.Fatal("the old holder moved the cursor after losing the lease")
		}
		if ok, _ := s.AckUsageSink(ctx, url, "y", 10); ok {
			t.Fatal("the cursor moved backwards")
		}
	})
}

// TestUsageEventCommittedLateIsNotPassed: on PostgreSQL a gateway's ledger
// transaction can write its row first and commit last. A consumer that
// read the events committed meanwhile, and moved its cursor past them,
// still gets the late one: its place in the export is given when it is
// committed, not when it is written.
func TestUsageEventCommittedLateIsNotPassed(t *testing.T) {
	loc := engineCases[1].newDB(t)
	a, b := openAt(t, loc), openAt(t, loc)
	ctx := context.Background()
	slow, err := a.EnsureTenant(ctx, "slow")
	if err != nil {
		t.Fatal(err)
	}
	fast, err := a.EnsureTenant(ctx, "fast")
	if err != nil {
		t.Fatal(err)
	}
	// Gateway a's transaction writes its row and stays open.
	tx, err := a.book.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `INSERT INTO ledger (id, ts, tenant_id, key_id, model, status, outcome)
		VALUES ('req_late', ?, ?, 'key_a', 'm', 200, 'ok')`, toMicros(now()), slow.ID); err != nil {
		t.Fatal(err)
	}
	// Gateway b's row commits; the consumer reads it and moves on.
	if err := b.InsertLedger(ctx, []LedgerRow{streamRow("req_early", fast.ID, OutcomeOK, 1, 1)}); err != nil {
		t.Fatal(err)
	}
	evs := allUsageEvents(t, b, 0)
	if got := eventIDs(evs); !slices.Equal(got, []string{"req_early.v1"}) {
		t.Fatalf("events before the late commit: %v, want [req_early.v1]", got)
	}
	cursor := evs[0].Seq
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if got := eventIDs(allUsageEvents(t, a, cursor)); !slices.Equal(got, []string{"req_late.v1"}) {
		t.Fatalf("events after the cursor once the late row committed: %v, want [req_late.v1]", got)
	}
}
