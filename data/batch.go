package data

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
)

// ErrBatchStatus: the batch is not in a status that allows the change (for
// example cancelling a completed batch, or recording a line of a batch that
// is no longer running).
var ErrBatchStatus = errors.New("batch status does not allow this")

// Batch statuses, named as OpenAI names them. A batch moves
// validating → in_progress → finalizing → completed, or ends failed (no
// line could run), expired (its window passed) or, through cancelling,
// cancelled.
const (
	BatchValidating = "validating"
	BatchFailed     = "failed"
	BatchInProgress = "in_progress"
	BatchFinalizing = "finalizing"
	BatchCompleted  = "completed"
	BatchExpired    = "expired"
	BatchCancelling = "cancelling"
	BatchCancelled  = "cancelled"
)

// batchTimeColumn names the column stamped when a batch enters a status.
var batchTimeColumn = map[string]string{
	BatchFailed:     "failed_at",
	BatchInProgress: "in_progress_at",
	BatchFinalizing: "finalizing_at",
	BatchCompleted:  "completed_at",
	BatchExpired:    "expired_at",
	BatchCancelling: "cancelling_at",
	BatchCancelled:  "cancelled_at",
}

// Batch is a batch of requests run asynchronously for the key that created
// it. Zero times are times not reached yet.
type Batch struct {
	ID               string
	TenantID         int64
	KeyID            string // the key that created the batch; its lines run as this key
	Endpoint         string
	InputFileID      string
	CompletionWindow string
	Status           string
	Metadata         map[string]string
	Errors           []BatchError // why the batch failed, if it did
	OutputFileID     string
	ErrorFileID      string
	// OutputExpiresAfter is the lifetime of the batch's output and error
	// files from their creation; 0 means the caller's default.
	OutputExpiresAfter time.Duration

	Total, Completed, Failed       int64
	PromptTokens, CompletionTokens int64 // summed over completed lines

	CreatedAt, ExpiresAt             time.Time
	InProgressAt, FinalizingAt       time.Time
	CompletedAt, FailedAt, ExpiredAt time.Time
	CancellingAt, CancelledAt        time.Time
}

// BatchError is one reason a batch failed.
type BatchError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	Param   string `json:"param,omitempty"`
	Line    int64  `json:"line,omitempty"` // 1-based line of the input file; 0 when not about a line
}

// BatchLine is the result of one line of a batch's input file: a response
// (of any status) or, with no response, an error code saying why the line
// did not run.
type BatchLine struct {
	Line       int64  // 0-based line number in the input file
	ID         string // "batch_req_…"
	CustomID   string
	OK         bool // the line succeeded: it goes to the output file, else to the error file
	StatusCode int  // HTTP status of the response; 0 when there was none
	RequestID  string
	Body       []byte // response body; nil when there was none
	ErrorCode  string
	ErrorMsg   string
	FinishedAt time.Time // set by the store
	// PromptTokens and CompletionTokens of an OK line are added to the
	// batch's usage; they are not stored per line (the body has them).
	PromptTokens, CompletionTokens int64
}

