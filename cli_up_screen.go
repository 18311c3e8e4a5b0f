package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/tailgate-dev/tailgate/server/gateway"
	"github.com/tailgate-dev/tailgate/serving/childlog"
)

// What `up` shows. On a terminal (stderr is one): its banner, one progress
// line rewritten in place while the replicas come up, then a ready line
// that repeats what matters; only warnings and errors of the log come
// between, and the whole log goes to DIR/up.log (--verbose shows it on the
// terminal too). Under systemd or a pipe, stderr is the structured log as
// it always was, and the ready line goes to stdout.

// upLogName is the file under the data directory that holds up's whole log
// when stderr is a terminal.
const upLogName = "up.log"

// upScreen is up's logging: log for its own records, children for the
// lines its workers write (forwarded by child); con is the terminal, nil
// when stderr is not one.
type upScreen struct {
	log, children *slog.Logger
	con           *console
	logPath       string   // DIR/up.log on a terminal, else ""
	file          *os.File // the open up.log, closed by close
}

// newUpScreen sets up up's logging on stderr as the package doc says.
// Either way a worker's own "replica state" record goes to debug: the
// gateway logs the same change once, with the state it left.
func newUpScreen(lf logFlags, stderr io.Writer, dataDir string, verbose bool) (*upScreen, error) {
	if !isTerminal(stderr) {
		h, level, err := lf.handler(stderr)
		if err != nil {
			return nil, err
		}
		return &upScreen{log: slog.New(childlog.NewHandler(h, level)),
			children: slog.New(childlog.NewHandler(quietChild{h, level}, level))}, nil
	}
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return nil, fmt.Errorf("--data: %w", err)
	}
	path := filepath.Join(dataDir, upLogName)
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("log file: %w", err)
	}
	con := &console{w: stderr}
	fileH, level, err := lf.handler(f)
	if err != nil {
		f.Close()
		return nil, err
	}
	termLevel := slog.LevelWarn
	if verbose {
		termLevel = level
	}
	termH, _, _ := lf.handler(con)
	term := repeatLimit{shortAttrs{termH, maxTermAttr}, newRepeats(time.Minute, time.Now)}
	both := slog.NewMultiHandler(fileH, minLevel{term, termLevel})
	return &upScreen{log: slog.New(childlog.NewHandler(both, level)),
		children: slog.New(childlog.NewHandler(quietChild{both, level}, level)),
		con:      con, logPath: path, file: f}, nil
}

func (s *upScreen) close() {
	if s.file != nil {
		_ = s.file.Close()
	}
}

// console is a terminal that shows whole lines (log records) and below
// them one status line, rewritten in place.
type console struct {
	mu     sync.Mutex
	w      io.Writer
	status string // the status line shown; "" none
}

// clearLine returns the cursor to the line's start and erases the line.
const clearLine = "\r\x1b[K"

// Write writes p, whole lines, above the status line.
func (c *console) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.status != "" {
		_, _ = io.WriteString(c.w, clearLine)
	}
	n, err := c.w.Write(p)
	if c.status != "" {
		_, _ = io.WriteString(c.w, c.status)
	}
	return n, err
}

// setStatus shows line as the status line, in place of the last one.
func (c *console) setStatus(line string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if line != c.status {
		_, _ = io.WriteString(c.w, clearLine+line)
		c.status = line
	}
}

// println replaces the status line with line, for good.
func (c *console) println(line string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, _ = io.WriteString(c.w, clearLine+line+"\n")
	c.status = ""
}

// minLevel passes on the records at min or above.
type minLevel struct {
	slog.Handler
	min slog.Level
}

func (h minLevel) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= h.min && h.Handler.Enabled(ctx, l)
}

func (h minLevel) Handle(ctx context.Context, r slog.Record) error {
	if r.Level < h.min {
		return nil
	}
	return h.Handler.Handle(ctx, r)
}

func (h minLevel) WithAttrs(as []slog.Attr) slog.Handler {
	return minLevel{h.Handler.WithAttrs(as), h.min}
}
func (h minLevel) WithGroup(name string) slog.Handler {
	return minLevel{h.Handler.WithGroup(name), h.min}
}

// quietChild sends a worker's own "replica state" record to debug (the
// gateway logs each change once, from → to) and drops it below level.
type quietChild struct {
	slog.Handler
	level slog.Level
}

func (h quietChild) Handle(ctx context.Context, r slog.Record) error {
	if r.Message == "replica state" && r.Level == slog.LevelInfo {
		r.Level = slog.LevelDebug
	}
	if r.Level < h.level {
		return nil
	}
	return h.Handler.Handle(ctx, r)
}

func (h quietChild) WithAttrs(as []slog.Attr) slog.Handler {
	return quietChild{h.Handler.WithAttrs(as), h.level}
}
func (h quietChild) WithGroup(name string) slog.Handler {
	return quietChild{h.Handler.WithGroup(name), h.level}
}

