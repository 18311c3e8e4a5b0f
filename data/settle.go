package data

import (
	"context"
	"database/sql"
	"fmt"
)

// SettleOpen settles the ledger rows a previous run left open: every row
// still [OutcomeOpen] becomes [OutcomeInterrupted] with error class
// [ClassInterrupted], billed at the tokens and cost the row last carried,
// its last refresh's in ledger_live (what the gateway last recorded as
// delivered to the client). It returns
// how many rows it settled.
//
// The status stays what the open row says: the status line the client got,
// normally 200, as for any stream that broke after its first token (499 is
// for a client that went away, which is not what happened).
//
// Settling moves the rows into tenant spend, in the same transaction. Call
// it once at start-up, before anything reads [Store.TenantSpend] to seed
// budgets and before this process opens rows of its own: on SQLite an open
// row of a running stream would be settled too (one gateway per file).
//
// On PostgreSQL, where several gateways may share the database, it takes
// this gateway's lease and settles only the open rows of gateways whose
// lease ran out (see [Store.ReapGateways]): never those of a gateway that
// is running.
func (s *Store) SettleOpen(ctx context.Context) (n int, err error) {
	if s.engine == enginePostgres {
		if _, err := s.Renew(ctx); err != nil {
			return 0, fmt.Errorf("settle open rows: %w", err)
		}
		_, n, err := s.ReapGateways(ctx)
		if err != nil {
			return 0, fmt.Errorf("settle open rows: %w", err)
		}
		return n, nil
	}
	err = s.writeTx(ctx, func(tx *sql.Tx) error {
		n, err = s.settleRows(ctx, tx, `UPDATE ledger SET `+liveFigures+`, outcome = ?, error = ? WHERE outcome = ?`+settledSpend,
			OutcomeInterrupted, ClassInterrupted, OutcomeOpen)
		if err != nil {
			return err
		}
		// No row is open now: what is left are the figures of rows made
		// final before a refresh of theirs was written (harmless, unread).
		_, err = tx.ExecContext(ctx, `DELETE FROM ledger_live`)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("settle open rows: %w", err)
	}
	return n, nil
}
