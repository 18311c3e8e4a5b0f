package data

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestInviteAdmitsOnceItsOwnReplicaBeforeItExpires: a join token admits
// one registration of the replica id it was made for, before it expires;
// the store keeps only its hash.
func TestInviteAdmitsOnceItsOwnReplicaBeforeItExpires(t *testing.T) {
	forEachEngine(t, func(t *testing.T, e engineCase) {
		s := e.open(t)
		ctx := context.Background()
		inv, token, err := s.CreateInvite(ctx, "gpu-1", time.Hour)
		if err != nil || !strings.HasPrefix(token, JoinTokenPrefix) || inv.ReplicaID != "gpu-1" || !inv.ExpiresAt.After(inv.CreatedAt) {
			t.Fatalf("CreateInvite = %+v, %q, %v", inv, token, err)
		}
		admit := func(id, hash, tok string) (Worker, error) {
			return s.AdmitWorker(ctx, Worker{ReplicaID: id, Address: "http://10.0.0.1:9000", Hash: hashOf(hash)}, Admit{JoinToken: tok})
		}
		for _, c := range []struct{ name, id, token, want string }{
			{"another replica id", "gpu-2", token, `is for replica id "gpu-1", not "gpu-2"`},
			{"an unknown token", "gpu-1", JoinTokenPrefix + "nosuch", "no invite has this join token"},
		} {
			if _, err := admit(c.id, c.name, c.token); !errors.Is(err, ErrInviteInvalid) || !strings.Contains(err.Error(), c.want) {
				t.Errorf("%s: %v; want ErrInviteInvalid saying %q", c.name, err, c.want)
			}
		}
		w, err := admit("gpu-1", "a", token)
		if err != nil || !strings.HasPrefix(w.ID, "wkr_") {
			t.Fatalf("admit with the invite: %+v, %v", w, err)
		}
		if got, err := s.ActiveWorkerFor(ctx, "gpu-1"); err != nil || got.ID != w.ID {
			t.Fatalf("credential after the invite: %+v, %v", got, err)
		}
		// Used once: a second worker (after the first was revoked) cannot
		// use it again.
		if _, err := s.RevokeWorker(ctx, w.ID); err != nil {
			t.Fatal(err)
		}
		if _, err := admit("gpu-1", "b", token); !errors.Is(err, ErrInviteInvalid) || !strings.Contains(err.Error(), "was used") {
			t.Errorf("the invite used twice: %v", err)
		}
		invs, err := s.Invites(ctx)
		if err != nil || len(invs) != 1 || invs[0].UsedAt.IsZero() || invs[0].WorkerID != w.ID {
			t.Errorf("Invites = %+v, %v; want the one, used by %s", invs, err, w.ID)
		}
		var n int
		if err := s.read.QueryRowContext(ctx, `SELECT COUNT(*) FROM worker_invites WHERE hash = ?`, []byte(token)).Scan(&n); err != nil || n != 0 {
			t.Errorf("the token is stored as it is: %d %v", n, err)
		}

		_, short, err := s.CreateInvite(ctx, "gpu-3", time.Microsecond)
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Millisecond)
		if _, err := admit("gpu-3", "c", short); !errors.Is(err, ErrInviteInvalid) || !strings.Contains(err.Error(), "expired") {
			t.Errorf("an expired invite: %v", err)
		}
		if _, err := s.ActiveWorkerFor(ctx, "gpu-3"); !errors.Is(err, ErrNotFound) {
			t.Errorf("the expired invite issued a credential: %v", err)
		}
		for _, bad := range []string{"", "has space", `q"uote`, strings.Repeat("x", 129)} {
			if _, _, err := s.CreateInvite(ctx, bad, time.Hour); err == nil {
				t.Errorf("invite for replica id %q accepted", bad)
			}
		}
	})
}

