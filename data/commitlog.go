package data

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"

	"github.com/tailgate-dev/tailgate/data/commitlog"
)

// The ledger's commit log makes a committed row durable with one append to
// a file beside the SQLite database (package commitlog: its files, record
// format and recovery), instead of a wait for the SQLite transaction that
// carries it. The guarantee is the one a SQLite commit gives here (WAL,
// synchronous=NORMAL): the bytes are in the operating system's hands, so the
// row survives the gateway's death, not a power loss. The row is then
// written to SQLite like a row given to Add, with the next batch, and the
// log's file is removed once every row in it is in SQLite.
//
// Why: a one-row SQLite transaction is about ten write system calls (a WAL
// frame per page the row touches: the table, its indexes, the tenant's spend)
// and about 100 µs on the path of every JSON answer and stream end; one
// append is a copy into a mapped file (or one write where files are not
// mapped). And rows that need not wait batch up: the SQLite side
// writes many rows per transaction instead of one.
//
// A record's payload is the row as JSON (appendRecord). Rows found in the
// files when a writer opens the log — a gateway that died — are written to
// SQLite before anything else; the ledger's upsert takes a row twice
// harmlessly (a final row is never overwritten), so recovering twice bills
// nothing twice.

// ErrCommitLogLocked says another process owns the commit log of the store.
var ErrCommitLogLocked = commitlog.ErrLocked

// OpenCommitLog lets Commit return once its row is appended to a log file
// beside the database (see the README's "Ledger"), instead of waiting for the
// SQLite transaction. Rows a previous writer logged but had not written to
// SQLite (it died) are written first; OpenCommitLog returns how many of them
// were not in SQLite yet. A torn end of a file (the crash) is cut off; a
// file damaged before its end stops OpenCommitLog with an error that names
// it and says what to do (a *commitlog.CorruptError). Call it before
// [Store.SettleOpen] (a logged final row settles its stream) and before Run.
// A PostgreSQL store has no commit log (its commits are a round trip, and a
// local file would be one gateway's only): OpenCommitLog does nothing. When
// another process holds the log's lock (two gateways on one SQLite file), it
// returns an error wrapping [ErrCommitLogLocked] and Commit keeps waiting
// for transactions.
func (w *LedgerWriter) OpenCommitLog(ctx context.Context) (recovered int, err error) {
	return w.openCommitLog(ctx, commitlog.Config{})
}

func (w *LedgerWriter) openCommitLog(ctx context.Context, cfg commitlog.Config) (recovered int, err error) {
	s := w.store
	if s.engine != engineSQLite {
		return 0, nil
	}
	base, err := s.commitLogBase()
	if err != nil {
		return 0, err
	}
	cfg.ReadOnly = s.readOnly.Load
	cfg.Logger = w.log
	l, err := commitlog.Open(base, cfg, func(file string, payloads [][]byte) error {
		n, err := s.recoverRows(ctx, file, payloads)
		recovered += n
		return err
	})
	if err != nil {
		return recovered, err
	}
	w.mu.Lock()
	w.clog = l
	w.mu.Unlock()
	return recovered, nil
}

// commitLogBase is the path the commit log's files are named after.
func (s *Store) commitLogBase() (string, error) {
	return filepath.Abs(s.path + "-commits")
}

// recoverRows writes the rows of one commit-log file to SQLite and returns
// how many were not there yet.
func (s *Store) recoverRows(ctx context.Context, file string, payloads [][]byte) (int, error) {
	rows := make([]LedgerRow, len(payloads))
	for i, p := range payloads {
		if err := json.Unmarshal(p, &rows[i]); err != nil {
			// The record checked out: written so by a bug, not torn.
			return 0, fmt.Errorf("commit log %s: record %d: %w", file, i+1, err)
		}
	}
	total := 0
	for chunk := range slices.Chunk(rows, 512) {
		n, err := s.insertLedger(ctx, chunk)
		if err != nil {
			return total, fmt.Errorf("recover %d ledger rows from %s: %w", len(rows), file, err)
		}
		total += int(n)
	}
	return total, nil
}

// appendCommit appends row to the commit log and returns the file it went to.
func (w *LedgerWriter) appendCommit(row *LedgerRow) (uint64, error) {
	bp := w.recBufs.Get().(*[]byte)
	*bp = appendRecord((*bp)[:0], row)
	gen, err := w.clog.Append(*bp)
	w.recBufs.Put(bp)
	return gen, err
}
