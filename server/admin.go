package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/tailgate-dev/tailgate/data"
	"github.com/tailgate-dev/tailgate/policy"
	"github.com/tailgate-dev/tailgate/router"
	"github.com/tailgate-dev/tailgate/server/apierr"
	"github.com/tailgate-dev/tailgate/server/strictjson"
	"github.com/tailgate-dev/tailgate/serving"
)

func (s *Server) adminRoutes(e *echo.Echo, ui http.Handler) {
	guard := func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			if !s.checkAdmin(c) {
				return apierr.Reply(c, errBadAdminToken)
			}
			return next(c)
		}
	}
	e.POST(serving.HeartbeatPath, s.handlePostHeartbeat, s.bodyDeadline) // cluster token, not admin token
	e.GET("/readyz", s.handleGetReadyz)                                  // no token: probes and health checks

	metrics := promhttp.HandlerFor(s.gatherer, promhttp.HandlerOpts{})
	e.GET("/metrics", echo.WrapHandler(metrics), guard)
	s.profileRoutes(e, guard)

	a := e.Group("/admin/v1", s.bodyDeadline, guard)
	a.GET("/keys", s.handleGetKeys)
	a.POST("/keys", s.handlePostKeys)
	a.DELETE("/keys/:ref", s.handleDeleteKey)
	a.PATCH("/keys/:ref", s.handlePatchKey)
	a.POST("/keys/revoke", s.handlePostKeysRevoke)
	a.POST("/keys/:ref/rotate", s.handlePostKeyRotate)
	a.GET("/tenants", s.handleGetTenants)
	a.GET("/tenants/:name", s.handleGetTenant)
	a.PATCH("/tenants/:name", s.handlePatchTenant)
	a.GET("/usage", s.handleGetUsage)
	a.GET("/usage/events", s.handleGetUsageEvents)
	a.GET("/usage/sinks", s.handleGetUsageSinks)
	a.GET("/requests", s.handleGetRequests)
	a.GET("/requests/inflight", s.handleGetInflight)
	a.GET("/history", s.handleGetHistory)
	a.GET("/replicas", s.handleGetReplicas)
	a.GET("/workers", s.handleGetWorkers)
	a.GET("/slo", s.handleGetSLO)
	a.GET("/fleet", s.handleGetFleet)
	a.DELETE("/workers/:id", s.handleDeleteWorker)
	a.POST("/workers/:id/approve", s.handlePostApproveWorker)
	a.DELETE("/replicas/:id", s.handleDeleteReplica)

	if ui != nil {
		e.GET("/", func(c echo.Context) error { return c.Redirect(http.StatusFound, "/ui/") })
		e.GET("/ui", func(c echo.Context) error { return c.Redirect(http.StatusFound, "/ui/") })
		e.GET("/ui/*", echo.WrapHandler(ui), dashboardHeaders)
	}
}

// bodyDeadline bounds reading an admin or heartbeat request's body by
// Config.BodyTimeout (the token does not make a trickled body harmless:
// each holds a connection and a goroutine). The deadline stays after the
// handler, so an unread rest is not drained for ever, and is lifted once
// the body is read whole (a handler that then works long is not cut); the
// server sets the connection's next deadline when it reads the next
// request.
func (s *Server) bodyDeadline(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		r := c.Request()
		if r.Body == nil || r.Body == http.NoBody {
			return next(c)
		}
		rc := http.NewResponseController(c.Response())
		_ = rc.SetReadDeadline(time.Now().Add(s.cfg.BodyTimeout))
		r.Body = &liftAtEOF{ReadCloser: r.Body, rc: rc}
		return next(c)
	}
}

// liftAtEOF lifts the connection's read deadline once the body it reads
// has ended.
type liftAtEOF struct {
	io.ReadCloser
	rc   *http.ResponseController
	done bool
}

func (b *liftAtEOF) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF && !b.done {
		b.done = true
		_ = b.rc.SetReadDeadline(time.Time{})
	}
	return n, err
}

// dashboardCSP lets the dashboard run its own files and call the admin API
// of its origin, nothing else: no inline script, no other origin, no
// frame around it.
const dashboardCSP = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; " +
	"base-uri 'none'; form-action 'self'; frame-ancestors 'none'"

