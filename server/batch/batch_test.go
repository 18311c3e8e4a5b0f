package batch_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"

	"github.com/tailgate-dev/tailgate/data"
	"github.com/tailgate-dev/tailgate/policy"
	"github.com/tailgate-dev/tailgate/router"
	"github.com/tailgate-dev/tailgate/server"
	"github.com/tailgate-dev/tailgate/server/batch"
	"github.com/tailgate-dev/tailgate/server/internal/servertest"
	"github.com/tailgate-dev/tailgate/serving/sim"
)

type batchOpts struct {
	router router.Config
	batch  batch.Config
	// disabled leaves batch.Config.FilesDir empty (else it defaults to
	// DIR/files).
	disabled bool
}

// newSimFleet starts n sim engines on loopback; they outlive the gateways
// of a test, so a restarted gateway finds the same fleet.
func newSimFleet(t *testing.T, n int, cfg sim.Config) []servertest.Sim {
	t.Helper()
	return servertest.StartSims(t, n, cfg, nil)
}

// startBatchGateway starts a gateway with the Batch API on (files under
// DIR/files) and its executor polling fast, in front of fleet. A test can
// Close it and start another on the same dir and fleet: a restart.
func startBatchGateway(t *testing.T, dir string, fleet []servertest.Sim, o batchOpts) *servertest.Gateway {
	t.Helper()
	if o.batch.FilesDir == "" && !o.disabled {
		o.batch.FilesDir = filepath.Join(dir, "files")
	}
	if o.batch.PollInterval == 0 {
		o.batch.PollInterval = 20 * time.Millisecond
	}
	if o.batch.RetryWait == 0 {
		o.batch.RetryWait = 10 * time.Millisecond
	}
	return servertest.Start(t, servertest.Options{Dir: dir, Fleet: fleet, Router: o.router, Server: server.Config{Batch: o.batch}})
}

// key creates a key of tenant and returns its secret.
func key(g *servertest.Gateway, tenant string) string {
	return g.Key(policy.KeyOptions{Tenant: tenant})
}

// completedRow waits up to 20 s for a batch to complete and returns its
// row as it then stands (completed or not: the caller says what it wanted).
func completedRow(t *testing.T, g *servertest.Gateway, id string) data.Batch {
	t.Helper()
	b := batchRow(t, g, id)
	for deadline := time.Now().Add(20 * time.Second); b.Status != data.BatchCompleted && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
		b = batchRow(t, g, id)
	}
	return b
}

