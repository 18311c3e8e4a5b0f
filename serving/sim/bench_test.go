package sim

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

func benchmarkChat(b *testing.B, body string) {
	e, srv := start(b, Config{Model: "m"})
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256}}
	b.Cleanup(client.CloseIdleConnections)
	url := srv.URL + "/v1/chat/completions"
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			resp, err := client.Post(url, "application/json", strings.NewReader(body))
			if err != nil {
				b.Error(err)
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				b.Errorf("status %d", resp.StatusCode)
				return
			}
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
	if s := e.Stats(); s.Completed != int64(b.N) {
		b.Errorf("completed %d of %d", s.Completed, b.N)
	}
}

// BenchmarkChatNonStreaming measures the engine's own overhead (TTFT and TPOT
// 0) per request, client and loopback HTTP included.
func BenchmarkChatNonStreaming(b *testing.B) {
	benchmarkChat(b, `{"model":"m","messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"Say hello to the benchmark."}],"max_tokens":32,"ignore_eos":true}`)
}

func BenchmarkChatStreaming(b *testing.B) {
	benchmarkChat(b, `{"model":"m","messages":[{"role":"user","content":"Say hello to the benchmark."}],"max_tokens":32,"ignore_eos":true,"stream":true,"stream_options":{"include_usage":true}}`)
}
