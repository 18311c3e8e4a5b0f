package sse

import (
	"bufio"
	"bytes"
	"errors"
)

// ReadEvent reads one SSE event, the lines up to and including the blank
// line that ends it, verbatim, appending to buf[:0] (buf may be reused
// between events). Blank lines before an event are skipped. Lines longer than
// br's buffer are read whole.
//
// When no whole event remains it returns io.EOF (or the read error) together
// with the bytes of the incomplete last event, if any: SSE discards them, but
// a relay may pass them on.
func ReadEvent(br *bufio.Reader, buf []byte) ([]byte, error) {
	ev := buf[:0]
	long := false // in the middle of a line longer than br's buffer
	for {
		line, err := br.ReadSlice('\n')
		ev = append(ev, line...)
		if errors.Is(err, bufio.ErrBufferFull) {
			long = true
			continue
		}
		if err != nil {
			return ev, err
		}
		if long {
			// The end of a long line, not a line of its own: a "\n" here
			// (or the "\r\n" of a CRLF line cut between the two) is no
			// blank line.
			long = false
			continue
		}
		if isBlank(line) {
			if len(ev) == len(line) {
				ev = ev[:0] // a stray blank line between events
				continue
			}
			return ev, nil
		}
	}
}

// NextBuffered reports whether br already holds the whole next event, so
// reading it cannot block and a relay may hold its flush for it.
func NextBuffered(br *bufio.Reader) bool {
	b, _ := br.Peek(br.Buffered())
	for { // stray blank lines are no event
		switch {
		case len(b) > 0 && b[0] == '\n':
			b = b[1:]
			continue
		case len(b) > 1 && b[0] == '\r' && b[1] == '\n':
			b = b[2:]
			continue
		}
		break
	}
	return bytes.Contains(b, []byte("\n\n")) || bytes.Contains(b, []byte("\n\r\n"))
}

func isBlank(line []byte) bool {
	return len(line) == 1 || (len(line) == 2 && line[0] == '\r')
}