// batchRow reads a batch straight from the store (microsecond times).
func batchRow(t *testing.T, g *servertest.Gateway, id string) data.Batch {
	t.Helper()
	b, err := g.Store.BatchByID(context.Background(), 0, id)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func chatLine(customID, content string) string {
	return fmt.Sprintf(`{"custom_id":%q,"method":"POST","url":"/v1/chat/completions","body":{"model":%q,"messages":[{"role":"user","content":%q}],"max_tokens":16}}`,
		customID, servertest.SimModel, content)
}

func chatLines(n int) string {
	var b strings.Builder
	for i := range n {
		b.WriteString(chatLine(fmt.Sprintf("req-%03d", i), fmt.Sprintf("Say something about the number %d.", i)))
		b.WriteByte('\n')
	}
	return b.String()
}

func uploadBatchFile(t *testing.T, c openai.Client, content string) *openai.FileObject {
	t.Helper()
	f, err := c.Files.New(context.Background(), openai.FileNewParams{
		File: openai.File(strings.NewReader(content), "input.jsonl", "application/jsonl"), Purpose: openai.FilePurposeBatch,
	})
	if err != nil {
		t.Fatalf("upload: %v", err)
	}
	return f
}

func createBatch(t *testing.T, c openai.Client, fileID string, ep openai.BatchNewParamsEndpoint) *openai.Batch {
	t.Helper()
	b, err := c.Batches.New(context.Background(), openai.BatchNewParams{
		InputFileID: fileID, Endpoint: ep, CompletionWindow: openai.BatchNewParamsCompletionWindow24h,
		Metadata: map[string]string{"purpose": "test"},
	})
	if err != nil {
		t.Fatalf("create batch: %v", err)
	}
	return b
}

// waitBatch polls the batch until cond holds.
func waitBatch(t *testing.T, c openai.Client, id string, cond func(*openai.Batch) bool) *openai.Batch {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		b, err := c.Batches.Get(context.Background(), id)
		if err != nil {
			t.Fatalf("get batch: %v", err)
		}
		if cond(b) {
			return b
		}
		if time.Now().After(deadline) {
			t.Fatalf("batch %s still %s with %+v after 60s", id, b.Status, b.RequestCounts)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func statusIs(s ...openai.BatchStatus) func(*openai.Batch) bool {
	return func(b *openai.Batch) bool { return slices.Contains(s, b.Status) }
}

// batchResult is a line of an output or error file.
type batchResult struct {
	ID       string  `json:"id"`
	CustomID *string `json:"custom_id"`
	Response *struct {
		StatusCode int             `json:"status_code"`
		RequestID  string          `json:"request_id"`
		Body       json.RawMessage `json:"body"`
	} `json:"response"`
	Error *struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

func (r batchResult) customID() string {
	if r.CustomID == nil {
		return ""
	}
	return *r.CustomID
}

// fileResults downloads a result file with the SDK and parses its lines.
func fileResults(t *testing.T, c openai.Client, id string) []batchResult {
	t.Helper()
	if id == "" {
		return nil
	}
	resp, err := c.Files.Content(context.Background(), id)
	if err != nil {
		t.Fatalf("file content: %v", err)
	}
	defer resp.Body.Close()
	var out []batchResult
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var r batchResult
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("result line %q: %v", sc.Text(), err)
		}
		if !strings.HasPrefix(r.ID, "batch_req_") || (r.Response == nil) == (r.Error == nil) {
			t.Errorf("result line %s: want a batch_req_ id and exactly one of response and error", sc.Text())
		}
		out = append(out, r)
	}
	return out
}

type usage struct{ prompt, completion int64 }

func bodyUsage(t *testing.T, body []byte) usage {
	t.Helper()
	var v struct {
		Usage struct {
			PromptTokens     int64 `json:"prompt_tokens"`
			CompletionTokens int64 `json:"completion_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(body, &v); err != nil {
		t.Fatal(err)
	}
	return usage{v.Usage.PromptTokens, v.Usage.CompletionTokens}
}

// checkMeteredOnce checks that every successful line was billed by exactly
// one ledger row and that the ledger's billed tokens are the output's.
func checkMeteredOnce(t *testing.T, g *servertest.Gateway, out []batchResult) {
	t.Helper()
	var want usage
	ids := map[string]bool{}
	for _, r := range out {
		u := bodyUsage(t, r.Response.Body)
		want.prompt += u.prompt
		want.completion += u.completion
		ids[r.Response.RequestID] = true
	}
	var got usage
	ok := 0
	for _, row := range g.LedgerRows() {
		got.prompt += row.PromptTokens
		got.completion += row.CompletionTokens
		if row.Outcome == "ok" {
			ok++
			if !ids[row.ID] {
				t.Errorf("ledger row %s (ok) answers no output line", row.ID)
			}
		}
	}
	if ok != len(out) || got != want {
		t.Errorf("ledger: %d ok rows billing %+v; output: %d lines with usage %+v", ok, got, len(out), want)
	}
}

func TestBatchHappyPath(t *testing.T) {
	fleet := newSimFleet(t, 2, sim.Config{Model: servertest.SimModel})
	g := startBatchGateway(t, t.TempDir(), fleet, batchOpts{})
	c := g.Client(key(g, "acme"))
	ctx := context.Background()

	input := chatLines(10)
	f := uploadBatchFile(t, c, input)
	if !strings.HasPrefix(f.ID, "file-") || f.Purpose != openai.FileObjectPurposeBatch || f.Bytes != int64(len(input)) ||
		f.Filename != "input.jsonl" || f.CreatedAt == 0 {
		t.Errorf("file object = %+v", f)
	}
	if got, err := c.Files.Get(ctx, f.ID); err != nil || got.ID != f.ID || got.Bytes != f.Bytes {
		t.Errorf("Files.Get = %+v, %v", got, err)
	}
	created := createBatch(t, c, f.ID, openai.BatchNewParamsEndpointV1ChatCompletions)
	if !strings.HasPrefix(created.ID, "batch_") || created.Status != openai.BatchStatusValidating ||
		created.Endpoint != "/v1/chat/completions" || created.InputFileID != f.ID || created.CompletionWindow != "24h" ||
		created.ExpiresAt != created.CreatedAt+24*3600 || created.Metadata["purpose"] != "test" {
		t.Errorf("created batch = %s", created.RawJSON())
	}
	b := waitBatch(t, c, created.ID, statusIs(openai.BatchStatusCompleted, openai.BatchStatusFailed))
	if b.Status != openai.BatchStatusCompleted || b.RequestCounts.Total != 10 || b.RequestCounts.Completed != 10 ||
		b.RequestCounts.Failed != 0 || b.OutputFileID == "" || b.ErrorFileID != "" ||
		b.InProgressAt == 0 || b.FinalizingAt == 0 || b.CompletedAt == 0 {
		t.Fatalf("finished batch = %s", b.RawJSON())
	}
	// The raw object carries every field of OpenAI's batch, null when unset.
	var raw map[string]json.RawMessage
	_ = json.Unmarshal([]byte(b.RawJSON()), &raw)
	for _, k := range []string{"id", "object", "endpoint", "errors", "input_file_id", "completion_window", "status",
		"output_file_id", "error_file_id", "created_at", "in_progress_at", "expires_at", "finalizing_at", "completed_at",
		"failed_at", "expired_at", "cancelling_at", "cancelled_at", "request_counts", "metadata"} {
		if _, ok := raw[k]; !ok {
			t.Errorf("batch object has no %q", k)
		}
	}
	if string(raw["errors"]) != "null" || string(raw["failed_at"]) != "null" || string(raw["object"]) != `"batch"` {
		t.Errorf("errors = %s, failed_at = %s, object = %s", raw["errors"], raw["failed_at"], raw["object"])
	}

	out := fileResults(t, c, b.OutputFileID)
	var got []string
	var sum usage
	for _, r := range out {
		got = append(got, r.customID())
		if r.Response.StatusCode != 200 || r.Error != nil || !strings.HasPrefix(r.Response.RequestID, "req_") ||
			!bytes.Contains(r.Response.Body, []byte(`"chat.completion"`)) {
			t.Errorf("output line %s: %+v", r.customID(), r.Response)
		}
		u := bodyUsage(t, r.Response.Body)
		sum.prompt += u.prompt
		sum.completion += u.completion
	}
	slices.Sort(got)
	want := []string{}
	for i := range 10 {
		want = append(want, fmt.Sprintf("req-%03d", i))
	}
	if !slices.Equal(got, want) {
		t.Errorf("output custom_ids = %v, want %v", got, want)
	}
	if b.Usage.InputTokens != sum.prompt || b.Usage.OutputTokens != sum.completion || b.Usage.TotalTokens != sum.prompt+sum.completion {
		t.Errorf("batch usage = %+v, output bodies sum to %+v", b.Usage, sum)
	}
	if rows := g.LedgerRows(); len(rows) != 10 {
		t.Errorf("%d ledger rows, want 10 (one per line)", len(rows))
	}
	checkMeteredOnce(t, g, out)

	of, err := c.Files.Get(ctx, b.OutputFileID)
	if err != nil || of.Purpose != openai.FileObjectPurposeBatchOutput {
		t.Errorf("output file object = %+v, %v", of, err)
	}
	page, err := c.Batches.List(ctx, openai.BatchListParams{})
	if err != nil || len(page.Data) != 1 || page.Data[0].ID != b.ID {
		t.Errorf("Batches.List = %+v, %v", page, err)
	}

	// The legacy completions endpoint works the same way.
	comp := `{"custom_id":"c1","method":"POST","url":"/v1/completions","body":{"model":"` + servertest.SimModel + `","prompt":"Once upon","max_tokens":8}}` + "\n"
	cb := createBatch(t, c, uploadBatchFile(t, c, comp).ID, openai.BatchNewParamsEndpointV1Completions)
	cb = waitBatch(t, c, cb.ID, statusIs(openai.BatchStatusCompleted, openai.BatchStatusFailed))
	if res := fileResults(t, c, cb.OutputFileID); cb.RequestCounts.Completed != 1 || len(res) != 1 ||
		!bytes.Contains(res[0].Response.Body, []byte(`"text_completion"`)) {
		t.Errorf("completions batch = %s", cb.RawJSON())
	}

	// Newest first, with cursor paging.
	page, err = c.Batches.List(ctx, openai.BatchListParams{Limit: openai.Int(1)})
	if err != nil || len(page.Data) != 1 || page.Data[0].ID != cb.ID || !page.HasMore {
		t.Fatalf("first page = %+v, %v", page, err)
	}
	page, err = c.Batches.List(ctx, openai.BatchListParams{Limit: openai.Int(1), After: openai.String(cb.ID)})
	if err != nil || len(page.Data) != 1 || page.Data[0].ID != b.ID || page.HasMore {
		t.Errorf("second page = %+v, %v", page, err)
	}
}

func TestBatchMalformedLinesGoToTheErrorFile(t *testing.T) {
	fleet := newSimFleet(t, 2, sim.Config{Model: servertest.SimModel})
	g := startBatchGateway(t, t.TempDir(), fleet, batchOpts{})
	c := g.Client(key(g, "acme"))

	lines := []string{
		chatLine("good-1", "one"),
		`{"custom_id":"bad-json","method":"POST",`,
		strings.Replace(chatLine("wrong-url", "x"), "/v1/chat/completions", "/v1/completions", 1),
		chatLine("good-2", "two"),
		chatLine("good-1", "duplicate"),
		`{"custom_id":"streamed","method":"POST","url":"/v1/chat/completions","body":{"model":"` + servertest.SimModel + `","stream":true,"messages":[{"role":"user","content":"hi"}]}}`,
		`{"custom_id":"no-model","method":"POST","url":"/v1/chat/completions","body":{"messages":[{"role":"user","content":"hi"}]}}`,
		"",
		`{"custom_id":"get","method":"GET","url":"/v1/chat/completions","body":{"model":"` + servertest.SimModel + `"}}`,
		`{"custom_id":"unknown-model","method":"POST","url":"/v1/chat/completions","body":{"model":"nope","messages":[{"role":"user","content":"hi"}]}}`,
		chatLine("good-3", "three"),
	}
	f := uploadBatchFile(t, c, strings.Join(lines, "\n")) // no newline at the end
	b := createBatch(t, c, f.ID, openai.BatchNewParamsEndpointV1ChatCompletions)
	b = waitBatch(t, c, b.ID, statusIs(openai.BatchStatusCompleted, openai.BatchStatusFailed))
	if b.Status != openai.BatchStatusCompleted || b.RequestCounts.Total != 10 || b.RequestCounts.Completed != 3 || b.RequestCounts.Failed != 7 {
		t.Fatalf("batch = %s", b.RawJSON())
	}
	out := fileResults(t, c, b.OutputFileID)
	var good []string
	for _, r := range out {
		good = append(good, r.customID())
	}
	slices.Sort(good)
	if !slices.Equal(good, []string{"good-1", "good-2", "good-3"}) {
		t.Errorf("output custom_ids = %v", good)
	}
	// Lines that never ran carry an error code; a line the model path
	// refused carries the response it got.
	want := map[string]string{
		"": "invalid_json", "wrong-url": "invalid_url", "good-1": "duplicate_custom_id", "streamed": "stream_not_allowed",
		"no-model": "missing_model", "get": "invalid_method", "unknown-model": "status 404",
	}
	got := map[string]string{}
	for _, r := range fileResults(t, c, b.ErrorFileID) {
		switch {
		case r.Error != nil:
			got[r.customID()] = r.Error.Code
			if r.Error.Message == "" {
				t.Errorf("%s: error without a message", r.customID())
			}
		default:
			got[r.customID()] = "status " + strconv.Itoa(r.Response.StatusCode)
			if !bytes.Contains(r.Response.Body, []byte(`"model_not_found"`)) {
				t.Errorf("%s: body %s", r.customID(), r.Response.Body)
			}
		}
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("error file:\n got %v\nwant %v", got, want)
	}
	// The three good lines and the refused one went through the gateway.
	if rows := g.LedgerRows(); len(rows) != 4 {
		t.Errorf("%d ledger rows, want 4", len(rows))
	}
	checkMeteredOnce(t, g, out)
}

func TestBatchWithNoValidLineFails(t *testing.T) {
	fleet := newSimFleet(t, 1, sim.Config{Model: servertest.SimModel})
	g := startBatchGateway(t, t.TempDir(), fleet, batchOpts{})
	c := g.Client(key(g, "acme"))
	f := uploadBatchFile(t, c, "not json\n"+strings.Replace(chatLine("a", "x"), `"POST"`, `"PUT"`, 1)+"\n")
	b := createBatch(t, c, f.ID, openai.BatchNewParamsEndpointV1ChatCompletions)
	b = waitBatch(t, c, b.ID, statusIs(openai.BatchStatusCompleted, openai.BatchStatusFailed))
	if b.Status != openai.BatchStatusFailed || b.FailedAt == 0 || len(b.Errors.Data) != 2 || b.OutputFileID != "" {
		t.Fatalf("batch = %s", b.RawJSON())
	}
	if e := b.Errors.Data[0]; e.Code != "invalid_json" || e.Line != 1 {
		t.Errorf("first error = %+v", e)
	}
	if e := b.Errors.Data[1]; e.Code != "invalid_method" || e.Line != 2 {
		t.Errorf("second error = %+v", e)
	}
	if rows := g.LedgerRows(); len(rows) != 0 {
		t.Errorf("%d ledger rows, want none", len(rows))
	}
}

// slowSim answers one request at a time per replica, 200ms each.
var slowSim = sim.Config{Model: servertest.SimModel, TTFT: 200 * time.Millisecond, MaxSeqs: 1}

func TestBatchCancelStopsNewLines(t *testing.T) {
	fleet := newSimFleet(t, 2, slowSim)
	g := startBatchGateway(t, t.TempDir(), fleet, batchOpts{})
	c := g.Client(key(g, "acme"))
	f := uploadBatchFile(t, c, chatLines(40))
	b := createBatch(t, c, f.ID, openai.BatchNewParamsEndpointV1ChatCompletions)
	waitBatch(t, c, b.ID, func(b *openai.Batch) bool { return b.RequestCounts.Completed >= 2 })

	cb, err := c.Batches.Cancel(context.Background(), b.ID)
	if err != nil || cb.Status != openai.BatchStatusCancelling || cb.CancellingAt == 0 {
		t.Fatalf("cancel = %+v, %v", cb, err)
	}
	b = waitBatch(t, c, b.ID, statusIs(openai.BatchStatusCancelled))
	if b.CancelledAt == 0 || b.RequestCounts.Total != 40 || b.RequestCounts.Completed >= 40 || b.RequestCounts.Completed < 2 {
		t.Fatalf("cancelled batch = %s", b.RawJSON())
	}
	out := fileResults(t, c, b.OutputFileID)
	if int64(len(out)) != b.RequestCounts.Completed {
		t.Errorf("output has %d lines, counts say %d completed", len(out), b.RequestCounts.Completed)
	}
	// Lines in flight at the cancel finished and were kept; none started after.
	if rows := g.LedgerRows(); int64(len(rows)) != b.RequestCounts.Completed+b.RequestCounts.Failed {
		t.Errorf("%d ledger rows for %d finished lines", len(rows), b.RequestCounts.Completed+b.RequestCounts.Failed)
	}
	checkMeteredOnce(t, g, out)

	// A finished batch cannot be cancelled.
	if _, err := c.Batches.Cancel(context.Background(), b.ID); err != nil {
		t.Errorf("cancel of a cancelled batch: %v (want the batch back)", err)
	}
	done := createBatch(t, c, uploadBatchFile(t, c, chatLines(1)).ID, openai.BatchNewParamsEndpointV1ChatCompletions)
	waitBatch(t, c, done.ID, statusIs(openai.BatchStatusCompleted))
	resp := batchPost(t, g, "/v1/batches/"+done.ID+"/cancel", key(g, "acme"))
	if resp.StatusCode != http.StatusConflict {
		t.Errorf("cancel of a completed batch: %d, want 409", resp.StatusCode)
	}
}

// TestBatchRestartResumes stops the executor part-way (lines in flight
// finish: the drain), starts a new gateway on the same database and files,
// and checks the batch completes with every line answered and billed once.
func TestBatchRestartResumes(t *testing.T) {
	testBatchRestart(t, 0)
}

// TestBatchRestartRerunsCancelledLines stops the executor without a drain:
// lines in flight are cancelled, not recorded, and run again after the
// restart; only their answered run is billed.
func TestBatchRestartRerunsCancelledLines(t *testing.T) {
	testBatchRestart(t, -1)
}

func testBatchRestart(t *testing.T, drain time.Duration) {
	const n = 24
	dir := t.TempDir()
	fleet := newSimFleet(t, 2, slowSim)
	opts := batchOpts{batch: batch.Config{DrainTimeout: drain}}
	g1 := startBatchGateway(t, dir, fleet, opts)
	secret := key(g1, "acme")
	c1 := g1.Client(secret)
	f := uploadBatchFile(t, c1, chatLines(n))
	b := createBatch(t, c1, f.ID, openai.BatchNewParamsEndpointV1ChatCompletions)
	waitBatch(t, c1, b.ID, func(b *openai.Batch) bool { return b.RequestCounts.Completed >= 4 })
	g1.StopBatches()
	before := batchRow(t, g1, b.ID)
	if before.Status != data.BatchInProgress || before.Completed >= n {
		t.Fatalf("after stopping the executor: %s with %d of %d done; want a batch in progress", before.Status, before.Completed, n)
	}
	rows1 := g1.LedgerRows()
	g1.Close()
	t.Logf("stopped with %d of %d lines done, %d ledger rows", before.Completed, n, len(rows1))

	g2 := startBatchGateway(t, dir, fleet, opts)
	c2 := g2.Client(secret)
	done := waitBatch(t, c2, b.ID, statusIs(openai.BatchStatusCompleted, openai.BatchStatusFailed))
	if done.Status != openai.BatchStatusCompleted || done.RequestCounts.Completed != n || done.RequestCounts.Failed != 0 {
		t.Fatalf("after restart: %s", done.RawJSON())
	}
	out := fileResults(t, c2, done.OutputFileID)
	seen := map[string]int{}
	for _, r := range out {
		seen[r.customID()]++
	}
	for i := range n {
		if id := fmt.Sprintf("req-%03d", i); seen[id] != 1 {
			t.Errorf("%s answered %d times", id, seen[id])
		}
	}
	rows := g2.LedgerRows()
	cancelled := 0
	for _, r := range rows {
		if r.Outcome == "client_cancelled" {
			cancelled++
			if r.PromptTokens+r.CompletionTokens != 0 {
				t.Errorf("cancelled line billed: %+v", r)
			}
		}
	}
	if drain == 0 && len(rows) != n {
		t.Errorf("%d ledger rows for %d lines; a drained stop cancels nothing", len(rows), n)
	}
	t.Logf("%d ledger rows, %d of them lines cancelled by the stop", len(rows), cancelled)
	checkMeteredOnce(t, g2, out)
}

func batchPost(t *testing.T, g *servertest.Gateway, path, secret string) *http.Response {
	t.Helper()
	return batchDo(t, g, http.MethodPost, path, secret, "application/json", strings.NewReader(`{}`))
}

// batchDo sends a raw request to the public API and reads its body away.
func batchDo(t *testing.T, g *servertest.Gateway, method, path, secret, ctype string, body io.Reader) *http.Response {
	t.Helper()
	resp := g.Do(method, path, secret, ctype, body)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp
}

func TestBatchTenantIsolation(t *testing.T) {
	fleet := newSimFleet(t, 1, sim.Config{Model: servertest.SimModel})
	g := startBatchGateway(t, t.TempDir(), fleet, batchOpts{})
	ca := g.Client(key(g, "acme"))
	other := key(g, "globex")
	cb := g.Client(other)
	f := uploadBatchFile(t, ca, chatLines(2))
	b := createBatch(t, ca, f.ID, openai.BatchNewParamsEndpointV1ChatCompletions)
	b = waitBatch(t, ca, b.ID, statusIs(openai.BatchStatusCompleted))

	for _, path := range []string{"/v1/files/" + f.ID, "/v1/files/" + f.ID + "/content", "/v1/files/" + b.OutputFileID + "/content",
		"/v1/batches/" + b.ID} {
		if resp := batchDo(t, g, http.MethodGet, path, other, "", nil); resp.StatusCode != http.StatusNotFound {
			t.Errorf("GET %s by another tenant: %d, want 404", path, resp.StatusCode)
		}
	}
	if resp := batchPost(t, g, "/v1/batches/"+b.ID+"/cancel", other); resp.StatusCode != http.StatusNotFound {
		t.Errorf("cancel by another tenant: %d, want 404", resp.StatusCode)
	}
	_, err := cb.Batches.New(context.Background(), openai.BatchNewParams{InputFileID: f.ID,
		Endpoint: openai.BatchNewParamsEndpointV1ChatCompletions, CompletionWindow: openai.BatchNewParamsCompletionWindow24h})
	if apiErr, ok := err.(*openai.Error); !ok || apiErr.StatusCode != http.StatusNotFound {
		t.Errorf("batch on another tenant's file: %v, want 404", err)
	}
	if page, err := cb.Batches.List(context.Background(), openai.BatchListParams{}); err != nil || len(page.Data) != 0 {
		t.Errorf("another tenant lists %d batches (%v)", len(page.Data), err)
	}
	if page, err := cb.Files.List(context.Background(), openai.FileListParams{}); err != nil || len(page.Data) != 0 {
		t.Errorf("another tenant lists %d files (%v)", len(page.Data), err)
	}
	if resp := batchDo(t, g, http.MethodGet, "/v1/batches/"+b.ID, "tg-not-a-key", "", nil); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("bad key: %d, want 401", resp.StatusCode)
	}
}

func multipartBody(t *testing.T, purpose, content string) (string, *bytes.Buffer) {
	t.Helper()
	var buf bytes.Buffer
	w := multipart.NewWriter(&buf)
	_ = w.WriteField("purpose", purpose)
	fw, _ := w.CreateFormFile("file", "in.jsonl")
	_, _ = fw.Write([]byte(content))
	_ = w.Close()
	return w.FormDataContentType(), &buf
}

func TestBatchUploadRules(t *testing.T) {
	fleet := newSimFleet(t, 1, sim.Config{Model: servertest.SimModel})
	dir := t.TempDir()
	g := startBatchGateway(t, dir, fleet, batchOpts{batch: batch.Config{MaxFileBytes: 1024}})
	secret := key(g, "acme")
	for _, tc := range []struct {
		name, purpose, content string
		want                   int
	}{
		{"too large", "batch", strings.Repeat("x", 1025), http.StatusRequestEntityTooLarge},
		{"at the limit", "batch", strings.Repeat("x", 1024), http.StatusOK},
		{"wrong purpose", "fine-tune", "x", http.StatusBadRequest},
		{"empty", "batch", "", http.StatusBadRequest},
	} {
		ct, body := multipartBody(t, tc.purpose, tc.content)
		if resp := batchDo(t, g, http.MethodPost, "/v1/files", secret, ct, body); resp.StatusCode != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, resp.StatusCode, tc.want)
		}
	}
	// Refused uploads leave nothing behind.
	ents, _ := os.ReadDir(filepath.Join(dir, "files"))
	if len(ents) != 1 {
		t.Errorf("files dir holds %d entries, want the one accepted upload", len(ents))
	}
	if resp := batchDo(t, g, http.MethodPost, "/v1/batches", secret, "application/json",
		strings.NewReader(`{"input_file_id":"file-x","endpoint":"/v1/embeddings","completion_window":"24h"}`)); resp.StatusCode != http.StatusBadRequest {
		t.Errorf("unsupported endpoint: %d, want 400", resp.StatusCode)
	}

	// Without a files directory the Batch API says it is off.
	off := startBatchGateway(t, t.TempDir(), fleet, batchOpts{disabled: true})
	offSecret := key(off, "acme")
	ct, body := multipartBody(t, "batch", "x")
	if resp := batchDo(t, off, http.MethodPost, "/v1/files", offSecret, ct, body); resp.StatusCode != http.StatusNotImplemented {
		t.Errorf("upload with the Batch API off: %d, want 501", resp.StatusCode)
	}
	if resp := batchDo(t, off, http.MethodGet, "/v1/batches", offSecret, "", nil); resp.StatusCode != http.StatusNotImplemented {
		t.Errorf("list with the Batch API off: %d, want 501", resp.StatusCode)
	}
}

func TestBatchRateLimitedLinesWaitAndRetry(t *testing.T) {
	fleet := newSimFleet(t, 2, sim.Config{Model: servertest.SimModel})
	g := startBatchGateway(t, t.TempDir(), fleet, batchOpts{})
	// 60 requests per minute: the first 60 lines pass at once, then one
	// more every second.
	secret, _, err := policy.CreateKey(context.Background(), g.Store, policy.KeyOptions{Tenant: "acme", RPM: 60})
	if err != nil {
		t.Fatal(err)
	}
	c := g.Client(secret)
	// Six past the burst: the first 60 would have to take over 6 s for no
	// line to meet the limit (with 2 past it, a loaded machine sometimes
	// refilled the bucket in time and the test proved nothing).
	const n = 66
	b := createBatch(t, c, uploadBatchFile(t, c, chatLines(n)).ID, openai.BatchNewParamsEndpointV1ChatCompletions)
	b = waitBatch(t, c, b.ID, statusIs(openai.BatchStatusCompleted, openai.BatchStatusFailed))
	if b.Status != openai.BatchStatusCompleted || b.RequestCounts.Completed != n || b.RequestCounts.Failed != 0 {
		t.Fatalf("batch = %s", b.RawJSON())
	}
	out := fileResults(t, c, b.OutputFileID)
	rejected := 0
	for _, r := range g.LedgerRows() {
		if r.Status == http.StatusTooManyRequests {
			rejected++
		}
	}
	if rejected == 0 {
		t.Error("no line was rate limited; the test proves nothing")
	}
	t.Logf("%d admissions refused with 429 and retried", rejected)
	checkMeteredOnce(t, g, out)
}

func TestBatchRevokedKeyStopsNewLines(t *testing.T) {
	fleet := newSimFleet(t, 2, slowSim)
	g := startBatchGateway(t, t.TempDir(), fleet, batchOpts{})
	ctx := context.Background()
	owner, k, err := policy.CreateKey(ctx, g.Store, policy.KeyOptions{Tenant: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	c := g.Client(owner)
	const n = 40
	b := createBatch(t, c, uploadBatchFile(t, c, chatLines(n)).ID, openai.BatchNewParamsEndpointV1ChatCompletions)
	waitBatch(t, c, b.ID, func(b *openai.Batch) bool { return b.RequestCounts.Completed >= 2 })
	if _, err := policy.RevokeKey(ctx, g.Store, k.ID); err != nil {
		t.Fatal(err)
	}
	// The batch belongs to the tenant: another of its keys follows it.
	c2 := g.Client(key(g, "acme"))
	done := waitBatch(t, c2, b.ID, statusIs(openai.BatchStatusCompleted, openai.BatchStatusFailed))
	if done.Status != openai.BatchStatusCompleted || done.RequestCounts.Completed >= n ||
		done.RequestCounts.Completed+done.RequestCounts.Failed != n {
		t.Fatalf("batch = %s", done.RawJSON())
	}
	errs := fileResults(t, c2, done.ErrorFileID)
	for _, r := range errs {
		if r.Error == nil || r.Error.Code != "api_key_revoked" {
			t.Errorf("error line %s: %+v, want api_key_revoked", r.customID(), r.Error)
		}
	}
	if int64(len(errs)) != done.RequestCounts.Failed {
		t.Errorf("%d error lines, %d failed", len(errs), done.RequestCounts.Failed)
	}
	checkMeteredOnce(t, g, fileResults(t, c2, done.OutputFileID))
}

// TestBatchHedgingReport runs a 200-line batch on a stall-prone fleet of
// three replicas (3 % of requests stall 10×) once with hedging off and once
// on, and logs the batch's completion time, the hedges fired and the line
// latencies. It checks metering (every line billed exactly once), never
// timing. TAILGATE_BATCH_ROUNDS=N repeats the pair N times.
func TestBatchHedgingReport(t *testing.T) {
	if testing.Short() {
		t.Skip("runs two 200-line batches")
	}
	rounds := 1
	if v, err := strconv.Atoi(os.Getenv("TAILGATE_BATCH_ROUNDS")); err == nil && v > 0 {
		rounds = v
	}
	fleetCfg := sim.Config{Model: servertest.SimModel, TTFT: 50 * time.Millisecond, TPOT: 2 * time.Millisecond, StallProb: 0.03, StallFactor: 10}
	const lines, warm = 200, 60
	type figures struct {
		took          time.Duration
		hedged        int
		overhead      int64
		p50, p99, max time.Duration
	}
	runs := map[bool][]figures{}
	for round := range rounds {
		for _, hedge := range []bool{false, true} {
			fleet := newSimFleet(t, 3, fleetCfg)
			g := startBatchGateway(t, t.TempDir(), fleet, batchOpts{router: router.Config{Hedge: router.HedgeConfig{Enabled: hedge}}})
			secret := key(g, "acme")
			// Warm up: the hedge delay needs recent samples of the model.
			var wg sync.WaitGroup
			for i := range warm {
				wg.Go(func() {
					body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"warm %d"}],"max_tokens":16}`, servertest.SimModel, i)
					resp := batchDo(t, g, http.MethodPost, "/v1/chat/completions", secret, "application/json", strings.NewReader(body))
					if resp.StatusCode != http.StatusOK {
						t.Errorf("warm-up request: %d", resp.StatusCode)
					}
				})
				if i%8 == 7 {
					wg.Wait()
				}
			}
			wg.Wait()

			c := g.Client(secret)
			var in strings.Builder
			for i := range lines {
				in.WriteString(strings.Replace(chatLine(fmt.Sprintf("line-%03d", i), fmt.Sprintf("Tell me about %d.", i)),
					`"max_tokens":16`, `"max_tokens":16,"ignore_eos":true`, 1) + "\n")
			}
			b := createBatch(t, c, uploadBatchFile(t, c, in.String()).ID, openai.BatchNewParamsEndpointV1ChatCompletions)
			b = waitBatch(t, c, b.ID, statusIs(openai.BatchStatusCompleted, openai.BatchStatusFailed))
			if b.Status != openai.BatchStatusCompleted || b.RequestCounts.Completed != lines {
				t.Fatalf("hedge=%v: batch = %s", hedge, b.RawJSON())
			}
			row := batchRow(t, g, b.ID)
			out := fileResults(t, c, b.OutputFileID)
			ids := map[string]int{}
			for _, r := range out {
				ids[r.Response.RequestID]++
			}
			f := figures{took: row.FinalizingAt.Sub(row.InProgressAt)}
			var lat []time.Duration
			all := g.LedgerRows()
			for _, r := range all {
				if _, ok := ids[r.ID]; !ok {
					continue
				}
				ids[r.ID]++
				lat = append(lat, r.Stages.Total)
				f.overhead += r.HedgeOverheadTokens
				if r.Hedged {
					f.hedged++
				}
			}
			for id, n := range ids {
				if n != 2 { // once in the output, once in the ledger
					t.Errorf("hedge=%v: request %s: %d output lines + ledger rows, want 1 + 1", hedge, id, n)
				}
			}
			if len(ids) != lines || len(all) != lines+warm {
				t.Errorf("hedge=%v: %d distinct lines, %d ledger rows; want %d and %d", hedge, len(ids), len(all), lines, lines+warm)
			}
			slices.Sort(lat)
			f.p50, f.p99, f.max = lat[len(lat)/2], lat[len(lat)*99/100], lat[len(lat)-1]
			runs[hedge] = append(runs[hedge], f)
			t.Logf("round %d hedge=%-5v: %d lines in %v; %d hedged (%d overhead tokens); line latency p50 %v p99 %v max %v",
				round+1, hedge, lines, f.took.Round(time.Millisecond), f.hedged, f.overhead,
				f.p50.Round(time.Millisecond), f.p99.Round(time.Millisecond), f.max.Round(time.Millisecond))
			g.Close()
		}
	}
	median := func(fs []figures, get func(figures) time.Duration) time.Duration {
		v := make([]time.Duration, len(fs))
		for i, f := range fs {
			v[i] = get(f)
		}
		slices.Sort(v)
		return v[len(v)/2]
	}
	off, on := median(runs[false], func(f figures) time.Duration { return f.took }), median(runs[true], func(f figures) time.Duration { return f.took })
	t.Logf("median over %d round(s): completion without hedging %v, with hedging %v (ratio %.2f); line p99 %v vs %v",
		rounds, off.Round(time.Millisecond), on.Round(time.Millisecond), float64(on)/float64(off),
		median(runs[false], func(f figures) time.Duration { return f.p99 }).Round(time.Millisecond),
		median(runs[true], func(f figures) time.Duration { return f.p99 }).Round(time.Millisecond))
}

