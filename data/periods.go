package data

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Budget periods. A periodic budget resets at the start of each calendar
// period in UTC — the day, the ISO week (Monday) or the month — rather than
// over a rolling window: that is how invoices and LiteLLM's budget_duration
// count, a reset has a time that can be stated (a 429 says when), and every
// gateway sharing a database agrees on the boundary without coordinating.
// A request counts in the period its ledger row's time falls in.
const (
	PeriodNone    = ""
	PeriodDaily   = "daily"
	PeriodWeekly  = "weekly"
	PeriodMonthly = "monthly"
)

// CheckBudgetPeriod reports whether p names a budget period ("" or "none"
// is a lifetime budget).
func CheckBudgetPeriod(p string) error {
	switch p {
	case PeriodNone, PeriodDaily, PeriodWeekly, PeriodMonthly:
		return nil
	}
	return fmt.Errorf("budget period %q: want daily, weekly, monthly or none", p)
}

// PeriodStart is the start of the calendar period (UTC) that t falls in; the
// zero time for a lifetime budget (PeriodNone).
func PeriodStart(period string, t time.Time) time.Time {
	t = t.UTC()
	day := time.Date(t.Year(), t.Month(), t.Day(), 0, 0, 0, 0, time.UTC)
	switch period {
	case PeriodDaily:
		return day
	case PeriodWeekly:
		return day.AddDate(0, 0, -((int(day.Weekday()) + 6) % 7))
	case PeriodMonthly:
		return time.Date(t.Year(), t.Month(), 1, 0, 0, 0, 0, time.UTC)
	}
	return time.Time{}
}

// PeriodEnd is when the period that t falls in ends (the next one's start);
// the zero time for a lifetime budget.
func PeriodEnd(period string, t time.Time) time.Time {
	s := PeriodStart(period, t)
	switch period {
	case PeriodDaily:
		return s.AddDate(0, 0, 1)
	case PeriodWeekly:
		return s.AddDate(0, 0, 7)
	case PeriodMonthly:
		return s.AddDate(0, 1, 0)
	}
	return time.Time{}
}

// microsPerDay is the width of tenant_daily_spend's day.
const microsPerDay = int64(24 * time.Hour / time.Microsecond)

// dayOf is the tenant_daily_spend day that t falls in.
func dayOf(t time.Time) int64 { return toMicros(t) / microsPerDay }

// SetBudgetPeriod sets when a tenant's budget resets (see [PeriodStart];
// PeriodNone: never) and its soft threshold in percent (1–100), and bumps
// the keys version so running gateways reload it.
func (s *Store) SetBudgetPeriod(ctx context.Context, tenantID int64, period string, alertPercent int64) error {
	if err := CheckBudgetPeriod(period); err != nil {
		return fmt.Errorf("set budget period: %w", err)
	}
	if alertPercent < 1 || alertPercent > 100 {
		return errors.New("set budget period: the alert percent must be 1 to 100")
	}
	err := s.updateTenant(ctx, `UPDATE tenants SET budget_period = ?, budget_alert_percent = ? WHERE id = ?`,
		period, alertPercent, tenantID)
	if err != nil {
		return fmt.Errorf("set budget period: %w", err)
	}
	return nil
}

// periodSpendSQL sums a tenant's daily spend from a day on; with
// tenant_spend it is what a budget's check reads.
const periodSpendSQL = `SELECT CAST(COALESCE(SUM(tokens), 0) AS BIGINT), CAST(COALESCE(SUM(micros), 0) AS BIGINT)
	FROM tenant_daily_spend WHERE tenant_id = ? AND day >= ?`

// TenantPeriodSpend returns what the tenant's final ledger rows spent from
// since on (rows whose time is at or after since's UTC day; since is a
// period's start, a midnight). The zero since is the tenant's whole spend.
func (s *Store) TenantPeriodSpend(ctx context.Context, tenantID int64, since time.Time) (Spend, error) {
	var sp Spend
	var err error
	if since.IsZero() {
		err = s.read.QueryRowContext(ctx, `SELECT tokens, micros FROM tenant_spend WHERE tenant_id = ?`, tenantID).Scan(&sp.Tokens, &sp.Micros)
		if errors.Is(err, sql.ErrNoRows) {
			err = nil
		}
	} else {
		err = s.read.QueryRowContext(ctx, periodSpendSQL, tenantID, dayOf(since)).Scan(&sp.Tokens, &sp.Micros)
	}
	if err != nil {
		return Spend{}, fmt.Errorf("tenant %d period spend: %w", tenantID, err)
	}
	return sp, nil
}

// ParseUsageTime reads a bound of a usage query as a user gives it: a time
// in RFC 3339 ("2026-11-01T00:00:00Z"), a date ("2026-11-01", its midnight
// in UTC), or a duration before now in days ("7d") or in Go's syntax
// ("36h", "90m").
func ParseUsageTime(s string, now time.Time) (time.Time, error) {
	s = strings.TrimSpace(s)
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t.UTC(), nil
	}
	if t, err := time.Parse(time.DateOnly, s); err == nil {
		return t, nil
	}
	if days, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.ParseFloat(days, 64)
		if err == nil && n >= 0 && n <= 100*365 {
			return now.Add(-time.Duration(n * float64(24*time.Hour))).UTC(), nil
		}
	} else if d, err := time.ParseDuration(s); err == nil && d >= 0 {
		return now.Add(-d).UTC(), nil
	}
	return time.Time{}, fmt.Errorf("time %q: want a date (2026-11-01), a time in RFC 3339 (2026-11-01T00:00:00Z) or a duration ago (7d, 24h)", s)
}

// ClaimBudgetAlert records that the tenant's budget crossed threshold (a
// percent) in the period that starts at periodStart (zero: a lifetime
// budget), and reports whether this call recorded it — false when it had
// been already, by this gateway or another sharing the database — so that
// an alert goes out once.
func (s *Store) ClaimBudgetAlert(ctx context.Context, tenantID int64, periodStart time.Time, threshold int64) (bool, error) {
	var start int64
	if !periodStart.IsZero() {
		start = toMicros(periodStart)
	}
	var claimed bool
	err := s.writeTx(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `INSERT INTO budget_alerts (tenant_id, period_start, threshold, sent_at) VALUES (?, ?, ?, ?)
			ON CONFLICT (tenant_id, period_start, threshold) DO NOTHING`, tenantID, start, threshold, toMicros(now()))
		if err != nil {
			return err
		}
		n, err := res.RowsAffected()
		claimed = n == 1
		return err
	})
	if err != nil {
		return false, fmt.Errorf("claim budget alert: %w", err)
	}
	return claimed, nil
}
