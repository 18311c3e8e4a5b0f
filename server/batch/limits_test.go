package batch_test

import (
	"bufio"
	"context"
	"errors"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"

	"tailgate/server/internal/servertest"
	"tailgate/serving/sim"
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
// the per-file cap, and nothing is kept. The figures (Go heap, allocations,
// peak RSS, bytes on disk) are logged: go test -run ManyTinyLines -v.
func TestBatchManyTinyLinesStayCheap(t *testing.T) {
	if testing.Short() {
		t.Skip("uploads a file of two million lines")
	}
	fleet := newSimFleet(t, 1, sim.Config{Model: servertest.SimModel})
	dir := t.TempDir()
	g := startBatchGateway(t, dir, fleet, batchOpts{})
	c := g.Client(key(g, "acme"))
	var in strings.Builder
	in.WriteString(chatLine("good", "hi") + "\n")
	for range 2_000_000 - 1 {
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
	t.Logf("%d-byte file of 2,000,000 lines: %s in %v; Go heap peak +%d MiB, allocated %d MiB in %d allocations; "+
		"process peak RSS %s; disk +%d MiB",
		len(content), status, time.Since(start).Round(time.Millisecond), (int64(peak)-int64(before.HeapInuse))>>20,
		(after.TotalAlloc-before.TotalAlloc)>>20, after.Mallocs-before.Mallocs, peakRSS(), (dirBytes(dir)-diskBefore)>>20)

	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusBadRequest ||
		!strings.Contains(apiErr.Message, "line 50001") || !strings.Contains(apiErr.Message, "50000") {
		t.Fatalf("upload of 2,000,000 lines: %v; want 400 naming line 50001 and the 50000 limit", err)
	}
	if ents, _ := os.ReadDir(filepath.Join(dir, "files")); len(ents) != 0 {
		t.Errorf("the refused upload left %d entries in the files directory", len(ents))
	}
	// The body was streamed: the gateway never held the file, let alone a
	// struct per line (the 6 MB the test itself holds is in the figure).
	if grew := int64(peak) - int64(before.HeapInuse); grew > 48<<20 {
		t.Errorf("the Go heap grew by %d MiB while refusing a 6 MB upload", grew>>20)
	}
}