func TestBatchExpiresAfterItsWindow(t *testing.T) {
	var skew atomic.Int64
	now := func() time.Time { return time.Now().Add(time.Duration(skew.Load())) }
	fleet := newSimFleet(t, 2, slowSim)
	g := startBatchGateway(t, t.TempDir(), fleet, batchOpts{batch: batch.Config{Now: now}})
	c := g.Client(key(g, "acme"))
	const n = 40
	b := createBatch(t, c, uploadBatchFile(t, c, chatLines(n)).ID, openai.BatchNewParamsEndpointV1ChatCompletions)
	waitBatch(t, c, b.ID, func(b *openai.Batch) bool { return b.RequestCounts.Completed >= 2 })
	skew.Store(int64(25 * time.Hour))
	done := waitBatch(t, c, b.ID, statusIs(openai.BatchStatusExpired, openai.BatchStatusCompleted))
	if done.Status != openai.BatchStatusExpired || done.ExpiredAt == 0 || done.RequestCounts.Completed >= n ||
		done.RequestCounts.Completed+done.RequestCounts.Failed != n {
		t.Fatalf("batch = %s", done.RawJSON())
	}
	errs := fileResults(t, c, done.ErrorFileID)
	for _, r := range errs {
		if r.Error == nil || r.Error.Code != "batch_expired" {
			t.Errorf("error line %s: %+v, want batch_expired", r.customID(), r.Error)
		}
	}
	out := fileResults(t, c, done.OutputFileID)
	if int64(len(out)) != done.RequestCounts.Completed || int64(len(errs)) != done.RequestCounts.Failed {
		t.Errorf("%d output and %d error lines for counts %+v", len(out), len(errs), done.RequestCounts)
	}
	checkMeteredOnce(t, g, out)
}

