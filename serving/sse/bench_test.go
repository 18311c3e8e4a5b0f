package sse

import (
	"bufio"
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tidwall/gjson"
)

// The baselines below are the code this package replaces, copied as it was
// at e3a3fc4, so the benchmarks compare against it in the same run.

// oldInspect is the classification part of server/stream.go's inspect (the
// usage bookkeeping left out): markers for content and text only.
func oldInspect(ev []byte) Kind {
	payload := oldEventData(ev)
	if payload == nil {
		return Comment
	}
	if bytes.Equal(payload, oldDoneData) {
		return Done
	}
	if bytes.HasPrefix(bytes.TrimSpace(payload), oldErrorPrefix) {
		return Error
	}
	if (bytes.Contains(payload, oldContentMarker) && !bytes.Contains(payload, oldEmptyContent)) ||
		(bytes.Contains(payload, oldTextMarker) && !bytes.Contains(payload, oldEmptyText)) {
		return Token
	}
	if bytes.Contains(payload, oldFinishMarker) {
		return Token
	}
	return Other
}

var (
	oldDataPrefix    = []byte("data:")
	oldDoneData      = []byte("[DONE]")
	oldContentMarker = []byte(`"content":"`)
	oldTextMarker    = []byte(`"text":"`)
	oldEmptyContent  = []byte(`"content":""`)
	oldEmptyText     = []byte(`"text":""`)
	oldFinishMarker  = []byte(`"finish_reason":"`)
	oldErrorPrefix   = []byte(`{"error"`)
)

func oldEventData(ev []byte) []byte {
	for len(ev) > 0 {
		i := bytes.IndexByte(ev, '\n')
		var line []byte
		if i < 0 {
			line, ev = ev, nil
		} else {
			line, ev = ev[:i], ev[i+1:]
		}
		line = bytes.TrimRight(line, "\r")
		if bytes.HasPrefix(line, oldDataPrefix) {
			return bytes.TrimPrefix(line[len(oldDataPrefix):], []byte(" "))
		}
	}
	return nil
}

// oldHasToken is serving/sidecar/stream.go's hasToken.
func oldHasToken(ev []byte) bool {
	if !bytes.Contains(ev, oldDataPrefix) {
		return false
	}
	return oldNonEmpty(ev, oldContentMarker) || oldNonEmpty(ev, oldTextMarker) ||
		oldNonEmpty(ev, []byte(`"reasoning_content":"`)) || bytes.Contains(ev, []byte(`"tool_calls":[{`))
}

func oldNonEmpty(b, marker []byte) bool {
	for {
		i := bytes.Index(b, marker)
		if i < 0 {
			return false
		}
		b = b[i+len(marker):]
		if len(b) > 0 && b[0] != '"' {
			return true
		}
	}
}

// oldReadEvent is server/stream.go's readEvent.
func oldReadEvent(br *bufio.Reader, buf []byte) ([]byte, error) {
	ev := buf[:0]
	for {
		line, err := br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			ev = append(ev, line...)
			continue
		}
		ev = append(ev, line...)
		if err != nil {
			return nil, err
		}
		if len(bytes.TrimRight(line, "\r\n")) == 0 {
			if len(bytes.TrimSpace(ev)) == 0 {
				ev = ev[:0]
				continue
			}
			return ev, nil
		}
	}
}

// parsedClassify classifies by parsing every payload with gjson: what the
// byte scan saves.
func parsedClassify(ev []byte) Kind {
	p := Data(ev)
	switch {
	case p == nil:
		return Comment
	case bytes.Equal(p, doneData):
		return Done
	case gjson.GetBytes(p, "error").Exists():
		return Error
	}
	kind := Other
	gjson.GetBytes(p, "choices").ForEach(func(_, c gjson.Result) bool {
		if parsedOutput(c) || c.Get("finish_reason").Type == gjson.String {
			kind = Token
			return false
		}
		return true
	})
	return kind
}

