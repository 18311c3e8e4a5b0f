package commitlog

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"path/filepath"
	"testing"
)

func fileOf(payloads ...string) []byte {
	var b []byte
	for _, p := range payloads {
		b = AppendRecord(b, []byte(p))
	}
	return b
}

func legacyOf(payloads ...string) []byte {
	var b []byte
	for _, p := range payloads {
		b = binary.LittleEndian.AppendUint32(b, uint32(len(p)))
		b = binary.LittleEndian.AppendUint32(b, crc32.ChecksumIEEE([]byte(p)))
		b = append(b, p...)
	}
	return b
}

// FuzzCommitLogDecode: whatever a file holds, Decode does not panic, and
// what it returns checks out: the records it gives back are exactly the
// bytes before End, each with its CRC (re-encoding them gives those bytes
// again), and a CorruptError points at a record that checks out.
func FuzzCommitLogDecode(f *testing.F) {
	rows := []string{`{"ID":"a"}`, `{"ID":"b","AttemptLog":[{"N":1}]}`, `{}`}
	v1 := fileOf(rows...)
	old := legacyOf(rows...)
	f.Add([]byte{})
	f.Add(v1)
	f.Add(old)
	f.Add(append(bytes.Clone(v1), make([]byte, 64)...))
	f.Add(append(bytes.Clone(old), make([]byte, 64)...))
	f.Add(v1[:len(v1)-3])
	damaged := bytes.Clone(v1)
	damaged[15] ^= 1
	f.Add(damaged)
	f.Add(append(legacyOf(rows[0]), fileOf(rows[1])...))
	f.Fuzz(func(t *testing.T, b []byte) {
		file, err := Decode(b)
		if ce, ok := errors.AsType[*CorruptError](err); ok {
			if ce.Offset >= ce.Next || ce.Next >= len(b) {
				t.Fatalf("corrupt at %d, good record at %d, in %d bytes", ce.Offset, ce.Next, len(b))
			}
			rest, err := Decode(b[ce.Next:])
			if ce2, ok := errors.AsType[*CorruptError](err); !(len(rest.Payloads) > 0 || ok && ce2.Good > 0) {
				t.Fatalf("no record checks out at %d, where the error says a good one starts", ce.Next)
			}
			return
		}
		if err != nil {
			t.Fatalf("Decode: %v, want nil or a *CorruptError", err)
		}
		if file.End > len(b) {
			t.Fatalf("End %d past %d bytes", file.End, len(b))
		}
		var again []byte
		for _, p := range file.Payloads {
			if file.Legacy {
				again = append(again, legacyOf(string(p))...)
			} else {
				again = AppendRecord(again, p)
			}
		}
		if !bytes.Equal(again, b[:file.End]) {
			t.Fatalf("the %d records returned re-encode to %x, not to the %d bytes before End %x", len(file.Payloads), again, file.End, b[:file.End])
		}
	})
}

// Decode's answers for what a crash leaves, what damage leaves and the old
// format.
func TestDecode(t *testing.T) {
	v1 := fileOf("{1}", "{22}", "{333}")
	second := len(fileOf("{1}"))
	flipped := bytes.Clone(v1)
	flipped[second+13] ^= 0x20
	for _, tc := range []struct {
		name     string
		b        []byte
		payloads []string
		end      int
		legacy   bool
		corrupt  int // offset of the damage; -1 none
	}{
		{"whole", v1, []string{"{1}", "{22}", "{333}"}, len(v1), false, -1},
		{"empty", nil, nil, 0, false, -1},
		{"torn header", v1[:second+5], []string{"{1}"}, second, false, -1},
		{"torn payload", v1[:len(v1)-1], []string{"{1}", "{22}"}, len(fileOf("{1}", "{22}")), false, -1},
		{"zero tail", append(bytes.Clone(v1), make([]byte, 4096)...), []string{"{1}", "{22}", "{333}"}, len(v1), false, -1},
		{"all zeros", make([]byte, 4096), nil, 0, true, -1},
		{"damaged middle", flipped, nil, 0, false, second},
		{"legacy", legacyOf("{1}", "{22}"), []string{"{1}", "{22}"}, len(legacyOf("{1}", "{22}")), true, -1},
		{"legacy zero tail", append(legacyOf("{1}"), make([]byte, 100)...), []string{"{1}"}, len(legacyOf("{1}")), true, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := Decode(tc.b)
			if tc.corrupt >= 0 {
				ce, ok := errors.AsType[*CorruptError](err)
				if !ok || ce.Offset != tc.corrupt {
					t.Fatalf("Decode: %v, want damage at %d", err, tc.corrupt)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := []string{}
			for _, p := range f.Payloads {
				got = append(got, string(p))
			}
			if fmt.Sprint(got) != fmt.Sprint(append([]string{}, tc.payloads...)) || f.End != tc.end || f.Legacy != tc.legacy {
				t.Errorf("Decode = %q end %d legacy %t, want %q end %d legacy %t", got, f.End, f.Legacy, tc.payloads, tc.end, tc.legacy)
			}
		})
	}
}

// TestHoldKeepsOpenOut: while Hold's lock is held (a restore in progress),
// the log cannot be opened (no gateway starts on the database), and the
// other way round.
func TestHoldKeepsOpenOut(t *testing.T) {
	base := filepath.Join(t.TempDir(), "db-commits")
	release, err := Hold(base)
	if err != nil {
		t.Fatal(err)
	}
	none := func(string, [][]byte) error { return nil }
	if _, err := Open(base, Config{}, none); !errors.Is(err, ErrLocked) {
		t.Fatalf("Open under Hold: %v, want ErrLocked", err)
	}
	release()
	l, err := Open(base, Config{}, none)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Hold(base); !errors.Is(err, ErrLocked) {
		t.Errorf("Hold under an open log: %v, want ErrLocked", err)
	}
	l.Close()
	l.Close()
}