// dashboardHeaders serves the dashboard's files with a content security
// policy and never inside a frame. The files load without the admin token
// (a browser sends none when it opens a link; the token rides in the
// fragment): they hold no data, and everything the page shows comes from
// the guarded API with the token.
func dashboardHeaders(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		h := c.Response().Header()
		h.Set("Content-Security-Policy", dashboardCSP)
		h.Set("X-Frame-Options", "DENY")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		return next(c)
	}
}

// KeyView is a key as the admin API and `tailgate keys list --json` show
// it: never the secret or its hash.
type KeyView struct {
	ID             string    `json:"id"`
	Tenant         string    `json:"tenant"`
	Prefix         string    `json:"prefix"`
	RPM            int64     `json:"rpm"`
	TPM            int64     `json:"tpm"`
	MaxConcurrency int64     `json:"max_concurrency"`
	Models         []string  `json:"models"`
	CreatedAt      time.Time `json:"created_at"`
	Revoked        bool      `json:"revoked"`
	// ExpiresAt is null for a key that never expires.
	ExpiresAt *time.Time `json:"expires_at"`
	Expired   bool       `json:"expired"`
	// Class is the key's priority class: interactive, standard or batch.
	Class string `json:"class"`
	// Name ("" for none; unique among the tenant's active keys), Owner and
	// Note say whose key it is and what for.
	Name  string `json:"name"`
	Owner string `json:"owner"`
	Note  string `json:"note"`
	// LastUsedAt is the time of the key's newest request, to within a
	// minute; null if never used.
	LastUsedAt *time.Time `json:"last_used_at"`
	// PreviousSecretUntil is when the secret the key had before its last
	// rotation stops working; null without one.
	PreviousSecretUntil *time.Time `json:"previous_secret_until"`
	// Requests, SpentTokens and SpentMicros (Spent in currency units) are
	// the key's totals over its life, from the ledger.
	Requests    int64   `json:"requests"`
	SpentTokens int64   `json:"spent_tokens"`
	SpentMicros int64   `json:"spent_micros"`
	Spent       float64 `json:"spent"`
}

// WithSpend is v with the key's totals t.
func (v KeyView) WithSpend(t data.KeyTotal) KeyView {
	v.Requests, v.SpentTokens, v.SpentMicros, v.Spent = t.Requests, t.Tokens, t.Micros, float64(t.Micros)/1e6
	return v
}

// ViewKey converts a stored key to its view as of now.
func ViewKey(k data.Key, now time.Time) KeyView {
	m := k.Models
	if m == nil {
		m = []string{}
	}
	v := KeyView{ID: k.ID, Tenant: k.Tenant.Name, Prefix: k.Prefix, RPM: k.RPM, TPM: k.TPM,
		MaxConcurrency: k.MaxConcurrency, Models: m, CreatedAt: k.CreatedAt, Revoked: k.Revoked(), Expired: k.ExpiredAt(now),
		Class: policy.StoredClass(k.Class).String(), Name: k.Name, Owner: k.Owner, Note: k.Note}
	if !k.ExpiresAt.IsZero() {
		v.ExpiresAt = &k.ExpiresAt
	}
	if !k.LastUsedAt.IsZero() {
		v.LastUsedAt = &k.LastUsedAt
	}
	if !k.PrevUntil.IsZero() && now.Before(k.PrevUntil) {
		v.PreviousSecretUntil = &k.PrevUntil
	}
	return v
}

func (s *Server) handleGetKeys(c echo.Context) error {
	ctx := c.Request().Context()
	s.flushLedger(ctx)
	keys, err := s.store.Keys(ctx, c.QueryParam("tenant"))
	if err != nil {
		return err
	}
	spend, err := s.store.KeySpend(ctx)
	if err != nil {
		return err
	}
	out := make([]KeyView, 0, len(keys))
	now := time.Now()
	for _, k := range keys {
		out = append(out, ViewKey(k, now).WithSpend(spend[k.ID]))
	}
	return c.JSON(http.StatusOK, map[string]any{"data": out})
}