// CreateBatch stores a new batch in status validating, created now and
// expiring after window, and returns it as stored. Its input file must be
// a file of its tenant ([ErrNotFound] if not): checked in the same
// transaction, so a file deleted meanwhile cannot become a batch's input.
func (s *Store) CreateBatch(ctx context.Context, b Batch, window time.Duration) (Batch, error) {
	if b.ID == "" || b.TenantID == 0 || b.KeyID == "" || b.Endpoint == "" || b.InputFileID == "" || window <= 0 {
		return Batch{}, errors.New("create batch: id, tenant, key, endpoint, input file and window are required")
	}
	meta := ""
	if len(b.Metadata) > 0 {
		raw, err := json.Marshal(b.Metadata)
		if err != nil {
			return Batch{}, fmt.Errorf("create batch: metadata: %w", err)
		}
		meta = string(raw)
	}
	created := now()
	var out Batch
	err := s.writeTx(ctx, func(tx *sql.Tx) error {
		var n int
		if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM files WHERE id = ? AND tenant_id = ?`,
			b.InputFileID, b.TenantID).Scan(&n); err != nil {
			return err
		}
		if n == 0 {
			return fmt.Errorf("input file %s: %w", b.InputFileID, ErrNotFound)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO batches
			(id, tenant_id, key_id, endpoint, input_file_id, completion_window, status, metadata, created_at, expires_at,
			output_expires_after)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
			b.ID, b.TenantID, b.KeyID, b.Endpoint, b.InputFileID, b.CompletionWindow, BatchValidating, meta,
			toMicros(created), toMicros(created.Add(window)), int64(b.OutputExpiresAfter/time.Second)); err != nil {
			return err
		}
		var err error
		out, err = scanBatch(tx.QueryRowContext(ctx, `SELECT `+batchCols+` FROM batches WHERE id = ?`, b.ID))
		return err
	})
	if err != nil {
		return Batch{}, fmt.Errorf("create batch: %w", err)
	}
	return out, nil
}

const batchCols = `id, tenant_id, key_id, endpoint, input_file_id, completion_window, status, metadata, errors,
	output_file_id, error_file_id, output_expires_after, total, completed, failed, prompt_tokens, completion_tokens,
	created_at, expires_at, in_progress_at, finalizing_at, completed_at, failed_at, expired_at, cancelling_at, cancelled_at`

func scanBatch(r rowScanner) (Batch, error) {
	var b Batch
	var meta, errs string
	var created, expires, outputTTL int64
	var times [7]sql.NullInt64
	err := r.Scan(&b.ID, &b.TenantID, &b.KeyID, &b.Endpoint, &b.InputFileID, &b.CompletionWindow, &b.Status, &meta, &errs,
		&b.OutputFileID, &b.ErrorFileID, &outputTTL, &b.Total, &b.Completed, &b.Failed, &b.PromptTokens, &b.CompletionTokens,
		&created, &expires, &times[0], &times[1], &times[2], &times[3], &times[4], &times[5], &times[6])
	if err != nil {
		return Batch{}, err
	}
	if meta != "" {
		if err := json.Unmarshal([]byte(meta), &b.Metadata); err != nil {
			return Batch{}, fmt.Errorf("batch %s: metadata: %w", b.ID, err)
		}
	}
	if errs != "" {
		if err := json.Unmarshal([]byte(errs), &b.Errors); err != nil {
			return Batch{}, fmt.Errorf("batch %s: errors: %w", b.ID, err)
		}
	}
	b.CreatedAt, b.ExpiresAt = fromMicros(created), fromMicros(expires)
	b.OutputExpiresAfter = time.Duration(outputTTL) * time.Second
	for i, p := range []*time.Time{&b.InProgressAt, &b.FinalizingAt, &b.CompletedAt, &b.FailedAt, &b.ExpiredAt, &b.CancellingAt, &b.CancelledAt} {
		*p = fromNullMicros(times[i])
	}
	return b, nil
}

// BatchByID returns the batch with that id, or [ErrNotFound]. tenantID,
// when not 0, restricts the lookup to that tenant's batches.
func (s *Store) BatchByID(ctx context.Context, tenantID int64, id string) (Batch, error) {
	b, err := getBatch(ctx, s.read, tenantID, id)
	if err != nil {
		return Batch{}, fmt.Errorf("batch %s: %w", id, err)
	}
	return b, nil
}

type queryRower interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

func getBatch(ctx context.Context, q queryRower, tenantID int64, id string) (Batch, error) {
	var row *sql.Row
	if tenantID != 0 {
		row = q.QueryRowContext(ctx, `SELECT `+batchCols+` FROM batches WHERE id = ? AND tenant_id = ?`, id, tenantID)
	} else {
		row = q.QueryRowContext(ctx, `SELECT `+batchCols+` FROM batches WHERE id = ?`, id)
	}
	b, err := scanBatch(row)
	if errors.Is(err, sql.ErrNoRows) {
		err = ErrNotFound
	}
	return b, err
}

// Batches returns up to limit of the tenant's batches, newest first,
// starting after the batch with id after ("" = from the newest).
func (s *Store) Batches(ctx context.Context, tenantID int64, after string, limit int) ([]Batch, error) {
	q := `SELECT ` + batchCols + ` FROM batches WHERE tenant_id = ?`
	args := []any{tenantID}
	if after != "" {
		q += ` AND seq < (SELECT seq FROM batches WHERE id = ? AND tenant_id = ?)`
		args = append(args, after, tenantID)
	}
	q += ` ORDER BY seq DESC LIMIT ?`
	args = append(args, limit)
	rows, err := s.read.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("batches: %w", err)
	}
	defer rows.Close()
	var bs []Batch
	for rows.Next() {
		b, err := scanBatch(rows)
		if err != nil {
			return nil, fmt.Errorf("batches: %w", err)
		}
		bs = append(bs, b)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("batches: %w", err)
	}
	return bs, nil
}

// Batches across gateways: a batch is run by one gateway at a time, the
// one that claimed it ([Store.ClaimBatch]); its claim lasts as long as that
// gateway's lease (see [Store.Renew]), so the batches of a gateway that
// died are taken over by another once its lease has run out. The lines it
// finished keep their rows and are not run again; a line it had in flight
// runs again on the new owner (batch_line_starts counts it towards the
// executor's limit on unclean stops). With SQLite there is one gateway and
// every claim is its.

// claimable is the condition under which this gateway may run a batch: no
// one has claimed it, it has, or its claimant's lease has run out.
const claimable = `(gateway = '' OR gateway = ? OR gateway NOT IN (SELECT id FROM gateways WHERE lease_until >= ?))`

// UnfinishedBatches returns the ids of the batches an executor still has
// work on (validating, in_progress, finalizing or cancelling) and this
// gateway may claim, oldest first.
func (s *Store) UnfinishedBatches(ctx context.Context) ([]string, error) {
	// The executor polls this: prepared once (see readStmt).
	st, err := s.readStmt(ctx, `SELECT id FROM batches WHERE status IN (?, ?, ?, ?) AND `+claimable+` ORDER BY seq`)
	if err != nil {
		return nil, fmt.Errorf("unfinished batches: %w", err)
	}
	rows, err := st.QueryContext(ctx, BatchValidating, BatchInProgress, BatchFinalizing, BatchCancelling, s.instance, toMicros(now()))
	if err != nil {
		return nil, fmt.Errorf("unfinished batches: %w", err)
	}
	defer rows.Close()
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, fmt.Errorf("unfinished batches: %w", err)
		}
		ids = append(ids, id)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("unfinished batches: %w", err)
	}
	return ids, nil
}

// ClaimBatch makes this gateway the one that runs batch id, unless another
// live gateway runs it; it reports whether this gateway has it now. An
// executor calls it before it runs a batch and again while it does: false
// then means its lease ran out (it was cut off from the database) and
// another gateway took the batch over.
func (s *Store) ClaimBatch(ctx context.Context, id string) (bool, error) {
	if s.engine == enginePostgres && !s.leased.Load() {
		if _, err := s.Renew(ctx); err != nil {
			return false, fmt.Errorf("claim batch: %w", err)
		}
	}
	var n int64
	err := s.writeTx(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `UPDATE batches SET gateway = ? WHERE id = ? AND `+claimable,
			s.instance, id, s.instance, toMicros(now()))
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	})
	if err != nil {
		return false, fmt.Errorf("claim batch: %w", err)
	}
	return n > 0, nil
}

// ReleaseBatches gives up this gateway's claims, when its executor stops
// cleanly: another gateway takes the batches over at once instead of after
// the lease.
func (s *Store) ReleaseBatches(ctx context.Context) error {
	if s.instance == "" {
		return nil
	}
	err := s.writeTx(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `UPDATE batches SET gateway = '' WHERE gateway = ?`, s.instance)
		return err
	})
	if err != nil {
		return fmt.Errorf("release batches: %w", err)
	}
	return nil
}

// setStatus moves batch id from one of the from statuses to status to,
// stamping the time column of to; ErrBatchStatus if it was in none of them.
func setStatus(ctx context.Context, tx *sql.Tx, id string, from []string, to string, extra string, args ...any) error {
	col, ok := batchTimeColumn[to]
	if !ok {
		return fmt.Errorf("unknown batch status %q", to)
	}
	q := `UPDATE batches SET status = ?, ` + col + ` = ?` + extra + ` WHERE id = ? AND status IN (?` + strings.Repeat(", ?", len(from)-1) + `)`
	all := append([]any{to, toMicros(now())}, args...)
	all = append(all, id)
	for _, f := range from {
		all = append(all, f)
	}
	res, err := tx.ExecContext(ctx, q, all...)
	if err != nil {
		return err
	}
	if n, err := res.RowsAffected(); err != nil {
		return err
	} else if n == 0 {
		return ErrBatchStatus
	}
	return nil
}

// SetBatchStatus moves batch id from one of the from statuses to status
// to, or returns [ErrBatchStatus] if it is in none of them.
func (s *Store) SetBatchStatus(ctx context.Context, id string, from []string, to string) error {
	err := s.writeTx(ctx, func(tx *sql.Tx) error { return setStatus(ctx, tx, id, from, to, "") })
	if err != nil {
		return fmt.Errorf("batch %s: %w", id, err)
	}
	return nil
}

// StartBatch moves a validating batch to in_progress with total lines, and
// records the lines that failed validation in the same transaction.
func (s *Store) StartBatch(ctx context.Context, id string, total int64, invalid []BatchLine) error {
	err := s.writeTx(ctx, func(tx *sql.Tx) error {
		if err := setStatus(ctx, tx, id, []string{BatchValidating}, BatchInProgress, `, total = ?`, total); err != nil {
			return err
		}
		for _, l := range invalid {
			if _, err := insertLine(ctx, tx, id, l); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("start batch %s: %w", id, err)
	}
	return nil
}

// FailBatch moves a validating batch to failed with errs saying why.
func (s *Store) FailBatch(ctx context.Context, id string, errs []BatchError) error {
	raw, err := json.Marshal(errs)
	if err != nil {
		return fmt.Errorf("fail batch %s: %w", id, err)
	}
	err = s.writeTx(ctx, func(tx *sql.Tx) error {
		return setStatus(ctx, tx, id, []string{BatchValidating}, BatchFailed, `, errors = ?`, string(raw))
	})
	if err != nil {
		return fmt.Errorf("fail batch %s: %w", id, err)
	}
	return nil
}

// CancelBatch asks for the tenant's batch to be cancelled: a validating or
// in_progress batch moves to cancelling; a cancelling or cancelled batch is
// returned as it is; any other status is [ErrBatchStatus].
func (s *Store) CancelBatch(ctx context.Context, tenantID int64, id string) (Batch, error) {
	var out Batch
	err := s.writeTx(ctx, func(tx *sql.Tx) error {
		b, err := getBatch(ctx, tx, tenantID, id)
		if err != nil {
			return err
		}
		switch b.Status {
		case BatchCancelling, BatchCancelled:
			out = b
			return nil
		case BatchValidating, BatchInProgress:
		default:
			return ErrBatchStatus
		}
		if err := setStatus(ctx, tx, id, []string{b.Status}, BatchCancelling, ""); err != nil {
			return err
		}
		out, err = getBatch(ctx, tx, tenantID, id)
		return err
	})
	if err != nil {
		return Batch{}, fmt.Errorf("cancel batch %s: %w", id, err)
	}
	return out, nil
}

// RecordBatchLines records the results of lines of a running (in_progress
// or cancelling) batch and moves its counters, all in one transaction. A
// line already recorded is left as it is and not counted again. It returns
// how many lines were new.
func (s *Store) RecordBatchLines(ctx context.Context, id string, lines ...BatchLine) (int, error) {
	n := 0
	err := s.writeTx(ctx, func(tx *sql.Tx) error {
		var status string
		if err := tx.QueryRowContext(ctx, `SELECT status FROM batches WHERE id = ?`, id).Scan(&status); err != nil {
			if errors.Is(err, sql.ErrNoRows) {
				return ErrNotFound
			}
			return err
		}
		if status != BatchInProgress && status != BatchCancelling {
			return ErrBatchStatus
		}
		n = 0
		for _, l := range lines {
			added, err := insertLine(ctx, tx, id, l)
			if err != nil {
				return err
			}
			if _, err := tx.ExecContext(ctx, `DELETE FROM batch_line_starts WHERE batch_id = ? AND line = ?`, id, l.Line); err != nil {
				return err
			}
			if added {
				n++
			}
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("record batch %s lines: %w", id, err)
	}
	return n, nil
}

func insertLine(ctx context.Context, tx *sql.Tx, batchID string, l BatchLine) (bool, error) {
	res, err := tx.ExecContext(ctx, `INSERT INTO batch_lines
		(batch_id, line, id, custom_id, ok, status_code, request_id, body, error_code, error_message, finished_at)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (batch_id, line) DO NOTHING`,
		batchID, l.Line, l.ID, l.CustomID, boolInt(l.OK), l.StatusCode, l.RequestID, l.Body, l.ErrorCode, l.ErrorMsg, toMicros(now()))
	if err != nil {
		return false, err
	}
	if n, err := res.RowsAffected(); err != nil || n == 0 {
		return false, err
	}
	if l.OK {
		_, err = tx.ExecContext(ctx, `UPDATE batches SET completed = completed + 1,
			prompt_tokens = prompt_tokens + ?, completion_tokens = completion_tokens + ? WHERE id = ?`,
			l.PromptTokens, l.CompletionTokens, batchID)
	} else {
		_, err = tx.ExecContext(ctx, `UPDATE batches SET failed = failed + 1 WHERE id = ?`, batchID)
	}
	return err == nil, err
}

// StartBatchLine notes that a line of batch id starts running and returns
// how many unclean runs it has had before (starts without a result or a
// clean stop in between).
func (s *Store) StartBatchLine(ctx context.Context, id string, line int64) (before int, err error) {
	err = s.writeTx(ctx, func(tx *sql.Tx) error {
		return tx.QueryRowContext(ctx, `INSERT INTO batch_line_starts (batch_id, line, starts) VALUES (?, ?, 1)
			ON CONFLICT (batch_id, line) DO UPDATE SET starts = batch_line_starts.starts + 1 RETURNING starts - 1`, id, line).Scan(&before)
	})
	if err != nil {
		return 0, fmt.Errorf("start batch %s line %d: %w", id, line, err)
	}
	return before, nil
}

// LineBilled reports whether tenant was billed for an answer to a request
// whose id starts with prefix, made at since or later: a batch line's
// earlier run (its request ids share the line's prefix).
func (s *Store) LineBilled(ctx context.Context, tenantID int64, since time.Time, prefix string) (bool, error) {
	var n int
	err := s.read.QueryRowContext(ctx, `SELECT COUNT(*) FROM ledger
		WHERE tenant_id = ? AND ts >= ? AND substr(id, 1, ?) = ? AND outcome = ?`,
		tenantID, toMicros(since), len(prefix), prefix, OutcomeOK).Scan(&n)
	if err != nil {
		return false, fmt.Errorf("ledger rows of %s: %w", prefix, err)
	}
	return n > 0, nil
}

// EndBatchLine forgets a line's starts: it has a result, or the gateway
// stopped it cleanly.
func (s *Store) EndBatchLine(ctx context.Context, id string, line int64) error {
	err := s.writeTx(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `DELETE FROM batch_line_starts WHERE batch_id = ? AND line = ?`, id, line)
		return err
	})
	if err != nil {
		return fmt.Errorf("end batch %s line %d: %w", id, line, err)
	}
	return nil
}

// BatchLineStarts returns, for the lines of batch id that started and have
// neither a result nor a clean stop, how many times they started.
func (s *Store) BatchLineStarts(ctx context.Context, id string) (map[int64]int, error) {
	rows, err := s.read.QueryContext(ctx, `SELECT line, starts FROM batch_line_starts WHERE batch_id = ?`, id)
	if err != nil {
		return nil, fmt.Errorf("batch %s line starts: %w", id, err)
	}
	defer rows.Close()
	out := map[int64]int{}
	for rows.Next() {
		var line int64
		var n int
		if err := rows.Scan(&line, &n); err != nil {
			return nil, fmt.Errorf("batch %s line starts: %w", id, err)
		}
		out[line] = n
	}
	return out, rows.Err()
}

// BatchLinesDone returns the line numbers of batch id that have a result.
func (s *Store) BatchLinesDone(ctx context.Context, id string) (map[int64]bool, error) {
	rows, err := s.read.QueryContext(ctx, `SELECT line FROM batch_lines WHERE batch_id = ?`, id)
	if err != nil {
		return nil, fmt.Errorf("batch %s lines: %w", id, err)
	}
	defer rows.Close()
	done := map[int64]bool{}
	for rows.Next() {
		var l int64
		if err := rows.Scan(&l); err != nil {
			return nil, fmt.Errorf("batch %s lines: %w", id, err)
		}
		done[l] = true
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("batch %s lines: %w", id, err)
	}
	return done, nil
}

// EachBatchLine calls fn with every recorded line of batch id in line
// order, stopping at the first error fn returns.
func (s *Store) EachBatchLine(ctx context.Context, id string, fn func(BatchLine) error) error {
	rows, err := s.read.QueryContext(ctx, `SELECT line, id, custom_id, ok, status_code, request_id, body,
		error_code, error_message, finished_at FROM batch_lines WHERE batch_id = ? ORDER BY line`, id)
	if err != nil {
		return fmt.Errorf("batch %s lines: %w", id, err)
	}
	defer rows.Close()
	for rows.Next() {
		var l BatchLine
		var finished int64
		if err := rows.Scan(&l.Line, &l.ID, &l.CustomID, &l.OK, &l.StatusCode, &l.RequestID, &l.Body,
			&l.ErrorCode, &l.ErrorMsg, &finished); err != nil {
			return fmt.Errorf("batch %s lines: %w", id, err)
		}
		l.FinishedAt = fromMicros(finished)
		if err := fn(l); err != nil {
			return err
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("batch %s lines: %w", id, err)
	}
	return nil
}

// FinishBatch moves batch id from one of the from statuses to its final
// status to, registering its output and error files (either may be nil; a
// zero CreatedAt is set to now) in the same transaction. Its lines' rows
// are deleted: the two files now hold them, and a deleted or expired file
// then frees the disk it used.
func (s *Store) FinishBatch(ctx context.Context, id string, from []string, to string, output, errorFile *File) error {
	err := s.writeTx(ctx, func(tx *sql.Tx) error {
		var outID, errID string
		for _, f := range []*File{output, errorFile} {
			if f == nil {
				continue
			}
			if f.CreatedAt.IsZero() {
				f.CreatedAt = now()
			}
			if err := insertFile(ctx, tx, *f); err != nil {
				return err
			}
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM batch_lines WHERE batch_id = ?`, id); err != nil {
			return err
		}
		if output != nil {
			outID = output.ID
		}
		if errorFile != nil {
			errID = errorFile.ID
		}
		return setStatus(ctx, tx, id, from, to, `, output_file_id = ?, error_file_id = ?`, outID, errID)
	})
	if err != nil {
		return fmt.Errorf("finish batch %s: %w", id, err)
	}
	return nil
}
