package data

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
)

const tenantCols = `id, name, budget_tokens, budget_micros, budget_period, budget_alert_percent, created_at`

type rowScanner interface{ Scan(dest ...any) error }

func scanTenant(r rowScanner) (Tenant, error) {
	var t Tenant
	var created int64
	if err := r.Scan(&t.ID, &t.Name, &t.BudgetTokens, &t.BudgetMicros, &t.BudgetPeriod, &t.BudgetAlertPercent, &created); err != nil {
		return Tenant{}, err
	}
	t.CreatedAt = fromMicros(created)
	return t, nil
}

// EnsureTenant returns the tenant called name, creating it (with no budget)
// if it does not exist yet.
func (s *Store) EnsureTenant(ctx context.Context, name string) (Tenant, error) {
	if name == "" {
		return Tenant{}, errors.New("ensure tenant: empty name")
	}
	var t Tenant
	err := s.writeTx(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx,
			`INSERT INTO tenants (name, created_at) VALUES (?, ?) ON CONFLICT (name) DO NOTHING`,
			name, toMicros(now())); err != nil {
			return err
		}
		var err error
		t, err = scanTenant(tx.QueryRowContext(ctx, `SELECT `+tenantCols+` FROM tenants WHERE name = ?`, name))
		return err
	})
	if err != nil {
		return Tenant{}, fmt.Errorf("ensure tenant: %w", err)
	}
	return t, nil
}

// SetTenantBudget sets a tenant's budget (0 = unlimited) and bumps the keys
// version so running gateways reload it.
func (s *Store) SetTenantBudget(ctx context.Context, tenantID int64, tokens, micros int64) error {
	if tokens < 0 || micros < 0 {
		return errors.New("set tenant budget: negative budget")
	}
	err := s.updateTenant(ctx, `UPDATE tenants SET budget_tokens = ?, budget_micros = ? WHERE id = ?`, tokens, micros, tenantID)
	if err != nil {
		return fmt.Errorf("set tenant budget: %w", err)
	}
	return nil
}

// Tenants returns every tenant in order of creation.
func (s *Store) Tenants(ctx context.Context) ([]Tenant, error) {
	rows, err := s.read.QueryContext(ctx, `SELECT `+tenantCols+` FROM tenants ORDER BY id`)
	if err != nil {
		return nil, fmt.Errorf("tenants: %w", err)
	}
	defer rows.Close()
	var ts []Tenant
	for rows.Next() {
		t, err := scanTenant(rows)
		if err != nil {
			return nil, fmt.Errorf("tenants: %w", err)
		}
		ts = append(ts, t)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("tenants: %w", err)
	}
	return ts, nil
}

// TenantByName returns the tenant called name, or [ErrNotFound].
func (s *Store) TenantByName(ctx context.Context, name string) (Tenant, error) {
	t, err := scanTenant(s.read.QueryRowContext(ctx, `SELECT `+tenantCols+` FROM tenants WHERE name = ?`, name))
	if errors.Is(err, sql.ErrNoRows) {
		err = ErrNotFound
	}
	if err != nil {
		return Tenant{}, fmt.Errorf("tenant %q: %w", name, err)
	}
	return t, nil
}

// updateTenant runs one UPDATE of a tenant's row (ErrNotFound when it
// changed none) and tells running gateways, which reload within a second.
func (s *Store) updateTenant(ctx context.Context, query string, args ...any) error {
	return s.writeTx(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, query, args...)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil {
			return err
		} else if n == 0 {
			return ErrNotFound
		}
		return bumpKeysVersion(ctx, tx)
	})
}
