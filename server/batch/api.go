package batch

import (
	"cmp"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/tailgate-dev/tailgate/data"
	"github.com/tailgate-dev/tailgate/policy"
	"github.com/tailgate-dev/tailgate/server/apierr"
)

// The endpoints a batch may run, as OpenAI names them.
const (
	EndpointChat        = "/v1/chat/completions"
	EndpointCompletions = "/v1/completions"
)

const (
	batchWindow     = 24 * time.Hour
	purposeBatch    = "batch"
	purposeOutput   = "batch_output"
	maxListLimit    = 100
	maxMetadataKeys = 16
)

var (
	errBatchDisabled = &apierr.Error{Status: http.StatusNotImplemented, Type: "invalid_request_error", Code: "batch_disabled",
		Message: "the Batch API is not enabled on this gateway (it has no files directory)"}
	errFileTooLarge = &apierr.Error{Status: http.StatusRequestEntityTooLarge, Type: "invalid_request_error", Code: "file_too_large",
		Message: "the file is too large"}
)

func errNoSuch(kind, id, param string) *apierr.Error {
	return &apierr.Error{Status: http.StatusNotFound, Type: "invalid_request_error", Code: "not_found", Param: param,
		Message: fmt.Sprintf("No such %s object: %s", kind, id)}
}

// Routes registers the Batch API on g, the public API's /v1 group.
func (s *Batches) Routes(g *echo.Group) {
	g.POST("/files", s.handler(s.handlePostFile))
	g.GET("/files", s.handler(s.handleGetFiles))
	g.GET("/files/:id", s.handler(s.handleGetFile))
	g.DELETE("/files/:id", s.handler(s.handleDeleteFile))
	g.GET("/files/:id/content", s.handler(s.handleGetFileContent))
	g.POST("/batches", s.handler(s.handlePostBatch))
	g.GET("/batches", s.handler(s.handleGetBatches))
	g.GET("/batches/:id", s.handler(s.handleGetBatch))
	g.POST("/batches/:id/cancel", s.handler(s.handlePostBatchCancel))
}

// handler checks that the Batch API is on, authenticates the caller, runs
// h as the caller and answers h's error through the gateway's error table.
func (s *Batches) handler(h func(c echo.Context, p *policy.Principal) error) echo.HandlerFunc {
	return func(c echo.Context) error {
		if s.cfg.FilesDir == "" {
			return apierr.Reply(c, errBatchDisabled)
		}
		p, err := s.auth(c)
		if err != nil {
			return apierr.Reply(c, s.apiError(err))
		}
		if err := h(c, p); err != nil {
			ae := s.apiError(err)
			if ae.Status == http.StatusInternalServerError {
				s.log.Error("batch api", "path", c.Path(), "err", err)
			}
			return apierr.Reply(c, ae)
		}
		return nil
	}
}

// filePath is where the body of file id lives. Ids come from the store,
// which only holds ids this package made, so they are safe path elements.
func (s *Batches) filePath(id string) string { return filepath.Join(s.cfg.FilesDir, id) }

// newID returns prefix followed by 24 random lowercase letters and digits.
func newID(prefix string) string {
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	var b [24]byte
	_, _ = rand.Read(b[:])
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	return prefix + string(b[:])
}

type fileJSON struct {
	ID            string  `json:"id"`
	Object        string  `json:"object"`
	Bytes         int64   `json:"bytes"`
	CreatedAt     int64   `json:"created_at"`
	ExpiresAt     *int64  `json:"expires_at"`
	Filename      string  `json:"filename"`
	Purpose       string  `json:"purpose"`
	Status        string  `json:"status"`
	StatusDetails *string `json:"status_details"`
}

func fileObject(f data.File) fileJSON {
	out := fileJSON{ID: f.ID, Object: "file", Bytes: f.Bytes, CreatedAt: f.CreatedAt.Unix(), Filename: f.Filename,
		Purpose: f.Purpose, Status: "processed"}
	if !f.ExpiresAt.IsZero() {
		exp := f.ExpiresAt.Unix()
		out.ExpiresAt = &exp
	}
	return out
}

// listParams reads OpenAI's cursor pagination: limit (1..100, default 20)
// and after (the id to continue after).
func listParams(c echo.Context) (limit int, after string, err error) {
	limit = 20
	if v := c.QueryParam("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxListLimit {
			return 0, "", apierr.BadRequest("limit", "limit must be an integer from 1 to %d", maxListLimit)
		}
		limit = n
	}
	return limit, c.QueryParam("after"), nil
}

