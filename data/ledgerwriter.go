package data

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// LedgerConfig tunes a [LedgerWriter]. Zero (or negative) fields take the
// documented defaults.
type LedgerConfig struct {
	// BatchSize is the most rows written in one transaction; 0 means 512.
	BatchSize int
	// FlushInterval is the longest a row waits for its batch to fill before
	// the batch is written anyway; 0 means 20ms.
	FlushInterval time.Duration
	// Buffer is how many rows may wait to be written; Add blocks once it is
	// full. 0 means 16384.
	Buffer int
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
		c.FlushInterval = 20 * time.Millisecond
	}
	if c.Buffer <= 0 {
		c.Buffer = 16384
	}
	if c.DrainTimeout <= 0 {
		c.DrainTimeout = 30 * time.Second
	}
	return c
}

// Backoff between attempts of a failing batch write.
const (
	retryMin = 10 * time.Millisecond
	retryMax = 2 * time.Second
)

// ledgerItem is a row, or (flush != nil) a Flush marker: the channel is FIFO,
// so once the writer reaches a marker every row sent before it is in hand.
type ledgerItem struct {
	row   LedgerRow
	flush chan error
}

// LedgerWriter batches ledger rows from many requests into few transactions.
// [LedgerWriter.Run] is its one writing goroutine; [LedgerWriter.Add] never
// loses a row, and [LedgerWriter.Close] writes every row it was given before
// it returns.
type LedgerWriter struct {
	store *Store
	cfg   LedgerConfig
	log   *slog.Logger
	items chan ledgerItem

	// stopping is closed when the writer starts to stop; it wakes Adds and
	// Flushes blocked on a full buffer.
	stopping chan struct{}
	stopOnce sync.Once
	// sendMu fences senders: Add and Flush hold it shared while they put an
	// item into items, stop takes it exclusively once. After that no item
	// can enter, so a drain that empties items has seen every row.
	sendMu  sync.RWMutex
	stopped bool // guarded by sendMu

	mu      sync.Mutex
	claimed bool  // a consumer (Run, or Close if Run never started) owns items
	err     error // what stopping could not write; final once done is closed
	done    chan struct{}

	failing atomic.Bool // inside a streak of failed writes (logged once)
}

// NewLedgerWriter returns a writer for s. Start [LedgerWriter.Run] in a
// goroutine, and Close the writer before the Store.
func (s *Store) NewLedgerWriter(cfg LedgerConfig, log *slog.Logger) *LedgerWriter {
	cfg = cfg.withDefaults()
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &LedgerWriter{
		store:    s,
		cfg:      cfg,
		log:      log,
		items:    make(chan ledgerItem, cfg.Buffer),
		stopping: make(chan struct{}),
		done:     make(chan struct{}),
	}
}

// Add queues row to be written. It blocks only while the buffer is full, and
// never drops the row: once the writer has stopped, Add writes it itself
// before returning.
func (w *LedgerWriter) Add(row LedgerRow) {
	w.sendMu.RLock()
	if !w.stopped {
		select {
		case w.items <- ledgerItem{row: row}:
			w.sendMu.RUnlock()
			return
		case <-w.stopping:
		}
	}
	w.sendMu.RUnlock()
	// Errors are logged by write; Add's callers (request handlers) have no
	// better way to handle them.
	_ = w.write(context.Background(), []LedgerRow{row})
}

// Flush waits until every row whose Add returned before Flush was called is
// committed, or ctx is done. It needs Run to be running (or the writer to be
// closing). It returns an error if some of those rows could not be written.
func (w *LedgerWriter) Flush(ctx context.Context) error {
	c := make(chan error, 1)
	w.sendMu.RLock()
	if w.stopped {
		w.sendMu.RUnlock()
		return w.waitDone(ctx)
	}
	select {
	case w.items <- ledgerItem{flush: c}:
		w.sendMu.RUnlock()
	case <-w.stopping:
		w.sendMu.RUnlock()
		return w.waitDone(ctx)
	case <-ctx.Done():
		w.sendMu.RUnlock()
		return fmt.Errorf("flush ledger: %w", ctx.Err())
	}
	select {
	case err := <-c:
		return err
	case <-ctx.Done():
		return fmt.Errorf("flush ledger: %w", ctx.Err())
	}
}

// waitDone waits for a stopping writer to finish its drain, after which every
// row Added before the stop is written (or reported in the error).
func (w *LedgerWriter) waitDone(ctx context.Context) error {
	select {
	case <-w.done:
		return w.result()
	case <-ctx.Done():
		return fmt.Errorf("flush ledger: %w", ctx.Err())
	}
}

// Run writes batches until ctx is done or the writer is closed, then writes
// every row still buffered and returns. It returns nil unless some rows could
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
	close(w.done)
	return w.result()
}