type createKeyRequest struct {
	Tenant         string   `json:"tenant"`
	RPM            int64    `json:"rpm"`
	TPM            int64    `json:"tpm"`
	MaxConcurrency int64    `json:"max_concurrency"`
	Models         []string `json:"models"`
	BudgetTokens   *int64   `json:"budget_tokens"`
	BudgetMicros   *int64   `json:"budget_micros"`
	// Expires is as `tailgate keys create --expires` takes it (see
	// policy.ParseExpiry); "" never expires.
	Expires string `json:"expires"`
	// Class is the key's priority class ("" is standard).
	Class string `json:"class"`
	Name  string `json:"name"`
	Owner string `json:"owner"`
	Note  string `json:"note"`
	// BudgetPeriod and BudgetAlertPercent set the tenant's (see
	// PATCH /admin/v1/tenants/{name}).
	BudgetPeriod       *string `json:"budget_period"`
	BudgetAlertPercent *int64  `json:"budget_alert_percent"`
}

// createKeyFields lists createKeyRequest's fields for error messages.
const createKeyFields = "tenant, rpm, tpm, max_concurrency, models, budget_tokens, budget_micros, expires, class, name, owner, note, budget_period, budget_alert_percent"

func (s *Server) handlePostKeys(c echo.Context) error {
	var req createKeyRequest
	if ae := decodeAdminBody(c, &req, createKeyFields); ae != nil {
		return apierr.Reply(c, ae)
	}
	if req.Tenant == "" {
		return apierr.Reply(c, apierr.BadRequest("tenant", "tenant is required"))
	}
	if req.RPM < 0 || req.TPM < 0 || req.MaxConcurrency < 0 {
		return apierr.Reply(c, apierr.BadRequest("", "limits must not be negative"))
	}
	opts := policy.KeyOptions{
		Tenant: req.Tenant, RPM: req.RPM, TPM: req.TPM, MaxConcurrency: req.MaxConcurrency,
		Models: req.Models, BudgetTokens: req.BudgetTokens, BudgetMicros: req.BudgetMicros,
		Name: req.Name, Owner: req.Owner, Note: req.Note, BudgetPeriod: req.BudgetPeriod, BudgetAlertPercent: req.BudgetAlertPercent,
	}
	if err := data.CheckKeyName(req.Name); err != nil {
		return apierr.Reply(c, apierr.BadRequest("name", "%v", err))
	}
	if req.BudgetPeriod != nil {
		if err := data.CheckBudgetPeriod(policy.NormalizePeriod(*req.BudgetPeriod)); err != nil {
			return apierr.Reply(c, apierr.BadRequest("budget_period", "%v", err))
		}
	}
	if p := req.BudgetAlertPercent; p != nil && (*p < 1 || *p > 100) {
		return apierr.Reply(c, apierr.BadRequest("budget_alert_percent", "the alert percent must be 1 to 100"))
	}
	var err error
	if opts.Class, err = policy.ParseClass(req.Class); err != nil {
		return apierr.Reply(c, apierr.BadRequest("class", "%v", err))
	}
	if req.Expires != "" {
		exp, err := policy.ParseExpiry(req.Expires, time.Now())
		if err != nil {
			return apierr.Reply(c, apierr.BadRequest("expires", "%v", err))
		}
		if !exp.IsZero() && !exp.After(time.Now()) {
			return apierr.Reply(c, apierr.BadRequest("expires", "expiry %s is not in the future: the key would never work", exp.Format(time.RFC3339)))
		}
		opts.ExpiresAt = exp
	}
	// A money budget no price can reach would never be enforced.
	var unpriced *policy.UnpricedBudget
	if err := s.gate.CheckNewKey(c.Request().Context(), opts); errors.As(err, &unpriced) {
		return apierr.Reply(c, apierr.BadRequest("budget_micros", "%s", unpriced.Error()))
	} else if err != nil {
		return err
	}
	secret, k, err := policy.CreateKey(c.Request().Context(), s.store, opts)
	if errors.Is(err, data.ErrNameTaken) {
		return apierr.Reply(c, &apierr.Error{Status: http.StatusConflict, Type: "invalid_request_error", Code: "key_name_taken", Param: "name",
			Message: fmt.Sprintf("tenant %q has an active key named %q: revoke it or pick another name", req.Tenant, req.Name)})
	} else if err != nil {
		return err
	}
	s.log.Info("key created", "key_id", k.ID, "prefix", k.Prefix, "tenant", k.Tenant.Name)
	return c.JSON(http.StatusCreated, map[string]any{"secret": secret, "key": ViewKey(k, time.Now())})
}

