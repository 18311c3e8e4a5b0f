package sim

import (
	"context"
	"math"
	"net/http"
	"strconv"
	"time"

	"tailgate/serving"
)

// flushBytes bounds how much a stream buffers while tokens are due at once
// (TPOT 0): tokens already due go out in one write, tokens in the future are
// flushed as they come.
const flushBytes = 32 << 10

// generate runs one validated request: queue for a slot, wait the drawn TTFT,
// then produce the tokens TPOT apart, writing them as JSON at the end or as
// SSE events as they come. A cancelled request context (the client went away)
// aborts at once and frees the slot.
func (e *Engine) generate(w http.ResponseWriter, r *http.Request, j *job, arrived time.Time) {
	ctx := r.Context()
	n := j.completionTokens()
	lat := e.lat.draw()
	resp := e.newResponse(j)

	var rc *http.ResponseController
	if j.stream {
		// Like vLLM, send the 200 before the request is scheduled: headers
		// say nothing about when the first token comes.
		w.Header()["Content-Type"] = []string{"text/event-stream; charset=utf-8"}
		w.WriteHeader(http.StatusOK)
		rc = http.NewResponseController(w)
		_ = rc.Flush()
	}

	if err := e.sched.acquire(ctx); err != nil {
		e.abort(0)
		return
	}
	held := true
	defer func() {
		if held {
			e.sched.release()
		}
	}()
	queued := time.Since(arrived)
	e.metrics.queue.Observe(queued.Seconds())

	var p pacer
	defer p.stop()
	if p.sleep(ctx, lat.ttft) != nil {
		e.abort(0)
		return
	}
	first := time.Now()
	e.metrics.prefilled(j.promptTokens, arrived, first)

	if !j.stream {
		if n > 1 && p.sleep(ctx, scale(lat.tpot, n-1)) != nil {
			e.abort(tokensBy(first, lat.tpot, n))
			return
		}
		held = false
		e.sched.release()
		e.finish(j, n, arrived, first, time.Now())
		buf := e.getBuf()
		w.Header()[serving.HeaderSimQueue] = []string{string(appendMillis(nil, queued))}
		*buf = resp.appendBody((*buf)[:0], j.hash, n)
		writeJSON(w, http.StatusOK, *buf)
		e.putBuf(buf)
		return
	}

	pooled := e.getBuf()
	defer e.putBuf(pooled)
	buf := (*pooled)[:0]
	defer func() { *pooled = buf }() // keep what the buffer grew to
	if j.chat {
		buf = resp.appendRoleChunk(buf)
	}
	for i := range n {
		if i > 0 {
			if err := p.sleep(ctx, time.Until(first.Add(scale(lat.tpot, i)))); err != nil {
				e.abort(i)
				return
			}
		}
		if i == 0 {
			// The 200 went out before the slot was taken, so the queue time
			// travels in-band, as a comment the sidecar reads and strips.
			buf = append(buf, queueComment...)
			buf = appendMillis(buf, queued)
			buf = append(buf, "\n\n"...)
		}
		last := i == n-1
		if last {
			held = false
			e.sched.release()
			e.finish(j, n, arrived, first, time.Now())
		}
		buf = resp.appendTokenChunk(buf, word(j.hash, i), i, last)
		if last {
			buf = resp.appendEnd(buf, n)
		} else if lat.tpot == 0 && len(buf) < flushBytes {
			continue // the next token is due now: send them together
		}
		if _, err := w.Write(buf); err != nil {
			if !last {
				e.abort(i + 1)
			}
			return
		}
		_ = rc.Flush()
		buf = buf[:0]
	}
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

func (e *Engine) finish(j *job, n int, arrived, first, end time.Time) {
	e.completed.Add(1)
	e.metrics.finished(n, n >= j.limit, arrived, first, end)
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

// tokensBy estimates how many of n tokens a non-streaming request had
// generated when it was aborted.
func tokensBy(first time.Time, tpot time.Duration, n int) int {
	if tpot <= 0 {
		return n
	}
	return min(n, 1+int(time.Since(first)/tpot))
}

func nowUnix() int64 { return time.Now().Unix() }
