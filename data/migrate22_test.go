package data

import (
	"context"
	"database/sql"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// Migration 0022 on a SQLite file whose ledger was written under 0021,
// when a trigger wrote each inserted final row's usage event: the events
// already exported stay as they were, and after it the rows inserted, an
// open row of then made final, a final row of then sent again and one
// corrected are events exactly as the trigger made them — version 1 for a
// row first final, the next version for a correction, none for a row sent
// again or open, in the order of the cursor.
func TestUsageEventsMigration22KeepsEvents(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "tailgate.db")
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	old, err := sql.Open("sqlite", dsn(path, "_pragma=journal_mode(WAL)"))
	if err != nil {
		t.Fatal(err)
	}
	ms, err := loadMigrations(engineSQLite)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := old.ExecContext(ctx, `CREATE TABLE schema_migrations (version BIGINT PRIMARY KEY, name TEXT NOT NULL, applied_at BIGINT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		if m.version <= 21 {
			if err := applyMigration(ctx, old, m); err != nil {
				t.Fatalf("migration %s: %v", m.name, err)
			}
		}
	}
	// Written as 0021's gateway wrote them: its trigger made the events.
	for _, q := range []string{
		`INSERT INTO tenants (id, name, created_at) VALUES (1, 'acme', 0)`,
		`INSERT INTO ledger (id, ts, tenant_id, key_id, model, prompt_tokens, completion_tokens, cost_micros, status, outcome)
			VALUES ('req_old', 1000, 1, 'key_test', 'm', 3, 4, 7, 200, 'ok'),
			('req_open', 2000, 1, 'key_test', 'm', 5, 1, 6, 200, 'open'),
			('req_anon', 3000, 0, '', '', 0, 0, 0, 401, 'rejected')`,
	} {
		if _, err := old.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	if err := old.Close(); err != nil {
		t.Fatal(err)
	}

	s := openAt(t, path)
	before := allUsageEvents(t, s, 0)
	if got := eventIDs(before); !slices.Equal(got, []string{"req_old.v1"}) {
		t.Fatalf("events written under 0021: %v, want [req_old.v1]", got)
	}
	final := streamRow("req_open", 1, OutcomeOK, 5, 9)
	resent := streamRow("req_old", 1, OutcomeOK, 3, 99)
	fresh := streamRow("req_new", 1, OutcomeOK, 2, 2)
	opened := streamRow("req_still_open", 1, OutcomeOpen, 1, 1)
	anon := streamRow("req_anon2", 0, OutcomeRejected, 0, 0)
	if err := s.InsertLedger(ctx, []LedgerRow{final, resent, fresh, opened, anon}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.write.ExecContext(ctx, `UPDATE ledger SET cost_micros = 1 WHERE id = 'req_old'`); err != nil {
		t.Fatal(err)
	}
	// A stream's open row and its final one in one transaction: one event.
	if err := s.InsertLedger(ctx, []LedgerRow{streamRow("req_s", 1, OutcomeOpen, 1, 0), streamRow("req_s", 1, OutcomeOK, 1, 3)}); err != nil {
		t.Fatal(err)
	}
	evs := allUsageEvents(t, s, 0)
	want := []string{"req_old.v1", "req_open.v1", "req_new.v1", "req_old.v2", "req_s.v1"}
	if got := eventIDs(evs); !slices.Equal(got, want) {
		t.Fatalf("events: %v, want %v", got, want)
	}
	if evs[0] != before[0] {
		t.Errorf("req_old's first event changed: %+v, was %+v", evs[0], before[0])
	}
	if e := evs[1]; e.CompletionTokens != 9 || e.Outcome != OutcomeOK || e.Tenant != "acme" {
		t.Errorf("req_open's event: %+v, want its final row's figures", e)
	}
	if e := evs[2]; e.PromptTokens != 2 || e.CompletionTokens != 2 || e.CostMicros != 4 || e.KeyID != "key_test" || e.Status != 200 {
		t.Errorf("req_new's event: %+v, want the row as inserted", e)
	}
	if e := evs[4]; e.CompletionTokens != 3 {
		t.Errorf("req_s's event: %+v, want its final row's figures", e)
	}
	for i := 1; i < len(evs); i++ {
		if evs[i].Seq <= evs[i-1].Seq {
			t.Errorf("seq %d after %d", evs[i].Seq, evs[i-1].Seq)
		}
	}
}
