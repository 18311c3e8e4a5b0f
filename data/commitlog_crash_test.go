package data

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/data/commitlog"
)

// What a crash, a power loss or damage leaves of a commit-log file, and
// what the next start makes of it: the rows a real SQLite ledger bills.

// crashRows returns n final rows of tenant, of varied sizes.
func crashRows(tenant int64, n int) []LedgerRow {
	rows := make([]LedgerRow, n)
	for i := range rows {
		rows[i] = LedgerRow{ID: fmt.Sprintf("req_%03d", i), Time: time.Unix(1_800_000_000+int64(i), 0).UTC(), TenantID: tenant,
			Model: "m", PromptTokens: int64(10 + i), CompletionTokens: int64(i % 7), CostMicros: int64(100 + i),
			Status: 200, Outcome: OutcomeOK, Stages: UnknownStages()}
		for a := range i % 3 {
			rows[i].AttemptLog = append(rows[i].AttemptLog, Attempt{N: a + 1, Replica: strings.Repeat("r", 1+i), Outcome: AttemptWon})
		}
	}
	return rows
}

// logBytes returns rows as a commit-log file of the current format, and
// where each record ends.
func logBytes(rows []LedgerRow) ([]byte, []int) {
	var b []byte
	var ends []int
	for i := range rows {
		b = commitlog.AppendRecord(b, appendRecord(nil, &rows[i]))
		ends = append(ends, len(b))
	}
	return b, ends
}

// legacyBytes returns rows as a commit-log file of the format before
// version 1: length and CRC-32 (IEEE), little-endian, then the JSON row.
func legacyBytes(rows []LedgerRow) []byte {
	var b []byte
	for i := range rows {
		rec := appendRecord(nil, &rows[i])
		b = binary.LittleEndian.AppendUint32(b, uint32(len(rec)))
		b = binary.LittleEndian.AppendUint32(b, crc32.ChecksumIEEE(rec))
		b = append(b, rec...)
	}
	return b
}

func writeLog(t testing.TB, name string, b []byte) {
	t.Helper()
	if err := os.WriteFile(name, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// recoverAt opens the store at path and its commit log (a gateway's start)
// with its log lines in logs, and returns the rows recovered and the error.
func recoverAt(t testing.TB, path string, logs *bytes.Buffer) (*Store, int, error) {
	t.Helper()
	s, w, n, err := recoverWriter(t, path, logs)
	_ = w
	return s, n, err
}

// recoverWriter is recoverAt, and returns the writer too.
func recoverWriter(t testing.TB, path string, logs *bytes.Buffer) (*Store, *LedgerWriter, int, error) {
	t.Helper()
	s := openAt(t, path)
	var log *slog.Logger
	if logs != nil {
		log = slog.New(slog.NewTextHandler(logs, nil))
	}
	w := s.NewLedgerWriter(LedgerConfig{}, log)
	n, err := w.OpenCommitLog(context.Background())
	t.Cleanup(func() { w.Close() })
	return s, w, n, err
}

// checkBilled checks that s's ledger holds exactly rows, each once, and
// that their tenant's spend counts each once.
func checkBilled(t testing.TB, s *Store, rows []LedgerRow, what string) {
	t.Helper()
	ctx := context.Background()
	got, err := s.LedgerRows(ctx, UsageFilter{})
	if err != nil {
		t.Fatal(err)
	}
	var ids, want []string
	var tokens, micros int64
	for _, r := range got {
		ids = append(ids, r.ID)
	}
	for _, r := range rows {
		want = append(want, r.ID)
		tokens += r.PromptTokens + r.CompletionTokens
		micros += r.CostMicros
	}
	slices.Sort(ids)
	if !slices.Equal(ids, want) {
		t.Fatalf("%s: ledger holds %v, want %v", what, ids, want)
	}
	spend, err := s.TenantSpend(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var sp Spend
	if len(rows) > 0 {
		sp = spend[rows[0].TenantID]
	}
	if sp.Tokens != tokens || sp.Micros != micros {
		t.Fatalf("%s: tenant spend %+v, want %d tokens and %d micros (each row billed once)", what, sp, tokens, micros)
	}
}

func newLedgerDir(t testing.TB) (path string, tenant int64) {
	t.Helper()
	path = filepath.Join(t.TempDir(), "tailgate.db")
	tn, err := openAt(t, path).EnsureTenant(context.Background(), "acme")
	if err != nil {
		t.Fatal(err)
	}
	return path, tn.ID
}

// TestZeroFilledTailIsTheEndOfTheLog: after a power loss ext4 and XFS may
// leave a file's last blocks as zeros. The start recovers every record
// before them, cuts the zeros off, says so at INFO, and removes the file;
// and the next start is a plain one.
func TestZeroFilledTailIsTheEndOfTheLog(t *testing.T) {
	for _, tc := range []struct {
		name string
		// zeroFrom is where the zeros start, relative to the end of the
		// records (negative: inside the last one).
		zeroFrom, zeros, kept int
	}{
		{"zeros after the last record", 0, 8192, 10},
		{"zeros over half the last record", -20, 4096, 9},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path, tenant := newLedgerDir(t)
			rows := crashRows(tenant, 10)
			b, _ := logBytes(rows)
			cut := len(b) + tc.zeroFrom
			b = append(b[:cut], make([]byte, tc.zeros)...)
			name := path + "-commits-1"
			writeLog(t, name, b)

			var logs bytes.Buffer
			s, w, n, err := recoverWriter(t, path, &logs)
			if err != nil {
				t.Fatalf("start after a zero-filled tail: %v", err)
			}
			if n != tc.kept {
				t.Errorf("recovered %d rows, want %d", n, tc.kept)
			}
			checkBilled(t, s, rows[:tc.kept], "after the start")
			if want := fmt.Sprintf("bytes_dropped=%d", len(b)-len(logBytesOf(rows[:tc.kept]))); !strings.Contains(logs.String(), want) || !strings.Contains(logs.String(), "level=INFO") {
				t.Errorf("log %q does not say at INFO that the tail was cut (%s)", logs.String(), want)
			}
			if _, err := os.Stat(name); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("the recovered file is still there: %v", err)
			}
			w.Close()
			if _, n, err := recoverAt(t, path, nil); err != nil || n != 0 {
				t.Errorf("the next start: %d rows recovered, %v; want a plain start", n, err)
			}
		})
	}
}

