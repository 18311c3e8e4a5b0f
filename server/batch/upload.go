package batch

// Uploads: POST /v1/files streams the file part of a multipart body to
// disk through the per-file limits, under a read deadline that moves with
// the upload's progress, and stores it against its tenant's quota. A
// refused upload leaves nothing on disk.

import (
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/tailgate-dev/tailgate/data"
	"github.com/tailgate-dev/tailgate/policy"
	"github.com/tailgate-dev/tailgate/server/apierr"
)

// The lifetimes a client may ask for (expires_after, output_expires_after),
// as OpenAI allows them.
const (
	minExpiresAfter = time.Hour
	maxExpiresAfter = 30 * 24 * time.Hour
)

var errBodyTimeout = &apierr.Error{Status: http.StatusRequestTimeout, Type: "invalid_request_error", Code: "request_timeout",
	Message: "the request body did not arrive in time"}

// errStorageQuota says what the tenant's files use of its quota. need is
// the bytes the upload needed, or -1 when all that is known is that it did
// not fit.
func errStorageQuota(used, limit, need int64) *apierr.Error {
	what := fmt.Sprintf("this upload needs %d", need)
	if need < 0 {
		what = fmt.Sprintf("this upload is larger than the %d left", max(limit-used, 0))
	}
	return &apierr.Error{Status: http.StatusBadRequest, Type: "invalid_request_error", Code: "storage_quota_exceeded", Param: "file",
		Message: fmt.Sprintf("you have exceeded your file storage quota: your files use %d of %d bytes and %s; "+
			"delete files (DELETE /v1/files/{id}) or wait for them to expire", used, limit, what)}
}

// handlePostFile stores an uploaded file: multipart/form-data with the
// fields file and purpose ("batch"), and optionally expires_after[anchor]
// ("created_at") and expires_after[seconds]. The body is streamed to disk,
// never held in memory.
func (s *Batches) handlePostFile(c echo.Context, p *policy.Principal) error {
	r := c.Request()
	if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt != "multipart/form-data" {
		return apierr.BadRequest("", "upload the file as multipart/form-data with the fields 'file' and 'purpose'")
	}
	used, err := s.store.TenantFileBytes(r.Context(), p.TenantID)
	if err != nil {
		return err
	}
	room := s.cfg.TenantStorageBytes - used
	if room <= 0 {
		return errStorageQuota(used, s.cfg.TenantStorageBytes, -1)
	}
	if err := os.MkdirAll(s.cfg.FilesDir, 0o700); err != nil {
		return fmt.Errorf("files dir: %w", err)
	}
	rc := http.NewResponseController(c.Response())
	// The file plus a little room for the other fields and the part headers.
	r.Body = http.MaxBytesReader(c.Response(), struct {
		io.Reader
		io.Closer
	}{newUploadBody(r.Body, rc, s.cfg), r.Body}, s.cfg.MaxFileBytes+64<<10)
	mr, err := r.MultipartReader()
	if err != nil {
		return apierr.BadRequest("", "upload the file as multipart/form-data with the fields 'file' and 'purpose'")
	}
	var (
		purpose, filename, tmp, anchor, seconds string
		size                                    int64
	)
	defer func() {
		if tmp != "" {
			_ = os.Remove(tmp)
		}
	}()
	field := func(part io.Reader) (string, error) {
		b, err := io.ReadAll(io.LimitReader(part, 64))
		return strings.TrimSpace(string(b)), err
	}
	for {
		part, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return uploadError(err)
		}
		switch part.FormName() {
		case "purpose":
			purpose, err = field(part)
		case "expires_after[anchor]":
			anchor, err = field(part)
		case "expires_after[seconds]":
			seconds, err = field(part)
		case "file":
			if tmp != "" {
				return apierr.BadRequest("file", "send one file per upload")
			}
			filename = filepath.Base(part.FileName())
			limit := min(s.cfg.MaxFileBytes, room)
			tmp, size, err = spool(s.cfg.FilesDir, part, limit, newLineChecker(s.cfg.MaxFileLines, s.cfg.MaxLineBytes))
			switch {
			case errors.Is(err, errSpoolLimit) && limit < s.cfg.MaxFileBytes:
				return errStorageQuota(used, s.cfg.TenantStorageBytes, -1)
			case errors.Is(err, errSpoolLimit):
				return errFileTooLarge
			case errors.Is(err, errDisk):
				return err
			}
		default:
			_, err = io.Copy(io.Discard, part)
		}
		if err != nil {
			return uploadError(err)
		}
	}
	// The body is read: from here on a read deadline would only cancel the
	// request's context (the server's check for a closed connection).
	_ = rc.SetReadDeadline(time.Time{})
	switch {
	case purpose != purposeBatch:
		return apierr.BadRequest("purpose", "purpose must be 'batch' (the only purpose this gateway stores)")
	case tmp == "":
		return apierr.BadRequest("file", "the upload has no 'file' field")
	case size == 0:
		return apierr.BadRequest("file", "the file is empty")
	}
	ttl, err := expiresAfter("expires_after", anchor, seconds, s.cfg.FileExpiry)
	if err != nil {
		return err
	}
	if filename == "" || filename == "." || filename == string(filepath.Separator) {
		filename = "upload.jsonl"
	}
	id := newID("file-")
	if err := os.Rename(tmp, s.filePath(id)); err != nil {
		return fmt.Errorf("store upload: %w", err)
	}
	tmp = ""
	created := s.cfg.Now()
	f, err := s.store.CreateFile(r.Context(), data.File{ID: id, TenantID: p.TenantID, Purpose: purposeBatch, Filename: filename,
		Bytes: size, CreatedAt: created, ExpiresAt: created.Add(ttl)}, s.cfg.TenantStorageBytes)
	if err != nil {
		_ = os.Remove(s.filePath(id))
		var qe *data.StorageQuotaError
		if errors.As(err, &qe) {
			return errStorageQuota(qe.Used, qe.Limit, qe.Bytes)
		}
		return err
	}
	return c.JSON(http.StatusOK, fileObject(f))
}

