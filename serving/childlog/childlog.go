// Package childlog makes the log of a process that forwards its children's
// output read as one log: every line is one record with one time, one level
// and each key once.
//
// # Overview
//
// A forwarder logs each line a child process writes as the message of one
// record, with the attributes that say whose line it is:
//
//	log.With("engine", "vllm", "pid", pid).Info(line)
//
// [NewHandler] wraps the handler of such a logger and turns that record
// into what the line says:
//
//   - a line that is itself a log record — slog's text or JSON form, as
//     tailgate's own children (a worker, the simulated engine) write them —
//     is logged as that record: its time, level, message and attributes,
//     after the forwarder's attributes, instead of nested in a message;
//   - a line of vLLM's log ("WARNING 09-12 10:00:00 [file.py:12] …", also
//     behind a "(EngineCore pid=42) " prefix) keeps its text and gets its
//     level;
//   - the lines of a Python traceback or a Go panic are errors, never INFO;
//   - any other line keeps the level it was logged at.
//
// The handler also keeps each key once per record, the first one: the
// logger's own attributes come before a call's, so a forwarder's
// replica=worker-1 or engine=sim wins over a repeat further down.
//
// Lines are recognised only in records without attributes of their own,
// which is how forwarders log them; nothing here starts or reads processes
// (that is serving/proc).
package childlog

import (
	"context"
	"log/slog"
	"sync"
)

// Handler is a slog.Handler that flattens forwarded child log lines and
// drops repeated keys; see the package doc.
type Handler struct {
	next  slog.Handler // gets every record, with all its attributes
	level slog.Leveler
	attrs []slog.Attr // the logger's own (WithAttrs), each key once
	lines *lineState  // traceback tracking of the lines of one source
}

// NewHandler returns a handler that logs through next the records at or
// above level. next must accept every level: this handler filters, because
// a forwarded line logged at INFO may turn out to be an error that a
// handler set to WARN must not drop.
func NewHandler(next slog.Handler, level slog.Leveler) *Handler {
	if level == nil {
		level = slog.LevelInfo
	}
	return &Handler{next: next, level: level, lines: new(lineState)}
}

// Enabled reports whether a record at l may be logged. Records at INFO and
// above always reach Handle, where forwarded lines get their real level.
func (h *Handler) Enabled(_ context.Context, l slog.Level) bool {
	return l >= h.level.Level() || l >= slog.LevelInfo
}

// WithAttrs returns a handler that adds attrs to every record, except keys
// it already has. Its lines are a new source for traceback tracking: a
// forwarder makes one logger per child.
func (h *Handler) WithAttrs(attrs []slog.Attr) slog.Handler {
	if len(attrs) == 0 {
		return h
	}
	out := &Handler{next: h.next, level: h.level, attrs: make([]slog.Attr, 0, len(h.attrs)+len(attrs)), lines: new(lineState)}
	seen := make(map[string]bool, len(h.attrs)+len(attrs))
	for _, a := range append(append([]slog.Attr{}, h.attrs...), attrs...) {
		if !seen[a.Key] {
			seen[a.Key] = true
			out.attrs = append(out.attrs, a)
		}
	}
	return out
}

// WithGroup returns a handler whose later attributes are in group name;
// keys are kept once within the group.
func (h *Handler) WithGroup(name string) slog.Handler {
	if name == "" {
		return h
	}
	next := h.next
	if len(h.attrs) > 0 {
		next = next.WithAttrs(h.attrs)
	}
	return &Handler{next: next.WithGroup(name), level: h.level, lines: h.lines}
}

// Handle logs r, or the record its message holds, with each key once.
func (h *Handler) Handle(ctx context.Context, r slog.Record) error {
	if r.NumAttrs() == 0 {
		r = h.lines.interpret(r)
	}
	if r.Level < h.level.Level() {
		return nil
	}
	out := slog.NewRecord(r.Time, r.Level, r.Message, r.PC)
	seen := make(map[string]bool, len(h.attrs)+r.NumAttrs())
	for _, a := range h.attrs {
		seen[a.Key] = true
		out.AddAttrs(a)
	}
	r.Attrs(func(a slog.Attr) bool {
		if !seen[a.Key] {
			seen[a.Key] = true
			out.AddAttrs(a)
		}
		return true
	})
	return h.next.Handle(ctx, out)
}

// lineState follows one source's lines across records: whether they are
// inside a traceback.
type lineState struct {
	mu      sync.Mutex
	python  bool // inside a Python traceback
	goPanic bool // after a Go panic or fatal error: the rest is its dump
}

// interpret returns the record a forwarded line stands for: the record it
// holds, or r with the line's level.
func (st *lineState) interpret(r slog.Record) slog.Record {
	line := r.Message
	if rec, ok := parseRecord(line); ok {
		st.mu.Lock()
		st.python, st.goPanic = false, false
		st.mu.Unlock()
		return rec
	}
	if l, ok := st.level(line); ok {
		r.Level = l
	}
	return r
}
