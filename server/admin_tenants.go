package server

import (
	"errors"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/tailgate-dev/tailgate/data"
	"github.com/tailgate-dev/tailgate/policy"
	"github.com/tailgate-dev/tailgate/server/apierr"
)

// TenantView is a tenant as the admin API and `tailgate tenants` show it.
// Budgets of 0 are unlimited; without a BudgetPeriod they are totals over
// the tenant's life, with one they reset at the start of each calendar
// period in UTC (BudgetResetsAt). Spent is what settled requests used over
// the tenant's life, PeriodSpent* what they used in the current period
// (what a periodic budget is checked against); Reserved is
// what requests admitted and still running hold, which only a running
// gateway knows — null where it is not known (the CLI reading the database).
// Where gateways share a PostgreSQL database both are the database's, not
// the answering gateway's share (policy.Gate.TenantTotals).
type TenantView struct {
	Name           string    `json:"name"`
	CreatedAt      time.Time `json:"created_at"`
	BudgetTokens   int64     `json:"budget_tokens"`
	BudgetMicros   int64     `json:"budget_micros"`
	Budget         float64   `json:"budget"`
	SpentTokens    int64     `json:"spent_tokens"`
	SpentMicros    int64     `json:"spent_micros"`
	Spent          float64   `json:"spent"`
	ReservedTokens *int64    `json:"reserved_tokens"`
	ReservedMicros *int64    `json:"reserved_micros"`
	// BudgetPeriod is "daily", "weekly", "monthly" or "" (a lifetime
	// budget); BudgetAlertPercent the soft threshold.
	BudgetPeriod       string     `json:"budget_period"`
	BudgetAlertPercent int64      `json:"budget_alert_percent"`
	BudgetResetsAt     *time.Time `json:"budget_resets_at"`
	PeriodSpentTokens  int64      `json:"period_spent_tokens"`
	PeriodSpentMicros  int64      `json:"period_spent_micros"`
	// BudgetUsedRatio is the share of the budget used in the period, as a
	// running gateway last measured it (tailgate_budget_used_ratio); null
	// where it is not known.
	BudgetUsedRatio *float64 `json:"budget_used_ratio"`
}

// WithPeriod is v with the current period's spend and end (zero: a
// lifetime budget, whose period spend is all of it).
func (v TenantView) WithPeriod(spent data.Spend, resets time.Time) TenantView {
	v.PeriodSpentTokens, v.PeriodSpentMicros = spent.Tokens, spent.Micros
	v.BudgetResetsAt = nil
	if !resets.IsZero() {
		v.BudgetResetsAt = &resets
	}
	return v
}

// ViewTenant converts a tenant and its spend to its view; reserved is nil
// when not known.
func ViewTenant(t data.Tenant, spent data.Spend, reserved *data.Spend) TenantView {
	v := TenantView{Name: t.Name, CreatedAt: t.CreatedAt, BudgetTokens: t.BudgetTokens, BudgetMicros: t.BudgetMicros,
		Budget: float64(t.BudgetMicros) / 1e6, SpentTokens: spent.Tokens, SpentMicros: spent.Micros, Spent: float64(spent.Micros) / 1e6,
		BudgetPeriod: t.BudgetPeriod, BudgetAlertPercent: t.BudgetAlertPercent, PeriodSpentTokens: spent.Tokens, PeriodSpentMicros: spent.Micros}
	if reserved != nil {
		v.ReservedTokens, v.ReservedMicros = &reserved.Tokens, &reserved.Micros
	}
	return v
}

// viewTenant is t's view with its totals (see policy.Gate.TenantTotals:
// the database's where gateways share one).
func viewTenant(t data.Tenant, totals map[int64]policy.TenantTotal) TenantView {
	tt := totals[t.ID]
	v := ViewTenant(t, tt.Spent, &tt.Reserved)
	if t.BudgetPeriod != "" {
		v = v.WithPeriod(tt.PeriodSpent, tt.ResetsAt)
	}
	if t.BudgetTokens > 0 || t.BudgetMicros > 0 {
		r := tt.UsedRatio
		v.BudgetUsedRatio = &r
	}
	return v
}

