package commitlog

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
)

// crashChild, when set to a log's base, makes the test binary a gateway
// that dies: it appends crashRecords records and SIGKILLs itself, with
// its file mapped and its preallocated space after the last record.
const crashChild = "COMMITLOG_CRASH_CHILD"

// crashTorn, when set too, makes it die in the middle of copying one more
// record: its payload's first half is in the file, its header is not.
const crashTorn = "COMMITLOG_CRASH_TORN"

const crashRecords = 500

// crashPayload is the i-th record the child appends: JSON of varied sizes.
func crashPayload(i int) []byte {
	return fmt.Appendf(nil, `{"id":"req_%d","pad":%q}`, i, strings.Repeat("x", 50+i%400))
}

func init() {
	base := os.Getenv(crashChild)
	if base == "" {
		return
	}
	fail := func(err error) {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	// Files of 64 KiB: the records take several, and the child dies in the
	// middle of the last.
	l, err := Open(base, Config{Rotate: 64 << 10}, func(string, [][]byte) error { return nil })
	if err != nil {
		fail(err)
	}
	if !l.mapOK {
		fail(errors.New("files not mapped"))
	}
	for i := range crashRecords {
		if _, err := l.Append(crashPayload(i)); err != nil {
			fail(err)
		}
	}
	if os.Getenv(crashTorn) != "" {
		rec := AppendRecord(nil, crashPayload(crashRecords))
		l.mu.Lock()
		copy(l.m[l.size+headerSize:], rec[headerSize:headerSize+(len(rec)-headerSize)/2])
	}
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {}
}

// TestKilledMidFileRecoversEveryRecord: a process killed with its file
// mapped and half used leaves every record whose Append returned in the
// page cache, and the next Open hands back each of them, in order, with no
// damage reported: the preallocated space after the last record is zeros,
// cut off and logged as such (not as a torn record). A record the death
// cut in the middle of its copy is cut off too, and said to be.
func TestKilledMidFileRecoversEveryRecord(t *testing.T) {
	for _, torn := range []bool{false, true} {
		t.Run(fmt.Sprintf("torn=%t", torn), func(t *testing.T) {
			base := filepath.Join(t.TempDir(), "db-commits")
			if l, _ := openLogMapped(t, true); l == nil {
				return
			}
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), crashChild+"="+base)
			if torn {
				cmd.Env = append(cmd.Env, crashTorn+"=1")
			}
			out, err := cmd.CombinedOutput()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
				t.Fatalf("child: %v (want killed): %s", err, out)
			}
			files, _ := filepath.Glob(base + "-*")
			if len(files) < 2 {
				t.Fatalf("the child left files %v, want several (its records fill more than one)", files)
			}

			var logs bytes.Buffer
			var got [][]byte
			var applied []string
			l, err := Open(base, Config{Rotate: 64 << 10, Logger: slog.New(slog.NewTextHandler(&logs, nil))},
				func(file string, payloads [][]byte) error {
					applied = append(applied, file)
					got = append(got, payloads...)
					return nil
				})
			if err != nil {
				t.Fatalf("Open after the kill: %v (want every record back, no damage)", err)
			}
			defer l.Close()
			if len(got) != crashRecords {
				t.Fatalf("recovered %d records from %v, want the %d whose Append returned", len(got), applied, crashRecords)
			}
			for i, p := range got {
				if !bytes.Equal(p, crashPayload(i)) {
					t.Fatalf("record %d is %.40q, want %.40q", i, p, crashPayload(i))
				}
			}
			// Only the file being appended to has a tail: the others were
			// truncated to their records when the next was started.
			lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
			if len(lines) != 1 || !strings.Contains(lines[0], "level=INFO") || !strings.Contains(lines[0], applied[len(applied)-1]) {
				t.Fatalf("log:\n%s\nwant one INFO line, about the last file %s", logs.String(), applied[len(applied)-1])
			}
			line := lines[0]
			wantTorn := "torn_bytes=0 "
			if torn {
				// From where its header should be to the end of the half payload.
				wantTorn = fmt.Sprintf("torn_bytes=%d ", headerSize+(len(AppendRecord(nil, crashPayload(crashRecords)))-headerSize)/2)
			}
			if !strings.Contains(line, wantTorn) || strings.Contains(line, "zero_bytes=0 ") {
				t.Errorf("log line %q: want %s and the preallocated zeros counted apart", line, wantTorn)
			}
			if !torn && strings.Contains(line, "torn end") {
				t.Errorf("log line %q calls the unused preallocated space a torn end", line)
			}
			if left, _ := filepath.Glob(base + "-*"); len(left) != 1 {
				t.Errorf("files after recovery: %v, want only the new one", left)
			}
		})
	}
}