// expiresAfter reads OpenAI's expiration policy {anchor, seconds}: anchor
// "created_at" (or unset), seconds from 1 hour to 30 days. Unset is def.
func expiresAfter(param, anchor, seconds string, def time.Duration) (time.Duration, error) {
	if anchor == "" && seconds == "" {
		return def, nil
	}
	if anchor != "" && anchor != "created_at" {
		return 0, apierr.BadRequest(param+".anchor", "%s.anchor must be 'created_at'", param)
	}
	n, err := strconv.ParseInt(seconds, 10, 64)
	if err != nil || n < int64(minExpiresAfter/time.Second) || n > int64(maxExpiresAfter/time.Second) {
		return 0, apierr.BadRequest(param+".seconds", "%s.seconds must be an integer from %d (1 hour) to %d (30 days)",
			param, int64(minExpiresAfter/time.Second), int64(maxExpiresAfter/time.Second))
	}
	return time.Duration(n) * time.Second, nil
}

// uploadError maps an error reading the upload to the client's error.
func uploadError(err error) error {
	var (
		mbe *http.MaxBytesError
		le  *lineLimitError
		ne  net.Error
	)
	switch {
	case errors.As(err, &mbe):
		return errFileTooLarge
	case errors.As(err, &le):
		return le.apiError()
	case errors.As(err, &ne) && ne.Timeout():
		// The deadline stays in force, so the server's drain of the rest
		// of the body fails fast too and the connection is closed.
		return errBodyTimeout
	}
	return apierr.BadRequest("", "could not read the upload: %v", err)
}

var (
	// errSpoolLimit: the upload holds more bytes than spool was allowed.
	errSpoolLimit = errors.New("upload over its byte limit")
	// errDisk marks a failure of the gateway's files directory, not of
	// the upload.
	errDisk = errors.New("files dir")
)

// spool copies r to a new temporary file in dir, synced to disk, through
// check, and returns its path and size. More than limit bytes is
// errSpoolLimit; a failure to write is errDisk; an error of check or of
// reading is returned as it is. On an error nothing is left in dir.
func spool(dir string, r io.Reader, limit int64, check io.Writer) (path string, n int64, err error) {
	f, err := os.CreateTemp(dir, ".upload-*")
	if err != nil {
		return "", 0, fmt.Errorf("spool upload: %w: %w", errDisk, err)
	}
	defer func() {
		if cerr := f.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("spool upload: %w: %w", errDisk, cerr)
		}
		if err != nil {
			_ = os.Remove(f.Name())
			path = ""
		}
	}()
	n, err = io.Copy(io.MultiWriter(check, diskWriter{f}), io.LimitReader(r, limit+1))
	switch {
	case err != nil:
		return "", 0, err
	case n > limit:
		return "", 0, errSpoolLimit
	}
	if err := f.Sync(); err != nil {
		return "", 0, fmt.Errorf("spool upload: %w: %w", errDisk, err)
	}
	return f.Name(), n, nil
}

// diskWriter marks its writer's errors as errDisk.
type diskWriter struct{ w io.Writer }

func (d diskWriter) Write(p []byte) (int, error) {
	n, err := d.w.Write(p)
	if err != nil {
		err = fmt.Errorf("spool upload: %w: %w", errDisk, err)
	}
	return n, err
}
