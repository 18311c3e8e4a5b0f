package server

import (
	"fmt"
	"runtime"
	"testing"
)

// TestAnswerLogMemoryPerStream measures what a resumable stream holds in
// memory while it runs: its answerLog with every event of a 256-token chat
// stream (vLLM's chunk shape), as the relay writes them one by one. It
// must stay within 2× the events' own bytes (the buffer grows by doubling)
// plus a small fixed part; the figure is logged for docs/api.md.
func TestAnswerLogMemoryPerStream(t *testing.T) {
	const streams, events = 200, 256
	ev := func(i int) []byte {
		return fmt.Appendf(nil, `data: {"id":"chatcmpl-8f2c0e1d4b7a4c6e9d3f","object":"chat.completion.chunk","created":1765000000,"model":"tailgate-sim","choices":[{"index":0,"delta":{"content":" word%d"},"logprobs":null,"finish_reason":null}]}`+"\n\n", i%1000)
	}
	raw := 0
	for i := range events {
		raw += len(ev(i))
	}
	evs := make([][]byte, events)
	for i := range evs {
		evs[i] = ev(i)
	}
	logs := make([]*answerLog, streams)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for s := range logs {
		l := newAnswerLog("req_x")
		l.Header().Set("Content-Type", "text/event-stream")
		l.WriteHeader(200)
		for _, e := range evs {
			_, _ = l.Write(e)
		}
		l.finish()
		logs[s] = l
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	per := float64(after.HeapAlloc-before.HeapAlloc) / streams
	runtime.KeepAlive(logs)
	t.Logf("a stream of %d events (%d bytes of events) holds %.0f bytes in its answer log (%.2f× its events)", events, raw, per, per/float64(raw))
	if per > 2*float64(raw)+4096 {
		t.Fatalf("a stream's log holds %.0f bytes for %d bytes of events", per, raw)
	}
	// A reader takes the events without copying them.
	v := logs[0].view(250)
	if len(v.events) != 6 || &v.events[0][0] != &logs[0].buf[logs[0].ends[249]] {
		t.Fatalf("view from 250: %d events, copied", len(v.events))
	}
}
