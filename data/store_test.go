package data

import (
	"context"
	"crypto/sha256"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/tailgate-dev/tailgate/data/pgtest"
)

func TestMain(m *testing.M) {
	code := m.Run()
	pgtest.Stop()
	os.Exit(code)
}

// engineCase is one database engine the store runs on: newDB makes a fresh,
// empty database and returns its location for [Open].
type engineCase struct {
	name  string
	newDB func(testing.TB) string
}

var engineCases = []engineCase{
	{"sqlite", func(tb testing.TB) string { return filepath.Join(tb.TempDir(), "db", "tailgate.db") }},
	{"postgres", pgtest.NewDatabase},
}

// open opens a store on a fresh database of the engine.
func (e engineCase) open(tb testing.TB) *Store {
	tb.Helper()
	s := openAt(tb, e.newDB(tb))
	if s.Postgres() != (e.name == "postgres") {
		tb.Fatalf("a store opened for %s runs on %s", e.name, s.engine)
	}
	return s
}

func (e engineCase) engine() engine {
	if e.name == "postgres" {
		return enginePostgres
	}
	return engineSQLite
}

// forEachEngine runs test once per engine, as a subtest named for it.
func forEachEngine(t *testing.T, test func(t *testing.T, e engineCase)) {
	for _, e := range engineCases {
		t.Run(e.name, func(t *testing.T) { test(t, e) })
	}
}

// openTestStore opens a store on a fresh SQLite database (benchmarks, and
// tests of what only SQLite has).
func openTestStore(t testing.TB) *Store {
	t.Helper()
	return engineCases[0].open(t)
}

func openAt(t testing.TB, path string) *Store {
	t.Helper()
	s, err := Open(path)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func hashOf(secret string) []byte {
	h := sha256.Sum256([]byte(secret))
	return h[:]
}

func TestOpenCreatesPrivateDirAndConfiguresConnections(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "nested", "data")
	path := filepath.Join(dir, "tailgate.db")
	s := openAt(t, path)
	if s.Path() != path {
		t.Errorf("Path() = %q, want %q", s.Path(), path)
	}
	fi, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	if perm := fi.Mode().Perm(); perm != 0o700 {
		t.Errorf("dir mode = %o, want 700", perm)
	}
	for _, name := range []string{"tailgate.db", "tailgate.db-wal"} {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if perm := fi.Mode().Perm(); perm != 0o600 {
			t.Errorf("%s mode = %o, want 600", name, perm)
		}
	}

	ctx := context.Background()
	for _, tc := range []struct {
		pragma string
		want   string
	}{
		{"journal_mode", "wal"},
		{"busy_timeout", "5000"},
		{"foreign_keys", "1"},
		{"synchronous", "1"}, // NORMAL
	} {
		var got string
		if err := s.write.QueryRowContext(ctx, "PRAGMA "+tc.pragma).Scan(&got); err != nil {
			t.Fatalf("PRAGMA %s: %v", tc.pragma, err)
		}
		if got != tc.want {
			t.Errorf("writer PRAGMA %s = %s, want %s", tc.pragma, got, tc.want)
		}
	}
	// The read pool must not be able to write.
	if _, err := s.read.ExecContext(ctx, `INSERT INTO meta (k, v) VALUES ('x', 1)`); err == nil {
		t.Error("insert through the read pool succeeded; want query_only error")
	}
}

func TestMigrationsApplyOnceAndReopenWorks(t *testing.T) {
	forEachEngine(t, func(t *testing.T, e engineCase) {
		path := e.newDB(t)
		ctx := context.Background()

		s, err := Open(path)
		if err != nil {
			t.Fatal(err)
		}
		tn, err := s.EnsureTenant(ctx, "acme")
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		if err := s.Close(); err != nil {
			t.Fatalf("second Close: %v", err)
		}

		s2 := openAt(t, path)
		ms, err := loadMigrations(e.engine())
		if err != nil {
			t.Fatal(err)
		}
		var n, maxV int
		if err := s2.read.QueryRowContext(ctx, `SELECT COUNT(*), MAX(version) FROM schema_migrations`).Scan(&n, &maxV); err != nil {
			t.Fatal(err)
		}
		if n != len(ms) || maxV != ms[len(ms)-1].version {
			t.Errorf("schema_migrations has %d rows up to %d, want %d up to %d", n, maxV, len(ms), ms[len(ms)-1].version)
		}
		got, err := s2.TenantByName(ctx, "acme")
		if err != nil {
			t.Fatal(err)
		}
		if got.ID != tn.ID || !got.CreatedAt.Equal(tn.CreatedAt) {
			t.Errorf("after reopen tenant = %+v, want %+v", got, tn)
		}
	})
}

