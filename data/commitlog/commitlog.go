// Package commitlog is an append-only log of checksummed records in files
// beside a database: a record appended here is durable against the death of
// the process as soon as Append returns (one write system call, shared by
// the Appends that run at the same time: a group commit), and the records a
// dead process had appended are handed back to the next one that opens the
// log. Package data uses it to make a ledger row durable before
// the SQLite transaction that carries it; commitlog knows nothing of rows —
// a payload is bytes.
//
// # Files
//
// BASE-N (N = 1, 2, …) hold the records; appends go to the newest, and a
// new one is started past Config.Rotate bytes. BASE.lock is locked (flock)
// by the one process that owns the files, for as long as the log is open.
// The owner tells the log (Written) when records have reached the database;
// a file that is no longer appended to and holds none that have not is
// removed, and Close removes the last one if it holds none.
//
// # Record format (version 1)
//
//	offset  size  field
//	0       4     magic "TGL" and the format version, 0x01
//	4       4     payload length n, big-endian (at most MaxPayload)
//	8       4     CRC-32C (Castagnoli) of bytes 0–7 and the payload, big-endian
//	12      n     payload (package data: the ledger row as a JSON object)
//
// This is the shape of litestream's and LiteFS's logs: a reader can tell a
// record that was written whole from one that was not without trusting
// anything in it. Files of the format before version 1 (no magic: length
// and CRC-32 IEEE, little-endian, then the JSON row) are still read, so
// that an upgrade recovers what the previous version left.
//
// # Recovery
//
// Open reads each file left by a previous owner up to the first record that
// does not check out. Appends are sequential and a file is never appended
// to by a later process, so a crash can only tear a file's end: a partial
// record, or — after a power loss on ext4 or XFS — a tail of zeros. That
// tail is cut off (logged at INFO with the bytes dropped), the records
// before it are applied, and the file is removed. A record that does not
// check out followed by one that does is damage, not a crash: Open stops
// with a *CorruptError naming the file and offset and saying what to do,
// applies nothing of that file and deletes nothing.
//
// Appends are not fsynced: like SQLite's WAL with synchronous=NORMAL, the
// bytes are in the operating system's hands, so records survive the
// process's death, and a power loss may lose the last ones — but never
// makes the log unreadable.
package commitlog

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
)

// Config configures a Log. The zero value is usable.
type Config struct {
	// Rotate is the size past which appends go to a new file, so that a
	// file's records all reach the database and it is removed while
	// traffic goes on. 0 means 4 MiB.
	Rotate int64
	// ReadOnly, if set, reports that the file system refuses writes: Append
	// then fails with ErrReadOnly. nil means never.
	ReadOnly func() bool
	// Logger receives the INFO line about a torn tail. nil discards.
	Logger *slog.Logger
}

// ErrLocked says another process owns the log.
var ErrLocked = errors.New("commit log locked by another process")

// ErrReadOnly is what Append fails with while Config.ReadOnly reports true.
var ErrReadOnly = errors.New("commit log: file system read-only")

// Log is an open commit log. Its methods are safe for concurrent use.
type Log struct {
	base string
	cfg  Config
	lock *os.File

	mu      sync.Mutex
	f       *os.File
	gen     uint64
	size    int64
	pending map[uint64]int // records appended to file n and not yet Written

	// The group commit (see Append). qmu is held for no I/O.
	qmu     sync.Mutex
	writing bool     // a write is under way, or the next group's leader is being woken
	next    *group   // the records waiting for the write under way to end
	spare   [][]byte // groups' buffers, for the next groups
	buf     []byte   // a lone Append's record; only the Append that set writing uses it

	writes atomic.Int64
}

// Open takes the log at base (its files are base-N and base.lock) and hands
// the records of every file a previous owner left, oldest file first, to
// apply, one call per file with the path of the file. A file is removed
// once apply returned nil for it; if apply fails, Open returns its error
// and the file stays for the next Open. Open then starts a new file for
// Append. When another process holds the lock, Open returns an error
// wrapping ErrLocked and applies nothing.
func Open(base string, cfg Config, apply func(file string, payloads [][]byte) error) (*Log, error) {
	if cfg.Rotate <= 0 {
		cfg.Rotate = 4 << 20
	}
	if cfg.ReadOnly == nil {
		cfg.ReadOnly = func() bool { return false }
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	lock, err := lockFile(base)
	if err != nil {
		return nil, err
	}
	l := &Log{base: base, cfg: cfg, lock: lock, pending: map[uint64]int{}}
	gens, err := l.files()
	if err == nil {
		err = l.recover(gens, apply)
	}
	if err == nil && len(gens) > 0 {
		l.gen = gens[len(gens)-1]
	}
	if err == nil {
		err = l.startLocked()
	}
	if err != nil {
		lock.Close()
		return nil, err
	}
	return l, nil
}

// Hold takes the lock of the log at base without opening the log, so that
// no process can Open it (no gateway can start on its database) until
// release is called. An error wrapping ErrLocked says another process holds
// it.
func Hold(base string) (release func(), err error) {
	f, err := lockFile(base)
	if err != nil {
		return nil, err
	}
	return func() { f.Close() }, nil
}

// lockFile opens base.lock and locks it, or says who holds it.
func lockFile(base string) (*os.File, error) {
	f, err := os.OpenFile(base+".lock", os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("commit log: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w: %s", ErrLocked, base+".lock")
		}
		return nil, fmt.Errorf("commit log: lock %s: %w", base+".lock", err)
	}
	return f, nil
}

