package commitlog

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/tailgate-dev/tailgate/e2e/testkit"
)

func openLog(t testing.TB) (*Log, string) {
	t.Helper()
	base := filepath.Join(t.TempDir(), "db-commits")
	l, err := Open(base, Config{}, func(string, [][]byte) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	return l, base
}

// openLogMapped opens a log whose files are mapped (mapped; skipped where
// the file system of the test's directory cannot) or written with write(2).
func openLogMapped(t testing.TB, mapped bool) (*Log, string) {
	t.Helper()
	l, base := openLog(t)
	if mapped && !l.mapOK {
		t.Skipf("%s: files on this file system are not mapped", base)
	}
	l.mapOK = mapped
	l.direct.Store(mapped)
	return l, base
}

// bothPaths runs test with mapped files and with write(2).
func bothPaths(t *testing.T, test func(t *testing.T, mapped bool)) {
	t.Run("mapped", func(t *testing.T) { test(t, true) })
	t.Run("write", func(t *testing.T) { test(t, false) })
}

// readAll decodes every record in the log's files at base, oldest first.
func readAll(t testing.TB, base string) []string {
	t.Helper()
	payloads, err := Peek(base)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, p := range payloads {
		out = append(out, string(p))
	}
	return out
}

// Appends that come while a write is under way go out together in the
// next one, and each returns only once its record is in the file.
func TestConcurrentAppendsShareOneWrite(t *testing.T) {
	const callers = 32
	l, base := openLogMapped(t, false)
	// The first Append's write waits on the file's lock (as on a slow
	// disk); every other Append queues behind it meanwhile.
	l.mu.Lock()
	var wg sync.WaitGroup
	appendOne := func(i int) {
		defer wg.Done()
		p := fmt.Sprintf("record-%02d", i)
		if _, err := l.Append([]byte(p)); err != nil {
			t.Errorf("Append %s: %v", p, err)
			return
		}
		if !slices.Contains(readAll(t, base), p) {
			t.Errorf("Append %s returned before its record was in the file", p)
		}
	}
	wg.Add(1)
	go appendOne(0)
	testkit.WaitFor(t, "the first Append writing", func() bool {
		l.qmu.Lock()
		defer l.qmu.Unlock()
		return l.writing
	})
	for i := 1; i < callers; i++ {
		wg.Add(1)
		go appendOne(i)
	}
	testkit.WaitFor(t, "every other Append queued", func() bool {
		l.qmu.Lock()
		defer l.qmu.Unlock()
		return l.next != nil && l.next.n == callers-1
	})
	l.mu.Unlock()
	wg.Wait()
	if n := l.Writes(); n != 2 {
		t.Errorf("%d Appends made %d writes, want 2 (the first alone, then all others together)", callers, n)
	}
	got := readAll(t, base)
	if len(got) != callers || got[0] != "record-00" {
		t.Errorf("the file holds %d records starting %q, want %d starting with the first Append's", len(got), got, callers)
	}
}

// With mapped files, concurrent Appends take turns copying their records
// in: each returns only once its record is in the file (a reader sees
// it), every record is there once, and no system call was made a record.
func TestConcurrentMappedAppendsEachReturnOnceInTheFile(t *testing.T) {
	const callers, each = 16, 200
	l, base := openLogMapped(t, true)
	l.cfg.Rotate = 64 << 10 // several files
	var wg sync.WaitGroup
	for c := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				p := fmt.Sprintf("record-%02d-%03d-%s", c, i, strings.Repeat("p", i))
				if _, err := l.Append([]byte(p)); err != nil {
					t.Errorf("Append %s: %v", p, err)
					return
				}
				if i == each-1 && !slices.Contains(readAll(t, base), p) {
					t.Errorf("Append %s returned before its record was in the file", p)
				}
			}
		}()
	}
	wg.Wait()
	got := readAll(t, base)
	if len(got) != callers*each || len(slices.Compact(slices.Sorted(slices.Values(got)))) != callers*each {
		t.Errorf("the files hold %d records (%d distinct), want each of the %d once", len(got), len(slices.Compact(slices.Sorted(slices.Values(got)))), callers*each)
	}
	if n := l.Syscalls(); n > callers*each/20 {
		t.Errorf("%d Appends made %d system calls, want only those that start, fault in and end files", callers*each, n)
	}
}

// A group whose write fails fails every Append in it, and leaves nothing
// of its records in the file; the next Appends go on. (Where files are
// mapped, a copy cannot fail: TestRefusedPreallocationFailsTheAppends.)
func TestFailedGroupWriteFailsEveryAppendInIt(t *testing.T) {
	l, base := openLogMapped(t, false)
	if _, err := l.Append([]byte("before")); err != nil {
		t.Fatal(err)
	}
	// A file opened read-only makes the next write fail.
	l.mu.Lock()
	good := l.f
	ro, err := os.Open(good.Name())
	if err != nil {
		t.Fatal(err)
	}
	l.f = ro
	l.mu.Unlock()
	const callers = 8
	errs := make(chan error, callers)
	for i := range callers {
		go func() {
			_, err := l.Append(fmt.Appendf(nil, "lost-%d", i))
			errs <- err
		}()
	}
	for range callers {
		if err := <-errs; err == nil {
			t.Error("an Append whose write failed returned nil")
		}
	}
	l.mu.Lock()
	l.f = good
	l.mu.Unlock()
	ro.Close()
	if _, err := l.Append([]byte("after")); err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, base); !slices.Equal(got, []string{"before", "after"}) {
		t.Errorf("records in the file: %q, want [before after]", got)
	}
}

// BenchmarkAppendParallel measures the writes (groups) and system calls per record with
// many concurrent Appends (a gateway answering at a high rate: every JSON
// answer and stream end appends its ledger row):
//
//	go test ./data/commitlog -run '^$' -bench AppendParallel -cpu 2 -benchtime 20000x
func BenchmarkAppendParallel(b *testing.B) {
	for _, par := range []int{1, 16, 64} {
		b.Run(fmt.Sprintf("parallelism=%d", par), func(b *testing.B) {
			l, _ := openLog(b)
			payload := make([]byte, 600) // a ledger row's JSON
			for i := range payload {
				payload[i] = 'a' + byte(i%26)
			}
			b.SetParallelism(par)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := l.Append(payload); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64(l.Writes())/float64(b.N), "writes/op")
			b.ReportMetric(float64(l.Syscalls())/float64(b.N), "syscalls/op")
		})
	}
}
