package data

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// File is a stored file of the Batch API. Its body lives on disk, kept by
// the caller under the file's id; the store only says who owns it, how big
// it is and when it expires.
type File struct {
	ID        string
	TenantID  int64
	Purpose   string // "batch" (uploaded input), "batch_output" (written by the executor)
	Filename  string
	Bytes     int64
	CreatedAt time.Time // zero: set to now when stored
	ExpiresAt time.Time // zero: never
}

// StorageQuotaError: storing a file of Bytes would take its tenant's files,
// Used bytes already, past Limit.
type StorageQuotaError struct {
	Used, Limit, Bytes int64
}

func (e *StorageQuotaError) Error() string {
	return fmt.Sprintf("the tenant's files use %d of their %d bytes; %d more do not fit", e.Used, e.Limit, e.Bytes)
}

// FileInUseError: the file is the input of a batch that has not finished,
// which may still read it.
type FileInUseError struct {
	BatchID, Status string
}

func (e *FileInUseError) Error() string {
	return fmt.Sprintf("the file is the input of batch %s, which is %s", e.BatchID, e.Status)
}

// unfinishedStatuses are the statuses of a batch the executor still works
// on; its input file must stay.
const unfinishedStatuses = `('` + BatchValidating + `', '` + BatchInProgress + `', '` + BatchFinalizing + `', '` + BatchCancelling + `')`

// CreateFile stores f's metadata and returns it as stored. With quota > 0
// it refuses, with a [*StorageQuotaError], a file that would take its
// tenant's files (their Bytes summed) past quota; the check and the insert
// are one transaction, so concurrent uploads cannot pass it together.
func (s *Store) CreateFile(ctx context.Context, f File, quota int64) (File, error) {
	if f.ID == "" || f.TenantID == 0 || f.Purpose == "" {
		return File{}, errors.New("create file: id, tenant and purpose are required")
	}
	if f.CreatedAt.IsZero() {
		f.CreatedAt = now()
	}
	err := s.writeTx(ctx, func(tx *sql.Tx) error {
		if quota > 0 {
			used, err := tenantFileBytes(ctx, tx, f.TenantID)
			if err != nil {
				return err
			}
			if used+f.Bytes > quota {
				return &StorageQuotaError{Used: used, Limit: quota, Bytes: f.Bytes}
			}
		}
		return insertFile(ctx, tx, f)
	})
	if err != nil {
		return File{}, fmt.Errorf("create file: %w", err)
	}
	return f, nil
}

func insertFile(ctx context.Context, tx *sql.Tx, f File) error {
	var expires sql.NullInt64
	if !f.ExpiresAt.IsZero() {
		expires = sql.NullInt64{Int64: toMicros(f.ExpiresAt), Valid: true}
	}
	_, err := tx.ExecContext(ctx, `INSERT INTO files (id, tenant_id, purpose, filename, bytes, created_at, expires_at)
		VALUES (?, ?, ?, ?, ?, ?, ?)`, f.ID, f.TenantID, f.Purpose, f.Filename, f.Bytes, toMicros(f.CreatedAt), expires)
	return err
}

func tenantFileBytes(ctx context.Context, q queryRower, tenantID int64) (int64, error) {
	var n int64
	err := q.QueryRowContext(ctx, `SELECT CAST(COALESCE(SUM(bytes), 0) AS BIGINT) FROM files WHERE tenant_id = ?`, tenantID).Scan(&n)
	return n, err
}

// TenantFileBytes returns the bytes of all the tenant's files: what counts
// against its storage quota.
func (s *Store) TenantFileBytes(ctx context.Context, tenantID int64) (int64, error) {
	n, err := tenantFileBytes(ctx, s.read, tenantID)
	if err != nil {
		return 0, fmt.Errorf("tenant file bytes: %w", err)
	}
	return n, nil
}

const fileCols = `id, tenant_id, purpose, filename, bytes, created_at, expires_at`

func scanFile(r rowScanner) (File, error) {
	var f File
	var created int64
	var expires sql.NullInt64
	if err := r.Scan(&f.ID, &f.TenantID, &f.Purpose, &f.Filename, &f.Bytes, &created, &expires); err != nil {
		return File{}, err
	}
	f.CreatedAt, f.ExpiresAt = fromMicros(created), fromNullMicros(expires)
	return f, nil
}

// FileByID returns the tenant's file with that id, or [ErrNotFound] (also
// when the file belongs to another tenant). An expired file is returned
// until it is deleted; the caller decides what its expiry means.
func (s *Store) FileByID(ctx context.Context, tenantID int64, id string) (File, error) {
	f, err := scanFile(s.read.QueryRowContext(ctx, `SELECT `+fileCols+` FROM files WHERE id = ? AND tenant_id = ?`, id, tenantID))
	if errors.Is(err, sql.ErrNoRows) {
		err = ErrNotFound
	}
	if err != nil {
		return File{}, fmt.Errorf("file %s: %w", id, err)
	}
	return f, nil
}

// FileExists reports whether any tenant has a file with that id.
func (s *Store) FileExists(ctx context.Context, id string) (bool, error) {
	var n int
	if err := s.read.QueryRowContext(ctx, `SELECT COUNT(*) FROM files WHERE id = ?`, id).Scan(&n); err != nil {
		return false, fmt.Errorf("file %s: %w", id, err)
	}
	return n > 0, nil
}