func (l *Log) name(gen uint64) string { return l.base + "-" + strconv.FormatUint(gen, 10) }

// files returns the generations of the log's files, oldest first.
func (l *Log) files() ([]uint64, error) {
	names, err := filepath.Glob(l.base + "-*")
	if err != nil {
		return nil, err
	}
	var gens []uint64
	for _, n := range names {
		if g, err := strconv.ParseUint(strings.TrimPrefix(n, l.base+"-"), 10, 64); err == nil {
			gens = append(gens, g)
		}
	}
	slices.Sort(gens)
	return gens, nil
}

// recover applies the files gens and removes them.
func (l *Log) recover(gens []uint64, apply func(string, [][]byte) error) error {
	for _, g := range gens {
		name := l.name(g)
		b, err := os.ReadFile(name)
		if err != nil {
			return fmt.Errorf("commit log: %w", err)
		}
		f, err := Decode(b)
		if ce, ok := errors.AsType[*CorruptError](err); ok {
			ce.File = name
			return ce
		}
		if f.End < len(b) {
			if err := cut(name, int64(f.End)); err != nil {
				return err
			}
			l.cfg.Logger.Info("commit log: cut off the torn end a crash left (the appends it held never returned)",
				"file", name, "bytes_dropped", len(b)-f.End, "records_kept", len(f.Payloads))
		}
		if err := apply(name, f.Payloads); err != nil {
			return err
		}
		if err := os.Remove(name); err != nil {
			return fmt.Errorf("commit log: %w", err)
		}
	}
	return nil
}

// cut truncates the file name to size and syncs it.
func cut(name string, size int64) error {
	f, err := os.OpenFile(name, os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("commit log: %w", err)
	}
	err = f.Truncate(size)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("commit log: cut torn tail: %w", err)
	}
	return nil
}

// startLocked opens the next file for appends.
func (l *Log) startLocked() error {
	f, err := os.OpenFile(l.name(l.gen+1), os.O_WRONLY|os.O_CREATE|os.O_APPEND|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("commit log: %w", err)
	}
	if l.f != nil {
		l.f.Close()
		if l.pending[l.gen] == 0 {
			delete(l.pending, l.gen)
			os.Remove(l.name(l.gen))
		}
	}
	l.f, l.size = f, 0
	l.gen++
	return nil
}

// Append makes payload durable (against the process's death) as one record
// and returns the generation of the file it went to, for Written. On an
// error nothing was appended (a partial record is cut off again).
//
// Concurrent Appends share one write (group commit, as SQLite's WAL and
// PostgreSQL's commit do it): an Append that finds no write under way
// writes its record at once and is the leader; those that come while it
// writes put their records in the next group and wait. When the leader's
// write returns, the first Append of the next group writes the whole group
// and wakes the others with its outcome. No timer: a record waits for at
// most the one write before its own, and each Append still returns only
// once its record was written.
func (l *Log) Append(payload []byte) (gen uint64, err error) {
	if len(payload) > MaxPayload {
		return 0, fmt.Errorf("commit log: record of %d bytes, more than %d", len(payload), MaxPayload)
	}
	if l.cfg.ReadOnly() {
		return 0, ErrReadOnly
	}
	l.qmu.Lock()
	if !l.writing {
		// No write under way and (then) no group waiting: write alone.
		l.writing = true
		l.qmu.Unlock()
		l.buf = AppendRecord(l.buf[:0], payload)
		gen, err = l.write(l.buf, 1)
		l.handOff()
		return gen, err
	}
	g := l.next
	lead := g == nil
	if lead {
		g = l.newGroupLocked()
		l.next = g
	}
	g.buf = AppendRecord(g.buf, payload)
	g.n++
	l.qmu.Unlock()
	if !lead {
		<-g.done
		return g.gen, g.err
	}
	<-g.lead // the write before this group's returned
	l.qmu.Lock()
	l.next = nil // later Appends start the group after this one
	l.qmu.Unlock()
	g.gen, g.err = l.write(g.buf, g.n)
	l.handOff()
	l.qmu.Lock()
	l.spare = append(l.spare, g.buf[:0])
	g.buf = nil
	l.qmu.Unlock()
	close(g.done)
	return g.gen, g.err
}

