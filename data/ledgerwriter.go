package data

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tailgate-dev/tailgate/data/commitlog"
)

// ErrLedgerUnavailable is wrapped by the errors of a [LedgerWriter] that
// cannot persist rows at the moment: its writes fail, or its backlog is
// above the bound. Nothing should be served that the ledger could not bill.
var ErrLedgerUnavailable = errors.New("ledger unavailable")

// LedgerConfig tunes a [LedgerWriter]. Zero (or negative) fields take the
// documented defaults.
type LedgerConfig struct {
	// BatchSize is the most rows written in one transaction; 0 means 512.
	BatchSize int
	// FlushInterval is the longest a row given to Add or Open waits for its
	// batch to fill before the batch is written anyway; 0 means 50ms. A
	// Commit or Flush does not wait for it: the writer starts a transaction
	// as soon as the previous one is done, taking every row queued by then.
	// A transaction rewrites a fixed set of pages whatever its size (the
	// ledger's last page, its three indexes' and the spend tables'): 7.7
	// WAL frames for one row, 15.5 for 20, 26 for 100, so at 1000 answers a
	// second 50ms instead of 20ms halved the gateway's WAL writes (17,700
	// to 9,100 pwrite calls in 10 s, perf stat) and cut its CPU a request
	// from 1.26× to 1.11× a bare Go proxy's (scripts/bench-ab.sh, one run).
	// Answers' rows are durable before that (the commit log); a stream's
	// first open row waits this long at most.
	FlushInterval time.Duration
	// RefreshInterval is the longest a refresh of an open row (an Open of
	// an ID whose earlier version the writer took already) waits for its
	// batch while nothing else is queued; any other row queued meanwhile
	// cuts the wait to FlushInterval. 0 means FlushInterval. With many
	// streams open their refreshes land on most of the ledger's pages, so a
	// transaction's cost is its pages, not its rows: at 500 streams a
	// transaction every 20 ms wrote ~50 pages to the WAL each time, 50 MB in
	// a 5 s run (bench-streams.sh, the gateway's /proc/PID/io).
	RefreshInterval time.Duration
	// LoggedInterval is the longest a row in the commit log (a Commit's
	// row, durable already: see OpenCommitLog) waits for its batch while
	// no row that may wait less is queued; any other row queued meanwhile
	// cuts the wait to its own. 0 means 4×FlushInterval. A transaction's
	// WAL frames grow slower than its rows (the ledger's and its indexes'
	// last pages are rewritten once a transaction, not once a row), so
	// the rows of answers, which need not reach SQLite soon, are written
	// more at a time: 0.72 pwrite calls a row in transactions of 200 rows
	// against 1.49 in transactions of 50 (checkpoints included, strace -c
	// of BenchmarkLedgerBatch). No crash-loss bound moves: a logged row is
	// durable before its answer ends, open rows and Add's rows keep their
	// intervals, and Usage reads the commit log's rows too.
	LoggedInterval time.Duration
	// Buffer is the hard cap: the most rows the writer holds (queued, or
	// taken and not yet written). Add and Commit wait for room once it is
	// reached; rows are never dropped. Open ignores it (it holds at most
	// one row per stream in flight). 0 means 16384.
	Buffer int
	// MaxBacklog is the soft bound: with more rows held than this,
	// [LedgerWriter.Healthy] reports the ledger unavailable, so that the
	// server refuses new work while the rows of the requests in flight still
	// fit under Buffer. 0 means Buffer/4; a value above Buffer means Buffer.
	MaxBacklog int
	// CommitWait bounds how long Commit waits for the transaction holding
	// its row, when the row cannot go to the commit log: past it Commit
	// returns an error and the row stays queued, as ctx ending does. 0
	// means 10s. (A bound here rather than a deadline on each caller's
	// context: a context with a timeout cost every answer about 4 µs of
	// the gateway's CPU at 1000 a second, pprof, though an answer's row
	// nearly always goes to the commit log and never waits.)
	CommitWait time.Duration
	// DrainTimeout bounds how long stopping keeps retrying a failing write.
	// While running, a failed batch is retried until it succeeds; once the
	// writer stops, rows that still cannot be written after this long are
	// reported as lost instead of hanging shutdown forever. 0 means 30s.
	DrainTimeout time.Duration
}

