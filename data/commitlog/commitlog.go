// Package commitlog is an append-only log of checksummed records in files
// beside a database: a record appended here is durable against the death of
// the process as soon as Append returns (a copy into the file's pages in the
// page cache, or where files cannot be mapped one write system call shared
// by the Appends that run at the same time: a group commit), and the
// records a dead process had appended are handed back to the next one that
// opens the log. Package data uses it to make a ledger row durable before
// the SQLite transaction that carries it; commitlog knows nothing of rows —
// a payload is bytes.
//
// # Files
//
// BASE-N (N = 1, 2, …) hold the records; appends go to the newest, and a
// new one is started when the next records would take it past
// Config.Rotate bytes (records larger than that get a file of their
// own). BASE.lock is locked (flock)
// by the one process that owns the files, for as long as the log is open.
// The owner tells the log (Written) when records have reached the database;
// a file that is no longer appended to and holds none that have not is
// removed, and Close removes the last one if it holds none.
//
// # Appends
//
// On ext4, XFS and tmpfs the file being appended to is preallocated to
// Config.Rotate bytes (fallocate(2), mode 0: its blocks are reserved and
// read as zeros) on the first Append that goes to it, and mapped shared and
// writable; an Append copies its record into the map, with no system call,
// under the log's lock (Appends that come together take turns: a copy is
// shorter than waking a goroutine to share one).
// A full disk (ENOSPC) or any other refusal comes from the preallocation:
// that Append fails, nothing is appended, and the next Append tries again.
// Because the blocks are reserved, a store into the map cannot fail for
// space later (the process would get SIGBUS). The pages of a shared file
// map are the file's page cache, the same pages write(2) fills: what was
// copied in is in the operating system's hands and survives the process's
// death exactly as written bytes do. When the file stops being appended to
// (a new one is started, or Close) it is unmapped and truncated to the
// records it holds. On other file systems (where preallocated space is not
// reserved, as on btrfs and ZFS, which copy on write) and off Linux, a
// group of records is one write(2) at the file's end.
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
// does not check out. Appends are sequential (records are copied in one
// after the other, each record's header after its payload) and
// a file is never appended to by a later process, so a crash can only tear
// a file's end: a partial record, the preallocated space after the last
// record (zeros), or — after a power loss on ext4 or XFS — a tail of zeros.
// That tail is cut off, the records before it are applied, and the file is
// removed. The cut is logged at INFO with the bytes dropped, as torn_bytes
// (what a record being appended when the process died left; never one
// whose Append returned) and zero_bytes (space preallocated and never
// written, or zeros a power loss left). A record that does not
// check out followed by one that does is damage, not a crash: Open stops
// with a *CorruptError naming the file and offset and saying what to do,
// applies nothing of that file and deletes nothing.
//
// Appends are not fsynced (nor the map msynced): like SQLite's WAL with
// synchronous=NORMAL, the bytes are in the operating system's hands, so
// records survive the process's death, and a power loss may lose the last
// ones — but never makes the log unreadable: a file is only ever appended
// to past its records, into space that reads as zeros.
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

	mu        sync.Mutex
	f         *os.File
	gen       uint64
	size      int64          // bytes of records in file gen
	cur       int            // records appended to file gen and not yet Written
	pending   map[uint64]int // the same for older files
	mapOK     bool           // the file system reserves preallocated blocks: map the files
	m         []byte         // file gen, preallocated and mapped; nil before its first Append, or with write(2)
	populated int            // m[:populated] is faulted in writable
	ahead     *populating    // the chunk after m[:populated], being faulted in; nil when none is

	// The group commit (see Append). qmu is held for no I/O.
	qmu     sync.Mutex
	writing bool     // a write is under way, or the next group's leader is being woken
	next    *group   // the records waiting for the write under way to end
	spare   [][]byte // groups' buffers, for the next groups
	buf     []byte   // a lone Append's record; only the Append that set writing uses it

	writes   atomic.Int64
	syscalls atomic.Int64
	direct   atomic.Bool // files are mapped: each Append copies its own record (appendDirect)
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
	l.mapOK = canMap(l.f)
	l.direct.Store(l.mapOK)
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
			torn := lastNonZero(b) + 1 - f.End
			if torn < 0 {
				torn = 0
			}
			msg := "commit log: cut off the torn end a crash left (the appends it held never returned)"
			if torn == 0 {
				msg = "commit log: cut off the zeros after the last record (space preallocated and never written, or what a power loss left)"
			}
			l.cfg.Logger.Info(msg, "file", name, "bytes_dropped", len(b)-f.End,
				"torn_bytes", torn, "zero_bytes", len(b)-f.End-torn, "records_kept", len(f.Payloads))
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

