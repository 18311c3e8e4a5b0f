package sim

import (
	"context"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/tailgate-dev/tailgate/serving"
)

// flushBytes bounds how much a stream buffers while tokens are due at once
// (TPOT 0): tokens already due go out in one write, tokens in the future are
// flushed as they come.
const flushBytes = 32 << 10

// encoder renders one answer in an endpoint's wire format. A stream is
// open (with the response headers, before the request is scheduled), first
// (together with the first token), one token call per token and choice,
// and end (after the last token); a JSON answer is body.
type encoder interface {
	mediaType() string
	open(b []byte) []byte
	first(b []byte) []byte
	token(b []byte, c *choice, k int) []byte
	end(b []byte) []byte
	body(b []byte) []byte
}

// generate runs one validated request: queue for a slot, wait the drawn
// TTFT, then produce the tokens TPOT apart — one token of every unfinished
// choice per step, as vLLM decodes n sequences together — writing them as
// JSON at the end or as SSE events as they come. A cancelled request
// context (the client went away) aborts at once and frees the slot.
func (e *Engine) generate(w http.ResponseWriter, r *http.Request, j *job, choices []*choice, enc encoder, arrived time.Time) {
	ctx := r.Context()
	steps, total, length := 0, 0, false
	for _, c := range choices {
		steps = max(steps, c.total())
		total += c.total()
		length = length || c.finish == "length"
	}
	lat := e.lat.drawFor(j.latencyKey())

	var rc *http.ResponseController
	if j.stream {
		// Like vLLM, send the 200 before the request is scheduled: headers
		// say nothing about when the first token comes.
		w.Header()["Content-Type"] = []string{"text/event-stream; charset=utf-8"}
		w.WriteHeader(http.StatusOK)
		rc = http.NewResponseController(w)
		if b := enc.open(nil); len(b) > 0 {
			_, _ = w.Write(b)
		}
		_ = rc.Flush()
	}

	// The request's KV footprint when it ends: its prompt and every token
	// of every choice.
	kv := j.promptTokens + total
	if err := e.sched.acquire(ctx, kv, j.priority); err != nil {
		e.abort(0)
		return
	}
	held := true
	defer func() {
		if held {
			e.sched.release(kv)
		}
	}()
	queued := time.Since(arrived)
	e.metrics.queue.Observe(queued.Seconds())
	prefill := e.prefill(j)

	var p pacer
	defer p.stop()
	if p.sleep(ctx, lat.ttft+prefill) != nil {
		e.abort(0)
		return
	}
	first := time.Now()
	e.metrics.prefilled(j.promptTokens, arrived, first)
	e.metrics.prefillTime.Observe(first.Sub(arrived.Add(queued)).Seconds())

	if !j.stream {
		if steps > 1 && p.sleep(ctx, scale(lat.tpot, steps-1)) != nil {
			e.abort(generatedBy(choices, stepsBy(first, lat.tpot, steps)))
			return
		}
		held = false
		e.sched.release(kv)
		end := time.Now()
		if steps > 1 {
			gap := end.Sub(first) / time.Duration(steps-1)
			for range steps - 1 {
				e.metrics.itl.Observe(gap.Seconds())
			}
		}
		e.finish(total, steps, length, arrived, first, end)
		buf := e.getBuf()
		w.Header()[serving.HeaderSimQueue] = []string{string(appendMillis(nil, queued))}
		*buf = enc.body((*buf)[:0])
		writeBody(w, http.StatusOK, enc.mediaType(), *buf)
		e.putBuf(buf)
		return
	}

	pooled := e.getBuf()
	defer e.putBuf(pooled)
	buf := enc.first((*pooled)[:0])
	defer func() { *pooled = buf }() // keep what the buffer grew to
	prev := first
	for k := range steps {
		if k > 0 {
			if err := p.sleep(ctx, time.Until(first.Add(scale(lat.tpot, k)))); err != nil {
				e.abort(generatedBy(choices, k))
				return
			}
			now := time.Now()
			e.metrics.itl.Observe(now.Sub(prev).Seconds())
			prev = now
		}
		if k == 0 {
			// The 200 went out before the slot was taken, so the queue time
			// travels in-band, as a comment the sidecar reads and strips.
			buf = append(buf, queueComment...)
			buf = appendMillis(buf, queued)
			buf = append(buf, "\n\n"...)
		}
		last := k == steps-1
		if last {
			held = false
			e.sched.release(kv)
			e.finish(total, steps, length, arrived, first, prev)
		}
		for _, c := range choices {
			if k < c.total() && c.chunkEnd(k, j.interval) {
				buf = appendChunk(buf, enc, c, k)
			}
		}
		if last {
			buf = enc.end(buf)
		} else if lat.tpot == 0 && len(buf) < flushBytes {
			continue // the next token is due now: send them together
		}
		if _, err := w.Write(buf); err != nil {
			if !last {
				e.abort(generatedBy(choices, k+1))
			}
			return
		}
		_ = rc.Flush()
		buf = buf[:0]
	}
}

