package data

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// commitLog makes a committed ledger row durable with one append to a file
// beside the SQLite database, instead of a wait for the SQLite transaction
// that carries it. The guarantee is the one a SQLite commit gives here (WAL,
// synchronous=NORMAL): the bytes are in the operating system's hands, so the
// row survives the gateway's death, not a power loss. The row is then
// written to SQLite like a row given to Add, with the next batch, and the
// log's file is removed once every row in it is in SQLite.
//
// Why: a one-row SQLite transaction is about ten write system calls (a WAL
// frame per page the row touches: the table, its indexes, the tenant's spend)
// and about 100 µs on the path of every JSON answer and stream end; one
// append is one write. And rows that need not wait batch up: the SQLite side
// writes many rows per transaction instead of one.
//
// Files: <db>-commits-<n>, appended to, a new one started past
// commitLogRotate bytes; <db>-commits.lock, locked (flock) by the one
// writer that owns them. A record is its length and CRC-32 (4 bytes each,
// little-endian), then the row as JSON. Rows found in the files when a
// writer takes the lock — a gateway that died — are written to SQLite
// before anything else (the ledger's upsert takes a row twice harmlessly:
// a final row is never overwritten), then the files are removed.
type commitLog struct {
	base     string
	lock     *os.File
	readOnly func() bool // the store refuses writes (Store.SetReadOnly)

	mu      sync.Mutex
	f       *os.File
	gen     uint64
	size    int64
	pending map[uint64]int // rows appended to file n and not yet in SQLite
	rotate  int64          // size past which a new file starts; commitLogRotate
	buf     []byte
}

// commitLogRotate is the size past which appends go to a new file, so that
// a file's rows all reach SQLite and it is removed while traffic goes on.
const commitLogRotate = 4 << 20

// errReadOnly is what appends fail with while the store is read-only.
var errReadOnly = errors.New("commit log: file system read-only")

// logged counts the rows of one commit-log file in a batch.
type logged struct {
	gen uint64
	n   int
}

func addLogged(ls []logged, gen uint64) []logged {
	for i := range ls {
		if ls[i].gen == gen {
			ls[i].n++
			return ls
		}
	}
	return append(ls, logged{gen: gen, n: 1})
}

// OpenCommitLog lets Commit return once its row is appended to a log file
// beside the database (see the README's "Ledger"), instead of waiting for the
// SQLite transaction. Rows a previous writer logged but had not written to
// SQLite (it died) are written first; OpenCommitLog returns how many. Call it
// before [Store.SettleOpen] (a logged final row settles its stream) and
// before Run. A PostgreSQL store has no commit log (its commits are a round
// trip, and a local file would be one gateway's only): OpenCommitLog does
// nothing. When another process holds the log's lock (two gateways on one
// SQLite file), it returns an error wrapping [ErrCommitLogLocked] and Commit
// keeps waiting for transactions.
func (w *LedgerWriter) OpenCommitLog(ctx context.Context) (recovered int, err error) {
	s := w.store
	if s.engine != engineSQLite {
		return 0, nil
	}
	base, err := filepath.Abs(s.path + "-commits")
	if err != nil {
		return 0, err
	}
	lock, err := os.OpenFile(base+".lock", os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return 0, fmt.Errorf("commit log: %w", err)
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		lock.Close()
		return 0, fmt.Errorf("%w: %s", ErrCommitLogLocked, base+".lock")
	}
	c := &commitLog{base: base, lock: lock, readOnly: s.readOnly.Load, pending: map[uint64]int{}, rotate: commitLogRotate}
	gens, err := c.files()
	if err == nil {
		recovered, err = c.recover(ctx, s, gens)
	}
	if err == nil && len(gens) > 0 {
		c.gen = gens[len(gens)-1]
	}
	if err == nil {
		err = c.startLocked()
	}
	if err != nil {
		lock.Close()
		return recovered, err
	}
	w.mu.Lock()
	w.clog = c
	w.mu.Unlock()
	return recovered, nil
}

// ErrCommitLogLocked says another process owns the commit log of the store.
var ErrCommitLogLocked = errors.New("commit log locked by another process")

func (c *commitLog) name(gen uint64) string { return c.base + "-" + strconv.FormatUint(gen, 10) }