// Close stops the writer, waits until every buffered row is written (by Run,
// or here if Run was never started) and returns what could not be written.
// It is safe to call more than once.
func (w *LedgerWriter) Close() error {
	w.stop()
	w.mu.Lock()
	consume := !w.claimed
	w.claimed = true
	w.mu.Unlock()
	if consume {
		w.drain()
		close(w.done)
	}
	<-w.done
	return w.result()
}

func (w *LedgerWriter) stop() {
	w.stopOnce.Do(func() {
		close(w.stopping) // releases senders blocked on a full buffer...
		w.sendMu.Lock()   // ...so that this cannot wait on them forever
		w.stopped = true
		w.sendMu.Unlock()
	})
}

func (w *LedgerWriter) result() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

// loop is Run's steady state: wait for a row, gather more until the batch is
// full, FlushInterval has passed or a Flush asks for it, write, repeat.
func (w *LedgerWriter) loop(ctx context.Context) {
	b := w.newBatch()
	timer := time.NewTimer(w.cfg.FlushInterval)
	timer.Stop()
	for {
		select {
		case it := <-w.items:
			b.add(it)
		case <-ctx.Done():
			return
		case <-w.stopping:
			return
		}
		if !b.ready(w.cfg.BatchSize) {
			timer.Reset(w.cfg.FlushInterval)
		fill:
			for !b.ready(w.cfg.BatchSize) {
				select {
				case it := <-w.items:
					b.add(it)
				case <-timer.C:
					break fill
				case <-ctx.Done():
					break fill
				case <-w.stopping:
					break fill
				}
			}
			timer.Stop()
		}
		w.commit(ctx, &b)
	}
}

// drain writes everything left in items once the writer is stopped (no
// sender can add more).
func (w *LedgerWriter) drain() {
	b := w.newBatch()
	for {
	fill:
		for !b.ready(w.cfg.BatchSize) {
			select {
			case it := <-w.items:
				b.add(it)
			default:
				break fill
			}
		}
		if len(b.rows) == 0 && len(b.flushes) == 0 {
			return
		}
		w.commit(context.Background(), &b)
	}
}

func (w *LedgerWriter) newBatch() batch {
	return batch{rows: make([]LedgerRow, 0, min(w.cfg.BatchSize, 1024))}
}

// batch is the rows gathered for one transaction and the Flushes waiting on
// them.
type batch struct {
	rows    []LedgerRow
	flushes []chan error
}

func (b *batch) add(it ledgerItem) {
	if it.flush != nil {
		b.flushes = append(b.flushes, it.flush)
		return
	}
	b.rows = append(b.rows, it.row)
}

// ready reports whether the batch should be written now: it is full, or a
// Flush is waiting (rows behind its marker belong to the next batch).
func (b *batch) ready(size int) bool { return len(b.rows) >= size || len(b.flushes) > 0 }

func (w *LedgerWriter) commit(ctx context.Context, b *batch) {
	err := w.write(ctx, b.rows)
	if err != nil {
		w.mu.Lock()
		w.err = errors.Join(w.err, err)
		w.mu.Unlock()
	}
	for _, c := range b.flushes {
		c <- err
	}
	clear(b.rows) // drop references to the rows' strings
	b.rows, b.flushes = b.rows[:0], b.flushes[:0]
}

// write inserts rows, retrying with backoff until it succeeds. Once the
// writer is stopping (closed, or ctx is done), it gives up after
// DrainTimeout and returns the error; the rows are then lost, and logged as
// such. ctx only signals stopping: it never aborts an insert.
func (w *LedgerWriter) write(ctx context.Context, rows []LedgerRow) error {
	if len(rows) == 0 {
		return nil
	}
	backoff := retryMin
	var deadline time.Time
	for {
		// Background: a request's or Run's context ending must not abort
		// the write of rows already accepted.
		err := w.store.InsertLedger(context.Background(), rows)
		if err == nil {
			if w.failing.Swap(false) {
				w.log.Info("ledger writes recovered")
			}
			return nil
		}
		if !w.failing.Swap(true) {
			w.log.Warn("ledger write failed, retrying; rows are kept", "rows", len(rows), "err", err)
		}
		if w.store.closed.Load() {
			// Retrying cannot help, and a straggler's Add must not hang.
			w.log.Error("ledger rows lost: store closed before the ledger writer", "rows", len(rows))
			return fmt.Errorf("write ledger: %d rows lost: store closed", len(rows))
		}
		if deadline.IsZero() && w.isStopping(ctx) {
			deadline = time.Now().Add(w.cfg.DrainTimeout)
		}
		if !deadline.IsZero() && time.Now().After(deadline) {
			w.log.Error("ledger rows lost: write kept failing while stopping", "rows", len(rows), "err", err)
			return fmt.Errorf("write ledger: %d rows lost: %w", len(rows), err)
		}
		time.Sleep(backoff)
		backoff = min(2*backoff, retryMax)
	}
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