// TestNewReplicaIDNeedsApprovalAndRevokedStaysOut: the cluster token alone
// registers no new id (it is listed pending) unless the gateway runs open;
// an approval admits it; a revoked id stays out, open or not, until it is
// approved again.
func TestNewReplicaIDNeedsApprovalAndRevokedStaysOut(t *testing.T) {
	forEachEngine(t, func(t *testing.T, e engineCase) {
		s := e.open(t)
		ctx := context.Background()
		admit := func(id, hash string, open bool) (Worker, error) {
			return s.AdmitWorker(ctx, Worker{ReplicaID: id, Address: "http://10.0.0.1:9000", Hash: hashOf(hash)}, Admit{Open: open, Code: "CODE-A"})
		}
		if _, err := admit("gpu-1", "a", false); !errors.Is(err, ErrNotApproved) {
			t.Fatalf("a new id with the token alone: %v, want ErrNotApproved", err)
		}
		if err := s.NotePending(ctx, "gpu-1", Asked{Address: "http://10.0.0.1:9000", Peer: "box1"}); err != nil {
			t.Fatal(err)
		}
		if err := s.NotePending(ctx, "gpu-1", Asked{Address: "http://10.0.0.1:9001", Peer: "box1"}); err != nil {
			t.Fatal(err)
		}
		p, err := s.PendingWorkers(ctx)
		if err != nil || len(p) != 1 || p[0].ReplicaID != "gpu-1" || p[0].Address != "http://10.0.0.1:9001" || p[0].Peer != "box1" || p[0].RequestedAt.IsZero() {
			t.Fatalf("PendingWorkers = %+v, %v", p, err)
		}
		before, after, err := s.ApproveWorker(ctx, "gpu-1", "CODE-A")
		if err != nil || before.State != AdmissionPending || after.State != AdmissionApproved {
			t.Fatalf("ApproveWorker = %+v, %+v, %v", before, after, err)
		}
		if p, _ := s.PendingWorkers(ctx); len(p) != 0 {
			t.Errorf("still pending after the approval: %+v", p)
		}
		w, err := admit("gpu-1", "a", false)
		if err != nil {
			t.Fatalf("the approved id: %v", err)
		}

		if _, err := s.RevokeWorker(ctx, "gpu-1"); err != nil {
			t.Fatal(err)
		}
		if a, err := s.AdmissionOf(ctx, "gpu-1"); err != nil || a.State != AdmissionRevoked {
			t.Fatalf("admission after the revocation: %+v, %v", a, err)
		}
		for _, open := range []bool{false, true} {
			if _, err := admit("gpu-1", "b", open); !errors.Is(err, ErrAdmissionRevoked) {
				t.Errorf("the revoked id again (open %v): %v, want ErrAdmissionRevoked", open, err)
			}
		}
		if err := s.NotePending(ctx, "gpu-1", Asked{Address: "http://10.0.0.1:9000", Peer: ""}); err != nil {
			t.Fatal(err)
		}
		if a, _ := s.AdmissionOf(ctx, "gpu-1"); a.State != AdmissionRevoked {
			t.Errorf("a refused beat turned the revoked id %s", a.State)
		}
		// Approved again by the revoked worker's id.
		if before, after, err := s.ApproveWorker(ctx, w.ID, "CODE-A"); err != nil || before.State != AdmissionRevoked || after.ReplicaID != "gpu-1" {
			t.Fatalf("approving by worker id = %+v, %+v, %v", before, after, err)
		}
		if _, err := admit("gpu-1", "b", false); err != nil {
			t.Errorf("the id approved again: %v", err)
		}

		// Open registration admits an id never seen.
		if _, err := admit("gpu-2", "c", true); err != nil {
			t.Errorf("open registration: %v", err)
		}
		if a, err := s.AdmissionOf(ctx, "gpu-2"); err != nil || a.State != AdmissionApproved {
			t.Errorf("admission after open registration: %+v, %v", a, err)
		}
		if _, _, err := s.ApproveWorker(ctx, "bad id", "CODE-A"); err == nil {
			t.Error("approved a replica id with a space")
		}
	})
}

