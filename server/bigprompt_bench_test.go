package server_test

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/policy"
	"github.com/tailgate-dev/tailgate/router"
	"github.com/tailgate-dev/tailgate/server/internal/servertest"
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
// the engine ("direct"), through a bare httputil.ReverseProxy ("proxy",
// bench/goproxy's hop) and through the gateway with every limit on
// ("gateway"). Client, hop and engine share the process, so a hop's own
// cost is its figure − direct's, in ns/op, B/op, allocs/op and
// cpu-ns/op (the process's user+system CPU per request, from getrusage:
// what bench-governed.sh's CPU per request measures of the gateway's
// process tree).
//
// The engine is the simulated one ("sim"), or ("replay") one that reads
// the request whole and answers with the bytes the simulated engine
// answered it: the simulated engine decodes and hashes the prompt, about
// 10 ms of CPU a request that the script does not count (its engine is
// another process) and that here would bury the hop's 1 ms in its noise.
func BenchmarkLargePrompt(b *testing.B) {
	body := bigPromptBody()
	cfg := benchEngine
	cfg.MaxModelLen = bigPromptBytes/4 + 4096 // as the script's --sim-max-model-len
	s := newBenchStack(b, cfg)
	b.Run("sim", func(b *testing.B) { benchHops(b, s, s.direct.URL, body) })

	var answer bytes.Buffer
	if err := postAndCheck(benchClient(b), s.direct.URL+"/v1/chat/completions", s.secret, body, false, &answer); err != nil {
		b.Fatal(err)
	}
	replay := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := io.Copy(io.Discard, r.Body); err != nil {
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", strconv.Itoa(answer.Len()))
		_, _ = w.Write(answer.Bytes())
	}))
	b.Cleanup(replay.Close)
	rs := newBenchStackOn(b, servertest.Sim{Server: replay, Model: benchModel})
	b.Run("replay", func(b *testing.B) { benchHops(b, rs, replay.URL, body) })
}

// benchHops runs body to engine directly, through the bare Go hop and
// through s's gateway.
func benchHops(b *testing.B, s *benchStack, engine, body string) {
	// The bare Go hop of bench/goproxy, for scale: what copying the
	// request through a Go process costs.
	u, err := url.Parse(engine)
	if err != nil {
		b.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.Transport = &http.Transport{MaxIdleConns: 1024, MaxIdleConnsPerHost: 1024, DisableCompression: true}
	rp.FlushInterval = -1
	proxy := httptest.NewServer(rp)
	b.Cleanup(proxy.Close)
	for _, target := range []struct{ name, url string }{
		{"direct", engine + "/v1/chat/completions"},
		{"proxy", proxy.URL + "/v1/chat/completions"},
		{"gateway", s.Public.URL + "/v1/chat/completions"},
	} {
		b.Run(target.name, func(b *testing.B) {
			runSerialPosts(b, s, target.url, body)
		})
	}
}

// newBenchStackOn is newBenchStack's gateway in front of engine alone.
func newBenchStackOn(tb testing.TB, engine servertest.Sim) *benchStack {
	tb.Helper()
	h := servertest.Start(tb, servertest.Options{Fleet: []servertest.Sim{engine}, Production: true,
		Router: router.Config{Hedge: router.HedgeConfig{Enabled: true}},
		Prices: map[string]policy.Price{engine.Model: {InputMicrosPerM: 200_000, OutputMicrosPerM: 600_000}}})
	return &benchStack{Gateway: h, direct: engine.Server, secret: benchKey(h)}
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