func (c LedgerConfig) withDefaults() LedgerConfig {
	if c.BatchSize <= 0 {
		c.BatchSize = 512
	}
	if c.FlushInterval <= 0 {
		c.FlushInterval = 50 * time.Millisecond
	}
	if c.RefreshInterval <= 0 {
		c.RefreshInterval = c.FlushInterval
	}
	if c.LoggedInterval <= 0 {
		c.LoggedInterval = 4 * c.FlushInterval
	}
	if c.Buffer <= 0 {
		c.Buffer = 16384
	}
	if c.MaxBacklog <= 0 {
		c.MaxBacklog = max(c.Buffer/4, 1)
	}
	c.MaxBacklog = min(c.MaxBacklog, c.Buffer)
	if c.CommitWait <= 0 {
		c.CommitWait = 10 * time.Second
	}
	if c.DrainTimeout <= 0 {
		c.DrainTimeout = 30 * time.Second
	}
	return c
}

// Backoff between attempts of a failing batch write. The ceiling is also the
// longest the writer takes to notice that writes work again.
const (
	retryMin = 10 * time.Millisecond
	retryMax = time.Second
)

// entry is a row waiting in the queue; done is its Commit's waiter (buffered,
// sent to once), nil for Add and Open.
type entry struct {
	row     LedgerRow
	done    chan error
	dropped bool   // a Commit's row given back to its caller: not written
	gen     uint64 // the commit-log file holding the row, 0 for none
	refresh bool   // an open row's newer version: may wait RefreshInterval
}

// LedgerWriter batches ledger rows from many requests into few transactions.
// [LedgerWriter.Run] is its one writing goroutine.
//
// # Rows
//
//   - [LedgerWriter.Add] queues a final row and returns at once.
//   - [LedgerWriter.Commit] queues a final row and waits until the
//     transaction holding it committed (group commit: the rows of concurrent
//     callers share one transaction).
//   - [LedgerWriter.Open] queues a stream's provisional row; the row's final
//     version (by Add or Commit, same ID) replaces it.
//
// No row given to the writer is dropped: a failing write is retried with
// backoff until it succeeds, and [LedgerWriter.Close] writes every row held
// before it returns (giving up only after DrainTimeout of failures).
//
// # Health
//
// [LedgerWriter.Healthy] says, with one or two atomic loads, whether rows are
// being persisted. It turns unavailable on the first failed write or when the
// backlog passes the soft bound, and back to nil by itself once a write
// succeeds and the backlog is under the bound again.
type LedgerWriter struct {
	store *Store
	cfg   LedgerConfig
	log   *slog.Logger

	// Fast-path state for Healthy.
	failure atomic.Pointer[error] // set while writes fail: the error Healthy returns
	backlog atomic.Int64          // == held, published for Healthy
	errFull error                 // Healthy's error for a backlog above the bound

	mu      sync.Mutex
	queue   []entry // rows not yet taken by the writer, oldest first
	headSeq uint64  // sequence number of queue[0]; entries are numbered in order
	nextSeq uint64  // the number the next new entry gets
	// opens maps an open row's ID to the sequence number of its last version
	// (below headSeq: taken already, so the next is a refresh) until its
	// final row is queued. An Open after the final row (a server never sends
	// one) stays here until Close.
	opens   map[string]uint64
	eager   int    // entries queued that are not refreshes
	logged  int    // entries queued whose row is in the commit log (of eager; they wait LoggedInterval at most)
	held    int    // rows in queue plus rows taken and not yet settled
	waiters int    // entries in queue with a Commit waiting
	flushTo uint64 // the newest entry a Flush waits for
	doneSeq uint64 // every entry up to this one is written (or lost)
	// progress is closed and replaced whenever doneSeq moves and when the
	// writer stops: it wakes Flushes and callers waiting for room.
	progress chan struct{}
	stopped  bool  // no entry may enter queue any more
	claimed  bool  // a consumer (Run, or Close if Run never started) owns queue
	err      error // rows lost while stopping; final once done is closed

	wake     chan struct{} // capacity 1: the queue needs the writer's attention
	stopping chan struct{} // closed when the writer starts to stop
	stopOnce sync.Once
	done     chan struct{} // closed when the drain is complete

	txs atomic.Int64 // committed transactions, for tests and benchmarks

	// doneChans holds the empty channels of Commits that got their answer,
	// for the next ones: every JSON answer and stream end waits on one.
	doneChans sync.Pool
	// recBufs holds buffers for the commit log's records (*[]byte).
	recBufs sync.Pool

	logMu sync.Mutex
	flog  failureLog

	clog *commitlog.Log // nil: Commits wait for their transaction (set once, before Run)

	// stored is every open row as the writer last wrote it, by ID, until its
	// final row is written: a newer version that differs only in its
	// billable figures is a refresh (see takeLocked). Only the consumer of
	// queue (Run, or Close's drain) uses it.
	stored map[string]LedgerRow
}

