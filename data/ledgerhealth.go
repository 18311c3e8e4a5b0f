package data

import (
	"fmt"
	"time"
)

// unavailableLogEvery is the most often a failing or backed-up ledger logs
// while the condition lasts; each line says how many failures it stands for.
const unavailableLogEvery = 10 * time.Second

// failureLog is the state of the rate-limited "ledger unavailable" lines.
type failureLog struct {
	failing  bool
	since    time.Time // start of the current streak of failed writes
	last     time.Time // last line logged about it
	count    int       // failed attempts since the last line
	total    int       // failed attempts in the streak
	overfull bool      // the backlog was above the bound after the last batch

	appendLast  time.Time // last line logged about a failed commit-log append
	appendCount int       // failed appends since then
}

// appendFailed logs, at most every unavailableLogEvery, that commit-log
// appends fail (Commits wait for their transaction meanwhile).
func (w *LedgerWriter) appendFailed(err error) {
	now := time.Now()
	w.logMu.Lock()
	defer w.logMu.Unlock()
	l := &w.flog
	l.appendCount++
	if now.Sub(l.appendLast) < unavailableLogEvery {
		return
	}
	w.log.Warn("ledger commit log append failed; answers wait for their SQLite transaction instead", "failures", l.appendCount, "err", err)
	l.appendLast, l.appendCount = now, 0
}

// failed records a failed write of rows: Healthy turns unavailable with an
// error saying why, Commits waiting in the queue are told at once (their
// rows are given back: dropped from the queue), and a line is logged at the start of a streak and at
// most every unavailableLogEvery after. It returns the error Commits get.
func (w *LedgerWriter) failed(err error, rows int) error {
	uerr := fmt.Errorf("%w: %w", ErrLedgerUnavailable, err)
	if code := dbCode(err); code != "" {
		uerr = fmt.Errorf("%w: %s: %w", ErrLedgerUnavailable, code, err)
	}
	w.mu.Lock()
	w.failure.Store(&uerr)
	if w.waiters > 0 {
		for i := range w.queue {
			if c := w.queue[i].done; c != nil {
				c <- uerr
				w.queue[i].done, w.queue[i].dropped = nil, true
				w.queue[i].row = LedgerRow{}
				w.held--
			}
		}
		w.waiters = 0
		w.backlog.Store(int64(w.held))
	}
	held := w.held
	w.mu.Unlock()

	now := time.Now()
	w.logMu.Lock()
	defer w.logMu.Unlock()
	l := &w.flog
	if !l.failing {
		*l = failureLog{failing: true, since: now, last: now, total: 1, overfull: l.overfull}
		w.log.Warn("ledger write failed, retrying; rows are kept", "rows", rows, "held", held, "err", uerr)
		return uerr
	}
	l.count++
	l.total++
	if now.Sub(l.last) >= unavailableLogEvery {
		w.log.Warn("ledger still unavailable, retrying; rows are kept", "failures", l.count,
			"for", now.Sub(l.since).Round(time.Second), "held", held, "err", uerr)
		l.last, l.count = now, 0
	}
	return uerr
}

// recovered records a successful write: Healthy no longer reports a write
// error, and the end of a failing streak is logged once.
func (w *LedgerWriter) recovered() {
	if w.failure.Load() == nil {
		return
	}
	w.mu.Lock()
	w.failure.Store(nil)
	w.mu.Unlock()
	w.logMu.Lock()
	defer w.logMu.Unlock()
	if l := &w.flog; l.failing {
		l.failing = false
		w.log.Info("ledger writes recovered", "failures", l.total, "after", time.Since(l.since).Round(time.Millisecond))
	}
}

// noteBacklog logs when the rows held after a batch cross the soft bound,
// once each way: above it, Healthy refuses new work.
func (w *LedgerWriter) noteBacklog(held int) {
	over := held > w.cfg.MaxBacklog
	w.logMu.Lock()
	defer w.logMu.Unlock()
	if over == w.flog.overfull {
		return
	}
	w.flog.overfull = over
	if over {
		w.log.Warn("ledger backlog above its bound; ledger unavailable until it drains", "held", held, "bound", w.cfg.MaxBacklog)
	} else {
		w.log.Info("ledger backlog back under its bound", "held", held, "bound", w.cfg.MaxBacklog)
	}
}
