package data

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/tailgate-dev/tailgate/data/commitlog"
)

// The callers' side of the LedgerWriter: rows enter the queue here, and
// Commit and Flush wait here for the writer to settle them.

// Add queues a final row to be written and returns. It waits only while the
// writer holds Buffer rows, and never drops the row: once the writer has
// stopped, Add writes it itself before returning.
func (w *LedgerWriter) Add(row LedgerRow) {
	if !w.put(row, nil, 0) {
		// Errors are logged by write; Add's callers (request handlers) have
		// no better way to handle them.
		_ = w.writeNow(row)
	}
}

// Commit queues a final row and returns once the row is durable: a crash
// after Commit returned nil cannot lose the row (durable against a process
// crash, not against power loss: SQLite's WAL with synchronous=NORMAL). With
// a commit log (OpenCommitLog) that is one append to the log, and the row
// goes to SQLite with the next batch; without one, Commit waits until the
// transaction holding the row has committed, and rows of concurrent callers
// share one transaction. While writes fail, the commit log is not used.
//
// A non-nil error wrapping [ErrLedgerUnavailable] means the ledger cannot
// write (returned at once if it already could not when Commit was called,
// else when the attempt that carried the row failed): the row is not
// committed and no longer held — the caller decides what happened instead
// (an answer withheld, a stream cut) and records that with Add. ctx's error
// means ctx ended first, and an error wrapping [ErrCommitWait] that
// CommitWait passed: the row stays queued and is written when it can be,
// like a row given to Add. Like Add, Commit waits for room while the writer
// holds Buffer rows, whatever ctx.
func (w *LedgerWriter) Commit(ctx context.Context, row LedgerRow) error {
	if w.clog != nil && w.failure.Load() == nil {
		gen, err := w.appendCommit(&row)
		if err == nil {
			if !w.put(row, nil, gen) {
				// Stopped: written here; should that fail, the log keeps it.
				if w.writeNow(row) == nil {
					w.clog.Written([]commitlog.Count{{Gen: gen, N: 1}})
				}
			}
			return nil
		}
		// The transaction decides: it may work where the append did not.
		w.appendFailed(err)
	}
	done := w.doneChans.Get().(chan error)
	if !w.put(row, done, 0) {
		w.doneChans.Put(done)
		return w.writeNow(row)
	}
	t := time.NewTimer(w.cfg.CommitWait)
	defer t.Stop()
	select {
	case err := <-done:
		w.doneChans.Put(done) // sent to once, and drained
		return err
	case <-ctx.Done():
		// The writer still sends to done: it is not reused.
		return fmt.Errorf("commit ledger row: %w", ctx.Err())
	case <-t.C:
		return fmt.Errorf("commit ledger row: %w after %v", ErrCommitWait, w.cfg.CommitWait)
	}
}

// ErrCommitWait is what Commit's error wraps when the transaction holding
// its row did not commit within LedgerConfig.CommitWait: the row stays
// queued.
var ErrCommitWait = errors.New("ledger transaction still pending")

// Open records a stream in progress: row (its Outcome is set to
// [OutcomeOpen]) is written soon, with the next transaction or within
// FlushInterval (RefreshInterval for a newer version of a row the writer
// took already), and Open never waits for it. Calling Open again with the
// same ID updates the open row (say, with the tokens delivered so far); while
// the previous version is still queued it is replaced in place, so frequent
// updates cost one row per transaction. The row's final version, given to
// Add or Commit with the same ID, replaces the open row, queued or stored; a
// final row is never replaced by an open one.
//
// An open row is not spend: it counts towards its tenant only once it is
// final, or settled by [Store.SettleOpen] after a crash, at the tokens and
// CostMicros it carries then. So an open row should carry the cost of its
// token counts, as a final row does.
//
// Open does not wait for room under Buffer: the writer holds at most two
// versions of one open row (one queued, one being written), so open rows
// are bounded by the streams in flight. Once the writer has stopped, Open
// writes the row itself.
func (w *LedgerWriter) Open(row LedgerRow) {
	row.Outcome = OutcomeOpen
	w.mu.Lock()
	if w.stopped {
		w.mu.Unlock()
		_ = w.writeNow(row)
		return
	}
	seq, ok := w.opens[row.ID]
	if ok && seq >= w.headSeq {
		w.queue[seq-w.headSeq].row = row
		w.mu.Unlock()
		return
	}
	w.opens[row.ID] = w.nextSeq
	// ok: an earlier version was taken already, this one refreshes it.
	signal := w.appendLocked(entry{row: row, refresh: ok})
	w.mu.Unlock()
	if signal {
		w.signal()
	}
}