var errTenantNotFound = &apierr.Error{Status: http.StatusNotFound, Type: "invalid_request_error", Code: "tenant_not_found",
	Message: "no such tenant (a tenant is created with its first key: POST /admin/v1/keys)"}

func (s *Server) handleGetTenants(c echo.Context) error {
	ts, err := s.store.Tenants(c.Request().Context())
	if err != nil {
		return err
	}
	totals, err := s.gate.TenantTotals(c.Request().Context())
	if err != nil {
		return err
	}
	out := make([]TenantView, 0, len(ts))
	for _, t := range ts {
		out = append(out, viewTenant(t, totals))
	}
	return c.JSON(http.StatusOK, map[string]any{"data": out})
}

func (s *Server) handleGetTenant(c echo.Context) error {
	t, err := s.store.TenantByName(c.Request().Context(), c.Param("name"))
	if errors.Is(err, data.ErrNotFound) {
		return apierr.Reply(c, errTenantNotFound)
	} else if err != nil {
		return err
	}
	return s.replyTenant(c, t)
}

// replyTenant answers with t's view.
func (s *Server) replyTenant(c echo.Context, t data.Tenant) error {
	totals, err := s.gate.TenantTotals(c.Request().Context())
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, viewTenant(t, totals))
}

func (s *Server) handlePatchTenant(c echo.Context) error {
	var req struct {
		BudgetTokens       *int64  `json:"budget_tokens"`
		BudgetMicros       *int64  `json:"budget_micros"`
		BudgetPeriod       *string `json:"budget_period"`
		BudgetAlertPercent *int64  `json:"budget_alert_percent"`
	}
	const fields = "budget_tokens, budget_micros, budget_period (daily, weekly, monthly or none), budget_alert_percent (1-100)"
	if ae := decodeAdminBody(c, &req, fields); ae != nil {
		return apierr.Reply(c, ae)
	}
	if req.BudgetPeriod != nil {
		if err := data.CheckBudgetPeriod(policy.NormalizePeriod(*req.BudgetPeriod)); err != nil {
			return apierr.Reply(c, apierr.BadRequest("budget_period", "%v", err))
		}
	}
	switch {
	case req.BudgetAlertPercent != nil && (*req.BudgetAlertPercent < 1 || *req.BudgetAlertPercent > 100):
		return apierr.Reply(c, apierr.BadRequest("budget_alert_percent", "the alert percent must be 1 to 100"))
	case req.BudgetTokens == nil && req.BudgetMicros == nil && req.BudgetPeriod == nil && req.BudgetAlertPercent == nil:
		return apierr.Reply(c, apierr.BadRequest("", "nothing to change: send %s (0 = unlimited)", fields))
	case req.BudgetTokens != nil && *req.BudgetTokens < 0:
		return apierr.Reply(c, apierr.BadRequest("budget_tokens", "budgets must not be negative (0 = unlimited)"))
	case req.BudgetMicros != nil && *req.BudgetMicros < 0:
		return apierr.Reply(c, apierr.BadRequest("budget_micros", "budgets must not be negative (0 = unlimited)"))
	}
	ctx := c.Request().Context()
	name := c.Param("name")
	if req.BudgetMicros != nil {
		// A money budget no price can reach would never be enforced.
		var unpriced *policy.UnpricedBudget
		if err := s.gate.CheckBudget(ctx, name, *req.BudgetMicros); errors.As(err, &unpriced) {
			return apierr.Reply(c, apierr.BadRequest("budget_micros", "%s", unpriced.Error()))
		} else if err != nil {
			return err
		}
	}
	t, err := policy.ChangeBudget(ctx, s.store, name, policy.BudgetChange{Tokens: req.BudgetTokens, Micros: req.BudgetMicros,
		Period: req.BudgetPeriod, AlertPercent: req.BudgetAlertPercent})
	if errors.Is(err, data.ErrNotFound) {
		return apierr.Reply(c, errTenantNotFound)
	} else if err != nil {
		return err
	}
	s.log.Info("tenant budget set", "tenant", t.Name, "budget_tokens", t.BudgetTokens, "budget_micros", t.BudgetMicros,
		"budget_period", t.BudgetPeriod, "budget_alert_percent", t.BudgetAlertPercent)
	return s.replyTenant(c, t)
}