func parsedOutput(c gjson.Result) bool {
	nonEmpty := func(r gjson.Result) bool { return r.Type == gjson.String && r.Str != "" }
	if nonEmpty(c.Get("text")) {
		return true
	}
	for _, m := range [...]string{"delta", "message"} {
		d := c.Get(m)
		for _, k := range [...]string{"content", "reasoning", "reasoning_content", "refusal"} {
			if nonEmpty(d.Get(k)) {
				return true
			}
		}
		if tc := d.Get("tool_calls"); tc.IsArray() && len(tc.Array()) > 0 {
			return true
		}
	}
	return false
}

func event(name string) []byte {
	for _, tc := range wireCases {
		if tc.name == name {
			return []byte(tc.ev)
		}
	}
	panic("no wire case " + name)
}

// streams are whole answers as vLLM sends them, event by event.
func streams() []struct {
	name string
	evs  [][]byte
} {
	repeat := func(ev []byte, n int) [][]byte {
		out := make([][]byte, n)
		for i := range out {
			out[i] = ev
		}
		return out
	}
	cat := func(parts ...[][]byte) [][]byte {
		var out [][]byte
		for _, p := range parts {
			out = append(out, p...)
		}
		return out
	}
	one := func(names ...string) [][]byte {
		var out [][]byte
		for _, n := range names {
			out = append(out, event(n))
		}
		return out
	}
	usageEnd := one("vllm usage-only chunk (include_usage)", "done")
	return []struct {
		name string
		evs  [][]byte
	}{
		{"chat", cat(one("vllm role chunk (0.25.1 capture)"), repeat(event("vllm content delta"), 200),
			one("vllm EOS: empty content with finish_reason stop"), usageEnd)},
		{"reasoning", cat(one("vllm role chunk (0.25.1 capture)"), repeat(event("vllm reasoning delta (current, 0.25.1 capture)"), 150),
			repeat(event("vllm content delta"), 50), one("vllm EOS: empty content with finish_reason stop"), usageEnd)},
		{"tools", cat(one("vllm role chunk (0.25.1 capture)", "vllm tool call opens (id, type, index, function name)"),
			repeat(event("vllm tool call arguments delta"), 40), one("vllm tool call finish"), usageEnd)},
		{"completions", cat(repeat(event("vllm completion text (current)"), 200),
			one("vllm completion EOS with finish_reason", "vllm completion usage-only chunk", "done"))},
	}
}

// BenchmarkClassifyRatio times Classify and a baseline over the same
// streams (see alternate).
func BenchmarkClassifyRatio(b *testing.B) {
	for _, s := range streams() {
		for _, cmp := range []struct {
			name      string
			new, base func([]byte) int
		}{
			{"classify-vs-old-inspect", classifyOnly, func(ev []byte) int { return int(oldInspect(ev)) }},
			{"classify-vs-gjson", classifyOnly, func(ev []byte) int { return int(parsedClassify(ev)) }},
			{"classify+pieces-vs-old-inspect", classifyPieces, func(ev []byte) int { return int(oldInspect(ev)) }},
		} {
			b.Run(s.name+"/"+cmp.name, func(b *testing.B) {
				sink := 0
				pass := func(f func([]byte) int) func() {
					return func() {
						for _, ev := range s.evs {
							sink += f(ev)
						}
					}
				}
				alternate(b, len(s.evs), "event", pass(cmp.new), pass(cmp.base))
				if sink < 0 {
					b.Log(sink)
				}
			})
		}
	}
}

// alternate runs a pass of the new code and one of the baseline in each
// iteration, in alternating order, so a machine whose load changes during the
// run slows both alike. It reports the mean ns per unit of each and their
// ratio, and the ratio of the fastest pass of each: a pass is microseconds
// long, so the fastest is one no other process interrupted, the steadier
// figure on a shared machine. Below 1: the new code is faster.
func alternate(b *testing.B, units int, unit string, newPass, basePass func()) {
	var tNew, tBase time.Duration
	minNew, minBase := time.Duration(1<<62), time.Duration(1<<62)
	for i := 0; b.Loop(); i++ {
		for j := range 2 {
			start := time.Now()
			if (i+j)%2 == 0 {
				newPass()
				d := time.Since(start)
				tNew += d
				minNew = min(minNew, d)
			} else {
				basePass()
				d := time.Since(start)
				tBase += d
				minBase = min(minBase, d)
			}
		}
	}
	n := float64(b.N * units)
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(float64(tNew.Nanoseconds())/n, "new-ns/"+unit)
	b.ReportMetric(float64(tBase.Nanoseconds())/n, "base-ns/"+unit)
	b.ReportMetric(float64(tNew)/float64(tBase), "new/base")
	b.ReportMetric(float64(minNew.Nanoseconds())/float64(units), "new-min-ns/"+unit)
	b.ReportMetric(float64(minBase.Nanoseconds())/float64(units), "base-min-ns/"+unit)
	b.ReportMetric(float64(minNew)/float64(minBase), "new/base-min")
}

