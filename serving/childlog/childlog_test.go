package childlog

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// logged logs through a childlog handler in front of a text or JSON handler
// and returns what it wrote.
func logged(t *testing.T, format string, level slog.Level, do func(log *slog.Logger)) string {
	t.Helper()
	var b bytes.Buffer
	opts := &slog.HandlerOptions{Level: slog.Level(-100), ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
		if a.Key == slog.TimeKey && len(groups) == 0 {
			return slog.Attr{} // stable output
		}
		return a
	}}
	var next slog.Handler = slog.NewTextHandler(&b, opts)
	if format == "json" {
		next = slog.NewJSONHandler(&b, opts)
	}
	do(slog.New(NewHandler(next, level)))
	return b.String()
}

func TestForwardedRecordIsFlattened(t *testing.T) {
	// What tailgate's simulated engine writes, forwarded by a worker's
	// launcher with its own attributes.
	child := `time=2026-11-30T13:57:41.670Z level=WARN msg="simulated engine serving (output is filler text, not a model)" addr=http://127.0.0.1:41175 model=tailgate-sim note="a \"quoted\" word" empty=""`
	out := logged(t, "text", slog.LevelInfo, func(log *slog.Logger) {
		log.With("engine", "sim").With("engine", "tailgate", "pid", 42).Info(child)
	})
	want := `level=WARN msg="simulated engine serving (output is filler text, not a model)" engine=sim pid=42 addr=http://127.0.0.1:41175 model=tailgate-sim note="a \"quoted\" word" empty=""` + "\n"
	if out != want {
		t.Fatalf("got\n%s\nwant\n%s", out, want)
	}

	// The child's time is kept.
	var b bytes.Buffer
	slog.New(NewHandler(slog.NewJSONHandler(&b, nil), slog.LevelInfo)).Info(child)
	var rec map[string]any
	if err := json.Unmarshal(b.Bytes(), &rec); err != nil || rec["time"] != "2026-11-30T13:57:41.67Z" || rec["level"] != "WARN" {
		t.Fatalf("JSON out of a text line: %s (%v)", b.String(), err)
	}
}

func TestForwardedJSONRecordIsFlattened(t *testing.T) {
	child := `{"time":"2026-11-30T14:13:47.906233039Z","level":"INFO","msg":"engine started","replica":"worker-1","pid":11987,"ratio":0.5,"ok":true,"none":null,"argv":["sim","--listen"],"g":{"a":1}}`
	out := logged(t, "json", slog.LevelInfo, func(log *slog.Logger) { log.With("replica", "worker-1").Warn(child) })
	want := `{"level":"INFO","msg":"engine started","replica":"worker-1","pid":11987,"ratio":0.5,"ok":true,"none":null,"argv":["sim","--listen"],"g":{"a":1}}` + "\n"
	if out != want {
		t.Fatalf("got\n%s\nwant\n%s", out, want)
	}
}

func TestLineLevels(t *testing.T) {
	lines := []struct {
		line, level string
	}{
		{"INFO 09-12 10:00:00 [api_server.py:1] Starting vLLM API server", "INFO"},
		{"(APIServer pid=7) WARNING 09-12 10:00:01 [config.py:2] Casting torch.bfloat16 to torch.float16.", "WARN"},
		{"Loading safetensors checkpoint shards:  50% Completed | 1/2", "INFO"},
		{"Traceback (most recent call last):", "ERROR"},
		{`  File "/usr/bin/vllm", line 8, in <module>`, "ERROR"},
		{"    sys.exit(main())", "ERROR"},
		{"ValueError: No available memory for the cache blocks.", "ERROR"},
		{"INFO 09-12 10:00:05 [launcher.py:3] Shutting down", "INFO"},
		{"(EngineCore_DP0 pid=42) ERROR 09-12 10:00:06 [core.py:700] EngineCore failed to start.", "ERROR"},
		{"(EngineCore_DP0 pid=42) Traceback (most recent call last):", "ERROR"},
		{`(EngineCore_DP0 pid=42)   File "core.py", line 1`, "ERROR"},
		{"(EngineCore_DP0 pid=42) RuntimeError: CUDA out of memory", "ERROR"},
		{"DEBUG 09-12 10:00:07 [x.py:1] hidden at INFO", ""},
		{"plain output", "INFO"},
		{"panic: runtime error: index out of range", "ERROR"},
		{"goroutine 1 [running]:", "ERROR"},
		{"main.main()", "ERROR"},
		{"level=INFO msg=\"back to records\"", "INFO"},
		{"after a record the panic is over", "INFO"},
	}
	out := logged(t, "text", slog.LevelInfo, func(log *slog.Logger) {
		src := log.With("engine", "vllm")
		for _, l := range lines {
			src.Info(l.line)
		}
	})
	var want strings.Builder
	for _, l := range lines {
		if l.level == "" {
			continue
		}
		msg := l.line
		if strings.HasPrefix(msg, "level=") {
			msg = "back to records"
		}
		r := slog.NewRecord(time.Time{}, 0, msg, 0)
		var b bytes.Buffer
		_ = slog.NewTextHandler(&b, nil).Handle(context.Background(), r)
		quoted := strings.TrimSuffix(strings.TrimPrefix(b.String(), "level=INFO msg="), "\n")
		want.WriteString("level=" + l.level + " msg=" + quoted + " engine=vllm\n")
	}
	if out != want.String() {
		t.Fatalf("got\n%s\nwant\n%s", out, want.String())
	}
}

// TestLevelFilter: a handler at WARN drops INFO records, but not a
// forwarded error logged at INFO.
func TestLevelFilter(t *testing.T) {
	out := logged(t, "text", slog.LevelWarn, func(log *slog.Logger) {
		log.Info("dropped")
		log.Debug("dropped too")
		log.Info("level=INFO msg=\"a child's info, dropped\"")
		log.Info("ERROR 09-12 10:00:06 [core.py:700] kept")
		log.Info(`time=2026-11-30T13:57:41.670Z level=ERROR msg="a child's error, kept"`)
		log.Warn("kept")
	})
	if strings.Contains(out, "dropped") || strings.Count(out, "kept") != 3 {
		t.Fatalf("got\n%s", out)
	}
}

func TestKeysOnce(t *testing.T) {
	out := logged(t, "text", slog.LevelInfo, func(log *slog.Logger) {
		log.With("replica", "a").With("replica", "b").Info("m", "replica", "c", "err", "x", "err", "y")
		log.WithGroup("g").With("k", 1).Info("m", "k", 2)
	})
	want := "level=INFO msg=m replica=a err=x\nlevel=INFO msg=m g.k=1\n"
	if out != want {
		t.Fatalf("got\n%s\nwant\n%s", out, want)
	}
}

// TestNotALineIsLeftAlone: messages that only look like the start of a
// record, and records with attributes, are logged as given.
func TestNotALineIsLeftAlone(t *testing.T) {
	out := logged(t, "text", slog.LevelInfo, func(log *slog.Logger) {
		log.Info("time=soon level=INFO msg=x")
		log.Info("level=INFO msg=x", "k", "v")
		log.Info(`{"level":"INFO"}`)
	})
	want := `level=INFO msg="time=soon level=INFO msg=x"` + "\n" + `level=INFO msg="level=INFO msg=x" k=v` + "\n" + `level=INFO msg="{\"level\":\"INFO\"}"` + "\n"
	if out != want {
		t.Fatalf("got\n%s\nwant\n%s", out, want)
	}
}
