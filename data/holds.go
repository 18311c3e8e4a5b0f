package data

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"time"
)

// Several gateways may share one PostgreSQL database. Each is an instance
// with a lease in the gateways table, renewed while it runs ([Store.Renew]);
// the ledger rows it writes carry its instance id, and so do its budget
// holds: what it reserved of a tenant's budget for requests it admitted and
// whose final ledger rows are not written yet.
//
// The invariant, kept by the database: a tenant's spend (tenant_spend, fed
// by final ledger rows) plus every gateway's hold never exceeds its budget.
// [Store.ReserveBudget] grows a hold only if that still holds, under a lock
// on the tenant's row; a final ledger row moves its cost from its gateway's
// hold to spend in the transaction that writes it (see spend.go);
// [Store.ReleaseBudget] gives back what a settled request reserved beyond
// its cost. A gateway whose lease ran out (it died) is reaped by any other
// ([Store.ReapGateways]): its open rows are settled as interrupted, billed
// at what their clients had received, and its holds are dropped.

// LeaseTTL is how long a gateway's lease lasts without renewal. A gateway
// renews it every [LeaseRenewEvery]; one that stops (SIGKILL, power loss) is
// reaped by the others once it has run out.
const (
	LeaseTTL        = 10 * time.Second
	LeaseRenewEvery = time.Second
)

// bookConns is the size of the reservation pool.
const bookConns = 4

func newInstanceID() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "gw_" + hex.EncodeToString(b[:])
}

// Instance returns the id this Store writes ledger rows, leases and budget
// holds under on PostgreSQL, "" on SQLite.
func (s *Store) Instance() string { return s.instance }

// SharedBudgets reports whether budgets must be reserved in the database
// ([Store.ReserveBudget]) because other gateways may spend them too; false
// on SQLite, whose one gateway reserves in memory.
func (s *Store) SharedBudgets() bool { return s.engine == enginePostgres }

// Renew takes or extends this instance's lease for [LeaseTTL]. It reports
// whether the lease had to be taken anew (first call, or after the others
// reaped this gateway because it had not renewed in time — its holds are
// gone and its open rows settled then).
func (s *Store) Renew(ctx context.Context) (fresh bool, err error) {
	if s.engine != enginePostgres {
		return false, nil
	}
	t := now()
	until := toMicros(t.Add(LeaseTTL))
	res, err := s.book.ExecContext(ctx, `UPDATE gateways SET lease_until = ? WHERE id = ?`, until, s.instance)
	if err != nil {
		return false, fmt.Errorf("renew gateway lease: %w", err)
	}
	if n, _ := res.RowsAffected(); n > 0 {
		s.leased.Store(true)
		return false, nil
	}
	if _, err := s.book.ExecContext(ctx,
		`INSERT INTO gateways (id, started_at, lease_until) VALUES (?, ?, ?)
		 ON CONFLICT (id) DO UPDATE SET lease_until = excluded.lease_until`,
		s.instance, toMicros(t), until); err != nil {
		return false, fmt.Errorf("take gateway lease: %w", err)
	}
	s.leased.Store(true)
	return true, nil
}

// LiveGateways counts the gateways whose lease is live, this one included
// once it renewed; 1 on SQLite (one gateway per database).
func (s *Store) LiveGateways(ctx context.Context) (int, error) {
	if s.engine != enginePostgres {
		return 1, nil
	}
	var n int
	if err := s.book.QueryRowContext(ctx, `SELECT COUNT(*) FROM gateways WHERE lease_until >= ?`, toMicros(now())).Scan(&n); err != nil {
		return 0, fmt.Errorf("count gateways: %w", err)
	}
	return n, nil
}