func (s *Server) handleDeleteKey(c echo.Context) error {
	ref := c.Param("ref")
	if policy.IsSecret(ref) {
		// URL paths end up in access logs and proxies' logs.
		return apierr.Reply(c, apierr.BadRequest("ref", "never put a key's secret in a URL: it ends up in logs. "+
			"Use the key's id or display prefix here, or POST /admin/v1/keys/revoke with {\"ref\": secret}; consider this secret exposed"))
	}
	return s.revoke(c, ref)
}

func (s *Server) handlePostKeysRevoke(c echo.Context) error {
	var req struct {
		Ref string `json:"ref"`
	}
	if ae := decodeAdminBody(c, &req, "ref"); ae != nil {
		return apierr.Reply(c, ae)
	}
	if req.Ref == "" {
		return apierr.Reply(c, apierr.BadRequest("ref", "send {\"ref\": key id, display prefix or secret}"))
	}
	return s.revoke(c, req.Ref)
}

// maxAdminBody bounds an admin request's body.
const maxAdminBody = 64 << 10

// decodeAdminBody reads an admin request's JSON object into v, strictly: a
// field v does not have is refused, not ignored — a misspelt limit
// ("rpmm") would otherwise make an unlimited key — and so are a repeated
// field and a value of the wrong type. The 400 names the field at fault;
// fields lists the ones v has.
func decodeAdminBody(c echo.Context, v any, fields string) *apierr.Error {
	body, err := io.ReadAll(io.LimitReader(c.Request().Body, maxAdminBody+1))
	switch {
	case err != nil:
		return apierr.BadRequest("", "reading the request body: %v", err)
	case len(body) > maxAdminBody:
		return apierr.BadRequest("", "request body is larger than %d bytes", maxAdminBody)
	}
	var dup *strictjson.DuplicateKeyError
	if err := strictjson.Check(body, strictjson.DefaultMaxDepth); errors.As(err, &dup) {
		return apierr.BadRequest(dup.Key, "request body has %s: send each field once", err)
	} else if err != nil {
		return apierr.BadRequest("", "body must be a JSON object with the fields %s: %v", fields, err)
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	err = dec.Decode(v)
	var te *json.UnmarshalTypeError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &te) && te.Field != "":
		return apierr.BadRequest(te.Field, "field %q: want a %s, not a JSON %s", te.Field, jsonKind(te.Type), te.Value)
	case errors.As(err, &te):
		return apierr.BadRequest("", "body must be a JSON object with the fields %s, not a JSON %s", fields, te.Value)
	}
	// encoding/json has no type for this error, only its text.
	if name, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		name, _ = strconv.Unquote(name)
		return apierr.BadRequest(name, "unknown field %q: the fields are %s", name, fields)
	}
	return apierr.BadRequest("", "body must be a JSON object with the fields %s: %v", fields, err)
}

// jsonKind names the JSON value a Go type decodes from.
func jsonKind(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "whole number"
	case reflect.Float32, reflect.Float64:
		return "number"
	case reflect.String:
		return "string"
	case reflect.Bool:
		return "boolean"
	case reflect.Slice, reflect.Array:
		return "list"
	}
	return "JSON object"
}

func (s *Server) revoke(c echo.Context, ref string) error {
	k, err := policy.RevokeKey(c.Request().Context(), s.store, ref)
	switch {
	case errors.Is(err, data.ErrNotFound):
		return apierr.Reply(c, &apierr.Error{Status: http.StatusNotFound, Type: "invalid_request_error", Code: "key_not_found", Message: "no such key"})
	case errors.Is(err, data.ErrAmbiguous):
		return apierr.Reply(c, apierr.BadRequest("ref", "that prefix matches more than one key; use the key id"))
	case err != nil:
		return err
	}
	s.log.Info("key revoked", "key_id", k.ID, "prefix", k.Prefix)
	return c.JSON(http.StatusOK, map[string]any{"key": ViewKey(k, time.Now())})
}