func classifyOnly(ev []byte) int { return int(Classify(ev)) }

// classifyPieces is what the gateway does per event: classify, and count the
// pieces of a token event.
func classifyPieces(ev []byte) int {
	if k := Classify(ev); k != Token {
		return int(k)
	}
	return Pieces(Data(ev))
}

// BenchmarkClassifyShape reports single event shapes.
func BenchmarkClassifyShape(b *testing.B) {
	for _, name := range []string{
		"vllm role chunk (0.25.1 capture)",
		"vllm content delta",
		"vllm reasoning delta (current, 0.25.1 capture)",
		"vllm tool call arguments delta",
		"vllm EOS: empty content with finish_reason stop",
		"vllm usage-only chunk (include_usage)",
		"vllm completion text (current)",
		"done",
	} {
		ev := event(name)
		short, _, _ := strings.Cut(name, " (")
		b.Run(strings.ReplaceAll(short, " ", "_")+"/new", func(b *testing.B) {
			for b.Loop() {
				Classify(ev)
			}
		})
		b.Run(strings.ReplaceAll(short, " ", "_")+"/old-inspect", func(b *testing.B) {
			for b.Loop() {
				oldInspect(ev)
			}
		})
	}
}

// BenchmarkReadEvent reads a whole chat stream from memory through a 16 KiB
// reader, as the relays do, against server/stream.go's old readEvent (see
// alternate).
func BenchmarkReadEvent(b *testing.B) {
	var stream bytes.Buffer
	evs := streams()[0].evs
	for _, ev := range evs {
		stream.Write(ev)
	}
	data := stream.Bytes()
	br := bufio.NewReaderSize(nil, 16<<10)
	buf := make([]byte, 0, 1024)
	pass := func(read func(*bufio.Reader, []byte) ([]byte, error)) func() {
		return func() {
			br.Reset(bytes.NewReader(data))
			for {
				ev, err := read(br, buf)
				if err != nil {
					return
				}
				buf = ev
			}
		}
	}
	alternate(b, len(evs), "event", pass(ReadEvent), pass(oldReadEvent))
}

// TestBaselinesAreTheOldBehaviour keeps the copied baselines honest: they
// must show the gaps this package closes, or they are not the old code.
func TestBaselinesAreTheOldBehaviour(t *testing.T) {
	reasoning := event("vllm reasoning delta (current, 0.25.1 capture)")
	tool := event("vllm tool call arguments delta")
	if oldInspect(reasoning) != Other || oldInspect(tool) != Other {
		t.Error("the old inspect saw reasoning or tool calls")
	}
	if oldHasToken(reasoning) {
		t.Error(`the old hasToken saw "reasoning"`)
	}
	for _, s := range streams() {
		for _, ev := range s.evs {
			if got, want := parsedClassify(ev), Classify(ev); got != want {
				t.Errorf("%s: gjson baseline says %v, Classify %v: %s", s.name, got, want, short(string(ev)))
			}
		}
	}
	// The old reader ends an event early when a line is exactly as long as
	// the reader's buffer and its "\n" comes in the next read.
	line := "data: " + strings.Repeat("y", 32-len("data: "))
	br := bufio.NewReaderSize(strings.NewReader(line+"\n: more\n\n"), 32)
	ev, err := oldReadEvent(br, nil)
	if err != nil || string(ev) != line+"\n" {
		t.Errorf("old reader: %q, %v; expected it to cut the event after the long line", ev, err)
	}
}
