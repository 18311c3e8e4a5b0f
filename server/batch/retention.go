package batch

// How files leave: DELETE /v1/files/{id}, expiry (removed by Run), and the
// sweep of bodies a crash left without a row. A file's row goes first and
// its body after, so a crash between the two leaves a body the next sweep
// removes, never a row without a body.

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/tailgate-dev/tailgate/data"
	"github.com/tailgate-dev/tailgate/policy"
	"github.com/tailgate-dev/tailgate/server/apierr"
)

// expireBatch bounds the files one pass of Run removes.
const expireBatch = 500

// handleDeleteFile deletes a file of the caller's tenant, freeing its
// quota and its disk. The input file of a batch that has not finished is
// refused (409): the batch may still read it.
func (s *Batches) handleDeleteFile(c echo.Context, p *policy.Principal) error {
	f, err := s.fileOf(c, p)
	if err != nil {
		return err
	}
	_, err = s.store.DeleteFile(c.Request().Context(), p.TenantID, f.ID)
	var inUse *data.FileInUseError
	switch {
	case errors.Is(err, data.ErrNotFound):
		return errNoSuch("File", f.ID, "file_id")
	case errors.As(err, &inUse):
		return &apierr.Error{Status: http.StatusConflict, Type: "invalid_request_error", Code: "file_in_use", Param: "file_id",
			Message: fmt.Sprintf("file %s is the input of batch %s, which is %s and may still read it; "+
				"wait for the batch to finish (or cancel it) and delete the file then", f.ID, inUse.BatchID, inUse.Status)}
	case err != nil:
		return err
	}
	s.removeBody(f.ID)
	return c.JSON(http.StatusOK, map[string]any{"id": f.ID, "object": "file", "deleted": true})
}

// removeBody removes the body of a file whose row is gone; a failure is
// logged (the sweep at the next start retries it).
func (s *Batches) removeBody(id string) {
	if err := os.Remove(s.filePath(id)); err != nil && !errors.Is(err, os.ErrNotExist) {
		s.log.Error("batch files: remove a deleted file's body", "file", id, "err", err)
	}
}

// expireFiles removes the files that have expired, except the input of a
// batch that has not finished (it goes once the batch does).
func (x *batchExec) expireFiles(ctx context.Context) {
	for ctx.Err() == nil {
		gone, err := x.s.store.DeleteExpiredFiles(ctx, x.cfg.Now(), expireBatch)
		if err != nil {
			if ctx.Err() == nil {
				x.log.Warn("batch files: expire", "err", err)
			}
			return
		}
		for _, f := range gone {
			x.s.removeBody(f.ID)
		}
		if len(gone) > 0 {
			x.log.Info("batch files expired", "files", len(gone))
		}
		if len(gone) < expireBatch {
			return
		}
	}
}

// sweepFiles removes what a crash left in the files directory: bodies
// whose row is gone and temporary files of uploads and result files. Only
// entries older than the longest upload are touched, so an upload in
// progress (its temporary file, or its body just before its row is
// written) is not.
func (x *batchExec) sweepFiles(ctx context.Context) error {
	ents, err := os.ReadDir(x.cfg.FilesDir)
	if err != nil {
		return fmt.Errorf("sweep files: %w", err)
	}
	old := time.Now().Add(-x.cfg.UploadTimeout - time.Minute)
	removed := 0
	for _, e := range ents {
		name := e.Name()
		if e.IsDir() || !(strings.HasPrefix(name, "file-") || strings.HasPrefix(name, ".upload-") || strings.HasPrefix(name, ".result-")) {
			continue
		}
		if fi, err := e.Info(); err != nil || fi.ModTime().After(old) {
			continue
		}
		if strings.HasPrefix(name, "file-") {
			ok, err := x.s.store.FileExists(ctx, name)
			if err != nil {
				return fmt.Errorf("sweep files: %w", err)
			}
			if ok {
				continue
			}
		}
		if err := os.Remove(filepath.Join(x.cfg.FilesDir, name)); err == nil {
			removed++
		}
	}
	if removed > 0 {
		x.log.Info("batch files: removed what an earlier run left behind", "entries", removed)
	}
	return nil
}
