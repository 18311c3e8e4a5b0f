package batch_test

import (
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"

	"github.com/tailgate-dev/tailgate/policy"
	"github.com/tailgate-dev/tailgate/server"
	"github.com/tailgate-dev/tailgate/server/batch"
	"github.com/tailgate-dev/tailgate/server/internal/servertest"
	"github.com/tailgate-dev/tailgate/serving/sim"
)

// TestBatchLinesRunAsBatchClass: a batch made with an interactive key runs
// its lines as class batch (the ledger says so); with the gateway's
// capacity at one request and room for one waiting batch line, lines the
// admission queue refuses (429 queue_full) wait and run again, and every
// line completes.
func TestBatchLinesRunAsBatchClass(t *testing.T) {
	dir := t.TempDir()
	fleet := newSimFleet(t, 1, sim.Config{Model: servertest.SimModel, TPOT: time.Millisecond})
	g := servertest.Start(t, servertest.Options{Dir: dir, Fleet: fleet, Server: server.Config{
		AdmitCapacity: 1, Admission: policy.QueueConfig{MaxQueue: 1, Headroom: -1},
		Batch: batch.Config{FilesDir: filepath.Join(dir, "files"), PollInterval: 20 * time.Millisecond, RetryWait: 10 * time.Millisecond},
	}})
	secret := g.Key(policy.KeyOptions{Tenant: "acme", Class: policy.ClassInteractive})
	c := g.Client(secret)
	const n = 12
	b := createBatch(t, c, uploadBatchFile(t, c, chatLines(n)).ID, openai.BatchNewParamsEndpointV1ChatCompletions)
	b = waitBatch(t, c, b.ID, statusIs(openai.BatchStatusCompleted, openai.BatchStatusFailed))
	if b.Status != openai.BatchStatusCompleted || b.RequestCounts.Completed != n || b.RequestCounts.Failed != 0 {
		t.Fatalf("batch = %s", b.RawJSON())
	}
	ok, refused := 0, 0
	for _, r := range g.LedgerRows() {
		if r.Priority != "batch" {
			t.Errorf("row %s (status %d) ran as %q, want batch", r.ID, r.Status, r.Priority)
		}
		switch {
		case r.Status == http.StatusOK:
			ok++
		case r.Status == http.StatusTooManyRequests && r.Error == "queue_full":
			refused++
		default:
			t.Errorf("row %s: status %d %s", r.ID, r.Status, r.Error)
		}
	}
	if ok != n {
		t.Errorf("%d lines answered, want %d", ok, n)
	}
	t.Logf("%d admissions refused with 429 queue_full and retried", refused)
}