// TestBatchHostileLinesFailAlone: a line nested millions of levels deep
// (once a fatal stack overflow that a restart replayed forever) and a line
// whose body repeats "stream" (read as a stream by the engine, billed as
// JSON by the gateway) fail on their own; the batch completes, and the
// gateway serves and restarts on the same data.
func TestBatchHostileLinesFailAlone(t *testing.T) {
	fleet := newSimFleet(t, 1, sim.Config{Model: servertest.SimModel})
	dir := t.TempDir()
	// The deep line is 4 MB: past the default line limit, which would
	// refuse it at upload; let it through to the line checks it pins.
	opts := batchOpts{batch: batch.Config{MaxLineBytes: 8 << 20}}
	g := startBatchGateway(t, dir, fleet, opts)
	secret := key(g, "acme")
	c := g.Client(secret)
	deep := `{"custom_id":"deep","method":"POST","url":"/v1/chat/completions","body":{"model":"` + servertest.SimModel +
		`","messages":[{"role":"user","content":"hi"}],"x":` + strings.Repeat("[", 2_000_000) + strings.Repeat("]", 2_000_000) + `}}`
	dup := `{"custom_id":"dup","method":"POST","url":"/v1/chat/completions","body":{"model":"` + servertest.SimModel +
		`","stream":false,"messages":[{"role":"user","content":"hi"}],"stream":true}}`
	f := uploadBatchFile(t, c, strings.Join([]string{chatLine("good", "one"), deep, dup}, "\n")+"\n")
	b := createBatch(t, c, f.ID, openai.BatchNewParamsEndpointV1ChatCompletions)
	b = waitBatch(t, c, b.ID, statusIs(openai.BatchStatusCompleted, openai.BatchStatusFailed))
	if b.Status != openai.BatchStatusCompleted || b.RequestCounts.Completed != 1 || b.RequestCounts.Failed != 2 {
		t.Fatalf("batch = %s", b.RawJSON())
	}
	var msgs []string
	for _, r := range fileResults(t, c, b.ErrorFileID) {
		if r.Error == nil || r.Error.Code != "invalid_request" {
			t.Fatalf("error line %+v, want invalid_request", r)
		}
		msgs = append(msgs, r.Error.Message)
	}
	if j := strings.Join(msgs, "|"); !strings.Contains(j, "nested deeper") || !strings.Contains(j, `duplicate key "stream"`) {
		t.Fatalf("error messages %q", msgs)
	}
	g.Close()
	g = startBatchGateway(t, dir, fleet, opts) // the same data: a restart finds nothing to choke on
	c = g.Client(secret)
	if _, err := c.Chat.Completions.New(t.Context(), openai.ChatCompletionNewParams{
		Model: servertest.SimModel, Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("still up?")},
	}); err != nil {
		t.Fatal(err)
	}
}

