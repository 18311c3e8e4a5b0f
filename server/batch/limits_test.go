package batch_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"

	"github.com/tailgate-dev/tailgate/server/batch"
	"github.com/tailgate-dev/tailgate/server/internal/servertest"
	"github.com/tailgate-dev/tailgate/serving/sim"
)

// peakRSS is the process's peak resident set size (VmHWM), "" where
// /proc is not there.
func peakRSS() string {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// dirBytes is the size of every file under dir.
func dirBytes(dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			if fi, err := d.Info(); err == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	return n
}

// heapPeak samples the Go heap in use until stop is called and returns the
// highest sample.
func heapPeak() (stop func() uint64) {
	var peak atomic.Uint64
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(5 * time.Millisecond)
		defer t.Stop()
		for {
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			if ms.HeapInuse > peak.Load() {
				peak.Store(ms.HeapInuse)
			}
			select {
			case <-done:
				return
			case <-t.C:
			}
		}
	})
	return func() uint64 { close(done); wg.Wait(); return peak.Load() }
}

// TestBatchManyTinyLinesStayCheap uploads a 6 MB file of two million tiny
// lines (one good request, then "{}" lines) and, if the gateway takes it,
// runs it as a batch. Once that took the gateway to ~2 GB RSS and wrote
// ~780 MB: every line became a struct in memory, a row in SQLite and a line
// of the error file. Now the upload is refused, streaming, at the line past
// the per-file cap, and nothing is kept. Then it runs the worst file the
// gateway accepts: 50,000 such lines. The figures (Go heap, allocations,
// peak RSS, bytes on disk) are logged: go test -run ManyTinyLines -v.
func TestBatchManyTinyLinesStayCheap(t *testing.T) {
	if testing.Short() {
		t.Skip("uploads a file of two million lines")
	}
	fleet := newSimFleet(t, 1, sim.Config{Model: servertest.SimModel})
	dir := t.TempDir()
	g := startBatchGateway(t, dir, fleet, batchOpts{})
	c := g.Client(key(g, "acme"))

	f, status, err := measureTinyLines(t, c, dir, 2_000_000)
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusBadRequest ||
		!strings.Contains(apiErr.Message, "line 50001") || !strings.Contains(apiErr.Message, "50000") {
		t.Fatalf("upload of 2,000,000 lines: %v (%s); want 400 naming line 50001 and the 50000 limit", err, status)
	}
	if ents, _ := os.ReadDir(filepath.Join(dir, "files")); len(ents) != 0 {
		t.Errorf("the refused upload left %d entries in the files directory", len(ents))
	}

	if raceEnabled {
		t.Log("the file of 50,000 lines takes minutes under the race detector: measured without it only")
		return
	}
	f, status, err = measureTinyLines(t, c, dir, 50_000)
	if err != nil || status != "batch completed" {
		t.Fatalf("50,000 lines: %v, %s; want a completed batch", err, status)
	}
	// Once finished, a batch's lines live in its result files only:
	// deleting them and the input frees the disk they took.
	b, _ := c.Batches.List(context.Background(), openai.BatchListParams{})
	for _, id := range []string{f.ID, b.Data[0].OutputFileID, b.Data[0].ErrorFileID} {
		if _, err := c.Files.Delete(context.Background(), id); err != nil {
			t.Fatal(err)
		}
	}
	if ents, _ := os.ReadDir(filepath.Join(dir, "files")); len(ents) != 0 {
		t.Errorf("%d entries left in the files directory after deleting every file", len(ents))
	}
}

