package batch

// Batch files: reading a batch's input JSONL and writing its output and
// error files in OpenAI's format.

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"

	"github.com/tidwall/gjson"

	"github.com/tailgate-dev/tailgate/data"
	"github.com/tailgate-dev/tailgate/server/strictjson"
)

// resultLine is one line of an output or error file, in OpenAI's format.
type resultLine struct {
	ID       string          `json:"id"`
	CustomID *string         `json:"custom_id"`
	Response *resultResponse `json:"response"`
	Error    *resultError    `json:"error"`
}

type resultResponse struct {
	StatusCode int             `json:"status_code"`
	RequestID  string          `json:"request_id"`
	Body       json.RawMessage `json:"body"`
}

type resultError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// writeResults writes the recorded lines of b, in input order, to a new
// output file (successes) and error file (the rest); a file with no line is
// not written (nil).
func (x *batchExec) writeResults(ctx context.Context, b data.Batch) (out, errFile *data.File, err error) {
	ow, err := x.newResultWriter(b, "output")
	if err != nil {
		return nil, nil, err
	}
	defer ow.discard()
	ew, err := x.newResultWriter(b, "error")
	if err != nil {
		return nil, nil, err
	}
	defer ew.discard()
	err = x.s.store.EachBatchLine(ctx, b.ID, func(l data.BatchLine) error {
		rl := resultLine{ID: l.ID}
		if l.CustomID != "" {
			rl.CustomID = &l.CustomID
		}
		if l.StatusCode > 0 {
			body := json.RawMessage(l.Body)
			if !json.Valid(body) {
				body, _ = json.Marshal(string(l.Body))
			}
			rl.Response = &resultResponse{StatusCode: l.StatusCode, RequestID: l.RequestID, Body: body}
		} else {
			rl.Error = &resultError{Code: l.ErrorCode, Message: l.ErrorMsg}
		}
		if l.OK {
			return ow.add(rl)
		}
		return ew.add(rl)
	})
	if err != nil {
		return nil, nil, err
	}
	if out, err = ow.commit(); err != nil {
		return nil, nil, err
	}
	if errFile, err = ew.commit(); err != nil {
		if out != nil {
			_ = os.Remove(x.s.filePath(out.ID))
		}
		return nil, nil, err
	}
	return out, errFile, nil
}

// resultWriter writes one result file to a temporary file, then moves it
// under its new id.
type resultWriter struct {
	x     *batchExec
	b     data.Batch
	kind  string
	tmp   *os.File
	bw    *bufio.Writer
	enc   *json.Encoder
	lines int
}

func (x *batchExec) newResultWriter(b data.Batch, kind string) (*resultWriter, error) {
	f, err := os.CreateTemp(x.cfg.FilesDir, ".result-*")
	if err != nil {
		return nil, fmt.Errorf("write %s file: %w", kind, err)
	}
	w := &resultWriter{x: x, b: b, kind: kind, tmp: f, bw: bufio.NewWriterSize(f, 64<<10)}
	w.enc = json.NewEncoder(w.bw)
	w.enc.SetEscapeHTML(false)
	return w, nil
}

func (w *resultWriter) add(rl resultLine) error {
	w.lines++
	return w.enc.Encode(rl)
}

// commit makes the file durable under a new id and describes it; nil when
// it has no line.
func (w *resultWriter) commit() (*data.File, error) {
	if w.lines == 0 {
		return nil, nil
	}
	if err := w.bw.Flush(); err != nil {
		return nil, fmt.Errorf("write %s file: %w", w.kind, err)
	}
	if err := w.tmp.Sync(); err != nil {
		return nil, fmt.Errorf("write %s file: %w", w.kind, err)
	}
	fi, err := w.tmp.Stat()
	if err != nil {
		return nil, fmt.Errorf("write %s file: %w", w.kind, err)
	}
	id := newID("file-")
	if err := os.Rename(w.tmp.Name(), w.x.s.filePath(id)); err != nil {
		return nil, fmt.Errorf("write %s file: %w", w.kind, err)
	}
	created := w.x.cfg.Now()
	return &data.File{ID: id, TenantID: w.b.TenantID, Purpose: purposeOutput, Filename: w.b.ID + "_" + w.kind + ".jsonl",
		Bytes: fi.Size(), CreatedAt: created, ExpiresAt: created.Add(cmp.Or(w.b.OutputExpiresAfter, w.x.cfg.FileExpiry))}, nil
}