// group is the records of Appends that came while a write was under way:
// they go out in the next write, which their first Append makes.
type group struct {
	buf  []byte        // the records, in the order their Appends came
	n    int           // how many
	lead chan struct{} // closed when the first Append may write the group
	done chan struct{} // closed once it did; gen and err are its outcome
	gen  uint64
	err  error
}

func (l *Log) newGroupLocked() *group {
	g := &group{lead: make(chan struct{}), done: make(chan struct{})}
	if k := len(l.spare); k > 0 {
		g.buf, l.spare = l.spare[k-1], l.spare[:k-1]
	}
	return g
}

// handOff ends a write: the group waiting, if any, may be written next.
func (l *Log) handOff() {
	l.qmu.Lock()
	if l.next != nil {
		close(l.next.lead) // l.writing stays set: its leader writes now
	} else {
		l.writing = false
	}
	l.qmu.Unlock()
}

// write appends b, n whole records, to the file being appended to, with
// one write system call, and returns the file's generation.
func (l *Log) write(b []byte, n int) (uint64, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return 0, errors.New("commit log closed")
	}
	if l.size >= l.cfg.Rotate {
		if err := l.startLocked(); err != nil {
			return 0, err
		}
	}
	w, err := l.f.Write(b)
	l.writes.Add(1)
	if err != nil {
		if w > 0 {
			_ = l.f.Truncate(l.size)
		}
		return 0, fmt.Errorf("commit log: %w", err)
	}
	l.size += int64(w)
	l.pending[l.gen] += n
	return l.gen, nil
}

// Writes returns how many write system calls Appends made: with
// concurrent Appends, fewer than the records appended.
func (l *Log) Writes() int64 { return l.writes.Load() }

// Count is how many records appended to the file of generation Gen have
// reached the database.
type Count struct {
	Gen uint64
	N   int
}

// AddCount counts one more record of the file gen in cs.
func AddCount(cs []Count, gen uint64) []Count {
	for i := range cs {
		if cs[i].Gen == gen {
			cs[i].N++
			return cs
		}
	}
	return append(cs, Count{Gen: gen, N: 1})
}

// Written notes that the records cs are in the database: a file that is no
// longer appended to and holds no record that is not is removed.
func (l *Log) Written(cs []Count) {
	var done []string
	l.mu.Lock()
	for _, c := range cs {
		l.pending[c.Gen] -= c.N
		if l.pending[c.Gen] <= 0 && c.Gen != l.gen {
			delete(l.pending, c.Gen)
			done = append(done, l.name(c.Gen))
		}
	}
	l.mu.Unlock()
	// The unlink is a file-system call every answer's Append would wait
	// for if it ran under l.mu; the file is no longer appended to.
	for _, name := range done {
		os.Remove(name)
	}
}

// Gen returns the generation of the file being appended to.
func (l *Log) Gen() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.gen
}

// Close closes the log and releases its lock, once its owner has written
// what it will: the file being appended to goes if every record in it was
// Written, else it stays for the next Open. Older files went when their
// last record was Written. Close is safe twice.
func (l *Log) Close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return
	}
	l.f.Close()
	l.f = nil
	if l.pending[l.gen] == 0 {
		os.Remove(l.name(l.gen))
	}
	l.lock.Close()
}

// Peek returns the payloads of every record in the log's files at base,
// oldest file first, without taking the lock: a reader beside the owner
// (`tailgate usage` while a gateway runs) sees what was appended and not
// yet removed. A record being appended meanwhile reads as a torn end and is
// left out; a file removed meanwhile is skipped (its records reached the
// database). It does not change the files.
func Peek(base string) ([][]byte, error) {
	l := &Log{base: base}
	gens, err := l.files()
	if err != nil {
		return nil, fmt.Errorf("commit log: %w", err)
	}
	var out [][]byte
	for _, g := range gens {
		b, err := os.ReadFile(l.name(g))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("commit log: %w", err)
		}
		f, err := Decode(b)
		if ce, ok := errors.AsType[*CorruptError](err); ok {
			ce.File = l.name(g)
			return nil, ce
		}
		out = append(out, f.Payloads...)
	}
	return out, nil
}
