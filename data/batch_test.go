package data

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

func TestFilesAreOwnedByTheirTenantAndListedNewestFirst(t *testing.T) {
	forEachEngine(t, func(t *testing.T, e engineCase) {
		s := e.open(t)
		ctx := context.Background()
		a, _ := s.EnsureTenant(ctx, "a")
		b, _ := s.EnsureTenant(ctx, "b")
		for i := range 3 {
			if _, err := s.CreateFile(ctx, File{ID: fmt.Sprintf("file-%d", i), TenantID: a.ID, Purpose: "batch", Filename: "in.jsonl", Bytes: 10}, 0); err != nil {
				t.Fatal(err)
			}
		}
		f, err := s.FileByID(ctx, a.ID, "file-1")
		if err != nil || f.Bytes != 10 || f.Filename != "in.jsonl" || f.CreatedAt.IsZero() {
			t.Fatalf("FileByID = %+v, %v", f, err)
		}
		if _, err := s.FileByID(ctx, b.ID, "file-1"); !errors.Is(err, ErrNotFound) {
			t.Errorf("another tenant's FileByID: err = %v, want ErrNotFound", err)
		}
		ids := func(fs []File) []string {
			var out []string
			for _, f := range fs {
				out = append(out, f.ID)
			}
			return out
		}
		all, err := s.Files(ctx, a.ID, "", "", 10, time.Time{})
		if err != nil || !slices.Equal(ids(all), []string{"file-2", "file-1", "file-0"}) {
			t.Errorf("Files = %v, %v; want newest first", ids(all), err)
		}
		page, _ := s.Files(ctx, a.ID, "batch", "file-2", 1, time.Time{})
		if !slices.Equal(ids(page), []string{"file-1"}) {
			t.Errorf("Files after file-2, limit 1 = %v, want [file-1]", ids(page))
		}
		if other, _ := s.Files(ctx, b.ID, "", "", 10, time.Time{}); len(other) != 0 {
			t.Errorf("tenant b sees %v", ids(other))
		}
	})
}

