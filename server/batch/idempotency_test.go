package batch_test

import (
	"context"
	"errors"
	"net/http"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/tailgate-dev/tailgate/server/internal/servertest"
	"github.com/tailgate-dev/tailgate/serving/sim"
)

// POST /v1/batches with an Idempotency-Key creates one batch: the retry
// gets the same batch, replayed; another body with the key is a 422.
func TestBatchCreationWithIdempotencyKeyCreatesOne(t *testing.T) {
	dir := t.TempDir()
	g := startBatchGateway(t, dir, newSimFleet(t, 1, sim.Config{Model: servertest.SimModel}), batchOpts{})
	c := g.Client(key(g, "acme"), option.WithHeader("Idempotency-Key", "nightly-2026-12-07"))
	f := uploadBatchFile(t, c, chatLines(2))
	params := openai.BatchNewParams{InputFileID: f.ID, Endpoint: openai.BatchNewParamsEndpointV1ChatCompletions,
		CompletionWindow: openai.BatchNewParamsCompletionWindow24h}
	first, err := c.Batches.New(context.Background(), params)
	if err != nil {
		t.Fatal(err)
	}
	var resp *http.Response
	again, err := c.Batches.New(context.Background(), params, option.WithResponseInto(&resp))
	if err != nil {
		t.Fatal(err)
	}
	if again.ID != first.ID || resp.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry created %s (first %s), replayed %q", again.ID, first.ID, resp.Header.Get("Idempotent-Replayed"))
	}
	list, err := c.Batches.List(context.Background(), openai.BatchListParams{})
	if err != nil || len(list.Data) != 1 {
		t.Fatalf("batches: %v %d, want 1", err, len(list.Data))
	}
	params.Metadata = map[string]string{"other": "body"}
	_, err = c.Batches.New(context.Background(), params)
	var ae *openai.Error
	if !errors.As(err, &ae) || ae.StatusCode != http.StatusUnprocessableEntity || ae.Code != "idempotency_key_reused" {
		t.Fatalf("another body with the key: %v", err)
	}
}
