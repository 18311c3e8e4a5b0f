package server_test

import (
	"bytes"
	"strings"
	"syscall"
	"testing"
	"time"
)

// bigPromptBytes is the user message of scripts/bench-governed.sh's large
// prompt point (BIG_BYTES): 256 KB of ASCII text.
const bigPromptBytes = 256 << 10

// bigPromptBody is that script's large-prompt request: one user message of
// bigPromptBytes of repeated text, 16 tokens out.
func bigPromptBody() string {
	const line = "The quick brown fox jumps over the lazy dog while the gateway meters every token. "
	text := strings.Repeat(line, bigPromptBytes/len(line)+1)[:bigPromptBytes]
	return `{"model":"` + benchModel + `","messages":[{"role":"user","content":"` + text + `"}],"max_tokens":16,"ignore_eos":true}`
}

// BenchmarkLargePrompt: scripts/bench-governed.sh's 256 KB prompt, one
// request at a time (concurrency 1, as the script sends it), straight to
// the engine ("direct") and through the gateway with every limit on
// ("gateway"). Client, gateway and engine share the process, so the
// gateway's own cost is gateway − direct, in ns/op, B/op, allocs/op and
// cpu-ns/op (the process's user+system CPU per request, from getrusage:
// what bench-governed.sh's CPU per request measures of the gateway's
// process tree).
func BenchmarkLargePrompt(b *testing.B) {
	body := bigPromptBody()
	cfg := benchEngine
	cfg.MaxModelLen = bigPromptBytes/4 + 4096 // as the script's --sim-max-model-len
	s := newBenchStack(b, cfg)
	for _, target := range []struct{ name, url string }{
		{"direct", s.direct.URL + "/v1/chat/completions"},
		{"gateway", s.Public.URL + "/v1/chat/completions"},
	} {
		b.Run(target.name, func(b *testing.B) {
			runSerialPosts(b, s, target.url, body)
		})
	}
}

// runSerialPosts posts body to url b.N times, one after the other, and
// reports the process's CPU per request; for the gateway it checks
// afterwards that every request was metered.
func runSerialPosts(b *testing.B, s *benchStack, url, body string) {
	client := benchClient(b)
	gateway := strings.HasPrefix(url, s.Public.URL)
	var before int64
	if gateway {
		before = s.meteredRequests(b)
	}
	var buf bytes.Buffer
	// One request first, so the connection and the buffers exist.
	if err := postAndCheck(client, url, s.secret, body, false, &buf); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := processCPU(b)
	for b.Loop() {
		if err := postAndCheck(client, url, s.secret, body, false, &buf); err != nil {
			b.Fatal(err)
		}
	}
	cpu := processCPU(b) - cpu0
	b.StopTimer()
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/op")
	if gateway {
		deadline := time.Now().Add(30 * time.Second)
		for {
			got := s.meteredRequests(b) - before
			if got == int64(b.N)+1 {
				break
			}
			if time.Now().After(deadline) {
				b.Fatalf("ledger holds %d rows for %d requests", got, b.N+1)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// processCPU is the user and system CPU time the process has used.
func processCPU(tb testing.TB) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