// NewLedgerWriter returns a writer for s. Start [LedgerWriter.Run] in a
// goroutine, and Close the writer before the Store.
func (s *Store) NewLedgerWriter(cfg LedgerConfig, log *slog.Logger) *LedgerWriter {
	cfg = cfg.withDefaults()
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	w := &LedgerWriter{
		store:    s,
		cfg:      cfg,
		log:      log,
		errFull:  fmt.Errorf("%w: writer backlog above %d rows", ErrLedgerUnavailable, cfg.MaxBacklog),
		nextSeq:  1,
		headSeq:  1,
		opens:    make(map[string]uint64),
		stored:   make(map[string]LedgerRow),
		progress: make(chan struct{}),
		wake:     make(chan struct{}, 1),
		stopping: make(chan struct{}),
		done:     make(chan struct{}),
	}
	w.doneChans.New = func() any { return make(chan error, 1) }
	w.recBufs.New = func() any { return new([]byte) }
	return w
}

// Healthy returns nil while rows are being persisted, and otherwise an error
// wrapping [ErrLedgerUnavailable] that says why: the last write error (its
// SQLite code first, e.g. "SQLITE_FULL") while writes fail, or a backlog
// above LedgerConfig.MaxBacklog. It is cheap enough to call on every request.
func (w *LedgerWriter) Healthy() error {
	if p := w.failure.Load(); p != nil {
		return *p
	}
	if w.backlog.Load() > int64(w.cfg.MaxBacklog) {
		return w.errFull
	}
	return nil
}

// Backlog returns how many rows the writer holds: queued, or being written.
func (w *LedgerWriter) Backlog() int { return int(w.backlog.Load()) }

// Run writes batches until ctx is done or the writer is closed, then writes
// every row still held and returns. It returns nil unless some rows could
// not be written while stopping. Only one Run may be active.
func (w *LedgerWriter) Run(ctx context.Context) error {
	w.mu.Lock()
	if w.claimed {
		w.mu.Unlock()
		select {
		case <-w.stopping:
			<-w.done // closed already, or being drained by Close
			return w.result()
		default:
			return errors.New("ledger writer: already running")
		}
	}
	w.claimed = true
	w.mu.Unlock()

	w.loop(ctx)
	w.stop()
	w.drain()
	w.closeLog()
	close(w.done)
	return w.result()
}

// Close stops the writer, waits until every held row is written (by Run, or
// here if Run was never started) and returns what could not be written. It
// is safe to call more than once.
func (w *LedgerWriter) Close() error {
	w.stop()
	w.mu.Lock()
	consume := !w.claimed
	w.claimed = true
	w.mu.Unlock()
	if consume {
		w.drain()
		w.closeLog()
		close(w.done)
	}
	<-w.done
	return w.result()
}

