package childlog

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// parseRecord reads a line that slog's text or JSON handler wrote. It needs
// the level and the message; the time is optional (now if absent).
func parseRecord(line string) (slog.Record, bool) {
	switch {
	case strings.HasPrefix(line, "time=") || strings.HasPrefix(line, "level="):
		return parseText(line)
	case strings.HasPrefix(line, `{"time":`) || strings.HasPrefix(line, `{"level":`):
		return parseJSON(line)
	}
	return slog.Record{}, false
}

// parseText reads slog's text form: key=value pairs separated by spaces,
// a key or value quoted (Go syntax) when it holds a space, '=' or '"'.
func parseText(s string) (slog.Record, bool) {
	var (
		t         time.Time
		level     slog.Level
		msg       string
		haveLevel bool
		haveMsg   bool
		attrs     []slog.Attr
	)
	for {
		s = strings.TrimLeft(s, " ")
		if s == "" {
			break
		}
		key, rest, ok := textToken(s, true)
		if !ok || !strings.HasPrefix(rest, "=") {
			return slog.Record{}, false
		}
		val, rest, ok := textToken(rest[1:], false)
		if !ok {
			return slog.Record{}, false
		}
		s = rest
		switch {
		case key == "time" && t.IsZero() && len(attrs) == 0:
			var err error
			if t, err = time.Parse(time.RFC3339Nano, val); err != nil {
				return slog.Record{}, false
			}
		case key == "level" && !haveLevel:
			if err := level.UnmarshalText([]byte(val)); err != nil {
				return slog.Record{}, false
			}
			haveLevel = true
		case key == "msg" && !haveMsg:
			msg, haveMsg = val, true
		default:
			attrs = append(attrs, slog.String(key, val))
		}
	}
	if !haveLevel || !haveMsg {
		return slog.Record{}, false
	}
	return newRecord(t, level, msg, attrs), true
}

// textToken reads a key (up to '=') or a value (up to a space) of slog's
// text form, quoted or not.
func textToken(s string, key bool) (tok, rest string, ok bool) {
	if strings.HasPrefix(s, `"`) {
		q, err := strconv.QuotedPrefix(s)
		if err != nil {
			return "", "", false
		}
		tok, err = strconv.Unquote(q)
		return tok, s[len(q):], err == nil
	}
	end := " "
	if key {
		end = "= "
	}
	i := strings.IndexAny(s, end)
	if i < 0 {
		i = len(s)
	}
	if key && i == 0 {
		return "", "", false
	}
	return s[:i], s[i:], true
}

// parseJSON reads slog's JSON form: one object whose members are the time,
// the level, the message and the attributes (groups as nested objects).
func parseJSON(s string) (slog.Record, bool) {
	dec := json.NewDecoder(strings.NewReader(s))
	dec.UseNumber()
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return slog.Record{}, false
	}
	var (
		t                  time.Time
		level              slog.Level
		msg                string
		haveLevel, haveMsg bool
		attrs              []slog.Attr
	)
	for dec.More() {
		tok, err := dec.Token()
		key, isKey := tok.(string)
		if err != nil || !isKey {
			return slog.Record{}, false
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return slog.Record{}, false
		}
		var str string
		isString := json.Unmarshal(raw, &str) == nil
		switch {
		case key == "time" && isString && t.IsZero():
			if t, err = time.Parse(time.RFC3339Nano, str); err != nil {
				return slog.Record{}, false
			}
		case key == "level" && isString && !haveLevel:
			if err := level.UnmarshalText([]byte(str)); err != nil {
				return slog.Record{}, false
			}
			haveLevel = true
		case key == "msg" && isString && !haveMsg:
			msg, haveMsg = str, true
		default:
			attrs = append(attrs, jsonAttr(key, raw))
		}
	}
	if tok, err := dec.Token(); err != nil || tok != json.Delim('}') || dec.More() {
		return slog.Record{}, false
	}
	if !haveLevel || !haveMsg {
		return slog.Record{}, false
	}
	return newRecord(t, level, msg, attrs), true
}

// jsonAttr turns a JSON member back into an attribute of the same kind.
func jsonAttr(key string, raw json.RawMessage) slog.Attr {
	raw = bytes.TrimSpace(raw)
	switch {
	case len(raw) == 0:
	case raw[0] == '"':
		var s string
		if json.Unmarshal(raw, &s) == nil {
			return slog.String(key, s)
		}
	case string(raw) == "true" || string(raw) == "false":
		return slog.Bool(key, string(raw) == "true")
	case string(raw) == "null":
		return slog.Any(key, nil)
	case raw[0] == '-' || raw[0] >= '0' && raw[0] <= '9':
		if n, err := strconv.ParseInt(string(raw), 10, 64); err == nil {
			return slog.Int64(key, n)
		}
		if f, err := strconv.ParseFloat(string(raw), 64); err == nil {
			return slog.Float64(key, f)
		}
	}
	return slog.Any(key, rawJSON(raw))
}

// rawJSON is a JSON object or array logged again as it was: as JSON by a
// JSON handler, as its text by a text handler.
type rawJSON []byte

func (r rawJSON) MarshalJSON() ([]byte, error) { return r, nil }
func (r rawJSON) MarshalText() ([]byte, error) { return r, nil }

func newRecord(t time.Time, level slog.Level, msg string, attrs []slog.Attr) slog.Record {
	if t.IsZero() {
		t = time.Now()
	}
	r := slog.NewRecord(t, level, msg, 0)
	r.AddAttrs(attrs...)
	return r
}

// vllmLevel matches the start of a vLLM log line, after an optional
// "(ProcessName pid=N) " prefix: its level, then the date.
var vllmLevel = regexp.MustCompile(`^(DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d`)

// level returns the level an unstructured line deserves, if it is not the
// one it was logged at: tracebacks and panics are errors, vLLM's lines have
// their own level.
func (st *lineState) level(line string) (slog.Level, bool) {
	s := line
	if strings.HasPrefix(s, "(") {
		if _, rest, ok := strings.Cut(s, ") "); ok {
			s = rest
		}
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	switch {
	case st.python && (strings.HasPrefix(s, " ") || strings.HasPrefix(s, "\t")):
		return slog.LevelError, true // a frame
	case strings.HasPrefix(s, "Traceback (most recent call last):"):
		st.python = true
		return slog.LevelError, true
	case strings.HasPrefix(s, "During handling of the above exception") || strings.HasPrefix(s, "The above exception was the direct cause"):
		st.python = false
		return slog.LevelError, true
	case st.python:
		st.python = false
		return slog.LevelError, true // the exception itself ends the traceback
	case strings.HasPrefix(s, "panic: ") || strings.HasPrefix(s, "fatal error: "):
		st.goPanic = true
		return slog.LevelError, true
	case st.goPanic:
		return slog.LevelError, true
	}
	if m := vllmLevel.FindStringSubmatch(s); m != nil {
		switch m[1] {
		case "DEBUG":
			return slog.LevelDebug, true
		case "INFO":
			return slog.LevelInfo, true
		case "WARNING":
			return slog.LevelWarn, true
		}
		return slog.LevelError, true
	}
	return 0, false
}
