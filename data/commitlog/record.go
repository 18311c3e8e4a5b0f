package commitlog

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
)

// The record of format version 1 (see the package doc).
const (
	headerSize = 12
	version    = 1
	// MaxPayload is the largest payload a record may carry. A ledger row is
	// well under a kilobyte; the bound keeps a damaged length from reading
	// as a record that runs to the end of the file.
	MaxPayload = 1 << 24
)

// magic starts every record: "TGL" and the format version. The version byte
// (0x01) is a control character, which a JSON payload never holds
// unescaped, so a record's magic cannot appear inside another's payload.
var magic = [4]byte{'T', 'G', 'L', version}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// AppendRecord appends payload to b as one record: magic and version,
// length, CRC-32C of the eight bytes before it and the payload, payload.
func AppendRecord(b, payload []byte) []byte {
	start := len(b)
	b = append(b, magic[:]...)
	b = binary.BigEndian.AppendUint32(b, uint32(len(payload)))
	sum := crc32.Update(crc32.Checksum(b[start:start+8], castagnoli), castagnoli, payload)
	b = binary.BigEndian.AppendUint32(b, sum)
	return append(b, payload...)
}

// putHeader writes payload's record header to h: what AppendRecord puts
// before the payload.
func putHeader(h *[headerSize]byte, payload []byte) {
	copy(h[:4], magic[:])
	binary.BigEndian.PutUint32(h[4:], uint32(len(payload)))
	binary.BigEndian.PutUint32(h[8:], crc32.Update(crc32.Checksum(h[:8], castagnoli), castagnoli, payload))
}

// File is what Decode found in a log file's bytes.
type File struct {
	// Payloads are the payloads of the records that check out, in order,
	// up to the first one that does not. They alias the bytes decoded.
	Payloads [][]byte
	// End is where the records that check out end: the size of the file
	// without its torn tail (len of the bytes when there is none).
	End int
	// Legacy is set for a file of the format before version 1.
	Legacy bool
}

// CorruptError is Decode's answer when a record does not check out and a
// good one follows it: the file was damaged where it had been written
// whole, which a crash does not do (a crash tears the end of the file
// only). Nothing of such a file may be applied silently.
type CorruptError struct {
	File   string // the file's path; empty from Decode, set by Open
	Offset int    // where the record that does not check out starts
	Next   int    // where a good record starts after it
	Good   int    // records that check out before Offset
}

func (e *CorruptError) Error() string {
	name := e.File
	if name == "" {
		name = "file"
	}
	return fmt.Sprintf("commit log %s is damaged: the record at byte %d does not check out and a good one follows at byte %d, "+
		"which a crash does not leave; none of its rows were applied and the file is kept. "+
		"Restore it from a copy if you have one, or move it out of the data directory (keep it: it holds %d good rows before byte %d "+
		"and more after it, not yet billed) and start again without its rows",
		name, e.Offset, e.Next, e.Good, e.Offset)
}

// Decode reads the records of a log file's bytes b up to the first that
// does not check out. What follows it is a torn tail — a crash in the middle
// of an append, or the zeros or garbage a file system leaves after a power
// loss — unless a record that checks out starts somewhere after it: then
// Decode returns a *CorruptError. A file that does not start with a
// version-1 record's magic is read in the format before it (Legacy).
func Decode(b []byte) (File, error) {
	f := File{Legacy: len(b) >= len(magic) && [4]byte(b[:4]) != magic}
	if len(b) < len(magic) {
		// Too short to be either: a tail torn before a first record.
		f.Legacy = false
	}
	off := 0
	for {
		p, next, ok := decodeAt(b, off, f.Legacy)
		if !ok {
			break
		}
		f.Payloads = append(f.Payloads, p)
		off = next
	}
	f.End = off
	if off < len(b) {
		if next, ok := goodAfter(b, off); ok {
			return File{}, &CorruptError{Offset: off, Next: next, Good: len(f.Payloads)}
		}
	}
	return f, nil
}

// decodeAt decodes the record that starts at b[off:] and returns its
// payload and where the next one starts; ok is false if none that checks
// out starts there.
func decodeAt(b []byte, off int, legacy bool) (payload []byte, next int, ok bool) {
	if legacy {
		return decodeLegacyAt(b, off)
	}
	r := b[off:]
	if len(r) < headerSize || [4]byte(r[:4]) != magic {
		return nil, 0, false
	}
	n := binary.BigEndian.Uint32(r[4:])
	if n > MaxPayload || uint64(n) > uint64(len(r)-headerSize) {
		return nil, 0, false
	}
	p := r[headerSize : headerSize+int(n)]
	if crc32.Update(crc32.Checksum(r[:8], castagnoli), castagnoli, p) != binary.BigEndian.Uint32(r[8:]) {
		return nil, 0, false
	}
	return p, off + headerSize + int(n), true
}

// decodeLegacyAt decodes a record of the format before version 1: the
// payload's length and its CRC-32 (IEEE), 4 bytes each, little-endian, then
// the payload, a JSON object. An empty payload (what a zero-filled tail
// reads as: its CRC is 0) is no record.
func decodeLegacyAt(b []byte, off int) (payload []byte, next int, ok bool) {
	r := b[off:]
	if len(r) < 9 {
		return nil, 0, false
	}
	n := binary.LittleEndian.Uint32(r)
	if n == 0 || n > MaxPayload || uint64(n) > uint64(len(r)-8) || r[8] != '{' {
		return nil, 0, false
	}
	p := r[8 : 8+int(n)]
	if crc32.ChecksumIEEE(p) != binary.LittleEndian.Uint32(r[4:]) {
		return nil, 0, false
	}
	return p, off + 8 + int(n), true
}

// goodAfter returns where the first record of either format that checks
// out starts after b[off] (a damaged first record can make a version-1
// file look legacy, so both are looked for). A record of either format
// holds a byte that is not zero at or after its start (the magic; a
// legacy record's '{'), so none starts in the zeros at the end of b: the
// space preallocated after the last record is stepped over at once.
func goodAfter(b []byte, off int) (int, bool) {
	last := lastNonZero(b)
	for i := off + 1; i <= last; i++ {
		if _, _, ok := decodeAt(b, i, false); ok {
			return i, true
		}
		if _, _, ok := decodeLegacyAt(b, i); ok {
			return i, true
		}
	}
	return 0, false
}

// lastNonZero returns the index of b's last byte that is not zero, -1 if
// there is none.
func lastNonZero(b []byte) int {
	i := len(b)
	for i >= 8 && binary.NativeEndian.Uint64(b[i-8:]) == 0 {
		i -= 8
	}
	for i > 0 && b[i-1] == 0 {
		i--
	}
	return i - 1
}