// flushLedger makes admin reads see every request finished so far.
func (s *Server) flushLedger(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	_ = s.ledger.Flush(ctx)
}

// handleGetUsage answers usage totals: ?tenant=, ?since= and ?until= (a
// date, RFC 3339 or a duration ago such as 7d; until exclusive), ?by=
// (day, week, month, tenant, key or model; default tenant, key and model).
func (s *Server) handleGetUsage(c echo.Context) error {
	ctx := c.Request().Context()
	f := data.UsageFilter{Tenant: c.QueryParam("tenant"), By: c.QueryParam("by")}
	if err := data.CheckUsageBy(f.By); err != nil {
		return apierr.Reply(c, apierr.BadRequest("by", "%v", err))
	}
	now := time.Now()
	for _, b := range []struct {
		name string
		dst  *time.Time
	}{{"since", &f.Since}, {"until", &f.Until}} {
		if v := c.QueryParam(b.name); v != "" {
			t, err := data.ParseUsageTime(v, now)
			if err != nil {
				return apierr.Reply(c, apierr.BadRequest(b.name, "%s: %v", b.name, err))
			}
			*b.dst = t
		}
	}
	if !f.Since.IsZero() && !f.Until.IsZero() && !f.Since.Before(f.Until) {
		return apierr.Reply(c, apierr.BadRequest("until", "until (%s) must be after since (%s)", f.Until.Format(time.RFC3339), f.Since.Format(time.RFC3339)))
	}
	s.flushLedger(ctx)
	rows, err := s.store.Usage(ctx, f)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, map[string]any{"data": UsageJSON(rows)})
}

// handlePostKeyRotate gives a key a new secret ({"grace": "24h"}: how long
// the old one keeps working; default policy.DefaultRotateGrace, "0s" none).
func (s *Server) handlePostKeyRotate(c echo.Context) error {
	ref := c.Param("ref")
	if policy.IsSecret(ref) {
		return apierr.Reply(c, apierr.BadRequest("ref", "never put a key's secret in a URL: it ends up in logs. "+
			"Use the key's id, display prefix or tenant/name here; consider this secret exposed"))
	}
	var req struct {
		Grace *string `json:"grace"`
	}
	if c.Request().ContentLength != 0 {
		if ae := decodeAdminBody(c, &req, "grace"); ae != nil {
			return apierr.Reply(c, ae)
		}
	}
	grace := policy.DefaultRotateGrace
	if req.Grace != nil {
		d, err := time.ParseDuration(*req.Grace)
		if err != nil || d < 0 {
			return apierr.Reply(c, apierr.BadRequest("grace", "grace %q: want a duration such as 24h, 90m or 0s", *req.Grace))
		}
		grace = d
	}
	secret, k, err := policy.RotateKey(c.Request().Context(), s.store, ref, grace, time.Now())
	switch {
	case errors.Is(err, data.ErrNotFound):
		return apierr.Reply(c, &apierr.Error{Status: http.StatusNotFound, Type: "invalid_request_error", Code: "key_not_found", Message: "no such key"})
	case errors.Is(err, data.ErrAmbiguous):
		return apierr.Reply(c, apierr.BadRequest("ref", "that prefix or name matches more than one key; use the key id or tenant/name"))
	case errors.Is(err, data.ErrRevoked):
		return apierr.Reply(c, &apierr.Error{Status: http.StatusConflict, Type: "invalid_request_error", Code: "key_revoked",
			Message: "that key is revoked and cannot be rotated; create a new one"})
	case err != nil:
		return err
	}
	s.log.Info("key rotated", "key_id", k.ID, "prefix", k.Prefix, "tenant", k.Tenant.Name, "grace", grace)
	return c.JSON(http.StatusOK, map[string]any{"secret": secret, "key": ViewKey(k, time.Now())})
}