// chunkEncoder is an encoder whose chunks can carry several tokens.
type chunkEncoder interface {
	chunk(b []byte, c *choice, from, to int) []byte
}

// appendChunk appends the chunk that ends with token k of c: the tokens
// since the last chunk, merged when the encoder can, else one event each.
func appendChunk(b []byte, enc encoder, c *choice, k int) []byte {
	if ce, ok := enc.(chunkEncoder); ok {
		b = ce.chunk(b, c, c.sent, k+1)
	} else {
		for t := c.sent; t <= k; t++ {
			b = enc.token(b, c, t)
		}
	}
	c.sent = k + 1
	return b
}

// generatedBy returns the tokens the choices had generated after steps
// steps.
func generatedBy(choices []*choice, steps int) int {
	n := 0
	for _, c := range choices {
		n += min(steps, c.total())
	}
	return n
}

// queueComment starts the SSE comment that reports a stream's queue time.
const queueComment = ": sim-queue-ms="

// appendMillis appends d in milliseconds with three decimals.
func appendMillis(b []byte, d time.Duration) []byte {
	return strconv.AppendFloat(b, float64(d)/float64(time.Millisecond), 'f', 3, 64)
}

// getBuf and putBuf recycle response buffers, which would otherwise be the
// engine's largest allocation per request.
func (e *Engine) getBuf() *[]byte {
	if b, ok := e.bufs.Get().(*[]byte); ok {
		return b
	}
	b := make([]byte, 0, 4096)
	return &b
}

func (e *Engine) putBuf(b *[]byte) {
	if cap(*b) <= 4*flushBytes {
		e.bufs.Put(b)
	}
}

func (e *Engine) finish(tokens, steps int, length bool, arrived, first, end time.Time) {
	e.completed.Add(1)
	e.metrics.finished(tokens, steps, length, arrived, first, end)
}

func (e *Engine) abort(generated int) {
	e.aborted.Add(1)
	e.metrics.abortedRequest(generated)
}

// pacer sleeps on one reusable timer, waking early when ctx ends.
type pacer struct{ t *time.Timer }

func (p *pacer) sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	if p.t == nil {
		p.t = time.NewTimer(d)
	} else {
		p.t.Reset(d)
	}
	select {
	case <-p.t.C:
		return nil
	case <-ctx.Done():
		p.t.Stop()
		return ctx.Err()
	}
}

func (p *pacer) stop() {
	if p.t != nil {
		p.t.Stop()
	}
}

// scale returns d×k, saturating instead of overflowing.
func scale(d time.Duration, k int) time.Duration {
	if k > 0 && d > math.MaxInt64/time.Duration(k) {
		return math.MaxInt64
	}
	return d * time.Duration(k)
}

// stepsBy estimates how many of n steps a non-streaming request had
// completed when it was aborted.
func stepsBy(first time.Time, tpot time.Duration, n int) int {
	if tpot <= 0 {
		return n
	}
	return min(n, 1+int(time.Since(first)/tpot))
}
