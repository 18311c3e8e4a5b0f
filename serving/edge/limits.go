package edge

import (
	"context"
	"errors"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// What one client may hold of the edge: connections (Config.MaxConnections
// and MaxConnsPerIP, through connlimit, as on the gateway's public
// listener), time (IdleTimeout between requests; BodyTimeout plus one
// second per BodyMinRate bytes to send a body) and memory (the bytes the
// edge holds of bodies it peeks at, over all requests, bounded by
// MaxPeekInFlight).

// errPeekBudget: the bytes the edge may hold of bodies are all held, and
// none came back within Config.PeekWait.
var errPeekBudget = errors.New("peek budget exhausted")

// peekBudget bounds the body bytes the edge holds at once over all
// requests (the peeks: each up to MaxPeek). It is the gateway's body
// budget (server/bodybudget.go) for a process that may not import package
// server: a request reserves before it reads, waits up to wait for bytes
// to come back, and gives them back when it ends.
type peekBudget struct {
	max  int64
	wait time.Duration

	mu    sync.Mutex
	used  int64
	freed chan struct{} // closed and replaced when bytes come back while someone waits
	wants bool
}

func newPeekBudget(max int64, wait time.Duration) *peekBudget {
	return &peekBudget{max: max, wait: wait, freed: make(chan struct{})}
}

// reserve takes n bytes, waiting up to b.wait for them.
func (b *peekBudget) reserve(ctx context.Context, n int64) error {
	var timer *time.Timer
	for {
		b.mu.Lock()
		if b.used+n <= b.max {
			b.used += n
			b.mu.Unlock()
			return nil
		}
		freed := b.freed
		b.wants = true
		b.mu.Unlock()
		if n > b.max {
			return errPeekBudget
		}
		if timer == nil {
			timer = time.NewTimer(b.wait)
			defer timer.Stop()
		}
		select {
		case <-freed:
		case <-timer.C:
			return errPeekBudget
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (b *peekBudget) release(n int64) {
	if n <= 0 {
		return
	}
	b.mu.Lock()
	b.used -= n
	if b.wants {
		close(b.freed)
		b.freed, b.wants = make(chan struct{}), false
	}
	b.mu.Unlock()
}

// inFlight is the bytes held now.
func (b *peekBudget) inFlight() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used
}

// pacedBody is a client's request body whose connection read deadline
// moves as it arrives: the body may take grace plus one second per rate
// bytes received, so a client trickling bytes is cut off (as the gateway's
// uploads are, server/batch/limits.go). timedOut says the deadline ended a
// read.
type pacedBody struct {
	io.ReadCloser
	rc    *http.ResponseController
	start time.Time
	grace time.Duration
	rate  float64

	n        int64
	set      time.Time
	timedOut atomic.Bool // read by the handler, set by whoever reads: the transport's writer too

	mu   sync.Mutex // the deadline is set from the handler and the transport's writer
	done bool       // the body was read whole, or the handler ended: no more deadlines
}

func newPacedBody(body io.ReadCloser, w http.ResponseWriter, grace time.Duration, rate int64) *pacedBody {
	p := &pacedBody{ReadCloser: body, rc: http.NewResponseController(w), start: time.Now(), grace: grace, rate: float64(rate)}
	p.move()
	return p
}

func (p *pacedBody) Read(b []byte) (int, error) {
	n, err := p.ReadCloser.Read(b)
	p.n += int64(n)
	switch {
	case err == io.EOF:
		p.finish()
	case err != nil:
		var te interface{ Timeout() bool }
		if errors.As(err, &te) && te.Timeout() {
			p.timedOut.Store(true)
		}
	default:
		p.move()
	}
	return n, err
}

// move sets the deadline the bytes so far have earned, at most every
// 100 ms of progress (each set arms a timer).
func (p *pacedBody) move() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done {
		return
	}
	d := p.start.Add(p.grace + time.Duration(float64(p.n)/p.rate*float64(time.Second)))
	if p.set.IsZero() || d.Sub(p.set) >= 100*time.Millisecond {
		_ = p.rc.SetReadDeadline(d)
		p.set = d
	}
}

// finish lifts the deadline once the body is read whole: the answer may
// take as long as it takes.
func (p *pacedBody) finish() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.done {
		p.done = true
		_ = p.rc.SetReadDeadline(time.Time{})
	}
}

// end is called as the handler returns: the connection is the server's
// again, and a transport still reading the body must not touch it.
func (p *pacedBody) end() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.done = true
}
