package server

import (
	"net/http"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/tailgate-dev/tailgate/data"
	"github.com/tailgate-dev/tailgate/policy"
	"github.com/tailgate-dev/tailgate/server/apierr"
)

// The admin endpoints the dashboard reads besides the plain lists: the
// request log's filters, the requests in flight and the last hour.

// requestFilter reads GET /admin/v1/requests' query: limit (1–1000,
// default 100), tenant, key (a key id), model, replica, status, id.
func requestFilter(c echo.Context) (data.RequestFilter, *apierr.Error) {
	f := data.RequestFilter{Limit: 100, Tenant: c.QueryParam("tenant"), KeyID: c.QueryParam("key"),
		Model: c.QueryParam("model"), Replica: c.QueryParam("replica"), ID: c.QueryParam("id")}
	if v := c.QueryParam("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 || n > 1000 {
			return f, apierr.BadRequest("limit", "limit must be a whole number from 1 to 1000, not %q", v)
		}
		f.Limit = n
	}
	if v := c.QueryParam("status"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 100 || n > 599 {
			return f, apierr.BadRequest("status", "status must be an HTTP status code such as 200 or 429, not %q", v)
		}
		f.Status = n
	}
	return f, nil
}

func (s *Server) handleGetInflight(c echo.Context) error {
	calls := s.live.list()
	now := time.Now()
	out := make([]map[string]any, 0, len(calls))
	for _, lc := range calls {
		out = append(out, map[string]any{"id": lc.ID, "start": lc.Start, "age_ms": float64(now.Sub(lc.Start)) / float64(time.Millisecond),
			"endpoint": lc.Endpoint, "tenant": lc.Tenant, "key_id": lc.KeyID, "key_prefix": lc.KeyPrefix})
	}
	return c.JSON(http.StatusOK, map[string]any{"data": out})
}

// kpiWindow is what the dashboard's first line sums: the last minute.
const kpiWindow = time.Minute

// handleGetHistory answers the last hour's points and replica transitions,
// and what the dashboard's first line shows: the last minute summed
// ("window"), the spend since 00:00 UTC ("spend_today", null when no model
// has a price) and which models have a price ("priced", for the models the
// replicas serve and today's usage names), so money is shown only where
// there is a price.
func (s *Server) handleGetHistory(c echo.Context) error {
	pts, trans := s.hist.snapshot()
	if pts == nil {
		pts = []HistoryPoint{}
	}
	now := time.Now().UTC()
	today, err := s.store.Usage(c.Request().Context(), data.UsageFilter{Since: now.Truncate(24 * time.Hour)})
	if err != nil {
		return err
	}
	priced := map[string]bool{}
	anyPriced := s.priced("") // a model without a price of its own costs the default price
	var micros int64
	for _, u := range today {
		micros += u.CostMicros
		priced[u.Model] = s.priced(u.Model)
	}
	for _, r := range s.reg.Replicas() {
		for _, m := range r.Models() {
			priced[m] = s.priced(m)
		}
	}
	for _, p := range priced {
		anyPriced = anyPriced || p
	}
	var spend *float64
	if anyPriced || micros != 0 {
		v := float64(micros) / 1e6
		spend = &v
	}
	return c.JSON(http.StatusOK, map[string]any{
		"interval_seconds": s.cfg.HistoryInterval.Seconds(),
		"data":             pts,
		"transitions":      trans,
		"window":           s.hist.window(kpiWindow),
		"spend_today":      spend,
		"priced":           priced,
	})
}

// priced reports whether requests for model cost anything.
func (s *Server) priced(model string) bool {
	return s.gate.Cost(model, policy.Usage{PromptTokens: 1_000_000, CompletionTokens: 1_000_000}) > 0
}