// files returns the generations of the log's files, oldest first.
func (c *commitLog) files() ([]uint64, error) {
	names, err := filepath.Glob(c.base + "-*")
	if err != nil {
		return nil, err
	}
	var gens []uint64
	for _, n := range names {
		if g, err := strconv.ParseUint(strings.TrimPrefix(n, c.base+"-"), 10, 64); err == nil {
			gens = append(gens, g)
		}
	}
	slices.Sort(gens)
	return gens, nil
}

// recover writes the rows of the files gens to SQLite and removes them.
func (c *commitLog) recover(ctx context.Context, s *Store, gens []uint64) (int, error) {
	total := 0
	for _, g := range gens {
		rows, err := readCommitLog(c.name(g))
		if err != nil {
			return total, err
		}
		for chunk := range slices.Chunk(rows, 512) {
			if err := s.InsertLedger(ctx, chunk); err != nil {
				return total, fmt.Errorf("recover %d ledger rows from %s: %w", len(rows), c.name(g), err)
			}
		}
		total += len(rows)
		if err := os.Remove(c.name(g)); err != nil {
			return total, fmt.Errorf("commit log: %w", err)
		}
	}
	return total, nil
}

// readCommitLog returns the rows of one file. A torn record at the end (the
// process died in the middle of an append, or the disk filled) ends it: its
// Commit never returned, so its answer was not delivered.
func readCommitLog(name string) ([]LedgerRow, error) {
	b, err := os.ReadFile(name)
	if err != nil {
		return nil, fmt.Errorf("commit log: %w", err)
	}
	var rows []LedgerRow
	for len(b) >= 8 {
		n := binary.LittleEndian.Uint32(b)
		sum := binary.LittleEndian.Uint32(b[4:])
		if uint64(n) > uint64(len(b)-8) || crc32.ChecksumIEEE(b[8:8+n]) != sum {
			break
		}
		var r LedgerRow
		if err := json.Unmarshal(b[8:8+n], &r); err != nil {
			return nil, fmt.Errorf("commit log %s: record %d: %w", name, len(rows)+1, err)
		}
		rows = append(rows, r)
		b = b[8+n:]
	}
	return rows, nil
}

// startLocked opens the next file for appends.
func (c *commitLog) startLocked() error {
	f, err := os.OpenFile(c.name(c.gen+1), os.O_WRONLY|os.O_CREATE|os.O_APPEND|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("commit log: %w", err)
	}
	if c.f != nil {
		c.f.Close()
		if c.pending[c.gen] == 0 {
			delete(c.pending, c.gen)
			os.Remove(c.name(c.gen))
		}
	}
	c.f, c.size = f, 0
	c.gen++
	return nil
}

// append makes row durable and returns the file it went to. On an error
// nothing was appended (a partial record is cut off again).
func (c *commitLog) append(row LedgerRow) (uint64, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.f == nil {
		return 0, errors.New("commit log closed")
	}
	if c.readOnly() {
		return 0, errReadOnly
	}
	if c.size >= c.rotate {
		if err := c.startLocked(); err != nil {
			return 0, err
		}
	}
	// The record's length and checksum, then the record.
	c.buf = appendRecord(append(c.buf[:0], make([]byte, 8)...), &row)
	rec := c.buf[8:]
	binary.LittleEndian.PutUint32(c.buf, uint32(len(rec)))
	binary.LittleEndian.PutUint32(c.buf[4:], crc32.ChecksumIEEE(rec))
	n, err := c.f.Write(c.buf)
	if err != nil {
		if n > 0 {
			_ = c.f.Truncate(c.size)
		}
		return 0, fmt.Errorf("commit log: %w", err)
	}
	c.size += int64(n)
	c.pending[c.gen]++
	return c.gen, nil
}

// written notes that the rows ls are in SQLite: a file that is no longer
// appended to and has no row left only there is removed.
func (c *commitLog) written(ls []logged) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, l := range ls {
		c.pending[l.gen] -= l.n
		if c.pending[l.gen] <= 0 && l.gen != c.gen {
			delete(c.pending, l.gen)
			os.Remove(c.name(l.gen))
		}
	}
}

// close closes the log once the writer has drained: its files go if every
// row in them is in SQLite, else they stay for the next writer to recover.
func (c *commitLog) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.f == nil {
		return
	}
	c.f.Close()
	c.f = nil
	// An older file is gone once its rows are in SQLite (written); only
	// the one appended to may have none left only here.
	if c.pending[c.gen] == 0 {
		os.Remove(c.name(c.gen))
	}
	c.lock.Close()
}
