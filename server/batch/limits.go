package batch

// The limits on a batch input file, checked while an upload streams to
// disk and again, from the stored file, when a batch validates it (a file
// stored under older, looser limits fails there instead of running).

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/tailgate-dev/tailgate/server/apierr"
)

// lineLimitError: an input file breaks a per-file limit at Line (1-based).
type lineLimitError struct {
	Code    string
	Line    int64
	Message string
}

func (e *lineLimitError) Error() string { return e.Message }

func (e *lineLimitError) apiError() *apierr.Error {
	return &apierr.Error{Status: http.StatusBadRequest, Type: "invalid_request_error", Code: e.Code, Param: "file", Message: e.Message}
}

func errTooManyLines(line int64, limit int) *lineLimitError {
	return &lineLimitError{Code: "too_many_lines", Line: line,
		Message: fmt.Sprintf("line %d: the file holds more than %d requests, the most one batch file may hold", line, limit)}
}

func errLineTooLong(line, limit int64) *lineLimitError {
	return &lineLimitError{Code: "line_too_long", Line: line,
		Message: fmt.Sprintf("line %d is longer than %d bytes, the longest request line this gateway accepts", line, limit)}
}

// lineChecker is a writer that checks the bytes of an input file as they
// stream past: at most maxLines requests (non-blank lines), none longer
// than maxLineBytes. It holds no line, only counters.
type lineChecker struct {
	maxLines     int
	maxLineBytes int64

	line     int64 // 1-based number of the current line
	lineLen  int64 // its bytes so far
	nonBlank bool  // it has a byte other than white space
	requests int
}

func newLineChecker(maxLines int, maxLineBytes int64) *lineChecker {
	return &lineChecker{maxLines: maxLines, maxLineBytes: maxLineBytes, line: 1}
}

func (c *lineChecker) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		seg, rest, newline := bytes.Cut(p, []byte{'\n'})
		c.lineLen += int64(len(seg))
		if c.lineLen > c.maxLineBytes {
			return 0, errLineTooLong(c.line, c.maxLineBytes)
		}
		// A space that a write splits in two (a multi-byte one) counts as
		// a request: the count may only be stricter than the executor's.
		if !c.nonBlank && len(bytes.TrimSpace(seg)) > 0 {
			c.nonBlank = true
			if c.requests++; c.requests > c.maxLines {
				return 0, errTooManyLines(c.line, c.maxLines)
			}
		}
		if !newline {
			break
		}
		p = rest
		c.line++
		c.lineLen, c.nonBlank = 0, false
	}
	return n, nil
}

// lineReader reads an input file line by line into one reused buffer,
// holding at most maxLineBytes+1 bytes of a line.
type lineReader struct {
	br  *bufio.Reader
	buf []byte
	max int64
}

// next returns the next line, its newline included, and size, the bytes it
// took in the file. A line longer than max is read past; tooLong says so
// and line is then nil. err is io.EOF after the last line.
func (lr *lineReader) next() (line []byte, size int64, tooLong bool, err error) {
	lr.buf = lr.buf[:0]
	for {
		frag, err := lr.br.ReadSlice('\n')
		size += int64(len(frag))
		if room := lr.max + 1 - int64(len(lr.buf)); room > 0 {
			lr.buf = append(lr.buf, frag[:min(int64(len(frag)), room)]...)
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		content := size
		if size > 0 && len(frag) > 0 && frag[len(frag)-1] == '\n' {
			content--
		}
		if content > lr.max {
			return nil, size, true, err
		}
		return lr.buf, size, false, err
	}
}

// uploadBody moves the connection's read deadline forward as an upload
// arrives: the body may take grace plus one second for every rate bytes
// received, and never past hard. A body slower than that fails its read
// with a timeout.
type uploadBody struct {
	body  io.Reader
	rc    *http.ResponseController
	start time.Time
	grace time.Duration
	rate  float64
	hard  time.Time

	n   int64
	set time.Time // the deadline in force
}

func newUploadBody(body io.Reader, rc *http.ResponseController, cfg Config) *uploadBody {
	now := time.Now()
	b := &uploadBody{body: body, rc: rc, start: now, grace: cfg.BodyTimeout, rate: float64(cfg.UploadMinRate),
		hard: now.Add(cfg.UploadTimeout)}
	b.move()
	return b
}

func (b *uploadBody) Read(p []byte) (int, error) {
	n, err := b.body.Read(p)
	b.n += int64(n)
	b.move()
	return n, err
}

// move sets the deadline the bytes so far have earned, at most every 100ms
// of progress (each set arms a timer).
func (b *uploadBody) move() {
	d := b.start.Add(b.grace + time.Duration(float64(b.n)/b.rate*float64(time.Second)))
	if d.After(b.hard) {
		d = b.hard
	}
	if b.set.IsZero() || d.Sub(b.set) >= 100*time.Millisecond {
		_ = b.rc.SetReadDeadline(d)
		b.set = d
	}
}
