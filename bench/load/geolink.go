package load

import (
	"errors"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// link is one simulated network path on loopback: a TCP proxy that holds
// every chunk for the link's one-way delay (plus jitter) in each
// direction, as a WAN path would, keeping the bytes in order. A new
// connection costs one round trip before its first byte moves (the TCP
// handshake). Closing the link refuses new connections and cuts the ones
// it carries: the far end is gone.
//
// It is a delay line, not sleep-then-write: a stream's chunks, a few
// milliseconds apart, each arrive one delay late, not one delay after the
// previous one. Shopify's toxiproxy has the same latency toxic, but as a
// library it comes with its API server and a dozen dependencies for what
// is this file; network namespaces with tc netem would do it in the
// kernel but need root and move every process of the fleet into them.
type link struct {
	ln     net.Listener
	target string
	delay  time.Duration // one way
	jitter time.Duration // uniform in ±jitter, per chunk
	seed   uint64
	opened atomic.Int64 // connections accepted

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// newLink listens on a loopback port and carries connections to target.
func newLink(target string, delay, jitter time.Duration, seed uint64) (*link, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	l := &link{ln: ln, target: target, delay: delay, jitter: min(jitter, delay), seed: seed, conns: map[net.Conn]struct{}{}}
	l.wg.Go(l.accept)
	return l, nil
}

// URL is the link's near end as an http:// URL.
func (l *link) URL() string { return "http://" + l.ln.Addr().String() }

func (l *link) accept() {
	for n := uint64(0); ; n++ {
		c, err := l.ln.Accept()
		if err != nil {
			return
		}
		if !l.track(c) {
			c.Close()
			return
		}
		l.opened.Add(1)
		l.wg.Go(func() { l.carry(c, n) })
	}
}

// track records c so Close can cut it; false once the link is closed.
func (l *link) track(c net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false
	}
	l.conns[c] = struct{}{}
	return true
}

func (l *link) untrack(cs ...net.Conn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range cs {
		delete(l.conns, c)
		c.Close()
	}
}

// carry connects c to the target after one round trip and pipes both
// ways; it returns when both directions are done.
func (l *link) carry(c net.Conn, n uint64) {
	time.Sleep(2 * l.delay)
	u, err := net.DialTimeout("tcp", l.target, 5*time.Second)
	if err != nil {
		l.untrack(c)
		return
	}
	if !l.track(u) {
		u.Close()
		l.untrack(c)
		return
	}
	var both sync.WaitGroup
	both.Go(func() { l.pipe(u, c, rand.New(rand.NewPCG(l.seed, 2*n))) })
	both.Go(func() { l.pipe(c, u, rand.New(rand.NewPCG(l.seed, 2*n+1))) })
	both.Wait()
	l.untrack(c, u)
}

type chunk struct {
	b  []byte
	at time.Time
}

// pipe copies src to dst, each chunk written one delay (± jitter) after
// it was read, never before the chunk ahead of it. When src ends, both
// connections close once what was read has been written.
func (l *link) pipe(dst, src net.Conn, r *rand.Rand) {
	q := make(chan chunk, 4096)
	var reader sync.WaitGroup
	reader.Go(func() {
		defer close(q)
		for {
			buf := make([]byte, 32<<10)
			n, err := src.Read(buf)
			if n > 0 {
				d := l.delay
				if l.jitter > 0 {
					d += time.Duration(r.Int64N(int64(2*l.jitter)+1)) - l.jitter
				}
				q <- chunk{buf[:n], time.Now().Add(d)}
			}
			if err != nil {
				return
			}
		}
	})
	var last time.Time
	for c := range q {
		at := c.at
		if at.Before(last) {
			at = last
		}
		last = at
		time.Sleep(time.Until(at))
		if _, err := dst.Write(c.b); err != nil {
			break
		}
	}
	dst.Close()
	src.Close() // ends the reader if the writer stopped first
	for range q {
	}
	reader.Wait()
}

// Close refuses new connections, cuts the ones the link carries and waits
// for its goroutines. It is safe twice.
func (l *link) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	err := l.ln.Close()
	for c := range l.conns {
		c.Close()
	}
	l.mu.Unlock()
	l.wg.Wait()
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}
