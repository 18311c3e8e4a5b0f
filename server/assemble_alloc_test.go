package server

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tailgate-dev/tailgate/policy"
	"github.com/tailgate-dev/tailgate/serving/sse"
)

// recordedPayloads returns the data payloads of a recorded vLLM stream,
// [DONE] left out.
func recordedPayloads(t testing.TB, name string) [][]byte {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("testdata", "assemble", name+".sse"))
	if err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(bytes.NewReader(raw))
	var out [][]byte
	for {
		ev, err := sse.ReadEvent(br, nil)
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		if sse.Classify(ev) != sse.Done && sse.Classify(ev) != sse.Comment {
			out = append(out, bytes.Clone(sse.Data(ev)))
		}
	}
}

// TestAssemblerKeepsNothingOfTheEventBuffer: the gateway reads a stream's
// events into one reused buffer, and the assembler parses each payload in
// place, so whatever the answer keeps must be its own copy. Every payload is
// overwritten right after the assembler took it; the answer must not change.
func TestAssemblerKeepsNothingOfTheEventBuffer(t *testing.T) {
	for _, name := range []string{"chat_content", "chat_reasoning", "chat_tools", "chat_logprobs_n2", "completions_logprobs"} {
		t.Run(name, func(t *testing.T) {
			ep := chatEndpoint
			if strings.HasPrefix(name, "completions") {
				ep = completionEndpoint
			}
			payloads := recordedPayloads(t, name)
			fresh := newAssembler(ep, false)
			for _, p := range payloads {
				fresh.add(bytes.Clone(p))
			}
			reused := newAssembler(ep, false)
			var buf []byte
			for _, p := range payloads {
				buf = append(buf[:0], p...)
				reused.add(buf)
				for i := range buf {
					buf[i] = '#'
				}
			}
			want, got := fresh.body(policy.Usage{}), reused.body(policy.Usage{})
			if !bytes.Equal(want, got) {
				t.Fatalf("answer changed when the event buffer was reused:\nwant %s\ngot  %s", want, got)
			}
		})
	}
}

// TestAssemblerAllocatesPerAnswerNotPerChunk: assembling a JSON answer
// from a stream costs allocations for what the answer keeps, not a copy of
// every chunk (an answer of a thousand tokens is a thousand chunks).
func TestAssemblerAllocatesPerAnswerNotPerChunk(t *testing.T) {
	payloads := recordedPayloads(t, "chat_content")
	// The plain content chunks again and again: a long answer. (Text with
	// escapes costs gjson an unescaped copy of each string, used or not.)
	var long [][]byte
	long = append(long, payloads[0])
	for range 100 {
		for _, p := range payloads[1 : len(payloads)-1] {
			if !bytes.Contains(p, []byte(`\`)) {
				long = append(long, p)
			}
		}
	}
	long = append(long, payloads[len(payloads)-1])
	allocs := testing.AllocsPerRun(20, func() {
		a := newAssembler(chatEndpoint, false)
		for _, p := range long {
			a.add(p)
		}
		_ = a.body(policy.Usage{})
	})
	t.Logf("%d chunks assembled with %.0f allocations", len(long), allocs)
	if allocs > float64(len(long))/10 {
		t.Errorf("%d chunks assembled with %.0f allocations, want at most %d", len(long), allocs, len(long)/10)
	}
}

// BenchmarkAssembler: one recorded vLLM stream per op, chunk by chunk, as
// the gateway assembles a JSON answer (run with -benchmem).
func BenchmarkAssembler(b *testing.B) {
	for _, name := range []string{"chat_content", "chat_tools", "chat_logprobs_n2"} {
		b.Run(name, func(b *testing.B) {
			payloads := recordedPayloads(b, name)
			b.ReportAllocs()
			for b.Loop() {
				a := newAssembler(chatEndpoint, false)
				for _, p := range payloads {
					a.add(p)
				}
				_ = a.body(policy.Usage{})
			}
		})
	}
}
