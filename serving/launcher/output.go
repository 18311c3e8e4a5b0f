package launcher

import (
	"regexp"
	"slices"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/tailgate-dev/tailgate/serving"
)

// errorTail keeps the engine's last error lines for operators: everything
// it writes to stderr, and the lines of its stdout that log an error. vLLM
// logs to stdout by default, while Python tracebacks and argparse's usage
// errors go to stderr, so together they hold why an engine died. It is safe
// for concurrent use: both output streams feed it.
type errorTail struct {
	mu    sync.Mutex
	lines []string // ring of at most serving.MaxEngineLogLines
	next  int      // where the next line goes once the ring is full
	added int64    // lines ever added; marks are counts
}

// add keeps line, cut to serving.MaxEngineLogLine bytes.
func (t *errorTail) add(line string) {
	line = clip(strings.TrimRight(line, " \t"), serving.MaxEngineLogLine)
	t.mu.Lock()
	defer t.mu.Unlock()
	t.added++
	if len(t.lines) < serving.MaxEngineLogLines {
		t.lines = append(t.lines, line)
		return
	}
	t.lines[t.next] = line
	t.next = (t.next + 1) % len(t.lines)
}

// snapshot returns the kept lines, oldest first; nil if none.
func (t *errorTail) snapshot() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.lines) == 0 {
		return nil
	}
	out := make([]string, 0, len(t.lines))
	out = append(out, t.lines[t.next:]...)
	return append(out, t.lines[:t.next]...)
}

// mark returns a position to ask [errorTail.lastSince] about.
func (t *errorTail) mark() int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.added
}

// lastSince returns the newest line if one was added after mark, else "".
func (t *errorTail) lastSince(mark int64) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.added <= mark || len(t.lines) == 0 {
		return ""
	}
	i := len(t.lines) - 1
	if len(t.lines) == serving.MaxEngineLogLines {
		i = (t.next + len(t.lines) - 1) % len(t.lines)
	}
	return t.lines[i]
}

// since returns the lines added after mark that are still kept, oldest
// first.
func (t *errorTail) since(mark int64) []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := int(min(t.added-mark, int64(len(t.lines))))
	if n <= 0 {
		return nil
	}
	all := append(slices.Clone(t.lines[t.next:]), t.lines[:t.next]...)
	return all[len(all)-n:]
}

// reset forgets the kept lines (marks stay valid).
func (t *errorTail) reset() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.lines, t.next = nil, 0
}

// logsError reports whether a line of the engine's stdout logs an error:
// vLLM's "ERROR 09-12 10:00:00 [core.py:700] …" and "CRITICAL …", also
// behind a worker prefix such as "(EngineCore_DP0 pid=42) ", and slog's
// "level=ERROR" (the simulated engine).
func logsError(line string) bool {
	s := strings.TrimSpace(line)
	if strings.HasPrefix(s, "(") {
		if _, rest, ok := strings.Cut(s, ") "); ok {
			s = strings.TrimSpace(rest)
		}
	}
	return strings.HasPrefix(s, "ERROR") || strings.HasPrefix(s, "CRITICAL") ||
		strings.Contains(s, "level=ERROR")
}

// clip cuts s to at most n bytes without splitting a UTF-8 sequence.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// argparseError matches the line Python's argparse ends a rejected command
// line with, "PROG: error: MESSAGE": "vllm: error: unrecognized arguments:
// --disable-log-requests", "vllm serve: error: argument --port: expected one
// argument".
var argparseError = regexp.MustCompile(`^[\w.-]+( [\w.-]+)?: error: `)

// argumentError returns what the engine said about its command line, from
// its argparse error line on, if those of lines hold one; else "".
func argumentError(lines []string) string {
	for i, line := range lines {
		if argparseError.MatchString(line) {
			return clip(strings.Join(lines[i:], " "), serving.MaxEngineLogLine)
		}
	}
	return ""
}