// measureTinyLines uploads a file of one good request and lines-1 "{}"
// lines and, if it is taken, runs it as a batch, and logs what that cost.
// The Go heap figures include the test's client (the file, twice).
func measureTinyLines(t *testing.T, c openai.Client, dir string, lines int) (*openai.FileObject, string, error) {
	t.Helper()
	var in strings.Builder
	in.WriteString(chatLine("good", "hi") + "\n")
	for range lines - 1 {
		in.WriteString("{}\n")
	}
	content := in.String()
	diskBefore := dirBytes(dir)

	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	stopPeak := heapPeak()
	start := time.Now()
	f, err := c.Files.New(context.Background(), openai.FileNewParams{
		File: openai.File(strings.NewReader(content), "tiny.jsonl", "application/jsonl"), Purpose: openai.FilePurposeBatch,
	})
	status := "refused"
	if err == nil {
		b := createBatch(t, c, f.ID, openai.BatchNewParamsEndpointV1ChatCompletions)
		// Slow work (two million rows) before the change: wait longer than
		// waitBatch does.
		for deadline := time.Now().Add(15 * time.Minute); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			if b, err = c.Batches.Get(context.Background(), b.ID); err != nil {
				t.Fatal(err)
			}
			if b.Status == openai.BatchStatusCompleted || b.Status == openai.BatchStatusFailed {
				break
			}
		}
		status = "batch " + string(b.Status)
	}
	peak := stopPeak()
	runtime.ReadMemStats(&after)
	t.Logf("%d-byte file of %d lines: %s in %v; Go heap peak +%d MiB, allocated %d MiB in %d allocations; "+
		"process peak RSS %s; disk +%d MiB",
		len(content), lines, status, time.Since(start).Round(time.Millisecond), (int64(peak)-int64(before.HeapInuse))>>20,
		(after.TotalAlloc-before.TotalAlloc)>>20, after.Mallocs-before.Mallocs, peakRSS(), (dirBytes(dir)-diskBefore)>>20)
	// The body was streamed: the gateway never held the file, let alone a
	// struct per line.
	if grew := int64(peak) - int64(before.HeapInuse); grew > 64<<20 {
		t.Errorf("%d lines: the Go heap grew by %d MiB", lines, grew>>20)
	}
	return f, status, err
}

// apiError returns err as the SDK's API error, failing the test if it is
// not one of status.
func apiError(t *testing.T, err error, status int) *openai.Error {
	t.Helper()
	var ae *openai.Error
	if !errors.As(err, &ae) || ae.StatusCode != status {
		t.Fatalf("err = %v, want an API error %d", err, status)
	}
	return ae
}

func upload(c openai.Client, content string, opts ...func(*openai.FileNewParams)) (*openai.FileObject, error) {
	p := openai.FileNewParams{File: openai.File(strings.NewReader(content), "in.jsonl", "application/jsonl"), Purpose: openai.FilePurposeBatch}
	for _, o := range opts {
		o(&p)
	}
	return c.Files.New(context.Background(), p)
}

// filesDirEntries lists the files directory (bodies and temporary files).
func filesDirEntries(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(dir, "files"))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

func TestBatchUploadLineLimits(t *testing.T) {
	fleet := newSimFleet(t, 1, sim.Config{Model: servertest.SimModel})
	dir := t.TempDir()
	g := startBatchGateway(t, dir, fleet, batchOpts{batch: batch.Config{MaxFileLines: 3, MaxLineBytes: 200}})
	c := g.Client(key(g, "acme"))
	line := func(id string) string { return chatLine(id, "hi") } // well under 200 bytes
	// pad returns a request line of exactly n bytes.
	pad := func(n int) string {
		l := line("pad")
		return strings.Replace(l, `"hi"`, `"hi`+strings.Repeat(" ", n-len(l))+`"`, 1)
	}
	for _, tc := range []struct {
		name, content                 string
		wantLine, wantCode, wantLimit string // "" = accepted
	}{
		{"at the line limit, blank lines do not count", line("a") + "\n\n" + line("b") + "\n  \n" + line("c") + "\n\n", "", "", ""},
		{"one request too many", line("a") + "\n\n" + line("b") + "\n" + line("c") + "\n\n" + line("d") + "\n", "line 6", "too_many_lines", "3 requests"},
		{"a line at the byte limit", pad(200) + "\n" + pad(200), "", "", ""},
		{"a line one byte too long", line("a") + "\n" + pad(201) + "\n", "line 2", "line_too_long", "200 bytes"},
		{"a long last line without a newline", line("a") + "\n" + pad(201), "line 2", "line_too_long", "200 bytes"},
	} {
		_, err := upload(c, tc.content)
		if tc.wantLine == "" {
			if err != nil {
				t.Errorf("%s: %v", tc.name, err)
			}
			continue
		}
		ae := apiError(t, err, http.StatusBadRequest)
		if ae.Code != tc.wantCode || ae.Param != "file" || !strings.Contains(ae.Message, tc.wantLine) || !strings.Contains(ae.Message, tc.wantLimit) {
			t.Errorf("%s: %d %s %q; want %s naming %q and %q", tc.name, ae.StatusCode, ae.Code, ae.Message, tc.wantCode, tc.wantLine, tc.wantLimit)
		}
	}
	if names := filesDirEntries(t, dir); len(names) != 2 {
		t.Errorf("files directory holds %v; want the two accepted uploads only", names)
	}
}

