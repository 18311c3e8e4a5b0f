package server_test

import (
	"bytes"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/serving/sim"
)

// BenchmarkPacedStreams: what scripts/bench-streams.sh measures on the
// binary, in one process for a CPU profile (go test -bench PacedStreams
// -cpuprofile): pacedStreams streams opened at once through the gateway,
// each pacedChunks chunks 50 ms apart, one round an op. The engine and the
// client share the profile; look at the gateway's functions.
func BenchmarkPacedStreams(b *testing.B) {
	const (
		pacedStreams = 200
		pacedChunks  = 40
	)
	s := newBenchStack(b, sim.Config{Model: benchModel, TTFTSigma: -1, TPOT: 50 * time.Millisecond, MaxSeqs: 4096})
	body := fmt.Sprintf(`{"model":"%s","messages":[{"role":"user","content":"Stream to the benchmark."}],`+
		`"max_tokens":%d,"ignore_eos":true,"stream":true,"stream_options":{"include_usage":true}}`, benchModel, pacedChunks)
	client := benchClient(b)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		var wg sync.WaitGroup
		for range pacedStreams {
			wg.Go(func() {
				var buf bytes.Buffer
				if err := postAndCheck(client, s.Public.URL+"/v1/chat/completions", s.secret, body, true, &buf); err != nil {
					b.Error(err)
				}
			})
		}
		wg.Wait()
	}
}