// discard closes the temporary file and removes it unless it was committed.
func (w *resultWriter) discard() {
	_ = w.tmp.Close()
	_ = os.Remove(w.tmp.Name()) // after a commit the name is gone: a no-op
}

// inputLine is a non-blank line of a batch's input file: where it is and,
// when it cannot run, why.
type inputLine struct {
	n         int64 // 0-based line number
	off, size int64
	customID  string
	errCode   string // "" for a line that can run
	errMsg    string
}

// scanBatchInput reads a JSONL input file and checks each line: a JSON
// object {"custom_id","method":"POST","url","body"} whose url is the batch's
// endpoint, whose custom_id is not used by an earlier line, and whose body
// is an object naming a model and not asking for a stream. Blank lines are
// skipped. A file of more than maxLines requests, or with a line longer
// than maxLineBytes, is a *lineLimitError; it holds one line at a time.
// Checking is deterministic, so a restarted executor finds the same lines
// again.
func scanBatchInput(r io.Reader, endpoint string, maxLines int, maxLineBytes int64) ([]inputLine, error) {
	lr := &lineReader{br: bufio.NewReaderSize(r, 64<<10), max: maxLineBytes}
	seen := map[string]int64{}
	var out []inputLine
	var off int64
	for n := int64(0); ; n++ {
		raw, size, tooLong, err := lr.next()
		if err != nil && !errors.Is(err, io.EOF) {
			return nil, err
		}
		if tooLong {
			return nil, errLineTooLong(n+1, maxLineBytes)
		}
		if len(bytes.TrimSpace(raw)) > 0 {
			if len(out) == maxLines {
				return nil, errTooManyLines(n+1, maxLines)
			}
			l := checkInputLine(raw, endpoint, seen, n)
			l.n, l.off, l.size = n, off, size
			out = append(out, l)
		}
		off += size
		if err != nil {
			return out, nil
		}
	}
}

func checkInputLine(raw []byte, endpoint string, seen map[string]int64, n int64) inputLine {
	var l inputLine
	bad := func(code, format string, args ...any) inputLine {
		l.errCode, l.errMsg = code, fmt.Sprintf(format, args...)
		return l
	}
	// The line's body is read again when the line runs, by the same strict
	// reader as a live request; checking the whole line here refuses a
	// repeated key or deep nesting at upload, before anything recurses.
	if err := strictjson.Check(raw, 0); err != nil {
		var se *strictjson.SyntaxError
		if errors.As(err, &se) {
			return bad("invalid_json", "line %d is not valid JSON: %v", n+1, err)
		}
		return bad("invalid_request", "line %d: %v", n+1, err)
	}
	v := gjson.ParseBytes(raw)
	if !v.IsObject() {
		return bad("invalid_request", "line %d is not a JSON object", n+1)
	}
	cid := v.Get("custom_id")
	if cid.Type != gjson.String || cid.Str == "" {
		return bad("missing_custom_id", "line %d has no custom_id (a non-empty string)", n+1)
	}
	l.customID = strings.Clone(cid.Str) // not a view of the whole line
	if first, dup := seen[l.customID]; dup {
		return bad("duplicate_custom_id", "custom_id %q is already used on line %d", l.customID, first+1)
	}
	seen[l.customID] = n
	if m := v.Get("method"); m.Type != gjson.String || m.Str != http.MethodPost {
		return bad("invalid_method", "method must be \"POST\"")
	}
	if u := v.Get("url"); u.Type != gjson.String || u.Str != endpoint {
		return bad("invalid_url", "url %q does not match the batch's endpoint %q", u.String(), endpoint)
	}
	body := v.Get("body")
	if !body.IsObject() {
		return bad("invalid_body", "body must be a JSON object")
	}
	if m := body.Get("model"); m.Type != gjson.String || m.Str == "" {
		return bad("missing_model", "body.model is required")
	}
	if body.Get("stream").Type == gjson.True {
		return bad("stream_not_allowed", "stream: true is not allowed in a batch")
	}
	return l
}