// UsageView is one usage total as the admin API and `tailgate usage --json`
// print it. Fields that do not group it are empty.
type UsageView struct {
	// Period is the first day (UTC) of the day, week or month it totals
	// when grouped by one; null otherwise.
	Period           *string `json:"period"`
	Tenant           string  `json:"tenant"`
	KeyID            string  `json:"key_id"`
	KeyPrefix        string  `json:"key_prefix"`
	KeyName          string  `json:"key_name"`
	Model            string  `json:"model"`
	Requests         int64   `json:"requests"`
	PromptTokens     int64   `json:"prompt_tokens"`
	CompletionTokens int64   `json:"completion_tokens"`
	CostMicros       int64   `json:"cost_micros"`
	Cost             float64 `json:"cost"`
	// Rejected counts refused requests, which the other totals leave out.
	Rejected int64 `json:"rejected"`
}

// UsageJSON converts ledger totals to their JSON view.
func UsageJSON(rows []data.UsageRow) []UsageView {
	out := make([]UsageView, 0, len(rows))
	for _, r := range rows {
		v := UsageView{Tenant: r.Tenant, KeyID: r.KeyID, KeyPrefix: r.KeyPrefix, KeyName: r.KeyName, Model: r.Model,
			Requests: r.Requests, PromptTokens: r.PromptTokens, CompletionTokens: r.CompletionTokens,
			CostMicros: r.CostMicros, Cost: float64(r.CostMicros) / 1e6, Rejected: r.Rejected}
		if !r.Period.IsZero() {
			d := r.Period.UTC().Format(time.DateOnly)
			v.Period = &d
		}
		out = append(out, v)
	}
	return out
}

func (s *Server) handleGetRequests(c echo.Context) error {
	ctx := c.Request().Context()
	f, ae := requestFilter(c)
	if ae != nil {
		return apierr.Reply(c, ae)
	}
	s.flushLedger(ctx)
	rows, err := s.store.FindRequests(ctx, f)
	if err != nil {
		return err
	}
	ms := func(d time.Duration) *float64 {
		if d < 0 {
			return nil
		}
		v := float64(d) / float64(time.Millisecond)
		return &v
	}
	out := make([]map[string]any, 0, len(rows))
	for _, r := range rows {
		stages := make(map[string]*float64, len(data.StageNames))
		r.Stages.Each(func(_ int, name string, d time.Duration) { stages[name] = ms(d) })
		out = append(out, map[string]any{
			"id": r.ID, "time": r.Time, "tenant": r.Tenant, "key_id": r.KeyID, "model": r.Model,
			"replica": r.Upstream, "stream": r.Stream, "status": r.Status, "outcome": r.Outcome, "error": r.Error,
			"attempts": r.Attempts, "hedged": r.Hedged,
			"prompt_tokens": r.PromptTokens, "completion_tokens": r.CompletionTokens,
			"hedge_overhead_tokens": r.HedgeOverheadTokens, "cost_micros": r.CostMicros,
			"stages_ms": stages, "attempt_log": attemptsJSON(r.AttemptLog, ms),
		})
	}
	return c.JSON(http.StatusOK, map[string]any{"data": out})
}

// attemptsJSON is a request's attempts as the admin API shows them, times
// in milliseconds (start and end after the request arrived; null unknown).
func attemptsJSON(as []data.Attempt, ms func(time.Duration) *float64) []map[string]any {
	out := make([]map[string]any, 0, len(as))
	for _, a := range as {
		out = append(out, map[string]any{
			"n": a.N, "replica": a.Replica, "role": a.Role, "outcome": a.Outcome, "reason": a.Reason,
			"start_ms": ms(a.Start), "ttft_ms": ms(a.TTFT), "end_ms": ms(a.End),
			"prompt_tokens": a.PromptTokens, "completion_tokens": a.CompletionTokens,
		})
	}
	return out
}

