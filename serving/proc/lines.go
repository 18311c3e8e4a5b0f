package proc

import (
	"bufio"
	"bytes"
	"io"
	"sync"
)

// MaxLine bounds one forwarded line; longer lines are split.
const MaxLine = 16 << 10

// forwardLines hands each non-blank line of r to sink until r ends.
func forwardLines(r io.Reader, sink func(string)) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 4096), MaxLine)
	sc.Split(splitLines)
	for sc.Scan() {
		if line := sc.Bytes(); sink != nil && len(bytes.TrimSpace(line)) > 0 {
			sink(string(line))
		}
	}
	// A read error (the pipe closed under us) ends forwarding; keep the
	// child from blocking on a full pipe by draining whatever is left.
	_, _ = io.Copy(io.Discard, r)
}

// splitLines is a bufio.SplitFunc that ends a line at "\n" or "\r" and at
// MaxLine bytes.
func splitLines(data []byte, atEOF bool) (advance int, token []byte, err error) {
	if i := bytes.IndexAny(data, "\r\n"); i >= 0 {
		return i + 1, data[:i], nil
	}
	if len(data) >= MaxLine || (atEOF && len(data) > 0) {
		return len(data), data, nil
	}
	return 0, nil, nil
}

// LineWriter returns a line sink for [Config] that writes prefix, the line
// and "\n" to w in one Write. It is safe for concurrent use, so one sink can
// take both streams.
func LineWriter(w io.Writer, prefix string) func(line string) {
	var mu sync.Mutex
	return func(line string) {
		mu.Lock()
		defer mu.Unlock()
		_, _ = io.WriteString(w, prefix+line+"\n")
	}
}