func (w *LedgerWriter) stop() {
	w.stopOnce.Do(func() {
		close(w.stopping)
		w.mu.Lock()
		w.stopped = true
		w.bumpLocked() // releases callers waiting for room; they write themselves
		w.mu.Unlock()
	})
}

// closeLog closes the commit log, if any, once every row is drained.
func (w *LedgerWriter) closeLog() {
	if w.clog != nil {
		w.clog.Close()
	}
}

func (w *LedgerWriter) bumpLocked() {
	close(w.progress)
	w.progress = make(chan struct{})
}

func (w *LedgerWriter) result() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

// readyLocked reports whether the queue should be written now rather than
// after FlushInterval: it holds a full batch, a Commit is waiting, or a
// Flush waits for a queued row.
func (w *LedgerWriter) readyLocked() bool {
	return len(w.queue) >= w.cfg.BatchSize || w.waiters > 0 || w.flushTo >= w.headSeq
}

// batchWaitLocked is the longest the queue's rows may wait for their batch
// to fill: FlushInterval if it holds a row that is neither a refresh nor in
// the commit log, else the least of RefreshInterval (if it holds a refresh)
// and LoggedInterval (if it holds a logged row).
func (w *LedgerWriter) batchWaitLocked() time.Duration {
	if w.eager > w.logged {
		return w.cfg.FlushInterval
	}
	wait := w.cfg.LoggedInterval
	if len(w.queue) > w.eager && (w.logged == 0 || w.cfg.RefreshInterval < wait) {
		wait = w.cfg.RefreshInterval
	}
	return wait
}

// loop is Run's steady state: wait for a row; unless the queue is ready, give
// it FlushInterval to become so; take a batch, write it, repeat. Rows queued
// while a transaction runs go into the next one: that is the group commit.
func (w *LedgerWriter) loop(ctx context.Context) {
	b := w.newBatch()
	timer := time.NewTimer(w.cfg.FlushInterval)
	timer.Stop()
	for {
		w.mu.Lock()
		for len(w.queue) == 0 {
			w.mu.Unlock()
			select {
			case <-w.wake:
			case <-ctx.Done():
				return
			case <-w.stopping:
				return
			}
			w.mu.Lock()
		}
		if !w.readyLocked() {
			wait := w.batchWaitLocked()
			w.mu.Unlock()
			start := time.Now()
			timer.Reset(wait)
		wait:
			for {
				select {
				case <-w.wake:
					w.mu.Lock()
					ready, least := w.readyLocked(), w.batchWaitLocked()
					w.mu.Unlock()
					if ready {
						break wait
					}
					if least < wait {
						// A row that may not wait as long as those before it.
						wait = least
						left := wait - time.Since(start)
						if left <= 0 {
							break wait
						}
						timer.Reset(left)
					}
				case <-timer.C:
					break wait
				case <-ctx.Done():
					timer.Stop()
					return // drain takes what is queued
				case <-w.stopping:
					timer.Stop()
					return
				}
			}
			timer.Stop()
			w.mu.Lock()
		}
		w.takeLocked(&b)
		w.mu.Unlock()
		w.commit(ctx, &b)
	}
}

// drain writes everything left in the queue once the writer is stopped (no
// caller can add more).
func (w *LedgerWriter) drain() {
	b := w.newBatch()
	for {
		w.mu.Lock()
		if len(w.queue) == 0 {
			w.mu.Unlock()
			return
		}
		w.takeLocked(&b)
		w.mu.Unlock()
		w.commit(context.Background(), &b)
	}
}

func (w *LedgerWriter) newBatch() batch {
	return batch{rows: make([]LedgerRow, 0, min(w.cfg.BatchSize, 1024))}
}

