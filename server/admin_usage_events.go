package server

import (
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/tailgate-dev/tailgate/data"
	"github.com/tailgate-dev/tailgate/server/apierr"
)

// Usage events: each final ledger row of a tenant's request, exported for a
// billing system (Stripe meter events, OpenMeter, Lago, any CloudEvents
// sink) under an id that never changes, so the receiver deduplicates by
// construction. GET /admin/v1/usage/events pulls them from a cursor; the
// usage webhook (usage_sink.go) pushes them. data.UsageEvent says what a
// version is and how the cursor's order is kept.

// UsageEventType is the CloudEvents type of a usage event; a change of the
// data's meaning gets a new version of it.
const UsageEventType = "tailgate.usage.v1"

// UsageEventSource is the CloudEvents source of every usage event. It is
// the same on every gateway of a deployment: OpenMeter deduplicates on
// source and id together, so one event must not get two sources.
const UsageEventSource = "tailgate"

// UsageEventJSON is a usage event as exported: a CloudEvents 1.0 event in
// its JSON format.
type UsageEventJSON struct {
	SpecVersion string `json:"specversion"` // "1.0"
	// ID is the request id and the row's version, "req_….v1": the same
	// every time this version is read, a new one for a corrected row.
	ID     string `json:"id"`
	Source string `json:"source"` // UsageEventSource
	Type   string `json:"type"`   // UsageEventType
	// Time is when the request started, the same for every version.
	Time            time.Time      `json:"time"`
	Subject         string         `json:"subject"` // the tenant's name
	DataContentType string         `json:"datacontenttype"`
	Data            UsageEventData `json:"data"`
}

// UsageEventData is what a usage event bills.
type UsageEventData struct {
	RequestID        string `json:"request_id"` // the x-request-id the client got
	Version          int64  `json:"version"`
	Tenant           string `json:"tenant"`
	TenantID         int64  `json:"tenant_id"`
	KeyID            string `json:"key_id"`
	Model            string `json:"model"`
	Endpoint         string `json:"endpoint"` // e.g. /v1/chat/completions; "" where the row names none
	PromptTokens     int64  `json:"prompt_tokens"`
	CompletionTokens int64  `json:"completion_tokens"`
	TotalTokens      int64  `json:"total_tokens"`
	CostMicros       int64  `json:"cost_micros"` // millionths of the currency
	Status           int    `json:"status"`      // the HTTP status the client got
	Outcome          string `json:"outcome"`     // ok, client_cancelled, interrupted, …
	// Replay marks an answer given again from its Idempotency-Key's record
	// rather than run again (it bills nothing); ReplayOf is the request
	// whose answer it replayed.
	Replay   bool   `json:"replay"`
	ReplayOf string `json:"replay_of,omitempty"`
}

func usageEventJSON(e data.UsageEvent) UsageEventJSON {
	return UsageEventJSON{
		SpecVersion: "1.0", ID: e.RequestID + ".v" + strconv.FormatInt(e.Version, 10),
		Source: UsageEventSource, Type: UsageEventType, Time: e.Time.UTC(), Subject: e.Tenant,
		DataContentType: "application/json",
		Data: UsageEventData{
			RequestID: e.RequestID, Version: e.Version, Tenant: e.Tenant, TenantID: e.TenantID, KeyID: e.KeyID,
			Model: e.Model, Endpoint: e.Endpoint, PromptTokens: e.PromptTokens, CompletionTokens: e.CompletionTokens,
			TotalTokens: e.PromptTokens + e.CompletionTokens, CostMicros: e.CostMicros, Status: e.Status,
			Outcome: string(e.Outcome), Replay: e.ReplayOf != "", ReplayOf: e.ReplayOf,
		},
	}
}

// UsageEventsPage is the answer of GET /admin/v1/usage/events.
type UsageEventsPage struct {
	Object string           `json:"object"` // "list"
	Data   []UsageEventJSON `json:"data"`
	// NextCursor is the after of the next page: past the last event here,
	// or the cursor asked for when there was none (poll again with it).
	NextCursor string `json:"next_cursor"`
	HasMore    bool   `json:"has_more"` // more events were there already
}

// The cursor is opaque to clients: today the decimal seq of the last event
// read. "" (or none) is before every event.
func formatUsageCursor(seq int64) string { return strconv.FormatInt(seq, 10) }

func parseUsageCursor(v string) (int64, bool) {
	if v == "" {
		return 0, true
	}
	n, err := strconv.ParseInt(v, 10, 64)
	return n, err == nil && n >= 0
}

// maxUsageEventsPage is the largest limit GET /admin/v1/usage/events takes.
const maxUsageEventsPage = 1000

// handleGetUsageEvents answers GET /admin/v1/usage/events?after=CURSOR&limit=N:
// up to limit events (1–1000, default 100) after the cursor, in the
// export's order, and the cursor to ask from next.
func (s *Server) handleGetUsageEvents(c echo.Context) error {
	after, ok := parseUsageCursor(c.QueryParam("after"))
	if !ok {
		return apierr.Reply(c, apierr.BadRequest("after", "after must be a cursor from next_cursor (or empty for the first event), not %q", c.QueryParam("after")))
	}
	limit := 100
	if v := c.QueryParam("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 || n > maxUsageEventsPage {
			return apierr.Reply(c, apierr.BadRequest("limit", "limit must be a whole number from 1 to %d, not %q", maxUsageEventsPage, v))
		}
		limit = n
	}
	evs, err := s.store.UsageEvents(c.Request().Context(), after, limit+1)
	if err != nil {
		return err
	}
	page := UsageEventsPage{Object: "list", Data: make([]UsageEventJSON, 0, min(len(evs), limit)), NextCursor: formatUsageCursor(after)}
	if len(evs) > limit {
		evs, page.HasMore = evs[:limit], true
	}
	for _, e := range evs {
		page.Data = append(page.Data, usageEventJSON(e))
	}
	if len(evs) > 0 {
		page.NextCursor = formatUsageCursor(evs[len(evs)-1].Seq)
	}
	return c.JSON(http.StatusOK, page)
}

// UsageSinkView is a usage webhook's delivery state as GET
// /admin/v1/usage/sinks shows it.
type UsageSinkView struct {
	URL         string     `json:"url"`         // without a password
	Cursor      string     `json:"cursor"`      // the last event acknowledged; the pull API's cursor
	Holder      string     `json:"holder"`      // the gateway delivering to it
	LeaseUntil  *time.Time `json:"lease_until"` // null: released
	DeliveredAt *time.Time `json:"delivered_at"`
	LastError   string     `json:"last_error"` // the last failed delivery's, "" once one succeeded
}

// handleGetUsageSinks answers GET /admin/v1/usage/sinks: where each usage
// webhook the database has seen stands — is it keeping up, is it failing.
func (s *Server) handleGetUsageSinks(c echo.Context) error {
	sinks, err := s.store.UsageSinks(c.Request().Context())
	if err != nil {
		return err
	}
	out := make([]UsageSinkView, 0, len(sinks))
	for _, st := range sinks {
		v := UsageSinkView{URL: st.URL, Cursor: formatUsageCursor(st.After), Holder: st.Holder, LastError: st.LastError,
			LeaseUntil: timeOrNil(st.LeaseUntil), DeliveredAt: timeOrNil(st.DeliveredAt)}
		if u, err := url.Parse(st.URL); err == nil {
			v.URL = u.Redacted()
		}
		out = append(out, v)
	}
	return c.JSON(http.StatusOK, map[string]any{"object": "list", "data": out})
}

func timeOrNil(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	t = t.UTC()
	return &t
}