func logBytesOf(rows []LedgerRow) []byte {
	b, _ := logBytes(rows)
	return b
}

// TestTornRecordIsTheEndOfTheLog: the process died in the middle of an
// append (its Commit never returned): the records before it are recovered,
// the torn one is not, and the start goes on.
func TestTornRecordIsTheEndOfTheLog(t *testing.T) {
	path, tenant := newLedgerDir(t)
	rows := crashRows(tenant, 10)
	b, ends := logBytes(rows)
	torn := ends[8] + (ends[9]-ends[8])/2
	writeLog(t, path+"-commits-3", b[:torn])

	var logs bytes.Buffer
	s, n, err := recoverAt(t, path, &logs)
	if err != nil {
		t.Fatalf("start after a torn record: %v", err)
	}
	if n != 9 {
		t.Errorf("recovered %d rows, want the 9 before the torn one", n)
	}
	checkBilled(t, s, rows[:9], "after the start")
	if want := fmt.Sprintf("bytes_dropped=%d", torn-ends[8]); !strings.Contains(logs.String(), want) {
		t.Errorf("log %q does not say %s", logs.String(), want)
	}
	if left, _ := filepath.Glob(path + "-commits-3"); len(left) != 0 {
		t.Errorf("the recovered file is still there")
	}
}

// TestCorruptMiddleRecordStopsStart: one damaged byte in a record that good
// records follow is not what a crash leaves. The start stops with an error
// that names the file, the offset and what to do; no row of the file is
// billed and the file is kept as it was — never a silent skip of the rows
// after the damage. Moved out of the way, the start goes on.
func TestCorruptMiddleRecordStopsStart(t *testing.T) {
	for _, tc := range []struct {
		name   string
		file   func(rows []LedgerRow) []byte
		damage int // record whose byte is flipped
	}{
		{"current format, payload byte", func(rows []LedgerRow) []byte { return logBytesOf(rows) }, 3},
		{"current format, first record's magic", func(rows []LedgerRow) []byte { return logBytesOf(rows) }, 0},
		{"format before version 1", legacyBytes, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path, tenant := newLedgerDir(t)
			rows := crashRows(tenant, 10)
			b := tc.file(rows)
			// Where record tc.damage starts: the lengths of the records before.
			off := len(tc.file(rows[:tc.damage]))
			flip := off + 1
			if tc.name != "current format, first record's magic" {
				flip = off + 14
			}
			b[flip] ^= 0x40
			name := path + "-commits-2"
			writeLog(t, name, b)

			s, n, err := recoverAt(t, path, nil)
			if err == nil {
				t.Fatalf("start over a damaged commit log succeeded (%d rows recovered)", n)
			}
			ce, ok := errors.AsType[*commitlog.CorruptError](err)
			if !ok {
				t.Fatalf("error %v is no *commitlog.CorruptError", err)
			}
			msg := err.Error()
			for _, want := range []string{name, fmt.Sprintf("byte %d", off), "move it out of the data directory"} {
				if !strings.Contains(msg, want) {
					t.Errorf("error %q does not say %q", msg, want)
				}
			}
			if ce.Offset != off {
				t.Errorf("offset %d, want %d", ce.Offset, off)
			}
			checkBilled(t, s, nil, "after the refused start")
			if got, err := os.ReadFile(name); err != nil || !bytes.Equal(got, b) {
				t.Errorf("the damaged file was changed or removed (%v)", err)
			}
			// Again: the same answer, not "locked" (the failed start let go).
			if _, _, err := recoverAt(t, path, nil); !errors.As(err, &ce) {
				t.Errorf("second start: %v, want the same damage reported", err)
			}
			if err := os.Rename(name, filepath.Join(t.TempDir(), "kept")); err != nil {
				t.Fatal(err)
			}
			if _, _, err := recoverAt(t, path, nil); err != nil {
				t.Errorf("start with the file moved away: %v", err)
			}
		})
	}
}

