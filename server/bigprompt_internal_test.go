package server

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/policy"
	"github.com/tailgate-dev/tailgate/serving"
)

// bigPrompt is scripts/bench-governed.sh's large-prompt request: 256 KB of
// text in one user message.
func bigPrompt() []byte {
	const line = "The quick brown fox jumps over the lazy dog while the gateway meters every token. "
	text := strings.Repeat(line, 256<<10/len(line)+1)[:256<<10]
	return []byte(`{"model":"tailgate-sim","messages":[{"role":"user","content":"` + text + `"}],"max_tokens":16,"ignore_eos":true}`)
}

// BenchmarkBigPromptRead: what reading the 256 KB prompt costs the
// gateway, step by step as serve takes it (body read, parse, salt), and a
// bare copy of it for scale.
func BenchmarkBigPromptRead(b *testing.B) {
	body := bigPrompt()
	// One replica, as in the script: the engine's JSON is relayed, the
	// request goes upstream as the client sent it (plus its cache_salt).
	lim := parseLimits{maxDepth: 64, mediaPart: DefaultMediaPartTokens, defaultMax: func(string) int64 { return 1024 },
		alternatives: func(string) bool { return false }}
	s := &Server{}
	s.salts.secret = []byte("bench")
	cl := &call{principal: &policy.Principal{TenantID: 1}}
	b.Run("copy", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		b.ReportAllocs()
		defer cpuPerOp(b)()
		for b.Loop() {
			_ = bytes.Clone(body)
		}
	})
	b.Run("ReadBody", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		b.ReportAllocs()
		w := httptest.NewRecorder()
		defer cpuPerOp(b)()
		for b.Loop() {
			r := httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(body))
			if _, err := serving.ReadBody(w, r, 1<<30); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("parse", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		b.ReportAllocs()
		defer cpuPerOp(b)()
		for b.Loop() {
			if _, err := parseRequest(chatEndpoint, body, "", lim); err != nil {
				b.Fatal(err)
			}
		}
	})
	// With more than one replica the JSON answer is assembled from a
	// stream, so the body is edited (stream, stream_options) too.
	assembled := lim
	assembled.alternatives = nil
	for _, c := range []struct {
		name string
		lim  parseLimits
	}{{"parse+salt", lim}, {"parse+salt/assembled", assembled}} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			defer cpuPerOp(b)()
			for b.Loop() {
				pr, err := parseRequest(chatEndpoint, body, "", c.lim)
				if err != nil {
					b.Fatal(err)
				}
				if err := s.saltRequest(cl, pr); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// cpuPerOp starts counting the process's CPU time (user and system, every
// thread: the garbage collector's work on what an op allocated included)
// and returns what reports it per op as cpu-ns/op, for a benchmark to
// defer: on a shared machine it varies less than ns/op.
func cpuPerOp(b *testing.B) func() {
	start := processCPU(b)
	return func() {
		b.ReportMetric(float64((processCPU(b)-start).Nanoseconds())/float64(b.N), "cpu-ns/op")
	}
}

func processCPU(tb testing.TB) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