// batch is the rows taken for one transaction and the Commits waiting on
// them.
type batch struct {
	logged  []commitlog.Count // the rows that are in the commit log, per file
	rows    []LedgerRow
	fresh   []LedgerRow // refreshes of stored open rows: their figures only
	taken   int         // the entries taken: rows, fresh and versions stored already
	waiters []chan error
	waitRow []int  // for each waiter, the index of its row in rows
	last    uint64 // sequence number of the last entry taken
}

// takeLocked moves up to BatchSize entries from the head of the queue into
// b. A new version of an open row stored already that differs from it only
// in its billable figures goes to b.fresh, which updates just those (a
// third of the full upsert's cost, and the writer's open rows were 22 % of
// the gateway's CPU with 500 streams open); one that does not differ
// at all is not written. The queue holds one entry per open row (Open
// replaces its queued version), so no other row of the batch precedes a
// refresh of the same ID, and refreshes run first.
func (w *LedgerWriter) takeLocked(b *batch) {
	k := min(len(w.queue), w.cfg.BatchSize)
	for _, e := range w.queue[:k] {
		if !e.refresh {
			w.eager--
		}
		if e.gen != 0 {
			w.logged--
		}
		if e.dropped {
			continue
		}
		b.taken++
		if e.row.Outcome == OutcomeOpen {
			if prev, ok := w.stored[e.row.ID]; ok && sameButFigures(&prev, &e.row) {
				if !sameFigures(&prev, &e.row) {
					b.fresh = append(b.fresh, e.row)
				}
				continue
			}
		}
		b.rows = append(b.rows, e.row)
		if e.gen != 0 {
			b.logged = commitlog.AddCount(b.logged, e.gen)
		}
		if e.done != nil {
			b.waiters = append(b.waiters, e.done)
			b.waitRow = append(b.waitRow, len(b.rows)-1)
			w.waiters--
		}
	}
	clear(w.queue[:k]) // drop references to the rows' strings
	if k == len(w.queue) {
		w.queue = w.queue[:0]
	} else {
		w.queue = w.queue[k:]
	}
	w.headSeq += uint64(k)
	b.last = w.headSeq - 1
}

// commit writes b, then settles it: its waiters learn the outcome, Flushes
// and callers waiting for room wake up.
func (w *LedgerWriter) commit(ctx context.Context, b *batch) {
	err := w.write(ctx, b)
	if err == nil {
		if len(b.logged) > 0 {
			w.clog.Written(b.logged)
		}
		w.noteStored(b)
	}
	b.logged = b.logged[:0]
	w.mu.Lock()
	if err != nil {
		w.err = errors.Join(w.err, err)
	}
	w.doneSeq = b.last
	w.held -= b.taken
	w.backlog.Store(int64(w.held))
	w.bumpLocked()
	held := w.held
	w.mu.Unlock()
	w.noteBacklog(held)
	for _, c := range b.waiters {
		if c != nil {
			c <- err
		}
	}
	clear(b.rows)
	clear(b.fresh)
	clear(b.waiters)
	b.rows, b.fresh, b.waiters, b.waitRow = b.rows[:0], b.fresh[:0], b.waiters[:0], b.waitRow[:0]
	b.taken = 0
}

// noteStored records what the written batch b left in the store: its open
// rows as they are now, and no more open row for its final ones.
func (w *LedgerWriter) noteStored(b *batch) {
	for _, r := range b.fresh {
		w.stored[r.ID] = r
	}
	for _, r := range b.rows {
		switch {
		case r.ID == "":
		case r.Outcome == OutcomeOpen:
			w.stored[r.ID] = r
		default:
			delete(w.stored, r.ID)
		}
	}
}

// sameButFigures reports whether two versions of an open row differ at
// most in the billable figures ledgerRefreshSQL sets.
func sameButFigures(a, b *LedgerRow) bool {
	return a.ID == b.ID && a.Time.Equal(b.Time) && a.TenantID == b.TenantID && a.KeyID == b.KeyID &&
		a.Model == b.Model && a.Upstream == b.Upstream && a.Stream == b.Stream && a.Endpoint == b.Endpoint &&
		a.Status == b.Status && a.Outcome == b.Outcome && a.Error == b.Error &&
		a.Attempts == b.Attempts && a.Hedged == b.Hedged && a.Stages == b.Stages &&
		len(a.AttemptLog) == 0 && len(b.AttemptLog) == 0 &&
		a.Priority == b.Priority && a.QueueWait == b.QueueWait && a.ReplayOf == b.ReplayOf
}