func (s *Server) handleGetReplicas(c echo.Context) error {
	now := time.Now()
	out := []map[string]any{}
	for _, r := range s.reg.Replicas() {
		var age *float64
		if t := r.LastOK(); !t.IsZero() {
			v := now.Sub(t).Seconds()
			age = &v
		}
		load := r.Load()
		row := map[string]any{
			"id": r.ID, "address": r.URL, "models": r.Models(), "state": r.State().String(),
			"ready": r.State() == router.StateReady, "reason": r.Reason(), "inflight": r.Inflight(),
			"static": r.Static, "engine": r.Engine(), "last_ok_age_seconds": age,
		}
		if r.Worker != "" {
			row["worker"] = r.Worker // the credential's id, never the secret
		}
		if n := r.ContextLen(); n > 0 {
			row["context_len"] = n // the engine's max_model_len
		}
		_, _, ttft, slow, score := s.reg.ScoreInputs(r)
		row["ttft_estimate_ms"] = ttft * 1000
		row["slow_start"] = slow
		row["score"] = score
		if r.State() == router.StateLost {
			row["lost_for_seconds"] = now.Sub(r.LeaseExpiry()).Seconds()
		}
		if l := r.LastLoss(); l != nil {
			// Why it last went away, kept after it comes back.
			row["last_loss"] = map[string]any{"reason": l.Reason, "at": l.At.UTC(), "was": l.Was.String()}
		}
		row["ejections"] = s.reg.Ejections(r.ID)
		if e := r.ProbeError(); e != "" {
			row["probe_error"] = e
		}
		if !r.Static {
			row["last_heartbeat_age_seconds"] = age
			row["lease_expires_in_seconds"] = r.LeaseExpiry().Sub(now).Seconds()
			row["engine_waiting"] = load.Waiting
			row["priority_scheduling"] = r.PriorityScheduling()
			row["engine_running"] = load.Running
			row["kv_cache_usage"] = load.KVCacheUsage
			if load.WaitReasons {
				row["engine_waiting_by_reason"] = map[string]float64{"capacity": load.WaitingCapacity, "deferred": load.WaitingDeferred}
			}
			row["engine_preemptions_total"] = load.Preemptions
			row["prefix_cache_queries_total"] = load.PrefixCacheQueries
			row["prefix_cache_hits_total"] = load.PrefixCacheHits
			if load.PrefixCacheQueries > 0 {
				row["prefix_cache_hit_rate"] = load.PrefixCacheHits / load.PrefixCacheQueries
			}
			if load.SleepState != "" {
				row["engine_sleep_state"] = load.SleepState
			}
			row["engine_slots"] = r.Slots()
			row["sidecar_inflight"] = load.Inflight
			row["recent_ttft_ms"] = load.TTFTMillis
			row["engine_log"] = r.EngineLog()
		}
		out = append(out, row)
	}
	return c.JSON(http.StatusOK, map[string]any{"data": out})
}

// handleDeleteReplica forgets a lost replica (its worker is gone for good)
// before the registry would; a replica that is not lost is refused with
// what to do instead.
func (s *Server) handleDeleteReplica(c echo.Context) error {
	id := c.Param("id")
	found, err := s.reg.Forget(id)
	switch {
	case !found:
		return apierr.Reply(c, &apierr.Error{Status: http.StatusNotFound, Type: "invalid_request_error",
			Code: "replica_not_found", Message: "no replica " + strconv.Quote(id)})
	case errors.Is(err, router.ErrNotLost):
		return apierr.Reply(c, &apierr.Error{Status: http.StatusConflict, Type: "invalid_request_error", Code: "replica_not_lost",
			Message: err.Error() + "; only a lost replica is forgotten here — to take a live worker out, revoke it: DELETE /admin/v1/workers/" + id})
	}
	s.log.Info("lost replica forgotten", "replica", id)
	return c.NoContent(http.StatusNoContent)
}

// handleGetReadyz says whether this gateway can take registrations and
// traffic: 200 once its listeners answer and its ledger can write, else
// 503. Unlike /healthz it does not wait for a ready replica — workers
// register through the gateway, so a probe that waited for one would keep
// them out (a Kubernetes Service does not route to a pod that is not ready).
// It says nothing a client could misuse, so it needs no token.
func (s *Server) handleGetReadyz(c echo.Context) error {
	if err := s.ledger.Healthy(); err != nil {
		return c.JSON(http.StatusServiceUnavailable, map[string]any{"status": "ledger unavailable", "ledger": err.Error()})
	}
	return c.JSON(http.StatusOK, map[string]any{"status": "ok", "ledger": "ok"})
}