func listObject[T any](items []T, limit int, id func(T) string) map[string]any {
	more := len(items) > limit
	if more {
		items = items[:limit]
	}
	out := map[string]any{"object": "list", "data": items, "has_more": more, "first_id": nil, "last_id": nil}
	if len(items) > 0 {
		out["first_id"], out["last_id"] = id(items[0]), id(items[len(items)-1])
	}
	return out
}

func (s *Batches) handleGetFiles(c echo.Context, p *policy.Principal) error {
	limit, after, err := listParams(c)
	if err != nil {
		return err
	}
	fs, err := s.store.Files(c.Request().Context(), p.TenantID, c.QueryParam("purpose"), after, limit+1, s.cfg.Now())
	if err != nil {
		return err
	}
	out := make([]fileJSON, len(fs))
	for i, f := range fs {
		out[i] = fileObject(f)
	}
	return c.JSON(http.StatusOK, listObject(out, limit, func(f fileJSON) string { return f.ID }))
}

func (s *Batches) fileOf(c echo.Context, p *policy.Principal) (data.File, error) {
	return s.liveFile(c, p, c.Param("id"), "file_id")
}

// liveFile returns the tenant's file id unless it is gone or expired (an
// expired file is removed by Run, and no such file until then).
func (s *Batches) liveFile(c echo.Context, p *policy.Principal, id, param string) (data.File, error) {
	f, err := s.store.FileByID(c.Request().Context(), p.TenantID, id)
	if errors.Is(err, data.ErrNotFound) || err == nil && s.expired(f) {
		return data.File{}, errNoSuch("File", id, param)
	}
	return f, err
}

func (s *Batches) expired(f data.File) bool {
	return !f.ExpiresAt.IsZero() && !s.cfg.Now().Before(f.ExpiresAt)
}

func (s *Batches) handleGetFile(c echo.Context, p *policy.Principal) error {
	f, err := s.fileOf(c, p)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, fileObject(f))
}

func (s *Batches) handleGetFileContent(c echo.Context, p *policy.Principal) error {
	f, err := s.fileOf(c, p)
	if err != nil {
		return err
	}
	fh, err := os.Open(s.filePath(f.ID))
	if err != nil {
		return fmt.Errorf("open file %s: %w", f.ID, err)
	}
	defer fh.Close()
	c.Response().Header().Set("Content-Type", "application/octet-stream")
	c.Response().Header().Set("Content-Disposition", mime.FormatMediaType("attachment", map[string]string{"filename": f.Filename}))
	http.ServeContent(c.Response(), c.Request(), "", f.CreatedAt, fh)
	return nil
}

// batchJSON is a batch exactly in OpenAI's shape: times in unix seconds,
// null until reached.
type batchJSON struct {
	ID               string            `json:"id"`
	Object           string            `json:"object"`
	Endpoint         string            `json:"endpoint"`
	Errors           *batchErrorsJSON  `json:"errors"`
	InputFileID      string            `json:"input_file_id"`
	CompletionWindow string            `json:"completion_window"`
	Status           string            `json:"status"`
	OutputFileID     *string           `json:"output_file_id"`
	ErrorFileID      *string           `json:"error_file_id"`
	CreatedAt        int64             `json:"created_at"`
	InProgressAt     *int64            `json:"in_progress_at"`
	ExpiresAt        *int64            `json:"expires_at"`
	FinalizingAt     *int64            `json:"finalizing_at"`
	CompletedAt      *int64            `json:"completed_at"`
	FailedAt         *int64            `json:"failed_at"`
	ExpiredAt        *int64            `json:"expired_at"`
	CancellingAt     *int64            `json:"cancelling_at"`
	CancelledAt      *int64            `json:"cancelled_at"`
	RequestCounts    batchCountsJSON   `json:"request_counts"`
	Metadata         map[string]string `json:"metadata"`
	Usage            batchUsageJSON    `json:"usage"`
}

type batchErrorsJSON struct {
	Object string           `json:"object"`
	Data   []batchErrorJSON `json:"data"`
}

type batchErrorJSON struct {
	Code    string  `json:"code"`
	Message string  `json:"message"`
	Param   *string `json:"param"`
	Line    *int64  `json:"line"`
}

type batchCountsJSON struct {
	Total     int64 `json:"total"`
	Completed int64 `json:"completed"`
	Failed    int64 `json:"failed"`
}