func (s *Server) handlePatchKey(c echo.Context) error {
	ref := c.Param("ref")
	if policy.IsSecret(ref) {
		return apierr.Reply(c, apierr.BadRequest("ref", "never put a key's secret in a URL: it ends up in logs. "+
			"Use the key's id or display prefix here; consider this secret exposed"))
	}
	var req struct {
		RPM            *int64    `json:"rpm"`
		TPM            *int64    `json:"tpm"`
		MaxConcurrency *int64    `json:"max_concurrency"`
		Models         *[]string `json:"models"`
		Expires        *string   `json:"expires"`
		Class          *string   `json:"class"`
		Name           *string   `json:"name"`
		Owner          *string   `json:"owner"`
		Note           *string   `json:"note"`
	}
	const fields = "rpm, tpm, max_concurrency, models ([] = every model), expires (30d, 720h, RFC 3339 or never), class (interactive, standard or batch), name, owner, note"
	if ae := decodeAdminBody(c, &req, fields); ae != nil {
		return apierr.Reply(c, ae)
	}
	u := data.KeyUpdate{RPM: req.RPM, TPM: req.TPM, MaxConcurrency: req.MaxConcurrency, Models: req.Models, Class: req.Class,
		Name: req.Name, Owner: req.Owner, Note: req.Note}
	if req.Name != nil {
		if err := data.CheckKeyName(*req.Name); err != nil {
			return apierr.Reply(c, apierr.BadRequest("name", "%v", err))
		}
	}
	switch {
	case u.RPM == nil && u.TPM == nil && u.MaxConcurrency == nil && u.Models == nil && req.Expires == nil && u.Class == nil &&
		u.Name == nil && u.Owner == nil && u.Note == nil:
		return apierr.Reply(c, apierr.BadRequest("", "nothing to change: send any of %s", fields))
	case u.RPM != nil && *u.RPM < 0, u.TPM != nil && *u.TPM < 0, u.MaxConcurrency != nil && *u.MaxConcurrency < 0:
		return apierr.Reply(c, apierr.BadRequest("", "limits must not be negative (0 = unlimited)"))
	}
	if u.Models != nil {
		for _, m := range *u.Models {
			if m == "" {
				return apierr.Reply(c, apierr.BadRequest("models", "empty model name; send [] to allow every model"))
			}
		}
	}
	if req.Class != nil {
		if _, err := policy.ParseClass(*req.Class); err != nil {
			return apierr.Reply(c, apierr.BadRequest("class", "%v", err))
		}
	}
	if req.Expires != nil {
		exp, err := policy.ParseExpiry(*req.Expires, time.Now())
		if err != nil {
			return apierr.Reply(c, apierr.BadRequest("expires", "%v", err))
		}
		u.ExpiresAt = &exp
	}
	k, err := policy.EditKey(c.Request().Context(), s.store, ref, u)
	switch {
	case errors.Is(err, data.ErrNotFound):
		return apierr.Reply(c, &apierr.Error{Status: http.StatusNotFound, Type: "invalid_request_error", Code: "key_not_found", Message: "no such key"})
	case errors.Is(err, data.ErrAmbiguous):
		return apierr.Reply(c, apierr.BadRequest("ref", "that prefix matches more than one key; use the key id"))
	case errors.Is(err, data.ErrRevoked):
		return apierr.Reply(c, &apierr.Error{Status: http.StatusConflict, Type: "invalid_request_error", Code: "key_revoked",
			Message: "that key is revoked and cannot be edited; create a new one"})
	case errors.Is(err, data.ErrNameTaken):
		return apierr.Reply(c, &apierr.Error{Status: http.StatusConflict, Type: "invalid_request_error", Code: "key_name_taken", Param: "name",
			Message: "another active key of the tenant has that name: revoke it or pick another name"})
	case err != nil:
		return err
	}
	s.log.Info("key edited", "key_id", k.ID, "prefix", k.Prefix, "tenant", k.Tenant.Name)
	return c.JSON(http.StatusOK, map[string]any{"key": ViewKey(k, time.Now())})
}