// TestOldFormatCommitLogIsRecoveredOnce: a file the previous version left
// (no magic; its own zero-filled tail) is recovered, then removed.
func TestOldFormatCommitLogIsRecoveredOnce(t *testing.T) {
	path, tenant := newLedgerDir(t)
	rows := crashRows(tenant, 12)
	name := path + "-commits-7"
	writeLog(t, name, append(legacyBytes(rows), make([]byte, 4096)...))
	s, w, n, err := recoverWriter(t, path, nil)
	if err != nil || n != 12 {
		t.Fatalf("recovery of an old-format file: %d rows, %v; want 12", n, err)
	}
	checkBilled(t, s, rows, "after the start")
	if _, err := os.Stat(name); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the old-format file is still there: %v", err)
	}
	w.Close()
	if _, n, err := recoverAt(t, path, nil); err != nil || n != 0 {
		t.Errorf("the next start: %d rows, %v; want a plain start", n, err)
	}
}

// TestCrashAtAnyOffsetBillsEveryRowBeforeItOnce cuts a commit log at many
// offsets (every record boundary and a few bytes either side, and random
// ones), and zero-fills a copy from there to the end of its block, and
// starts on a fresh copy of a real ledger each time: every row whose record
// is whole before the cut is billed exactly once and nothing after it. The
// rows are in both files (as after a start that died between the insert and
// the removal), which must bill nothing twice and count nothing twice.
func TestCrashAtAnyOffsetBillsEveryRowBeforeItOnce(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	tmpl := filepath.Join(dir, "template.db")
	st := openAt(t, filepath.Join(t.TempDir(), "src.db"))
	tn, err := st.EnsureTenant(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Backup(ctx, tmpl); err != nil {
		t.Fatal(err)
	}
	empty, err := os.ReadFile(tmpl)
	if err != nil {
		t.Fatal(err)
	}
	rows := crashRows(tn.ID, 12)
	b, ends := logBytes(rows)

	offsets := map[int]bool{}
	for _, e := range append([]int{0}, ends...) {
		// Boundaries, a byte short of one, one byte into the next header,
		// and a length half written.
		for _, d := range []int{-1, 0, 1, 6} {
			if o := e + d; o >= 0 && o <= len(b) {
				offsets[o] = true
			}
		}
	}
	rnd := rand.New(rand.NewPCG(1, 2))
	for range 8 {
		offsets[rnd.IntN(len(b)+1)] = true
	}
	sorted := slices.Sorted(func(yield func(int) bool) {
		for o := range offsets {
			if !yield(o) {
				return
			}
		}
	})
	if len(sorted) > 80 {
		t.Fatalf("%d offsets: keep the test bounded", len(sorted))
	}

	for i, o := range sorted {
		whole := 0
		for whole < len(ends) && ends[whole] <= o {
			whole++
		}
		// The same log cut at o, and zero-filled from o to the end of its
		// block: each alone recovers the rows before o; together they must
		// bill and count them once.
		cut := b[:o]
		zeroed := append(slices.Clone(cut), make([]byte, (len(b)+4095)/4096*4096-o)...)
		path := filepath.Join(dir, strconv.Itoa(i), "tailgate.db")
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			t.Fatal(err)
		}
		writeLog(t, path, empty)
		writeLog(t, path+"-commits-1", cut)
		writeLog(t, path+"-commits-2", zeroed)
		what := fmt.Sprintf("cut at byte %d of %d, and zero-filled from there", o, len(b))
		s, w, n, err := recoverWriter(t, path, nil)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if n != whole {
			t.Errorf("%s: %d rows recovered, want %d", what, n, whole)
		}
		checkBilled(t, s, rows[:whole], what)
		w.Close()
		s.Close()
	}
}
