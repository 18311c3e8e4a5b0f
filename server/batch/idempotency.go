package batch

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/tailgate-dev/tailgate/data"
	"github.com/tailgate-dev/tailgate/policy"
	"github.com/tailgate-dev/tailgate/server/apierr"
)

// POST /v1/batches honours Idempotency-Key as the generating endpoints do
// (server/idempotency.go, docs/api.md): a retry with the same key and body
// gets the batch the first created (its creation answer, with
// Idempotent-Replayed: true), not a second batch; another body is a 422.

const (
	idemHeader = "Idempotency-Key"
	// idemWait bounds how long a retry waits for a creation still running
	// (on this gateway or another); a creation is a few queries.
	idemWait = 5 * time.Second
)

var errIdemPending = &apierr.Error{Status: http.StatusConflict, Type: "invalid_request_error", Code: "idempotency_request_in_progress", Param: idemHeader,
	Message: "a request with this Idempotency-Key is still being processed; retry it"}

// createKeyed runs create once per tenant, key and body.
func (s *Batches) createKeyed(c echo.Context, p *policy.Principal, key string, body []byte, create func() (batchJSON, error)) error {
	if len(key) > 255 || !printable(key) {
		return apierr.BadRequest(idemHeader, "Idempotency-Key must be 1 to 255 printable ASCII characters")
	}
	sum := sha256.Sum256(append([]byte("/v1/batches\x00"), body...))
	fp := hex.EncodeToString(sum[:])
	ctx := c.Request().Context()
	now := time.Now()
	rec := data.IdemRecord{TenantID: p.TenantID, Key: key, Fingerprint: fp, RequestID: newID("req_"),
		Created: now, Expires: now.Add(s.cfg.IdempotencyRetention)}
	for deadline := now.Add(idemWait); ; {
		got, claimed, err := s.store.ClaimIdempotency(ctx, rec)
		if err != nil {
			return err
		}
		if claimed {
			b, err := create()
			if err != nil {
				_ = s.store.ReleaseIdempotency(context.WithoutCancel(ctx), p.TenantID, key, rec.RequestID)
				return err
			}
			raw, err := json.Marshal(b)
			if err != nil {
				return err
			}
			if err := s.store.FinishIdempotency(context.WithoutCancel(ctx), p.TenantID, key, rec.RequestID, "", http.StatusOK, echo.MIMEApplicationJSON, raw); err != nil {
				s.log.Warn("idempotency record not kept", "batch", b.ID, "err", err)
			}
			return c.JSONBlob(http.StatusOK, raw)
		}
		switch {
		case got.Fingerprint != fp:
			return &apierr.Error{Status: http.StatusUnprocessableEntity, Type: "invalid_request_error", Code: "idempotency_key_reused", Param: idemHeader,
				Message: "Idempotency-Key " + strconv.Quote(key) + " was used for a different request within the retention window; send a new key for a new request"}
		case got.State == data.IdemDone:
			c.Response().Header().Set("Idempotent-Replayed", "true")
			return c.Blob(got.Status, got.ContentType, got.Body)
		}
		alive, err := s.store.IdemOwnerAlive(ctx, got.Owner)
		if err != nil {
			return err
		}
		if !alive {
			// Its gateway died creating it: nothing was answered.
			if err := s.store.ReleaseIdempotency(ctx, p.TenantID, key, got.RequestID); err != nil {
				return err
			}
			continue
		}
		if time.Now().After(deadline) {
			return errIdemPending
		}
		select {
		case <-time.After(50 * time.Millisecond):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func printable(k string) bool {
	for i := 0; i < len(k); i++ {
		if k[i] < 0x20 || k[i] > 0x7e {
			return false
		}
	}
	return true
}