// ReapGateways settles what gateways whose lease ran out left behind: their
// open ledger rows become interrupted (billed at what their clients had
// received, moved from their holds into spend) and their remaining budget
// holds are dropped, in one transaction. Open rows that name no gateway
// (written before gateways had leases) count as left behind. It returns how
// many gateways and rows it settled. Only PostgreSQL has leases; on SQLite
// it does nothing.
func (s *Store) ReapGateways(ctx context.Context) (gateways, rows int, err error) {
	if s.engine != enginePostgres {
		return 0, 0, nil
	}
	err = s.writeTx(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `DELETE FROM gateways WHERE lease_until < ?`, toMicros(now()))
		if err != nil {
			return err
		}
		n, _ := res.RowsAffected()
		gateways = int(n)
		rows, err = s.settleRows(ctx, tx, `UPDATE ledger SET `+liveFigures+`, outcome = ?, error = ?
			WHERE outcome = ? AND gateway NOT IN (SELECT id FROM gateways)`+settledSpend,
			OutcomeInterrupted, ClassInterrupted, OutcomeOpen)
		if err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, `DELETE FROM budget_holds WHERE gateway NOT IN (SELECT id FROM gateways)`)
		return err
	})
	if err != nil {
		return 0, 0, fmt.Errorf("reap gateways: %w", err)
	}
	return gateways, rows, nil
}

// BudgetCheck is a tenant's budget as the database saw it when
// [Store.ReserveBudget] decided: its budget (0: unlimited), what final
// ledger rows have spent of it, and what all gateways hold of it (this
// reservation included when OK).
type BudgetCheck struct {
	OK                  bool
	Budget, Spent, Held Spend
	// Period is the tenant's budget period (see [PeriodStart]) and Resets
	// when the period Spent counts ends (zero: never).
	Period string
	Resets time.Time
}

// ReserveBudget adds tokens and micros to this gateway's hold of the
// tenant's budget if the tenant's spend plus every gateway's holds plus this
// reservation fit its budget (each part that is not 0). It is one database
// transaction, serialized per tenant by a lock on the tenant's row, so two
// gateways cannot both take the last of a budget. Only for PostgreSQL (see
// [Store.SharedBudgets]); an error means nothing was reserved.
func (s *Store) ReserveBudget(ctx context.Context, tenantID, tokens, micros int64) (BudgetCheck, error) {
	return s.ReserveBudgetAt(ctx, tenantID, tokens, micros, now())
}