// TestAdmissionMigrationKeepsExistingWorkers: workers registered before
// admissions existed keep their ids (active: approved) and a revoked one
// stays out.
func TestAdmissionMigrationKeepsExistingWorkers(t *testing.T) {
	forEachEngine(t, func(t *testing.T, e engineCase) {
		path := e.newDB(t)
		ctx := context.Background()
		s, err := Open(path)
		if err != nil {
			t.Fatal(err)
		}
		for _, w := range []Worker{{ReplicaID: "gpu-1", Hash: hashOf("a")}, {ReplicaID: "gpu-2", Hash: hashOf("b")}, {ReplicaID: "gpu-2", Hash: hashOf("c")}} {
			w.Address = "http://10.0.0.1:9000"
			w, err := s.CreateWorker(ctx, w)
			if err != nil {
				t.Fatal(err)
			}
			if w.ReplicaID == "gpu-2" {
				if _, err := s.RevokeWorker(ctx, w.ID); err != nil {
					t.Fatal(err)
				}
			}
		}
		// Back to the schema before 0012, with the credentials in it, and
		// 0012 applied again (later migrations stay as they are).
		for _, q := range []string{`DROP TABLE worker_admissions`, `DROP TABLE worker_invites`, `DELETE FROM schema_migrations WHERE version = 12`} {
			if _, err := s.write.ExecContext(ctx, q); err != nil {
				t.Fatal(err)
			}
		}
		ms, err := loadMigrations(s.engine)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range ms {
			if m.version == 12 {
				if err := applyMigration(ctx, s.write, m); err != nil {
					t.Fatal(err)
				}
			}
		}
		for _, q := range []string{ // 0016's columns, which the new table lacks
			`ALTER TABLE worker_admissions ADD COLUMN approved_code TEXT NOT NULL DEFAULT ''`,
			`ALTER TABLE worker_admissions ADD COLUMN asked_code TEXT NOT NULL DEFAULT ''`,
			`ALTER TABLE worker_admissions ADD COLUMN source TEXT NOT NULL DEFAULT ''`} {
			if _, err := s.write.ExecContext(ctx, q); err != nil {
				t.Fatal(err)
			}
		}
		s.Close()
		s = openAt(t, path)
		for id, want := range map[string]string{"gpu-1": AdmissionApproved, "gpu-2": AdmissionRevoked} {
			if a, err := s.AdmissionOf(ctx, id); err != nil || a.State != want {
				t.Errorf("%s after the migration: %+v, %v; want %s", id, a, err, want)
			}
		}
	})
}

// Two gateways sharing a database (two stores on it) that admit the same
// approved replica id at once issue exactly one live credential: the
// database holds one per id, in the transaction that issues it (a bounded
// race loop, on both engines); revoking the id revokes it.
func TestOneLiveCredentialPerReplicaID(t *testing.T) {
	forEachEngine(t, func(t *testing.T, e engineCase) {
		a := e.open(t)
		b := openAt(t, a.Path())
		stores := []*Store{a, b}
		ctx := context.Background()
		for round := range 20 {
			id := fmt.Sprintf("gpu-%d", round)
			if _, _, err := a.ApproveWorker(ctx, id, "CODE-A"); err != nil {
				t.Fatal(err)
			}
			var wg sync.WaitGroup
			errs := make([]error, 2)
			for i := range 2 {
				wg.Go(func() {
					_, errs[i] = stores[i].AdmitWorker(ctx, Worker{ReplicaID: id, Address: "http://10.0.0.1:9000", Hash: hashOf(fmt.Sprint(id, i))}, Admit{Code: "CODE-A", Open: true})
				})
			}
			wg.Wait()
			live := 0
			ws, err := a.Workers(ctx)
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range ws {
				if w.ReplicaID == id && !w.Revoked() {
					live++
				}
			}
			if live != 1 {
				t.Fatalf("round %d: %d live credentials for %s (errors %v), want 1", round, live, id, errs)
			}
			if (errs[0] == nil) == (errs[1] == nil) || !(errors.Is(errs[0], ErrReplicaTaken) || errors.Is(errs[1], ErrReplicaTaken)) {
				t.Fatalf("round %d: errors %v, want one nil and one ErrReplicaTaken", round, errs)
			}
			if _, err := a.RevokeWorker(ctx, id); err != nil {
				t.Fatal(err)
			}
			if _, err := a.ActiveWorkerFor(ctx, id); !errors.Is(err, ErrNotFound) {
				t.Fatalf("round %d: after revoking %s: %v, want no live credential", round, id, err)
			}
		}
	})
}