func newTestBatch(t *testing.T, s *Store, id string) (Batch, Tenant) {
	t.Helper()
	ctx := context.Background()
	tn, err := s.EnsureTenant(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	in := "file-in-" + id
	if _, err := s.CreateFile(ctx, File{ID: in, TenantID: tn.ID, Purpose: "batch", Filename: "in.jsonl", Bytes: 10}, 0); err != nil {
		t.Fatal(err)
	}
	b, err := s.CreateBatch(ctx, Batch{ID: id, TenantID: tn.ID, KeyID: "key_1", Endpoint: "/v1/chat/completions",
		InputFileID: in, CompletionWindow: "24h", Metadata: map[string]string{"job": "nightly"}}, 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return b, tn
}

func TestBatchLifecycleCountsEachLineOnce(t *testing.T) {
	forEachEngine(t, func(t *testing.T, e engineCase) {
		s := e.open(t)
		ctx := context.Background()
		b, tn := newTestBatch(t, s, "batch_1")
		if b.Status != BatchValidating || b.Metadata["job"] != "nightly" || !b.ExpiresAt.Equal(b.CreatedAt.Add(24*time.Hour)) {
			t.Fatalf("new batch = %+v", b)
		}
		if ids, _ := s.UnfinishedBatches(ctx); !slices.Equal(ids, []string{"batch_1"}) {
			t.Errorf("UnfinishedBatches = %v", ids)
		}
		// Lines cannot be recorded before the batch runs.
		if _, err := s.RecordBatchLines(ctx, b.ID, BatchLine{Line: 0, ID: "r0", CustomID: "a", OK: true}); !errors.Is(err, ErrBatchStatus) {
			t.Errorf("record while validating: err = %v, want ErrBatchStatus", err)
		}
		invalid := []BatchLine{{Line: 3, ID: "r3", CustomID: "d", ErrorCode: "invalid_url", ErrorMsg: "bad url"}}
		if err := s.StartBatch(ctx, b.ID, 4, invalid); err != nil {
			t.Fatal(err)
		}
		if err := s.StartBatch(ctx, b.ID, 4, nil); !errors.Is(err, ErrBatchStatus) {
			t.Errorf("second StartBatch: err = %v, want ErrBatchStatus", err)
		}
		n, err := s.RecordBatchLines(ctx, b.ID,
			BatchLine{Line: 0, ID: "r0", CustomID: "a", OK: true, StatusCode: 200, RequestID: "req_0", Body: []byte(`{"x":0}`), PromptTokens: 5, CompletionTokens: 7},
			BatchLine{Line: 1, ID: "r1", CustomID: "b", StatusCode: 400, Body: []byte(`{"error":{}}`)})
		if err != nil || n != 2 {
			t.Fatalf("RecordBatchLines = %d, %v", n, err)
		}
		// A line recorded again (a duplicate finish) changes nothing.
		if n, err := s.RecordBatchLines(ctx, b.ID, BatchLine{Line: 0, ID: "rX", CustomID: "a", OK: true, PromptTokens: 100}); err != nil || n != 0 {
			t.Fatalf("re-record = %d, %v; want 0 new", n, err)
		}
		done, err := s.BatchLinesDone(ctx, b.ID)
		if err != nil || len(done) != 3 || !done[0] || !done[1] || !done[3] || done[2] {
			t.Errorf("BatchLinesDone = %v, %v; want lines 0, 1, 3", done, err)
		}
		got, _ := s.BatchByID(ctx, tn.ID, b.ID)
		if got.Status != BatchInProgress || got.InProgressAt.IsZero() || got.Total != 4 || got.Completed != 1 || got.Failed != 2 ||
			got.PromptTokens != 5 || got.CompletionTokens != 7 {
			t.Errorf("after lines: %+v", got)
		}
		var lines []BatchLine
		if err := s.EachBatchLine(ctx, b.ID, func(l BatchLine) error { lines = append(lines, l); return nil }); err != nil {
			t.Fatal(err)
		}
		if len(lines) != 3 || lines[0].ID != "r0" || string(lines[0].Body) != `{"x":0}` || lines[0].RequestID != "req_0" ||
			lines[2].Line != 3 || lines[2].ErrorCode != "invalid_url" || lines[2].Body != nil {
			t.Errorf("EachBatchLine = %+v", lines)
		}

		if err := s.SetBatchStatus(ctx, b.ID, []string{BatchInProgress}, BatchFinalizing); err != nil {
			t.Fatal(err)
		}
		if _, err := s.CancelBatch(ctx, tn.ID, b.ID); !errors.Is(err, ErrBatchStatus) {
			t.Errorf("cancel while finalizing: err = %v, want ErrBatchStatus", err)
		}
		out := &File{ID: "file-out", TenantID: tn.ID, Purpose: "batch_output", Filename: "o.jsonl", Bytes: 1}
		if err := s.FinishBatch(ctx, b.ID, []string{BatchFinalizing}, BatchCompleted, out, nil); err != nil {
			t.Fatal(err)
		}
		got, _ = s.BatchByID(ctx, 0, b.ID)
		if got.Status != BatchCompleted || got.CompletedAt.IsZero() || got.FinalizingAt.IsZero() || got.OutputFileID != "file-out" || got.ErrorFileID != "" {
			t.Errorf("finished batch = %+v", got)
		}
		if _, err := s.FileByID(ctx, tn.ID, "file-out"); err != nil {
			t.Errorf("output file not registered: %v", err)
		}
		// The output file holds the lines now: their rows are gone.
		if done, err := s.BatchLinesDone(ctx, b.ID); err != nil || len(done) != 0 {
			t.Errorf("lines of a finished batch: %v, %v; want none", done, err)
		}
		if ids, _ := s.UnfinishedBatches(ctx); len(ids) != 0 {
			t.Errorf("UnfinishedBatches after completion = %v", ids)
		}
	})
}

func TestCancelBatchAndFailBatch(t *testing.T) {
	forEachEngine(t, func(t *testing.T, e engineCase) {
		s := e.open(t)
		ctx := context.Background()
		b, tn := newTestBatch(t, s, "batch_c")
		if _, err := s.CancelBatch(ctx, tn.ID+1, b.ID); !errors.Is(err, ErrNotFound) {
			t.Errorf("cancel by another tenant: err = %v, want ErrNotFound", err)
		}
		got, err := s.CancelBatch(ctx, tn.ID, b.ID)
		if err != nil || got.Status != BatchCancelling || got.CancellingAt.IsZero() {
			t.Fatalf("CancelBatch = %+v, %v", got, err)
		}
		if again, err := s.CancelBatch(ctx, tn.ID, b.ID); err != nil || again.Status != BatchCancelling {
			t.Errorf("second cancel = %v, %v; want it unchanged", again.Status, err)
		}
		// A validation that finishes after the cancel does not revive the batch.
		if err := s.StartBatch(ctx, b.ID, 1, nil); !errors.Is(err, ErrBatchStatus) {
			t.Errorf("StartBatch after cancel: err = %v, want ErrBatchStatus", err)
		}
		if err := s.FinishBatch(ctx, b.ID, []string{BatchCancelling}, BatchCancelled, nil, nil); err != nil {
			t.Fatal(err)
		}

		f, _ := newTestBatch(t, s, "batch_f")
		errs := []BatchError{{Code: "invalid_json", Message: "line 1 is not valid JSON", Line: 1}}
		if err := s.FailBatch(ctx, f.ID, errs); err != nil {
			t.Fatal(err)
		}
		got, _ = s.BatchByID(ctx, 0, f.ID)
		if got.Status != BatchFailed || got.FailedAt.IsZero() || !slices.Equal(got.Errors, errs) {
			t.Errorf("failed batch = %+v", got)
		}
		list, err := s.Batches(ctx, tn.ID, "", 10)
		if err != nil || len(list) != 2 || list[0].ID != "batch_f" || list[1].ID != "batch_c" {
			t.Errorf("Batches = %v, %v; want newest first", list, err)
		}
		if page, _ := s.Batches(ctx, tn.ID, "batch_f", 10); len(page) != 1 || page[0].ID != "batch_c" {
			t.Errorf("Batches after batch_f = %v", page)
		}
	})
}

func TestKeyByIDReturnsRevokedKeysToo(t *testing.T) {
	forEachEngine(t, func(t *testing.T, e engineCase) {
		s := e.open(t)
		ctx := context.Background()
		tn, _ := s.EnsureTenant(ctx, "acme")
		k, err := s.CreateKey(ctx, Key{Tenant: tn, Prefix: "tg-1", Hash: hashOf("secret")})
		if err != nil {
			t.Fatal(err)
		}
		got, err := s.KeyByID(ctx, k.ID)
		if err != nil || got.Tenant.Name != "acme" || got.Revoked() {
			t.Fatalf("KeyByID = %+v, %v", got, err)
		}
		if _, err := s.RevokeKey(ctx, k.ID, nil); err != nil {
			t.Fatal(err)
		}
		if got, err := s.KeyByID(ctx, k.ID); err != nil || !got.Revoked() {
			t.Errorf("KeyByID of a revoked key = %+v, %v", got, err)
		}
		if _, err := s.KeyByID(ctx, "key_nope"); !errors.Is(err, ErrNotFound) {
			t.Errorf("unknown key: err = %v, want ErrNotFound", err)
		}
	})
}

func TestStorageQuotaCountsEveryFileOfTheTenant(t *testing.T) {
	forEachEngine(t, func(t *testing.T, e engineCase) {
		s := e.open(t)
		ctx := context.Background()
		a, _ := s.EnsureTenant(ctx, "a")
		b, _ := s.EnsureTenant(ctx, "b")
		file := func(id string, tn Tenant, n int64) File {
			return File{ID: id, TenantID: tn.ID, Purpose: "batch", Filename: "f", Bytes: n}
		}
		if _, err := s.CreateFile(ctx, file("f1", a, 60), 100); err != nil {
			t.Fatal(err)
		}
		_, err := s.CreateFile(ctx, file("f2", a, 41), 100)
		var qe *StorageQuotaError
		if !errors.As(err, &qe) || qe.Used != 60 || qe.Limit != 100 || qe.Bytes != 41 {
			t.Fatalf("over quota: err = %v, want a StorageQuotaError of 60 used, 100 limit, 41 more", err)
		}
		if _, err := s.CreateFile(ctx, file("f3", a, 40), 100); err != nil {
			t.Errorf("exactly at the quota: %v", err)
		}
		if _, err := s.CreateFile(ctx, file("f4", b, 100), 100); err != nil {
			t.Errorf("another tenant's quota: %v", err)
		}
		if used, err := s.TenantFileBytes(ctx, a.ID); err != nil || used != 100 {
			t.Errorf("TenantFileBytes = %d, %v; want 100", used, err)
		}
		if _, err := s.DeleteFile(ctx, a.ID, "f1"); err != nil {
			t.Fatal(err)
		}
		if used, _ := s.TenantFileBytes(ctx, a.ID); used != 40 {
			t.Errorf("after a delete: %d bytes used, want 40", used)
		}
	})
}

func TestDeleteFileRefusesTheInputOfAnUnfinishedBatch(t *testing.T) {
	forEachEngine(t, func(t *testing.T, e engineCase) {
		s := e.open(t)
		ctx := context.Background()
		b, tn := newTestBatch(t, s, "batch_d")
		_, err := s.DeleteFile(ctx, tn.ID, b.InputFileID)
		var inUse *FileInUseError
		if !errors.As(err, &inUse) || inUse.BatchID != b.ID || inUse.Status != BatchValidating {
			t.Fatalf("delete while validating: err = %v, want FileInUseError naming the batch", err)
		}
		if _, err := s.DeleteFile(ctx, tn.ID+1, b.InputFileID); !errors.Is(err, ErrNotFound) {
			t.Errorf("delete by another tenant: err = %v, want ErrNotFound", err)
		}
		if err := s.FailBatch(ctx, b.ID, []BatchError{{Code: "x", Message: "x"}}); err != nil {
			t.Fatal(err)
		}
		if f, err := s.DeleteFile(ctx, tn.ID, b.InputFileID); err != nil || f.ID != b.InputFileID {
			t.Fatalf("delete once the batch failed: %+v, %v", f, err)
		}
		if _, err := s.DeleteFile(ctx, tn.ID, b.InputFileID); !errors.Is(err, ErrNotFound) {
			t.Errorf("second delete: err = %v, want ErrNotFound", err)
		}
		// A batch cannot start on a file that is gone.
		if _, err := s.CreateBatch(ctx, Batch{ID: "batch_e", TenantID: tn.ID, KeyID: "key_1", Endpoint: "/v1/chat/completions",
			InputFileID: b.InputFileID, CompletionWindow: "24h"}, time.Hour); !errors.Is(err, ErrNotFound) {
			t.Errorf("batch on a deleted file: err = %v, want ErrNotFound", err)
		}
	})
}

func TestDeleteExpiredFilesKeepsWhatABatchStillReads(t *testing.T) {
	forEachEngine(t, func(t *testing.T, e engineCase) {
		s := e.open(t)
		ctx := context.Background()
		b, tn := newTestBatch(t, s, "batch_x")
		t0 := time.Now().UTC().Truncate(time.Second)
		for _, f := range []File{
			{ID: "old", ExpiresAt: t0.Add(-time.Minute)},
			{ID: "older", ExpiresAt: t0.Add(-time.Hour)},
			{ID: "fresh", ExpiresAt: t0.Add(time.Hour)},
			{ID: "forever"},
		} {
			f.TenantID, f.Purpose, f.Filename, f.Bytes = tn.ID, "batch_output", "o", 1
			if _, err := s.CreateFile(ctx, f, 0); err != nil {
				t.Fatal(err)
			}
		}
		// The batch's input expires too, but the batch still runs.
		if _, err := s.write.ExecContext(ctx, `UPDATE files SET expires_at = ? WHERE id = ?`, toMicros(t0.Add(-time.Second)), b.InputFileID); err != nil {
			t.Fatal(err)
		}
		if got, _ := s.FileByID(ctx, tn.ID, "fresh"); !got.ExpiresAt.Equal(t0.Add(time.Hour)) {
			t.Errorf("ExpiresAt = %v, want %v", got.ExpiresAt, t0.Add(time.Hour))
		}
		live, _ := s.Files(ctx, tn.ID, "", "", 10, t0)
		if len(live) != 2 || live[0].ID != "forever" || live[1].ID != "fresh" {
			t.Errorf("files live at t0 = %+v, want forever and fresh", live)
		}
		gone, err := s.DeleteExpiredFiles(ctx, t0, 1)
		if err != nil || len(gone) != 1 || gone[0].ID != "older" {
			t.Fatalf("DeleteExpiredFiles(limit 1) = %+v, %v; want the one that expired first", gone, err)
		}
		gone, err = s.DeleteExpiredFiles(ctx, t0, 10)
		if err != nil || len(gone) != 1 || gone[0].ID != "old" {
			t.Fatalf("DeleteExpiredFiles = %+v, %v; want old, and not the running batch's input", gone, err)
		}
		if err := s.FailBatch(ctx, b.ID, []BatchError{{Code: "x", Message: "x"}}); err != nil {
			t.Fatal(err)
		}
		if gone, _ = s.DeleteExpiredFiles(ctx, t0, 10); len(gone) != 1 || gone[0].ID != b.InputFileID {
			t.Errorf("after the batch ended: %+v, want its input", gone)
		}
		if ok, _ := s.FileExists(ctx, "fresh"); !ok {
			t.Error("fresh file gone")
		}
	})
}

// TestFilesStoredBeforeExpiryExpireAfter30Days: a database that had files
// before migration 0004 gives each of them OpenAI's default lifetime.
func TestFilesStoredBeforeExpiryExpireAfter30Days(t *testing.T) {
	ctx := context.Background()
	db, err := sql.Open("sqlite", filepath.Join(t.TempDir(), "old.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ms, err := loadMigrations(engineSQLite)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at INTEGER NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		if m.version < 4 {
			if err := applyMigration(ctx, db, m); err != nil {
				t.Fatal(err)
			}
		}
	}
	created := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	if _, err := db.ExecContext(ctx, `INSERT INTO files (id, tenant_id, purpose, filename, bytes, created_at) VALUES ('f', 1, 'batch', 'in', 1, ?)`,
		toMicros(created)); err != nil {
		t.Fatal(err)
	}
	if err := migrate(ctx, db, engineSQLite); err != nil {
		t.Fatal(err)
	}
	f, err := scanFile(db.QueryRowContext(ctx, `SELECT `+fileCols+` FROM files`))
	if err != nil || !f.ExpiresAt.Equal(created.Add(30*24*time.Hour)) {
		t.Errorf("file after the migration = %+v, %v; want it to expire 30 days after creation", f, err)
	}
}

// TestBatchLineStartsCountUncleanRuns: a line started again without a result
// or a clean stop in between counts its earlier starts (the crash-loop
// guard), on both engines. On PostgreSQL the upsert's bare column name was
// ambiguous and every start failed.
func TestBatchLineStartsCountUncleanRuns(t *testing.T) {
	forEachEngine(t, func(t *testing.T, e engineCase) {
		s := e.open(t)
		ctx := context.Background()
		b, _ := newTestBatch(t, s, "batch_starts")
		for want := range 3 {
			before, err := s.StartBatchLine(ctx, b.ID, 7)
			if err != nil {
				t.Fatal(err)
			}
			if before != want {
				t.Fatalf("start %d: %d unclean runs before, want %d", want+1, before, want)
			}
		}
		if got, err := s.BatchLineStarts(ctx, b.ID); err != nil || got[7] != 3 {
			t.Fatalf("BatchLineStarts = %v, %v; want line 7 started 3 times", got, err)
		}
		if err := s.EndBatchLine(ctx, b.ID, 7); err != nil {
			t.Fatal(err)
		}
		if before, err := s.StartBatchLine(ctx, b.ID, 7); err != nil || before != 0 {
			t.Fatalf("start after a clean end: %d, %v; want 0", before, err)
		}
	})
}