type batchUsageJSON struct {
	InputTokens         int64          `json:"input_tokens"`
	InputTokensDetails  map[string]int `json:"input_tokens_details"`
	OutputTokens        int64          `json:"output_tokens"`
	OutputTokensDetails map[string]int `json:"output_tokens_details"`
	TotalTokens         int64          `json:"total_tokens"`
}

func batchObject(b data.Batch) batchJSON {
	unix := func(t time.Time) *int64 {
		if t.IsZero() {
			return nil
		}
		v := t.Unix()
		return &v
	}
	str := func(s string) *string {
		if s == "" {
			return nil
		}
		return &s
	}
	out := batchJSON{
		ID: b.ID, Object: "batch", Endpoint: b.Endpoint, InputFileID: b.InputFileID, CompletionWindow: b.CompletionWindow,
		Status: b.Status, OutputFileID: str(b.OutputFileID), ErrorFileID: str(b.ErrorFileID), CreatedAt: b.CreatedAt.Unix(),
		InProgressAt: unix(b.InProgressAt), ExpiresAt: unix(b.ExpiresAt), FinalizingAt: unix(b.FinalizingAt),
		CompletedAt: unix(b.CompletedAt), FailedAt: unix(b.FailedAt), ExpiredAt: unix(b.ExpiredAt),
		CancellingAt: unix(b.CancellingAt), CancelledAt: unix(b.CancelledAt),
		RequestCounts: batchCountsJSON{Total: b.Total, Completed: b.Completed, Failed: b.Failed},
		Metadata:      b.Metadata,
		Usage: batchUsageJSON{InputTokens: b.PromptTokens, OutputTokens: b.CompletionTokens, TotalTokens: b.PromptTokens + b.CompletionTokens,
			InputTokensDetails: map[string]int{"cached_tokens": 0}, OutputTokensDetails: map[string]int{"reasoning_tokens": 0}},
	}
	if len(b.Errors) > 0 {
		out.Errors = &batchErrorsJSON{Object: "list"}
		for _, e := range b.Errors {
			je := batchErrorJSON{Code: e.Code, Message: e.Message, Param: str(e.Param)}
			if e.Line > 0 {
				je.Line = &e.Line
			}
			out.Errors.Data = append(out.Errors.Data, je)
		}
	}
	return out
}

// handlePostBatch creates a batch in status validating; the executor
// validates its lines and runs them.
func (s *Batches) handlePostBatch(c echo.Context, p *policy.Principal) error {
	r := c.Request()
	rc := http.NewResponseController(c.Response())
	_ = rc.SetReadDeadline(time.Now().Add(s.cfg.BodyTimeout))
	body, err := io.ReadAll(http.MaxBytesReader(c.Response(), r.Body, s.cfg.MaxBodyBytes))
	if err != nil {
		// The deadline stays in force, so the server's drain of the rest
		// of the body fails fast too and the connection is closed.
		var (
			mbe *http.MaxBytesError
			ne  net.Error
		)
		switch {
		case errors.As(err, &mbe):
			return err // the error table's 413
		case errors.As(err, &ne) && ne.Timeout():
			return errBodyTimeout
		}
		return apierr.BadRequest("", "could not read the request body")
	}
	_ = rc.SetReadDeadline(time.Time{})
	if key := r.Header.Get(idemHeader); key != "" {
		return s.createKeyed(c, p, key, body, func() (batchJSON, error) { return s.createBatch(c, p, body) })
	}
	b, err := s.createBatch(c, p, body)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, b)
}