// One source asking under many replica ids fills its own share of the
// pending list, not the list: another source's request is still listed.
func TestPendingCappedPerSource(t *testing.T) {
	forEachEngine(t, func(t *testing.T, e engineCase) {
		s := e.open(t)
		ctx := context.Background()
		for i := range 300 {
			if err := s.NotePending(ctx, fmt.Sprintf("junk-%d", i), Asked{Address: "http://10.6.6.6:9000", Source: "10.6.6.6"}); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.NotePending(ctx, "gpu-1", Asked{Address: "http://10.0.0.1:9000", Code: "ABCD-EFGH-IJKL", Source: "10.0.0.1"}); err != nil {
			t.Fatal(err)
		}
		p, err := s.PendingWorkers(ctx)
		if err != nil {
			t.Fatal(err)
		}
		bySource := map[string]int{}
		for _, a := range p {
			bySource[a.Source]++
		}
		if bySource["10.6.6.6"] != maxPendingPerSource || bySource["10.0.0.1"] != 1 {
			t.Fatalf("pending by source %v; want %d from the junk source and the other one's request", bySource, maxPendingPerSource)
		}
	})
}

// TestOneLiveCredentialMigration: a database that gave one replica id two
// live credentials (before the index) keeps the newest live; the older is
// revoked at the time the newer was issued.
func TestOneLiveCredentialMigration(t *testing.T) {
	forEachEngine(t, func(t *testing.T, e engineCase) {
		s := e.open(t)
		ctx := context.Background()
		for _, q := range []string{`DROP INDEX worker_credentials_live`, `DELETE FROM schema_migrations WHERE version = 16`} {
			if _, err := s.write.ExecContext(ctx, q); err != nil {
				t.Fatal(err)
			}
		}
		old, err := s.CreateWorker(ctx, Worker{ReplicaID: "gpu-1", Address: "http://a", Hash: hashOf("old")})
		if err != nil {
			t.Fatal(err)
		}
		newer, err := s.CreateWorker(ctx, Worker{ReplicaID: "gpu-1", Address: "http://b", Hash: hashOf("new")})
		if err != nil {
			t.Fatal(err)
		}
		ms, err := loadMigrations(s.engine)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range ms {
			if m.version == 16 {
				if err := applyMigration(ctx, s.write, m); err != nil {
					t.Fatal(err)
				}
			}
		}
		live, err := s.ActiveWorkerFor(ctx, "gpu-1")
		if err != nil || live.ID != newer.ID {
			t.Fatalf("live credential after the migration: %+v, %v; want the newer %s", live, err, newer.ID)
		}
		o, err := s.WorkerByHash(ctx, hashOf("old"))
		if err != nil || !o.Revoked() || !o.RevokedAt.Equal(newer.CreatedAt) {
			t.Fatalf("the older credential %s after the migration: %+v, %v; want revoked at %s", old.ID, o, err, newer.CreatedAt)
		}
		if _, err := s.CreateWorker(ctx, Worker{ReplicaID: "gpu-1", Address: "http://c", Hash: hashOf("third")}); err == nil {
			t.Fatal("a second live credential after the migration")
		}
	})
}