// TestBatchValidationAppliesTheLimitsToStoredFiles: a file stored under
// looser limits (an older gateway) fails its batch with the limit it
// breaks, instead of being read whole.
func TestBatchValidationAppliesTheLimitsToStoredFiles(t *testing.T) {
	fleet := newSimFleet(t, 1, sim.Config{Model: servertest.SimModel})
	dir := t.TempDir()
	g := startBatchGateway(t, dir, fleet, batchOpts{})
	secret := key(g, "acme")
	f := uploadBatchFile(t, g.Client(secret), chatLines(3))
	g.Close()
	g = startBatchGateway(t, dir, fleet, batchOpts{batch: batch.Config{MaxFileLines: 2}})
	c := g.Client(secret)
	b := createBatch(t, c, f.ID, openai.BatchNewParamsEndpointV1ChatCompletions)
	b = waitBatch(t, c, b.ID, statusIs(openai.BatchStatusFailed, openai.BatchStatusCompleted))
	if b.Status != openai.BatchStatusFailed || len(b.Errors.Data) != 1 || b.Errors.Data[0].Code != "too_many_lines" || b.Errors.Data[0].Line != 3 {
		t.Fatalf("batch = %s", b.RawJSON())
	}
	if rows := g.LedgerRows(); len(rows) != 0 {
		t.Errorf("%d lines ran", len(rows))
	}
}

// TestBatchLoweredLimitsLetRunningBatchesFinish: a batch past validation
// passed the limits once; a gateway restarted with lower ones finishes it.
func TestBatchLoweredLimitsLetRunningBatchesFinish(t *testing.T) {
	fleet := newSimFleet(t, 2, slowSim)
	dir := t.TempDir()
	g := startBatchGateway(t, dir, fleet, batchOpts{})
	secret := key(g, "acme")
	c := g.Client(secret)
	b := createBatch(t, c, uploadBatchFile(t, c, chatLines(6)).ID, openai.BatchNewParamsEndpointV1ChatCompletions)
	waitBatch(t, c, b.ID, func(b *openai.Batch) bool { return b.RequestCounts.Completed >= 1 })
	g.Close()
	g = startBatchGateway(t, dir, fleet, batchOpts{batch: batch.Config{MaxFileLines: 2, MaxLineBytes: 100}})
	c = g.Client(secret)
	b = waitBatch(t, c, b.ID, statusIs(openai.BatchStatusCompleted, openai.BatchStatusFailed))
	if b.Status != openai.BatchStatusCompleted || b.RequestCounts.Completed != 6 {
		t.Fatalf("batch = %s", b.RawJSON())
	}
}