// startLocked opens the next file for appends (it is preallocated and
// mapped by the first write to it).
func (l *Log) startLocked() error {
	f, err := os.OpenFile(l.name(l.gen+1), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	l.syscalls.Add(1)
	if err != nil {
		return fmt.Errorf("commit log: %w", err)
	}
	if l.f != nil {
		l.endLocked()
	}
	l.f, l.size = f, 0
	l.gen++
	return nil
}

// endLocked stops appending to file gen: it is unmapped, then removed if
// every record in it was Written, or else truncated to its records (no
// zero tail) and left for Written or the next Open.
func (l *Log) endLocked() {
	mapped := l.m != nil
	if mapped {
		if l.ahead != nil {
			<-l.ahead.done // no fault-in runs on an unmapped range
			l.ahead = nil
		}
		unmap(l.m)
		l.m = nil
		l.syscalls.Add(1)
	}
	if l.cur == 0 {
		os.Remove(l.name(l.gen))
	} else {
		if mapped {
			_ = l.f.Truncate(l.size)
		}
		l.pending[l.gen] = l.cur
	}
	l.f.Close()
	l.syscalls.Add(2)
	l.cur = 0
}

// populateChunk is how much of a mapped file is faulted in at a time: 16
// pages, one system call for about a hundred 500-byte records.
const populateChunk = 64 << 10

// mapLocked preallocates file gen, empty, for a group of need bytes and
// maps it. It leaves l.m nil where the file system cannot preallocate, and
// appends go on with write(2).
func (l *Log) mapLocked(need int) error {
	page := int64(os.Getpagesize())
	size := (max(l.cfg.Rotate, int64(need)) + page - 1) / page * page
	m, err := preallocate(l.f, int(size))
	l.syscalls.Add(2)
	if errors.Is(err, errNoPrealloc) {
		l.mapOK = false
		l.direct.Store(false)
		return nil
	}
	if err != nil {
		// ext4 keeps what it allocated before ENOSPC: give it back.
		_ = l.f.Truncate(0)
		l.syscalls.Add(1)
		return fmt.Errorf("commit log: %w", err)
	}
	l.m, l.populated = m, 0
	return nil
}

// Append makes payload durable (against the process's death) as one record
// and returns the generation of the file it went to, for Written. On an
// error nothing was appended (a partial record is cut off again).
//
// Where files are mapped, an Append copies its record in under the log's
// lock and returns. Otherwise concurrent Appends share one write (group
// commit, as SQLite's WAL and PostgreSQL's commit do it): an Append that
// finds no write under way
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
	if l.direct.Load() {
		return l.appendDirect(payload)
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

// appendDirect appends payload's record with a copy into the mapped file
// under l.mu — shorter than waking a goroutine, so Appends that come
// together take turns instead of forming a group. The checksum is
// computed before the lock; the header is stored after the payload.
func (l *Log) appendDirect(payload []byte) (uint64, error) {
	var hdr [headerSize]byte
	putHeader(&hdr, payload)
	n := headerSize + len(payload)
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.reserveLocked(n); err != nil {
		return 0, err
	}
	l.writes.Add(1)
	if l.m == nil {
		// The file system turned out not to preallocate: one write.
		b := AppendRecord(make([]byte, 0, n), payload)
		if err := l.writeAtLocked(b); err != nil {
			return 0, err
		}
	} else {
		at := int(l.size)
		l.populateLocked(at + n)
		copy(l.m[at+headerSize:at+n], payload)
		copy(l.m[at:], hdr[:])
	}
	l.size += int64(n)
	l.cur++
	return l.gen, nil
}

// reserveLocked makes room for n more bytes of records: a new file if
// they would take this one past its size, preallocated and mapped if
// files are.
func (l *Log) reserveLocked(n int) error {
	if l.f == nil {
		return errors.New("commit log closed")
	}
	limit := l.cfg.Rotate
	if l.m != nil {
		limit = int64(len(l.m))
	}
	if l.size > 0 && l.size+int64(n) > limit {
		if err := l.startLocked(); err != nil {
			return err
		}
	}
	if l.mapOK && l.m == nil {
		return l.mapLocked(n)
	}
	return nil
}

// writeAtLocked writes b at the end of the records with one system call;
// on an error nothing of b is left in the file.
func (l *Log) writeAtLocked(b []byte) error {
	w, err := l.f.WriteAt(b, l.size)
	l.syscalls.Add(1)
	if err != nil {
		if w > 0 {
			_ = l.f.Truncate(l.size)
		}
		return fmt.Errorf("commit log: %w", err)
	}
	return nil
}

// populateLocked readies the map for a store up to end. The chunk after
// what is faulted in is faulted in by a goroutine once the Appends come
// within half a chunk of it, so no Append waits for a fault-in (about
// 0.3 ms for a chunk on a VM, which would be the 1 % slowest answers' at
// 1000 a second) but the first of a file, or one that outran the goroutine;
// a store past what is faulted in faults its page in itself.
func (l *Log) populateLocked(end int) {
	if a := l.ahead; a != nil {
		select {
		case <-a.done:
			l.ahead = nil
			if a.ok {
				l.populated = a.to
			} else {
				l.populated = len(l.m) // not on this kernel: stores fault the pages in
			}
		default:
		}
	}
	if end > l.populated && l.ahead == nil {
		to := min((end+populateChunk-1)/populateChunk*populateChunk, len(l.m))
		l.syscalls.Add(1)
		if populate(l.m[l.populated:to]) {
			l.populated = to
		} else {
			l.populated = len(l.m)
		}
	}
	if l.ahead == nil && l.populated < len(l.m) && end > l.populated-populateChunk/2 {
		a := &populating{to: min(l.populated+populateChunk, len(l.m)), done: make(chan struct{})}
		m := l.m[l.populated:a.to]
		l.ahead = a
		l.syscalls.Add(1)
		go func() {
			a.ok = populate(m)
			close(a.done)
		}()
	}
}

// populating is a chunk of a mapped file a goroutine faults in ahead of
// the Appends; ok and to are read once done is closed.
type populating struct {
	to   int
	ok   bool
	done chan struct{}
}

// write appends b, n whole records, to the file being appended to (not
// mapped) with one write system call, and returns the file's generation.
func (l *Log) write(b []byte, n int) (uint64, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.reserveLocked(len(b)); err != nil {
		return 0, err
	}
	l.writes.Add(1)
	if err := l.writeAtLocked(b); err != nil {
		return 0, err
	}
	l.size += int64(len(b))
	l.cur += n
	return l.gen, nil
}

// Writes returns how many times Appends wrote to the log's files: where
// files are mapped, once an Append (a copy into the map, no system call);
// otherwise once a group of concurrent Appends (a write system call: fewer
// than the records appended). Syscalls says how many system calls they
// took.
func (l *Log) Writes() int64 { return l.writes.Load() }

// Syscalls returns how many system calls Appends made: with mapped files,
// the few that start a file (open, fallocate, mmap), end one (munmap,
// ftruncate, close) and fault its pages in 64 KiB at a time
// (madvise), none a record; otherwise one write a group.
func (l *Log) Syscalls() int64 { return l.syscalls.Load() }

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
		if c.Gen == l.gen {
			l.cur -= c.N
			continue
		}
		l.pending[c.Gen] -= c.N
		if l.pending[c.Gen] <= 0 {
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
// Written, else it stays for the next Open, truncated to its records. Older files went when their
// last record was Written. Close is safe twice.
func (l *Log) Close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return
	}
	l.endLocked()
	l.f = nil
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
		f, err := peekFile(l.name(g))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out = append(out, f.Payloads...)
	}
	return out, nil
}

// peekFile decodes the file name. A mapped file being appended to is read
// while records are copied into it, and a reader on another CPU may see a
// later record's bytes before an earlier one's (the file's size does not
// bound what it reads, as it does during a write(2)): a record that does
// not check out followed by one that does is read again, a few times,
// before it is called damage.
func peekFile(name string) (File, error) {
	for try := 0; ; try++ {
		b, err := os.ReadFile(name)
		if errors.Is(err, os.ErrNotExist) {
			return File{}, err
		}
		if err != nil {
			return File{}, fmt.Errorf("commit log: %w", err)
		}
		f, err := Decode(b)
		if ce, ok := errors.AsType[*CorruptError](err); ok {
			if try < 3 {
				continue
			}
			ce.File = name
			return File{}, ce
		}
		return f, nil
	}
}