// TestBatchLineRunningDuringTwoCrashesFailsAlone: a line that was running
// each of the two times the gateway died (its start noted, no result, no
// clean stop) is failed with a reason at the next start instead of run a
// third time; the other lines run.
func TestBatchLineRunningDuringTwoCrashesFailsAlone(t *testing.T) {
	fleet := newSimFleet(t, 1, sim.Config{Model: servertest.SimModel})
	dir := t.TempDir()
	g := startBatchGateway(t, dir, fleet, batchOpts{})
	g.StopBatches() // nothing runs until the "restart"
	c := g.Client(key(g, "acme"))
	f := uploadBatchFile(t, c, chatLines(3))
	b := createBatch(t, c, f.ID, openai.BatchNewParamsEndpointV1ChatCompletions)
	for range 2 { // two runs of line 0 that a crash ended
		if _, err := g.Store.StartBatchLine(t.Context(), b.ID, 0); err != nil {
			t.Fatal(err)
		}
	}
	g.Close()
	g = startBatchGateway(t, dir, fleet, batchOpts{})
	c = g.Client(key(g, "acme"))
	final := completedRow(t, g, b.ID)
	if final.Status != data.BatchCompleted || final.Completed != 2 || final.Failed != 1 {
		t.Fatalf("batch %+v, want 2 completed and line 1 failed", final)
	}
	errs := fileResults(t, c, final.ErrorFileID)
	if len(errs) != 1 || errs[0].Error == nil || errs[0].Error.Code != "line_interrupted" || errs[0].customID() != "req-000" {
		t.Fatalf("error file %+v, want line 1 (req-000) failed as line_interrupted", errs)
	}
}

