package data

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"
)

func TestFilesAreOwnedByTheirTenantAndListedNewestFirst(t *testing.T) {
	s := openTestStore(t)
	ctx := context.Background()
	a, _ := s.EnsureTenant(ctx, "a")
	b, _ := s.EnsureTenant(ctx, "b")
	for i := range 3 {
		if _, err := s.CreateFile(ctx, File{ID: fmt.Sprintf("file-%d", i), TenantID: a.ID, Purpose: "batch", Filename: "in.jsonl", Bytes: 10}); err != nil {
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
	all, err := s.Files(ctx, a.ID, "", "", 10)
	if err != nil || !slices.Equal(ids(all), []string{"file-2", "file-1", "file-0"}) {
		t.Errorf("Files = %v, %v; want newest first", ids(all), err)
	}
	page, _ := s.Files(ctx, a.ID, "batch", "file-2", 1)
	if !slices.Equal(ids(page), []string{"file-1"}) {
		t.Errorf("Files after file-2, limit 1 = %v, want [file-1]", ids(page))
	}
	if other, _ := s.Files(ctx, b.ID, "", "", 10); len(other) != 0 {
		t.Errorf("tenant b sees %v", ids(other))
	}
}

func newTestBatch(t *testing.T, s *Store, id string) (Batch, Tenant) {
	t.Helper()
	ctx := context.Background()
	tn, err := s.EnsureTenant(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.CreateBatch(ctx, Batch{ID: id, TenantID: tn.ID, KeyID: "key_1", Endpoint: "/v1/chat/completions",
		InputFileID: "file-in", CompletionWindow: "24h", Metadata: map[string]string{"job": "nightly"}}, 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return b, tn
}

func TestBatchLifecycleCountsEachLineOnce(t *testing.T) {
	s := openTestStore(t)
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
	if ids, _ := s.UnfinishedBatches(ctx); len(ids) != 0 {
		t.Errorf("UnfinishedBatches after completion = %v", ids)
	}
}

func TestCancelBatchAndFailBatch(t *testing.T) {
	s := openTestStore(t)
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
}

func TestKeyByIDReturnsRevokedKeysToo(t *testing.T) {
	s := openTestStore(t)
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
}