func TestBatchStorageQuotaPerTenant(t *testing.T) {
	fleet := newSimFleet(t, 1, sim.Config{Model: servertest.SimModel})
	dir := t.TempDir()
	g := startBatchGateway(t, dir, fleet, batchOpts{batch: batch.Config{TenantStorageBytes: 1000}})
	c := g.Client(key(g, "acme"))
	ctx := context.Background()
	blob := func(n int) string { return strings.Repeat("x", n-1) + "\n" }

	first, err := upload(c, blob(600))
	if err != nil {
		t.Fatal(err)
	}
	// Found while streaming: more than the 400 bytes left.
	ae := apiError(t, func() error { _, err := upload(c, blob(401)); return err }(), http.StatusBadRequest)
	if ae.Code != "storage_quota_exceeded" || !strings.Contains(ae.Message, "600 of 1000 bytes") {
		t.Errorf("over quota: %s %q; want storage_quota_exceeded saying 600 of 1000 bytes", ae.Code, ae.Message)
	}
	if _, err := upload(c, blob(400)); err != nil {
		t.Fatalf("exactly filling the quota: %v", err)
	}
	// Full: refused before the body is read.
	ae = apiError(t, func() error { _, err := upload(c, blob(1)); return err }(), http.StatusBadRequest)
	if ae.Code != "storage_quota_exceeded" || !strings.Contains(ae.Message, "1000 of 1000 bytes") {
		t.Errorf("full quota: %s %q", ae.Code, ae.Message)
	}
	// Another tenant has its own.
	if _, err := upload(g.Client(key(g, "globex")), blob(1000)); err != nil {
		t.Errorf("another tenant: %v", err)
	}
	// Deleting frees it.
	if _, err := c.Files.Delete(ctx, first.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := upload(c, blob(600)); err != nil {
		t.Errorf("after a delete: %v", err)
	}
	if names := filesDirEntries(t, dir); len(names) != 3 {
		t.Errorf("files directory holds %v, want the three stored files", names)
	}
}

func TestBatchDeleteFile(t *testing.T) {
	fleet := newSimFleet(t, 2, slowSim)
	dir := t.TempDir()
	g := startBatchGateway(t, dir, fleet, batchOpts{})
	secret := key(g, "acme")
	c := g.Client(secret)
	ctx := context.Background()
	f := uploadBatchFile(t, c, chatLines(8))
	b := createBatch(t, c, f.ID, openai.BatchNewParamsEndpointV1ChatCompletions)
	waitBatch(t, c, b.ID, statusIs(openai.BatchStatusInProgress))

	// The batch still reads its input.
	_, err := c.Files.Delete(ctx, f.ID)
	ae := apiError(t, err, http.StatusConflict)
	if ae.Code != "file_in_use" || !strings.Contains(ae.Message, b.ID) {
		t.Errorf("delete of a running batch's input: %s %q; want file_in_use naming %s", ae.Code, ae.Message, b.ID)
	}
	// Another tenant sees no such file.
	resp := batchDo(t, g, http.MethodDelete, "/v1/files/"+f.ID, key(g, "globex"), "", nil)
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("delete by another tenant: %d, want 404", resp.StatusCode)
	}

	b = waitBatch(t, c, b.ID, statusIs(openai.BatchStatusCompleted))
	resp = g.Do(http.MethodDelete, "/v1/files/"+f.ID, secret, "", nil)
	var raw map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&raw); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || fmt.Sprint(raw) != fmt.Sprint(map[string]any{"id": f.ID, "object": "file", "deleted": true}) {
		t.Errorf("delete = %d %v", resp.StatusCode, raw)
	}
	if _, err := c.Files.Get(ctx, f.ID); err == nil {
		t.Error("a deleted file is still there")
	} else {
		apiError(t, err, http.StatusNotFound)
	}
	if _, err := c.Files.Delete(ctx, f.ID); err == nil {
		t.Error("a second delete succeeded")
	} else {
		apiError(t, err, http.StatusNotFound)
	}
	// The batch keeps its results; its output file goes the same way.
	if d, err := c.Files.Delete(ctx, b.OutputFileID); err != nil || !d.Deleted || d.ID != b.OutputFileID {
		t.Errorf("delete of the output file = %+v, %v", d, err)
	}
	if _, err := c.Files.Content(ctx, b.OutputFileID); err == nil {
		t.Error("a deleted output file still has content")
	}
	if names := filesDirEntries(t, dir); len(names) != 0 {
		t.Errorf("files directory holds %v after deleting every file", names)
	}
	if used, err := g.Store.TenantFileBytes(ctx, batchRow(t, g, b.ID).TenantID); err != nil || used != 0 {
		t.Errorf("tenant's files use %d bytes (%v) after deleting them all", used, err)
	}
}