// createBatch creates the batch body asks for.
func (s *Batches) createBatch(c echo.Context, p *policy.Principal, body []byte) (batchJSON, error) {
	var req struct {
		InputFileID        string            `json:"input_file_id"`
		Endpoint           string            `json:"endpoint"`
		CompletionWindow   string            `json:"completion_window"`
		Metadata           map[string]string `json:"metadata"`
		OutputExpiresAfter *struct {
			Anchor  string      `json:"anchor"`
			Seconds json.Number `json:"seconds"`
		} `json:"output_expires_after"`
	}
	r := c.Request()
	if err := json.Unmarshal(body, &req); err != nil {
		return batchJSON{}, apierr.BadRequest("", "the body must be a JSON object with input_file_id, endpoint and completion_window: %v", err)
	}
	switch {
	case req.InputFileID == "":
		return batchJSON{}, apierr.BadRequest("input_file_id", "input_file_id is required")
	case req.Endpoint != EndpointChat && req.Endpoint != EndpointCompletions:
		return batchJSON{}, apierr.BadRequest("endpoint", "endpoint must be %s or %s", EndpointChat, EndpointCompletions)
	case req.CompletionWindow != "24h":
		return batchJSON{}, apierr.BadRequest("completion_window", "completion_window must be '24h'")
	case len(req.Metadata) > maxMetadataKeys:
		return batchJSON{}, apierr.BadRequest("metadata", "metadata may hold at most %d keys", maxMetadataKeys)
	}
	for k, v := range req.Metadata {
		if len(k) > 64 || len(v) > 512 {
			return batchJSON{}, apierr.BadRequest("metadata", "metadata keys are at most 64 characters and values at most 512")
		}
	}
	var outputTTL time.Duration
	var err error
	if oe := req.OutputExpiresAfter; oe != nil {
		if outputTTL, err = expiresAfter("output_expires_after", oe.Anchor, cmp.Or(oe.Seconds.String(), "missing"), 0); err != nil {
			return batchJSON{}, err
		}
	}
	f, err := s.liveFile(c, p, req.InputFileID, "input_file_id")
	if err != nil {
		return batchJSON{}, err
	}
	if f.Purpose != purposeBatch {
		return batchJSON{}, apierr.BadRequest("input_file_id", "the input file must have purpose 'batch', not %q", f.Purpose)
	}
	b, err := s.store.CreateBatch(r.Context(), data.Batch{
		ID: newID("batch_"), TenantID: p.TenantID, KeyID: p.KeyID, Endpoint: req.Endpoint, InputFileID: f.ID,
		CompletionWindow: req.CompletionWindow, Metadata: req.Metadata, OutputExpiresAfter: outputTTL,
	}, batchWindow)
	if errors.Is(err, data.ErrNotFound) {
		return batchJSON{}, errNoSuch("File", req.InputFileID, "input_file_id") // deleted meanwhile
	}
	if err != nil {
		return batchJSON{}, err
	}
	s.log.Info("batch created", "batch", b.ID, "tenant", p.Tenant, "key", p.KeyPrefix, "endpoint", b.Endpoint, "input_file", f.ID)
	s.wakeExecutor()
	return batchObject(b), nil
}

func (s *Batches) batchOf(c echo.Context, p *policy.Principal) (data.Batch, error) {
	id := c.Param("id")
	b, err := s.store.BatchByID(c.Request().Context(), p.TenantID, id)
	if errors.Is(err, data.ErrNotFound) {
		return data.Batch{}, errNoSuch("Batch", id, "batch_id")
	}
	return b, err
}

func (s *Batches) handleGetBatch(c echo.Context, p *policy.Principal) error {
	b, err := s.batchOf(c, p)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, batchObject(b))
}

func (s *Batches) handleGetBatches(c echo.Context, p *policy.Principal) error {
	limit, after, err := listParams(c)
	if err != nil {
		return err
	}
	bs, err := s.store.Batches(c.Request().Context(), p.TenantID, after, limit+1)
	if err != nil {
		return err
	}
	out := make([]batchJSON, len(bs))
	for i, b := range bs {
		out[i] = batchObject(b)
	}
	return c.JSON(http.StatusOK, listObject(out, limit, func(b batchJSON) string { return b.ID }))
}

// handlePostBatchCancel moves a batch to cancelling; the executor starts no
// new line of it, lets the lines in flight finish, and then marks it
// cancelled with the output and error files of what was done.
func (s *Batches) handlePostBatchCancel(c echo.Context, p *policy.Principal) error {
	id := c.Param("id")
	b, err := s.store.CancelBatch(c.Request().Context(), p.TenantID, id)
	switch {
	case errors.Is(err, data.ErrNotFound):
		return errNoSuch("Batch", id, "batch_id")
	case errors.Is(err, data.ErrBatchStatus):
		cur, gerr := s.batchOf(c, p)
		if gerr != nil {
			return gerr
		}
		return &apierr.Error{Status: http.StatusConflict, Type: "invalid_request_error", Code: "batch_not_cancellable",
			Message: fmt.Sprintf("cannot cancel a batch with status %q", cur.Status)}
	case err != nil:
		return err
	}
	if b.Status == data.BatchCancelling {
		s.log.Info("batch cancelling", "batch", b.ID, "tenant", p.Tenant)
		s.wakeExecutor()
	}
	return c.JSON(http.StatusOK, batchObject(b))
}