// put queues a final row, waiting for room under Buffer (unless it replaces
// a queued open row of the same ID, which takes no room). done, if not nil,
// receives the outcome of the transaction that carries the row; if writes
// are failing already, it receives that error at once. put reports false,
// having queued nothing, if the writer has stopped.
func (w *LedgerWriter) put(row LedgerRow, done chan error, gen uint64) bool {
	w.mu.Lock()
	for {
		if w.stopped {
			w.mu.Unlock()
			return false
		}
		if p := w.failure.Load(); p != nil && done != nil {
			// A Commit while writes fail: its row is not taken (the open
			// row it would replace stays).
			w.mu.Unlock()
			done <- *p
			return true
		}
		if seq, ok := w.opens[row.ID]; ok {
			delete(w.opens, row.ID)
			if seq >= w.headSeq {
				e := &w.queue[seq-w.headSeq]
				e.row, e.gen = row, gen
				done = w.waitLocked(e, done)
				nudge := done != nil
				if e.refresh {
					e.refresh = false // a final row waits FlushInterval (or LoggedInterval) at most
					w.eager++
				}
				if gen != 0 {
					w.logged++
				}
				// The first row that may not wait as long as the others.
				nudge = nudge || (gen == 0 && w.eager-w.logged == 1) || (gen != 0 && w.eager == 1)
				w.mu.Unlock()
				if nudge {
					w.signal()
				}
				return true
			}
		}
		if w.held < w.cfg.Buffer {
			break
		}
		ch := w.progress
		w.mu.Unlock()
		<-ch
		w.mu.Lock()
	}
	e := entry{row: row, gen: gen}
	done = w.waitLocked(&e, done)
	signal := w.appendLocked(e)
	w.mu.Unlock()
	if signal || done != nil {
		w.signal()
	}
	return true
}

// waitLocked attaches done to e and returns it.
func (w *LedgerWriter) waitLocked(e *entry, done chan error) chan error {
	if done == nil {
		return nil
	}
	e.done = done
	w.waiters++
	return done
}

// appendLocked adds a new entry to the queue and reports whether the writer
// needs a nudge: the queue was empty (the writer may be asleep), holds a
// full batch now, or holds its first entry that may not wait as long as
// those before it (the writer may be giving them RefreshInterval or
// LoggedInterval; see batchWaitLocked).
func (w *LedgerWriter) appendLocked(e entry) bool {
	w.queue = append(w.queue, e)
	w.nextSeq++
	w.held++
	w.backlog.Store(int64(w.held))
	first := false
	switch {
	case e.refresh:
	case e.gen != 0:
		w.eager++
		w.logged++
		first = w.eager == 1 // may wait less than refreshes only
	default:
		w.eager++
		first = w.eager-w.logged == 1
	}
	return len(w.queue) == 1 || len(w.queue) == w.cfg.BatchSize || first
}

func (w *LedgerWriter) signal() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// writeNow writes one row in the caller's goroutine, for rows that arrive
// after the writer stopped.
func (w *LedgerWriter) writeNow(row LedgerRow) error {
	b := batch{rows: []LedgerRow{row}}
	return w.write(context.Background(), &b)
}

// Flush waits until every row whose Add (or Open) returned before Flush was
// called is committed, or ctx is done. It needs Run to be running (or the
// writer to be closing). It returns an error if rows could not be written.
func (w *LedgerWriter) Flush(ctx context.Context) error {
	w.mu.Lock()
	if w.stopped {
		w.mu.Unlock()
		return w.waitDone(ctx)
	}
	target := w.nextSeq - 1
	if target > w.flushTo {
		w.flushTo = target
	}
	w.mu.Unlock()
	w.signal()
	for {
		w.mu.Lock()
		switch {
		case w.doneSeq >= target:
			err := w.err
			w.mu.Unlock()
			return err
		case w.stopped:
			w.mu.Unlock()
			return w.waitDone(ctx)
		}
		ch := w.progress
		w.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("flush ledger: %w", ctx.Err())
		}
	}
}

// waitDone waits for a stopping writer to finish its drain, after which every
// row given to it before the stop is written (or reported in the error).
func (w *LedgerWriter) waitDone(ctx context.Context) error {
	select {
	case <-w.done:
		return w.result()
	case <-ctx.Done():
		return fmt.Errorf("flush ledger: %w", ctx.Err())
	}
}