// ReserveBudgetAt is [Store.ReserveBudget] for a request made at: a
// periodic budget counts the spend of the period at falls in (final ledger
// rows whose time is in it). Holds have no period: what gateways hold
// counts against the current period, however old the requests it is for —
// a request admitted before a boundary and settled after it holds budget of
// the new period until its row, which counts in the old one, is written.
// So the spend of rows in a period plus the holds never exceed the budget.
func (s *Store) ReserveBudgetAt(ctx context.Context, tenantID, tokens, micros int64, at time.Time) (BudgetCheck, error) {
	if s.engine != enginePostgres {
		return BudgetCheck{}, errors.New("reserve budget: budgets are reserved in the database only on PostgreSQL")
	}
	if !s.leased.Load() {
		if _, err := s.Renew(ctx); err != nil {
			return BudgetCheck{}, fmt.Errorf("reserve budget: %w", err)
		}
	}
	var c BudgetCheck
	err := func() error {
		tx, err := s.book.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		err = tx.QueryRowContext(ctx, `SELECT budget_tokens, budget_micros, budget_period FROM tenants WHERE id = ? FOR UPDATE`, tenantID).
			Scan(&c.Budget.Tokens, &c.Budget.Micros, &c.Period)
		if errors.Is(err, sql.ErrNoRows) {
			return ErrNotFound
		}
		if err != nil {
			return err
		}
		// One statement, one snapshot: a ledger row moving cost from a hold
		// into spend is seen entirely or not at all.
		spent := `COALESCE((SELECT tokens FROM tenant_spend WHERE tenant_id = ?), 0),
			COALESCE((SELECT micros FROM tenant_spend WHERE tenant_id = ?), 0)`
		args := []any{tenantID, tenantID}
		if start := PeriodStart(c.Period, at); !start.IsZero() {
			c.Resets = PeriodEnd(c.Period, at)
			spent = `COALESCE((SELECT SUM(tokens) FROM tenant_daily_spend WHERE tenant_id = ? AND day >= ?), 0)::BIGINT,
			COALESCE((SELECT SUM(micros) FROM tenant_daily_spend WHERE tenant_id = ? AND day >= ?), 0)::BIGINT`
			args = []any{tenantID, dayOf(start), tenantID, dayOf(start)}
		}
		err = tx.QueryRowContext(ctx, `SELECT `+spent+`,
			COALESCE((SELECT SUM(tokens) FROM budget_holds WHERE tenant_id = ?), 0)::BIGINT,
			COALESCE((SELECT SUM(micros) FROM budget_holds WHERE tenant_id = ?), 0)::BIGINT`,
			append(args, tenantID, tenantID)...).
			Scan(&c.Spent.Tokens, &c.Spent.Micros, &c.Held.Tokens, &c.Held.Micros)
		if err != nil {
			return err
		}
		if !within(c.Budget.Tokens, c.Spent.Tokens, c.Held.Tokens, tokens) ||
			!within(c.Budget.Micros, c.Spent.Micros, c.Held.Micros, micros) {
			return nil
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO budget_holds (gateway, tenant_id, tokens, micros) VALUES (?, ?, ?, ?)
			ON CONFLICT (gateway, tenant_id) DO UPDATE SET
				tokens = budget_holds.tokens + excluded.tokens, micros = budget_holds.micros + excluded.micros`,
			s.instance, tenantID, tokens, micros); err != nil {
			return err
		}
		if err := tx.Commit(); err != nil {
			return err
		}
		c.OK = true
		c.Held.Tokens += tokens
		c.Held.Micros += micros
		return nil
	}()
	if err != nil {
		return BudgetCheck{}, fmt.Errorf("reserve budget of tenant %d: %w", tenantID, err)
	}
	return c, nil
}

// within reports whether spent+held+need ≤ budget, a budget of 0 being
// unlimited, without overflowing.
func within(budget, spent, held, need int64) bool {
	if budget <= 0 {
		return true
	}
	left := budget - spent - held
	return left >= 0 && need <= left
}

// ReleaseBudget takes tokens and micros out of this gateway's hold of the
// tenant's budget (never below zero): what a settled request reserved beyond
// what its ledger row will bill.
func (s *Store) ReleaseBudget(ctx context.Context, tenantID, tokens, micros int64) error {
	if s.engine != enginePostgres {
		return nil
	}
	_, err := s.book.ExecContext(ctx, `UPDATE budget_holds SET
		tokens = GREATEST(tokens - ?, 0), micros = GREATEST(micros - ?, 0)
		WHERE gateway = ? AND tenant_id = ?`, tokens, micros, s.instance, tenantID)
	if err != nil {
		return fmt.Errorf("release budget of tenant %d: %w", tenantID, err)
	}
	return nil
}

// BudgetHeld returns what every gateway holds of each tenant's budget
// (PostgreSQL; empty on SQLite).
func (s *Store) BudgetHeld(ctx context.Context) (map[int64]Spend, error) {
	out := make(map[int64]Spend)
	if s.engine != enginePostgres {
		return out, nil
	}
	rows, err := s.read.QueryContext(ctx, `SELECT tenant_id, SUM(tokens)::BIGINT, SUM(micros)::BIGINT FROM budget_holds GROUP BY tenant_id`)
	if err != nil {
		return nil, fmt.Errorf("budget held: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var id int64
		var sp Spend
		if err := rows.Scan(&id, &sp.Tokens, &sp.Micros); err != nil {
			return nil, fmt.Errorf("budget held: %w", err)
		}
		out[id] = sp
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("budget held: %w", err)
	}
	return out, nil
}