// A batch starts when it is created, not at the executor's next look for
// work: with the poll an hour apart, batches created one after another each
// complete (each is created after the executor has settled into waiting).
func TestBatchStartsWhenCreated(t *testing.T) {
	fleet := newSimFleet(t, 1, sim.Config{Model: servertest.SimModel})
	g := startBatchGateway(t, t.TempDir(), fleet, batchOpts{batch: batch.Config{PollInterval: time.Hour}})
	c := g.Client(key(g, "acme"))
	for i := range 2 {
		f := uploadBatchFile(t, c, chatLine(fmt.Sprintf("doc-%d", i), "One line that should run at once."))
		created := createBatch(t, c, f.ID, openai.BatchNewParamsEndpointV1ChatCompletions)
		deadline := time.Now().Add(30 * time.Second) // far below the hour the poll would take
		for {
			b, err := c.Batches.Get(context.Background(), created.ID)
			if err != nil {
				t.Fatalf("get batch: %v", err)
			}
			if b.Status == openai.BatchStatusCompleted && b.RequestCounts.Completed == 1 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("batch %d still %s with %+v 30s after it was created: the executor waits for its poll", i, b.Status, b.RequestCounts)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// TestBatchLineBilledButLostIsNotBilledTwice: the gateway died after a
// line's answer was billed and before its result was stored (its start
// noted, an ok ledger row under the line's request id prefix, no result).
// The line runs again after the restart — its answer is in the output —
// but the tenant is not billed for it a second time: that run's tokens are
// overhead. Before, the tenant paid twice.
func TestBatchLineBilledButLostIsNotBilledTwice(t *testing.T) {
	fleet := newSimFleet(t, 1, sim.Config{Model: servertest.SimModel})
	dir := t.TempDir()
	g := startBatchGateway(t, dir, fleet, batchOpts{})
	g.StopBatches() // nothing runs until the "restart"
	c := g.Client(key(g, "acme"))
	f := uploadBatchFile(t, c, chatLines(2))
	b := createBatch(t, c, f.ID, openai.BatchNewParamsEndpointV1ChatCompletions)
	row := batchRow(t, g, b.ID)
	if _, err := g.Store.StartBatchLine(t.Context(), b.ID, 0); err != nil {
		t.Fatal(err)
	}
	lost := data.LedgerRow{ID: fmt.Sprintf("req_%s_l0_req_lost", b.ID), TenantID: row.TenantID, KeyID: row.KeyID,
		Model: servertest.SimModel, PromptTokens: 10, CompletionTokens: 20, Status: 200, Outcome: data.OutcomeOK,
		Attempts: 1, Stages: data.UnknownStages()}
	if err := g.Store.InsertLedger(t.Context(), []data.LedgerRow{lost}); err != nil {
		t.Fatal(err)
	}
	g.Close()
	g = startBatchGateway(t, dir, fleet, batchOpts{})
	c = g.Client(key(g, "acme"))
	final := completedRow(t, g, b.ID)
	if final.Status != data.BatchCompleted || final.Completed != 2 {
		t.Fatalf("batch %+v, want both lines completed", final)
	}
	var billed, overhead int64
	prefix := fmt.Sprintf("req_%s_l0_", b.ID)
	for _, r := range g.LedgerRows() {
		if strings.HasPrefix(r.ID, prefix) && r.ID != lost.ID && r.Outcome == data.OutcomeOK {
			billed += r.PromptTokens + r.CompletionTokens
			overhead += r.HedgeOverheadTokens
		}
	}
	if billed != 0 || overhead == 0 {
		t.Errorf("line 0's second run billed %d tokens (overhead %d); want nothing billed, its tokens as overhead", billed, overhead)
		for _, r := range g.LedgerRows() {
			t.Logf("row %s %s billed %d overhead %d", r.ID, r.Outcome, r.PromptTokens+r.CompletionTokens, r.HedgeOverheadTokens)
		}
	}
}

// TestBatchWaitsForWorkersToRegisterAfterAStart: a gateway that restarts
// finds an unfinished batch before the workers serving its model have
// registered again. Its lines wait for them instead of failing with 404
// model_not_found.
func TestBatchWaitsForWorkersToRegisterAfterAStart(t *testing.T) {
	others := newSimFleet(t, 1, sim.Config{Model: "another-model"}) // no replica of the batch's model
	late := newSimFleet(t, 1, sim.Config{Model: servertest.SimModel})
	dir := t.TempDir()
	g := startBatchGateway(t, dir, others, batchOpts{})
	g.StopBatches() // nothing runs until the restart
	c := g.Client(key(g, "acme"))
	f := uploadBatchFile(t, c, chatLines(3))
	b := createBatch(t, c, f.ID, openai.BatchNewParamsEndpointV1ChatCompletions)
	g.Close()
	g = startBatchGateway(t, dir, others, batchOpts{})
	// The lines have been tried (and refused) before the worker comes.
	for deadline := time.Now().Add(10 * time.Second); ; {
		if rows := g.LedgerRows(); len(rows) >= 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the batch's lines were never tried")
		}
		time.Sleep(20 * time.Millisecond)
	}
	g.AddReplica("late", late[0].Server.URL, servertest.SimModel)
	final := completedRow(t, g, b.ID)
	if final.Status != data.BatchCompleted || final.Completed != 3 || final.Failed != 0 {
		t.Fatalf("batch %+v, want its 3 lines completed once the worker registered", final)
	}
}