func TestOpenRefusesNewerSchema(t *testing.T) {
	forEachEngine(t, func(t *testing.T, e engineCase) {
		path := e.newDB(t)
		s := openAt(t, path)
		if _, err := s.write.Exec(`INSERT INTO schema_migrations (version, name, applied_at) VALUES (9999, '9999_future.sql', 0)`); err != nil {
			t.Fatal(err)
		}
		s.Close()
		if s2, err := Open(path); err == nil {
			s2.Close()
			t.Fatal("Open of a database from a newer binary succeeded")
		}
	})
}

func TestConcurrentOpensOfNewFileMigrateOnce(t *testing.T) {
	forEachEngine(t, func(t *testing.T, e engineCase) {
		path := e.newDB(t)
		const n = 4
		var wg sync.WaitGroup
		errs := make([]error, n)
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				s, err := Open(path)
				if err == nil {
					s.Close()
				}
				errs[i] = err
			}()
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Errorf("Open %d: %v", i, err)
			}
		}
		s := openAt(t, path)
		var v int64
		if err := s.read.QueryRow(`SELECT v FROM meta WHERE k = 'keys_version'`).Scan(&v); err != nil {
			t.Fatal(err)
		}
		if v != 0 {
			t.Errorf("keys_version = %d after concurrent opens, want 0", v)
		}
	})
}

// The CLI and a running gateway each open their own Store on the same file.
func TestTwoStoresOnOneFileSeeEachOthersWrites(t *testing.T) {
	forEachEngine(t, func(t *testing.T, e engineCase) {
		path := e.newDB(t)
		gw := openAt(t, path)
		cli := openAt(t, path)
		ctx := context.Background()

		v0, err := gw.KeysVersion(ctx)
		if err != nil {
			t.Fatal(err)
		}
		tn, err := cli.EnsureTenant(ctx, "acme")
		if err != nil {
			t.Fatal(err)
		}
		k, err := cli.CreateKey(ctx, Key{Tenant: tn, Prefix: "tg-aaaa", Hash: hashOf("secret")})
		if err != nil {
			t.Fatal(err)
		}
		got, err := gw.KeyByHash(ctx, hashOf("secret"))
		if err != nil {
			t.Fatalf("gateway does not see the key the CLI created: %v", err)
		}
		if got.ID != k.ID {
			t.Errorf("gateway sees key %s, want %s", got.ID, k.ID)
		}
		if v1, _ := gw.KeysVersion(ctx); v1 <= v0 {
			t.Errorf("gateway keys version %d after CLI create, want > %d", v1, v0)
		}

		if _, err := cli.RevokeKey(ctx, k.ID, nil); err != nil {
			t.Fatal(err)
		}
		got, err = gw.KeyByHash(ctx, hashOf("secret"))
		if err != nil {
			t.Fatal(err)
		}
		if !got.Revoked() {
			t.Error("gateway does not see the CLI's revocation")
		}

		// And the other way: the gateway's ledger is visible to `tailgate usage`.
		if err := gw.InsertLedger(ctx, []LedgerRow{{ID: "r1", TenantID: tn.ID, KeyID: k.ID, Model: "m", PromptTokens: 3, Stages: UnknownStages()}}); err != nil {
			t.Fatal(err)
		}
		u, err := cli.Usage(ctx, UsageFilter{})
		if err != nil {
			t.Fatal(err)
		}
		if len(u) != 1 || u[0].PromptTokens != 3 || u[0].KeyPrefix != "tg-aaaa" {
			t.Errorf("CLI usage = %+v, want one row with 3 prompt tokens for tg-aaaa", u)
		}
	})
}