func TestBatchFilesExpire(t *testing.T) {
	var skew atomic.Int64
	now := func() time.Time { return time.Now().Add(time.Duration(skew.Load())) }
	fleet := newSimFleet(t, 2, slowSim)
	dir := t.TempDir()
	g := startBatchGateway(t, dir, fleet, batchOpts{batch: batch.Config{Now: now}})
	secret := key(g, "acme")
	c := g.Client(secret)
	ctx := context.Background()
	hour := func(p *openai.FileNewParams) {
		p.ExpiresAfter = openai.FileNewParamsExpiresAfter{Seconds: 3600}
	}

	month, err := upload(c, chatLines(1))
	if err != nil {
		t.Fatal(err)
	}
	if month.ExpiresAt != month.CreatedAt+30*86400 {
		t.Errorf("default expiry: created %d, expires %d; want 30 days later", month.CreatedAt, month.ExpiresAt)
	}
	short, err := upload(c, chatLines(1), hour)
	if err != nil {
		t.Fatal(err)
	}
	if short.ExpiresAt != short.CreatedAt+3600 {
		t.Errorf("expires_after 3600: created %d, expires %d", short.CreatedAt, short.ExpiresAt)
	}
	_, err = upload(c, chatLines(1), func(p *openai.FileNewParams) { p.ExpiresAfter = openai.FileNewParamsExpiresAfter{Seconds: 60} })
	if ae := apiError(t, err, http.StatusBadRequest); ae.Param != "expires_after.seconds" {
		t.Errorf("expires_after of 60s: param %q", ae.Param)
	}
	// A batch whose input expires while it runs keeps it until it ends.
	running, err := upload(c, chatLines(6), hour)
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.Batches.New(ctx, openai.BatchNewParams{InputFileID: running.ID, Endpoint: openai.BatchNewParamsEndpointV1ChatCompletions,
		CompletionWindow:   openai.BatchNewParamsCompletionWindow24h,
		OutputExpiresAfter: openai.BatchNewParamsOutputExpiresAfter{Seconds: 2 * 3600}})
	if err != nil {
		t.Fatal(err)
	}
	waitBatch(t, c, b.ID, statusIs(openai.BatchStatusInProgress))

	skew.Store(int64(90 * time.Minute))
	waitGone := func(id string) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); slices.Contains(filesDirEntries(t, dir), id); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("expired file %s is still on disk", id)
			}
		}
	}
	waitGone(short.ID)
	for _, path := range []string{"/v1/files/" + short.ID, "/v1/files/" + short.ID + "/content", "/v1/files/" + running.ID} {
		if resp := batchDo(t, g, http.MethodGet, path, secret, "", nil); resp.StatusCode != http.StatusNotFound {
			t.Errorf("GET %s after expiry: %d, want 404", path, resp.StatusCode)
		}
	}
	page, err := c.Files.List(ctx, openai.FileListParams{})
	if err != nil || len(page.Data) != 1 || page.Data[0].ID != month.ID {
		t.Errorf("files listed after expiry: %+v, %v; want only %s", page.Data, err, month.ID)
	}
	if !slices.Contains(filesDirEntries(t, dir), running.ID) {
		t.Fatal("the input of a running batch was removed")
	}
	_, err = c.Batches.New(ctx, openai.BatchNewParams{InputFileID: short.ID, Endpoint: openai.BatchNewParamsEndpointV1ChatCompletions,
		CompletionWindow: openai.BatchNewParamsCompletionWindow24h})
	apiError(t, err, http.StatusNotFound)

	b = waitBatch(t, c, b.ID, statusIs(openai.BatchStatusCompleted))
	waitGone(running.ID) // once the batch is done
	out, err := c.Files.Get(ctx, b.OutputFileID)
	if err != nil || out.ExpiresAt != out.CreatedAt+2*3600 {
		t.Fatalf("output file = %+v, %v; want it to expire 2 hours after its creation", out, err)
	}
	skew.Store(int64(90*time.Minute + 2*time.Hour))
	waitGone(b.OutputFileID)
	skew.Store(int64(31 * 24 * time.Hour))
	waitGone(month.ID)
	if names := filesDirEntries(t, dir); len(names) != 0 {
		t.Errorf("files directory holds %v once every file expired", names)
	}
}

