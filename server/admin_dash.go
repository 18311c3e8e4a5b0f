package server

import (
	"net/http"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"

	"tailgate/data"
	"tailgate/server/apierr"
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

func (s *Server) handleGetHistory(c echo.Context) error {
	pts, trans := s.hist.snapshot()
	if pts == nil {
		pts = []HistoryPoint{}
	}
	return c.JSON(http.StatusOK, map[string]any{
		"interval_seconds": s.cfg.HistoryInterval.Seconds(),
		"data":             pts,
		"transitions":      trans,
	})
}