// maxTermAttr is the longest attribute value shown on the terminal (an
// engine's argv runs to 700 characters); up.log keeps them whole.
const maxTermAttr = 120

// shortAttrs shortens attribute values longer than max characters.
type shortAttrs struct {
	slog.Handler
	max int
}

func (h shortAttrs) Handle(ctx context.Context, r slog.Record) error {
	long := false
	r.Attrs(func(a slog.Attr) bool {
		long = long || len(a.Value.String()) > h.max
		return !long
	})
	if !long {
		return h.Handler.Handle(ctx, r)
	}
	short := slog.NewRecord(r.Time, r.Level, r.Message, r.PC)
	r.Attrs(func(a slog.Attr) bool {
		if v := a.Value.String(); len(v) > h.max {
			a = slog.String(a.Key, v[:h.max]+"… ("+strconv.Itoa(len(v)-h.max)+" more characters in "+upLogName+")")
		}
		short.AddAttrs(a)
		return true
	})
	return h.Handler.Handle(ctx, short)
}

func (h shortAttrs) WithAttrs(as []slog.Attr) slog.Handler {
	return shortAttrs{h.Handler.WithAttrs(as), h.max}
}
func (h shortAttrs) WithGroup(name string) slog.Handler {
	return shortAttrs{h.Handler.WithGroup(name), h.max}
}

// repeats is what a repeatLimit handler remembers: when each message was
// last shown and how many like it were held back since.
type repeats struct {
	every time.Duration
	now   func() time.Time
	mu    sync.Mutex
	seen  map[string]*repeated // by level and message: a bounded set (messages are constants)
}

type repeated struct {
	shown time.Time
	held  int
}

func newRepeats(every time.Duration, now func() time.Time) *repeats {
	return &repeats{every: every, now: now, seen: map[string]*repeated{}}
}

// repeatLimit shows a message at most once every r.every on the terminal:
// the next one after that carries how many were held back (repeated=N), so
// an hour of refused keys, scrape timeouts or no_replica answers is a line
// a minute, not a screen that scrolls the ready line away. up.log keeps
// every one.
type repeatLimit struct {
	slog.Handler
	r *repeats
}

func (h repeatLimit) Handle(ctx context.Context, rec slog.Record) error {
	key := rec.Level.String() + " " + rec.Message
	now := h.r.now()
	h.r.mu.Lock()
	st := h.r.seen[key]
	if st != nil && now.Sub(st.shown) < h.r.every {
		st.held++
		h.r.mu.Unlock()
		return nil
	}
	held := 0
	if st == nil {
		st = &repeated{}
		h.r.seen[key] = st
	}
	held, st.shown, st.held = st.held, now, 0
	h.r.mu.Unlock()
	if held > 0 {
		rec = rec.Clone()
		rec.AddAttrs(slog.Int("repeated", held), slog.String("since", h.r.every.String()+" ago, all in "+upLogName))
	}
	return h.Handler.Handle(ctx, rec)
}

func (h repeatLimit) WithAttrs(as []slog.Attr) slog.Handler {
	return repeatLimit{h.Handler.WithAttrs(as), h.r}
}
func (h repeatLimit) WithGroup(name string) slog.Handler {
	return repeatLimit{h.Handler.WithGroup(name), h.r}
}

// readiness reports how many of up's replicas are ready: a log record
// whenever that changes (and every 15 s while some are still starting); on
// a terminal, the progress line; once all are, the ready line (on the
// terminal, else on stdout), and on a terminal a line for each change
// after it.
type readiness struct {
	gw     *gateway.Gateway
	log    *slog.Logger
	want   int
	con    *console // nil: stderr is not a terminal
	stdout io.Writer
	what   string // the ready line's tail: API, dashboard, key
}

func (p *readiness) run(ctx context.Context) {
	t := time.NewTicker(250 * time.Millisecond)
	defer t.Stop()
	start, lastLog := time.Now(), time.Now()
	last, shown := -1, false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		ready, total := p.gw.ReplicaCounts()
		// Outside workers may join up's: the count is of all, never more
		// ready than there are.
		want := max(p.want, total)
		changed := ready != last
		if changed || (ready < want && time.Since(lastLog) > 15*time.Second) {
			p.log.Info("replicas ready", "ready", ready, "of", want)
			lastLog = time.Now()
		}
		last = ready
		switch {
		case !shown && ready >= p.want:
			shown = true
			line := fmt.Sprintf("ready: %d/%d replicas — %s", ready, want, p.what)
			if p.con != nil {
				p.con.println(line)
			} else {
				fmt.Fprintln(p.stdout, line)
			}
		case !shown && p.con != nil:
			p.con.setStatus(fmt.Sprintf("starting replicas: %d/%d ready (%s)", ready, want, time.Since(start).Round(time.Second)))
		case shown && changed && p.con != nil:
			p.con.println(fmt.Sprintf("replicas: %d/%d ready", ready, want))
		}
	}
}