// trickle sends a request whose body starts with head and then comes one
// space per gap (white space a JSON reader skips, waiting for more), as a
// client that holds a handler with a slow body, and
// returns the status line and body of the answer (the connection is
// closed after it, or after 10s with no answer).
func trickle(t *testing.T, g *servertest.Gateway, path, secret, ctype, head string, gap time.Duration) string {
	t.Helper()
	conn, err := net.Dial("tcp", g.Public.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n%s",
		path, secret, ctype, 1<<20, head)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	defer wg.Wait()
	defer close(stop)
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(gap):
			}
			if _, err := conn.Write([]byte(" ")); err != nil {
				return
			}
		}
	})
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return "no answer: " + err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.Status + " " + string(body)
}

// pacedReader yields its content chunk bytes at a time, one chunk per gap.
type pacedReader struct {
	r     io.Reader
	chunk int
	gap   time.Duration
}

func (p *pacedReader) Read(b []byte) (int, error) {
	time.Sleep(p.gap)
	return p.r.Read(b[:min(len(b), p.chunk)])
}

func TestBatchSlowBodiesGet408(t *testing.T) {
	fleet := newSimFleet(t, 1, sim.Config{Model: servertest.SimModel})
	dir := t.TempDir()
	g := startBatchGateway(t, dir, fleet, batchOpts{batch: batch.Config{BodyTimeout: 300 * time.Millisecond, UploadMinRate: 1000}})
	secret := key(g, "acme")
	c := g.Client(secret)

	got := trickle(t, g, "/v1/batches", secret, "application/json", `{"input_file_id":"file-x",`, 50*time.Millisecond)
	if !strings.HasPrefix(got, "408 ") || !strings.Contains(got, `"request_timeout"`) {
		t.Errorf("POST /v1/batches with a trickling body: %q, want 408 request_timeout", got)
	}
	// An upload that trickles (20 bytes a second, a byte every 50ms: never
	// idle, far below the minimum rate) is cut once it falls behind.
	head := "--B\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n" +
		"--B\r\nContent-Disposition: form-data; name=\"file\"; filename=\"in.jsonl\"\r\n\r\n" + chatLines(1)
	got = trickle(t, g, "/v1/files", secret, "multipart/form-data; boundary=B", head, 50*time.Millisecond)
	if !strings.HasPrefix(got, "408 ") || !strings.Contains(got, `"request_timeout"`) {
		t.Errorf("POST /v1/files with a trickling body: %q, want 408 request_timeout", got)
	}
	if names := filesDirEntries(t, dir); len(names) != 0 {
		t.Errorf("the cut upload left %v", names)
	}

	// An upload slower than BodyTimeout in all but above the minimum rate
	// (2,000 bytes a second, for about 1.5s) is taken.
	ct, body := multipartBody(t, "batch", strings.Repeat(chatLine("a", "steady")+"\n", 20)[:3000])
	req, err := http.NewRequest(http.MethodPost, g.Public.URL+"/v1/files", &pacedReader{r: body, chunk: 200, gap: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	req.ContentLength = int64(body.Len())
	req.Header.Set("Authorization", "Bearer "+secret)
	req.Header.Set("Content-Type", ct)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("a steady upload at twice the minimum rate: %d, want 200", resp.StatusCode)
	}
	// The gateway still serves.
	if _, err := upload(c, chatLines(1)); err != nil {
		t.Errorf("after slow clients: %v", err)
	}
}