// Files returns up to limit of the tenant's files, newest first, starting
// after the file with id after ("" = from the newest); purpose "" means any.
// Files expired at time at are left out; a zero at lists them all.
func (s *Store) Files(ctx context.Context, tenantID int64, purpose, after string, limit int, at time.Time) ([]File, error) {
	q := `SELECT ` + fileCols + ` FROM files WHERE tenant_id = ?`
	args := []any{tenantID}
	if purpose != "" {
		q += ` AND purpose = ?`
		args = append(args, purpose)
	}
	if !at.IsZero() {
		q += ` AND (expires_at IS NULL OR expires_at > ?)`
		args = append(args, toMicros(at))
	}
	if after != "" {
		q += ` AND rowid < (SELECT rowid FROM files WHERE id = ? AND tenant_id = ?)`
		args = append(args, after, tenantID)
	}
	q += ` ORDER BY rowid DESC LIMIT ?`
	args = append(args, limit)
	return s.queryFiles(ctx, "files", q, args...)
}

func (s *Store) queryFiles(ctx context.Context, what, q string, args ...any) ([]File, error) {
	return s.queryFilesWith(ctx, what, func() (*sql.Rows, error) { return s.read.QueryContext(ctx, q, args...) })
}

// queryFilesWith is queryFiles with the query run by query.
func (s *Store) queryFilesWith(ctx context.Context, what string, query func() (*sql.Rows, error)) ([]File, error) {
	rows, err := query()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	defer rows.Close()
	var fs []File
	for rows.Next() {
		f, err := scanFile(rows)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		fs = append(fs, f)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return fs, nil
}

// fileInUse returns the error for file id when a batch that has not
// finished reads it, else nil.
func fileInUse(ctx context.Context, tx *sql.Tx, id string) error {
	var e FileInUseError
	err := tx.QueryRowContext(ctx, `SELECT id, status FROM batches WHERE input_file_id = ? AND status IN `+unfinishedStatuses+
		` ORDER BY seq LIMIT 1`, id).Scan(&e.BatchID, &e.Status)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return nil
	case err != nil:
		return err
	}
	return &e
}

// DeleteFile deletes the tenant's file with that id and returns it, so the
// caller removes its body. It is [ErrNotFound] for no such file of the
// tenant and a [*FileInUseError] while a batch that has not finished has it
// as input. The check and the delete are one transaction, and CreateBatch
// checks its input file in its own, so a batch never starts on a deleted
// file.
func (s *Store) DeleteFile(ctx context.Context, tenantID int64, id string) (File, error) {
	var f File
	err := s.writeTx(ctx, func(tx *sql.Tx) error {
		var err error
		f, err = scanFile(tx.QueryRowContext(ctx, `SELECT `+fileCols+` FROM files WHERE id = ? AND tenant_id = ?`, id, tenantID))
		if errors.Is(err, sql.ErrNoRows) {
			return ErrNotFound
		}
		if err != nil {
			return err
		}
		if err := fileInUse(ctx, tx, id); err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, `DELETE FROM files WHERE id = ?`, id)
		return err
	})
	if err != nil {
		return File{}, fmt.Errorf("delete file %s: %w", id, err)
	}
	return f, nil
}

// expiredFilesSQL is DeleteExpiredFiles's read.
const expiredFilesSQL = `SELECT ` + fileCols + ` FROM files f
		WHERE expires_at IS NOT NULL AND expires_at <= ?
		AND NOT EXISTS (SELECT 1 FROM batches b WHERE b.input_file_id = f.id AND b.status IN ` + unfinishedStatuses + `)
		ORDER BY expires_at LIMIT ?`

// DeleteExpiredFiles deletes up to limit files that expired at time at and
// returns them, so the caller removes their bodies. A file that a batch
// which has not finished still reads is kept until that batch finishes.
func (s *Store) DeleteExpiredFiles(ctx context.Context, at time.Time, limit int) ([]File, error) {
	// The read finds candidates without taking the write lock, which the
	// executor would otherwise take every poll.
	// The executor polls this: prepared once (see readStmt).
	cands, err := s.queryFilesWith(ctx, "expired files", func() (*sql.Rows, error) {
		st, err := s.readStmt(ctx, expiredFilesSQL)
		if err != nil {
			return nil, err
		}
		return st.QueryContext(ctx, toMicros(at), limit)
	})
	if err != nil || len(cands) == 0 {
		return nil, err
	}
	var out []File
	err = s.writeTx(ctx, func(tx *sql.Tx) error {
		out = out[:0]
		for _, f := range cands {
			if err := fileInUse(ctx, tx, f.ID); err != nil {
				var inUse *FileInUseError
				if errors.As(err, &inUse) {
					continue // a batch started on it since the read
				}
				return err
			}
			res, err := tx.ExecContext(ctx, `DELETE FROM files WHERE id = ?`, f.ID)
			if err != nil {
				return err
			}
			if n, _ := res.RowsAffected(); n > 0 {
				out = append(out, f)
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("delete expired files: %w", err)
	}
	return out, nil
}