// TestRefusedPreallocationFailsTheAppends: when the file system refuses
// the space of a new file (a full disk; here the file-size limit,
// RLIMIT_FSIZE, which the kernel checks in the same fallocate), every
// Append that needed it fails and nothing of theirs is in the log; once
// space is back, the next Append succeeds without a restart.
func TestRefusedPreallocationFailsTheAppends(t *testing.T) {
	base := filepath.Join(t.TempDir(), "db-commits")
	l, err := Open(base, Config{Rotate: 64 << 10}, func(string, [][]byte) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if !l.mapOK {
		t.Skipf("%s: files on this file system are not mapped", base)
	}
	if _, err := l.Append([]byte("before")); err != nil {
		t.Fatal(err)
	}
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_FSIZE, &lim); err != nil {
		t.Fatal(err)
	}
	restore := func() {
		if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &lim); err != nil {
			t.Fatal(err)
		}
	}
	defer restore()
	if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &syscall.Rlimit{Cur: 16 << 10, Max: lim.Max}); err != nil {
		t.Fatal(err)
	}
	// Records too big for what is left of the first file: each needs a
	// new one, whose preallocation is refused.
	big := bytes.Repeat([]byte("b"), 64<<10-headerSize) // a record of 64 KiB
	const callers = 8
	errs := make(chan error, callers)
	for range callers {
		go func() {
			_, err := l.Append(big)
			errs <- err
		}()
	}
	for range callers {
		if err := <-errs; !errors.Is(err, syscall.EFBIG) {
			t.Errorf("Append needing a file the file system refused: %v, want EFBIG", err)
		}
	}
	restore()
	if _, err := l.Append([]byte("after")); err != nil {
		t.Fatalf("Append once space is back: %v", err)
	}
	if got := readAll(t, base); !slices.Equal(got, []string{"before", "after"}) {
		t.Errorf("records in the log: %.60q, want [before after]", got)
	}
}

// TestFilesLeftBehindEndWithTheirLastRecord: a file no longer appended to
// holds its records and nothing after them — a started file's
// predecessor, and the last one when Close leaves it (records not yet
// Written) — so the previous version's recovery reads it as it wrote it.
func TestFilesLeftBehindEndWithTheirLastRecord(t *testing.T) {
	bothPaths(t, func(t *testing.T, mapped bool) {
		l, base := openLogMapped(t, mapped)
		l.cfg.Rotate = 8 << 10
		var want []byte
		for i := range 200 {
			p := crashPayload(i)
			want = AppendRecord(want, p)
			if _, err := l.Append(p); err != nil {
				t.Fatal(err)
			}
		}
		l.Close()
		files, _ := filepath.Glob(base + "-*")
		if len(files) < 3 {
			t.Fatalf("files %v, want several", files)
		}
		var all []byte
		for _, name := range files {
			b, err := os.ReadFile(name)
			if err != nil {
				t.Fatal(err)
			}
			if f, err := Decode(b); err != nil || f.End != len(b) || len(b) > 8<<10 {
				t.Errorf("%s: %d bytes, records end at %d (%v); want no tail and at most 8 KiB", name, len(b), f.End, err)
			}
			all = append(all, b...)
		}
		if !bytes.Equal(all, want) {
			t.Errorf("the files hold %d bytes, not the %d of the records appended", len(all), len(want))
		}
	})
}

// TestTheNextChunkIsFaultedInAheadOfTheAppends: once the Appends come
// within half a chunk of what is faulted in, a goroutine faults the next
// chunk in, so the Append that crosses into it finds it ready instead of
// making the system call (about 0.3 ms on a VM) while others queue behind
// its lock.
func TestTheNextChunkIsFaultedInAheadOfTheAppends(t *testing.T) {
	l, err := Open(filepath.Join(t.TempDir(), "log"), Config{}, func(string, [][]byte) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if !l.mapOK {
		t.Skip("the temporary directory's file system is not mapped")
	}
	payload := bytes.Repeat([]byte("x"), 500)
	for l.size <= populateChunk/2 {
		if _, err := l.Append(payload); err != nil {
			t.Fatal(err)
		}
	}
	l.mu.Lock()
	a, populated := l.ahead, l.populated
	l.mu.Unlock()
	if a == nil || populated != populateChunk || a.to != 2*populateChunk {
		t.Fatalf("past half of the first chunk: fault-in ahead %v, faulted in %d; want the chunk [%d, %d) under way", a, populated, populateChunk, 2*populateChunk)
	}
	<-a.done
	before := l.Syscalls()
	for l.size <= populateChunk+headerSize+500 {
		if _, err := l.Append(payload); err != nil {
			t.Fatal(err)
		}
	}
	l.mu.Lock()
	populated = l.populated
	l.mu.Unlock()
	if populated != 2*populateChunk {
		t.Fatalf("faulted in %d after crossing into the second chunk, want %d", populated, 2*populateChunk)
	}
	if n := l.Syscalls() - before; n != 0 {
		t.Errorf("the Appends that crossed into the chunk faulted in ahead made %d system calls, want 0", n)
	}
}
