package server_test

import (
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
)

// BenchmarkIdempotencyKey: BenchmarkGatewayOverhead's request through the
// gateway, without the header ("none"), with a new Idempotency-Key each
// ("new": claimed, run, its answer kept) and with one key sent again
// ("replay": answered from the record). Compare with the same run's
// "none" for the cost per request of the header.
func BenchmarkIdempotencyKey(b *testing.B) {
	body := `{"model":"` + benchModel + `","messages":[{"role":"system","content":"You are terse."},` +
		`{"role":"user","content":"Say hello to the benchmark."}],"max_tokens":16,"ignore_eos":true}`
	s := newBenchStack(b, benchEngine)
	url := s.Public.URL + "/v1/chat/completions"
	var seq atomic.Int64
	for _, mode := range []string{"none", "new", "replay"} {
		b.Run(mode, func(b *testing.B) {
			client := benchClient(b)
			b.SetParallelism(4)
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
					req.Header.Set("Authorization", "Bearer "+s.secret)
					req.Header.Set("Content-Type", "application/json")
					switch mode {
					case "new":
						req.Header.Set("Idempotency-Key", "bench-"+strconv.FormatInt(seq.Add(1), 10))
					case "replay":
						req.Header.Set("Idempotency-Key", "bench-replay")
					}
					resp, err := client.Do(req)
					if err != nil {
						b.Error(err)
						return
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != 200 {
						b.Errorf("status %d", resp.StatusCode)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
		})
	}
}
