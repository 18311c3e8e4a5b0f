package server_test

import (
	"bytes"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/serving/sim"
)

// The gateway's overhead is measured as a ratio: the same request, the same
// client and the same engine, once straight to the engine ("direct") and once
// through the gateway with a real key, every limit on, and metering into
// SQLite ("gateway"). The engine answers at once (TTFT and TPOT 0), so what
// the gateway costs is not hidden behind simulated inference time.
// scripts/bench-overhead.sh measures the same thing as latency under an
// open-loop load.

const benchModel = "tailgate-sim"

var benchEngine = sim.Config{Model: benchModel, TTFTSigma: -1, MaxSeqs: 4096}

// BenchmarkGatewayOverhead: non-streaming chat completions.
func BenchmarkGatewayOverhead(b *testing.B) {
	body := `{"model":"` + benchModel + `","messages":[{"role":"system","content":"You are terse."},` +
		`{"role":"user","content":"Say hello to the benchmark."}],"max_tokens":16,"ignore_eos":true}`
	s := newBenchStack(b, benchEngine)
	for _, target := range []struct{ name, url string }{
		{"direct", s.direct.URL + "/v1/chat/completions"},
		{"gateway", s.Public.URL + "/v1/chat/completions"},
	} {
		b.Run(target.name, func(b *testing.B) {
			runParallelPosts(b, s, target.url, body, false)
		})
	}
}

// streamTokens is the length of each benchmarked stream: one SSE event per
// token, all due at once (TPOT 0), so the relay itself is what is timed.
const streamTokens = 64

// BenchmarkStreamRelay: streamed chat completions of streamTokens events.
func BenchmarkStreamRelay(b *testing.B) {
	body := fmt.Sprintf(`{"model":"%s","messages":[{"role":"user","content":"Stream to the benchmark."}],`+
		`"max_tokens":%d,"ignore_eos":true,"stream":true,"stream_options":{"include_usage":true}}`, benchModel, streamTokens)
	s := newBenchStack(b, benchEngine)
	for _, target := range []struct{ name, url string }{
		{"direct", s.direct.URL + "/v1/chat/completions"},
		{"gateway", s.Public.URL + "/v1/chat/completions"},
	} {
		b.Run(target.name, func(b *testing.B) {
			// Both paths must deliver every token as its own event.
			var buf bytes.Buffer
			if err := postAndCheck(http.DefaultClient, target.url, s.secret, body, true, &buf); err != nil {
				b.Fatal(err)
			}
			if n := countContentEvents(&buf); n != streamTokens {
				b.Fatalf("%d content events, want %d", n, streamTokens)
			}
			runParallelPosts(b, s, target.url, body, true)
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*streamTokens), "ns/event")
		})
	}
}

// runParallelPosts posts body to url from 4×GOMAXPROCS goroutines and, for
// the gateway, checks afterwards that every request was metered.
func runParallelPosts(b *testing.B, s *benchStack, url, body string, stream bool) {
	client := benchClient(b)
	gateway := strings.HasPrefix(url, s.Public.URL)
	var before int64
	if gateway {
		before = s.meteredRequests(b)
	}
	b.SetParallelism(4)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		var buf bytes.Buffer
		for pb.Next() {
			if err := postAndCheck(client, url, s.secret, body, stream, &buf); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
	if gateway {
		deadline := time.Now().Add(30 * time.Second)
		for {
			got := s.meteredRequests(b) - before
			if got == int64(b.N) {
				break
			}
			if time.Now().After(deadline) {
				b.Fatalf("ledger holds %d rows for %d requests", got, b.N)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}