// sameFigures reports whether two versions of a row bill the same.
func sameFigures(a, b *LedgerRow) bool {
	return a.PromptTokens == b.PromptTokens && a.CompletionTokens == b.CompletionTokens &&
		a.HedgeOverheadTokens == b.HedgeOverheadTokens && a.CostMicros == b.CostMicros
}

// write inserts b's rows, retrying with backoff until it succeeds. Once the
// writer is stopping (closed, or ctx is done), it gives up after
// DrainTimeout and returns the error; the rows are then lost, and logged as
// such. ctx only signals stopping: it never aborts an insert.
func (w *LedgerWriter) write(ctx context.Context, b *batch) error {
	if len(b.rows)+len(b.fresh) == 0 {
		return nil
	}
	backoff := retryMin
	var deadline time.Time
	conflicts := 0
	for {
		// Background: a request's or Run's context ending must not abort
		// the write of rows already accepted.
		_, err := w.store.writeLedger(context.Background(), b.rows, b.fresh)
		if err == nil {
			w.txs.Add(1)
			w.recovered()
			return nil
		}
		if conflicts < maxConflictRetries && conflict(err) {
			// Another gateway's transaction won a lock race: not the
			// ledger failing. Again at once, before anyone is told.
			conflicts++
			continue
		}
		err = fmt.Errorf("insert ledger: %w", err)
		uerr := w.failed(err, len(b.rows)+len(b.fresh))
		w.giveBack(b, uerr)
		left := len(b.rows) + len(b.fresh)
		if left == 0 {
			// Only Commits rode it: their callers record what happened
			// instead, and those rows carry the next attempt. Still failing.
			return nil
		}
		if w.store.closed.Load() {
			// Retrying cannot help, and a straggler's Add must not hang.
			w.log.Error("ledger rows lost: store closed before the ledger writer", "rows", left)
			return fmt.Errorf("write ledger: %d rows lost: store closed", left)
		}
		if deadline.IsZero() && w.isStopping(ctx) {
			deadline = time.Now().Add(w.cfg.DrainTimeout)
		}
		if !deadline.IsZero() && time.Now().After(deadline) {
			w.log.Error("ledger rows lost: write kept failing while stopping", "rows", left, "err", err)
			return fmt.Errorf("write ledger: %d rows lost: %w", left, err)
		}
		time.Sleep(backoff)
		backoff = min(2*backoff, retryMax)
	}
}

// giveBack tells the Commits riding b that their attempt failed and takes
// their rows out of b: a Commit's caller, told its row is not committed,
// records what happened instead. Rows given to Add stay for the retry.
func (w *LedgerWriter) giveBack(b *batch, err error) {
	var drop []bool
	for i, c := range b.waiters {
		if c == nil {
			continue
		}
		c <- err
		b.waiters[i] = nil
		if drop == nil {
			drop = make([]bool, len(b.rows))
		}
		drop[b.waitRow[i]] = true
	}
	if drop == nil {
		return
	}
	kept := b.rows[:0]
	for i, r := range b.rows {
		if !drop[i] {
			kept = append(kept, r)
		}
	}
	n := len(b.rows) - len(kept)
	clear(b.rows[len(kept):])
	b.rows = kept
	b.taken -= n
	b.waiters, b.waitRow = b.waiters[:0], b.waitRow[:0]
	w.mu.Lock()
	w.held -= n
	w.backlog.Store(int64(w.held))
	w.mu.Unlock()
}

func (w *LedgerWriter) isStopping(ctx context.Context) bool {
	select {
	case <-w.stopping:
		return true
	case <-ctx.Done():
		return true
	default:
		return false
	}
}
