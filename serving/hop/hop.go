// Package hop is the gateway's HTTP/1.1 client to its replicas: an
// [http.RoundTripper] that writes a request and reads its answer on the
// caller's goroutine, over a pool of keep-alive connections.
//
// net/http's Transport hands every request to two goroutines of its
// connection (one writes, one reads and passes the response back through a
// channel, then waits for the body's end), so each request through it costs
// a few goroutine wake-ups. On the gateway's hop — a loopback or tailnet
// connection to an engine that answers in milliseconds — those wake-ups were
// a measurable part of what the gateway adds. Here the request is written
// and its answer's head read by the goroutine that called RoundTrip — as
// [http.Request.Write] writes and [http.ReadResponse] reads them, by hand for
// the common shapes (write.go, read.go) and by those functions for the rest;
// its body is read by whoever reads it.
//
// Only what the gateway sends to engines takes this path: plain http, a
// request body of known length or none. Anything else (https, a proxy, a
// protocol upgrade) goes to Fallback. The httptrace hooks the gateway's
// attempts use (GetConn, GotConn, ConnectStart, ConnectDone, WroteRequest,
// GotFirstResponseByte) are called as net/http's Transport calls them.
package hop

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Transport is a RoundTripper for plain-http replicas. The zero value is not
// usable; set Dial.
type Transport struct {
	// Dial opens a connection to addr ("host:port"); required.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// IdleTimeout closes a connection left idle this long; 0 means 90 s.
	IdleTimeout time.Duration
	// MaxIdlePerHost bounds the idle connections kept per host; 0 means 256.
	MaxIdlePerHost int
	// BufferSize sizes the read and write buffers of a request; 0 means
	// 32 KiB. A connection holds no buffer while idle, and its write buffer
	// only while it writes a request: an open stream holds one read buffer.
	BufferSize int
	// Fallback carries the requests this transport does not (not plain
	// http); nil means they fail.
	Fallback http.RoundTripper

	mu   sync.Mutex
	idle map[string][]*conn // per host, most recently used last

	// The buffers of the requests in flight, for the next ones: a pooled
	// connection holding its own (32 KiB each way) cost an open stream 64
	// KiB and each idle connection as much (TestOpenStreamMemoryIsBounded,
	// server package).
	readers, writers sync.Pool
}

// conn is one connection to a replica.
type conn struct {
	t    *Transport
	key  string
	nc   net.Conn
	br   *bufio.Reader // while a request is in flight; nil while idle
	used bool          // has carried a request before this one
	// unblock makes c's pending and future reads and writes fail at once:
	// what a cancelled request calls (made once per connection, not per
	// request).
	unblock func()

	idleTimer *time.Timer // closes it when idle too long; nil while in use
}

// errUnsupported is what a request this transport does not carry gets when
// there is no Fallback.
var errUnsupported = errors.New("hop: only plain http requests are supported and no fallback is set")

// RoundTrip implements [http.RoundTripper].
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Scheme != "http" || req.Method == http.MethodConnect || req.URL.Host == "" ||
		(req.Body != nil && req.Body != http.NoBody && req.ContentLength <= 0) {
		if t.Fallback == nil {
			closeBody(req)
			return nil, errUnsupported
		}
		return t.Fallback.RoundTrip(req)
	}
	ctx := req.Context()
	trace := httptrace.ContextClientTrace(ctx)
	key := hostPort(req.URL.Host)
	for {
		c, err := t.get(ctx, key, trace)
		if err != nil {
			closeBody(req)
			return nil, err
		}
		resp, err := c.roundTrip(req, trace)
		if err == nil {
			return resp, nil
		}
		// A reused connection the replica had closed (it times idle ones
		// out, or it stopped) fails before any answer byte: send again, if
		// the request may be sent twice — as net/http does. Several pooled
		// connections may be dead at once (a restarted engine closed them
		// all); each leaves the pool as it fails, so this ends at the
		// latest on a fresh dial, whose error is the one returned.
		if c.used && errors.Is(err, errStale) && ctx.Err() == nil && replayable(req) {
			if body, gerr := rewind(req); gerr == nil {
				r2 := *req
				r2.Body = body
				req = &r2
				continue
			}
		}
		closeBody(req)
		return nil, err
	}
}

// NetHTTP returns a net/http Transport set as t is — its dialer, idle
// connections per host (maxIdle in all), idle timeout and buffers — with no
// compression (an SSE answer must arrive as the engine flushed it): the
// Fallback for what t does not carry.
func (t *Transport) NetHTTP(maxIdle int) *http.Transport {
	return &http.Transport{
		DialContext:         t.Dial,
		MaxIdleConns:        maxIdle,
		MaxIdleConnsPerHost: t.maxIdlePerHost(),
		IdleConnTimeout:     t.idleTimeout(),
		DisableCompression:  true,
		WriteBufferSize:     t.bufferSize(),
		ReadBufferSize:      t.bufferSize(),
	}
}

func (t *Transport) idleTimeout() time.Duration {
	if t.IdleTimeout <= 0 {
		return 90 * time.Second
	}
	return t.IdleTimeout
}

func (t *Transport) maxIdlePerHost() int {
	if t.MaxIdlePerHost <= 0 {
		return 256
	}
	return t.MaxIdlePerHost
}

func (t *Transport) bufferSize() int {
	if t.BufferSize <= 0 {
		return 32 << 10
	}
	return t.BufferSize
}

// CloseIdleConnections closes the pooled connections.
func (t *Transport) CloseIdleConnections() {
	t.mu.Lock()
	idle := t.idle
	t.idle = nil
	t.mu.Unlock()
	for _, cs := range idle {
		for _, c := range cs {
			c.idleTimer.Stop()
			c.nc.Close()
		}
	}
	if ci, ok := t.Fallback.(interface{ CloseIdleConnections() }); ok {
		ci.CloseIdleConnections()
	}
}

// errStale marks a failure on a reused connection before any byte of the
// answer came back: the replica had closed the connection.
var errStale = errors.New("hop: connection closed by the replica before it answered")

type staleError struct{ err error }

func (e *staleError) Error() string   { return errStale.Error() + ": " + e.err.Error() }
func (e *staleError) Unwrap() []error { return []error{errStale, e.err} }
func replayable(req *http.Request) bool {
	if req.Body != nil && req.Body != http.NoBody && req.GetBody == nil {
		return false
	}
	switch req.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return true
	}
	// As net/http: a request with an idempotency key may be sent again.
	_, a := req.Header["Idempotency-Key"]
	_, b := req.Header["X-Idempotency-Key"]
	return a || b
}

func rewind(req *http.Request) (io.ReadCloser, error) {
	if req.Body == nil || req.Body == http.NoBody {
		return req.Body, nil
	}
	return req.GetBody()
}

func closeBody(req *http.Request) {
	if req.Body != nil {
		req.Body.Close()
	}
}

func hostPort(host string) string {
	if _, port, err := net.SplitHostPort(host); err == nil && port != "" {
		return host
	}
	return net.JoinHostPort(trimBrackets(host), "80")
}

func trimBrackets(h string) string {
	if len(h) > 1 && h[0] == '[' && h[len(h)-1] == ']' {
		return h[1 : len(h)-1]
	}
	return h
}

// get returns an idle connection to key, or dials one.
func (t *Transport) get(ctx context.Context, key string, trace *httptrace.ClientTrace) (*conn, error) {
	if trace != nil && trace.GetConn != nil {
		trace.GetConn(key)
	}
	t.mu.Lock()
	if cs := t.idle[key]; len(cs) > 0 {
		c := cs[len(cs)-1]
		cs[len(cs)-1] = nil
		t.idle[key] = cs[:len(cs)-1]
		c.idleTimer.Stop()
		t.mu.Unlock()
		if trace != nil && trace.GotConn != nil {
			trace.GotConn(httptrace.GotConnInfo{Conn: c.nc, Reused: true, WasIdle: true})
		}
		return c, nil
	}
	t.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if trace != nil && trace.ConnectStart != nil {
		trace.ConnectStart("tcp", key)
	}
	nc, err := t.Dial(ctx, "tcp", key)
	if trace != nil && trace.ConnectDone != nil {
		trace.ConnectDone("tcp", key, err)
	}
	if err != nil {
		return nil, err
	}
	c := &conn{t: t, key: key, nc: nc}
	c.unblock = func() { c.nc.SetDeadline(aLongTimeAgo) }
	if trace != nil && trace.GotConn != nil {
		trace.GotConn(httptrace.GotConnInfo{Conn: nc})
	}
	return c, nil
}

// put returns c to the pool, or closes it when the pool is full.
func (t *Transport) put(c *conn) {
	c.used = true
	idle := t.idleTimeout()
	t.mu.Lock()
	if len(t.idle[c.key]) >= t.maxIdlePerHost() {
		t.mu.Unlock()
		c.nc.Close()
		return
	}
	if t.idle == nil {
		t.idle = make(map[string][]*conn)
	}
	t.idle[c.key] = append(t.idle[c.key], c)
	if c.idleTimer == nil {
		c.idleTimer = time.AfterFunc(idle, c.expire)
	} else {
		c.idleTimer.Reset(idle)
	}
	t.mu.Unlock()
}

// expire closes c if it is still idle.
func (c *conn) expire() {
	t := c.t
	t.mu.Lock()
	cs := t.idle[c.key]
	for i, x := range cs {
		if x == c {
			t.idle[c.key] = append(cs[:i], cs[i+1:]...)
			cs[len(cs)-1] = nil
			t.mu.Unlock()
			c.nc.Close()
			return
		}
	}
	t.mu.Unlock() // taken meanwhile
}

// reader returns a read buffer on nc from the pool.
func (t *Transport) reader(nc net.Conn) *bufio.Reader {
	if br, ok := t.readers.Get().(*bufio.Reader); ok {
		br.Reset(nc)
		return br
	}
	return bufio.NewReaderSize(nc, t.bufferSize())
}

// writeRequest writes req on c through a pooled write buffer.
func (c *conn) writeRequest(req *http.Request) error {
	t := c.t
	bw, ok := t.writers.Get().(*bufio.Writer)
	if ok {
		bw.Reset(c.nc)
	} else {
		bw = bufio.NewWriterSize(c.nc, t.bufferSize())
	}
	ok, err := false, error(nil)
	if trace := httptrace.ContextClientTrace(req.Context()); trace == nil || (trace.WroteHeaderField == nil && trace.WroteHeaders == nil) {
		ok, err = writeHead(bw, req)
	}
	if !ok {
		err = req.Write(bw)
	}
	if err == nil {
		err = bw.Flush()
	}
	bw.Reset(nil)
	t.writers.Put(bw)
	return err
}

// dropReader gives c's read buffer back to the pool; only the goroutine
// that reads c may call it.
func (c *conn) dropReader() {
	if c.br == nil {
		return
	}
	c.br.Reset(nil)
	c.t.readers.Put(c.br)
	c.br = nil
}

// aLongTimeAgo is a deadline that makes the connection's pending and future
// reads and writes fail at once.
var aLongTimeAgo = time.Unix(1, 0)

// roundTrip writes req on c and reads its answer's head. On success the
// response's body owns c: it goes back to the pool when the body is read to
// its end, and is closed when the body is closed before.
func (c *conn) roundTrip(req *http.Request, trace *httptrace.ClientTrace) (*http.Response, error) {
	ctx := req.Context()
	// A cancelled request unblocks its reads and writes; the connection is
	// then closed, never pooled.
	stop := context.AfterFunc(ctx, c.unblock)
	fail := func(err error, stale bool) (*http.Response, error) {
		stop()
		c.nc.Close()
		c.dropReader()
		if cerr := ctx.Err(); cerr != nil {
			return nil, cerr
		}
		if stale {
			return nil, &staleError{err}
		}
		return nil, err
	}
	c.br = c.t.reader(c.nc)
	werr := c.writeRequest(req)
	if trace != nil && trace.WroteRequest != nil {
		trace.WroteRequest(httptrace.WroteRequestInfo{Err: werr})
	}
	if werr != nil {
		return fail(werr, c.used && (errors.Is(werr, syscall.EPIPE) || errors.Is(werr, syscall.ECONNRESET)))
	}
	// The first byte apart: a reused connection that ends before it was
	// closed by the replica while idle (the request may be sent again).
	if _, err := c.br.Peek(1); err != nil {
		return fail(err, c.used && noAnswer(err))
	}
	if trace != nil && trace.GotFirstResponseByte != nil {
		trace.GotFirstResponseByte()
	}
	resp, b, err := c.readResponse(req)
	// Informational answers (100 Continue, 103 Early Hints) come before
	// the answer, as net/http's Transport skips them.
	for err == nil && resp.StatusCode >= 100 && resp.StatusCode < 200 && resp.StatusCode != http.StatusSwitchingProtocols {
		resp, b, err = c.readResponse(req)
	}
	if err != nil {
		return fail(err, false)
	}
	keep := !resp.Close && !req.Close
	if resp.Body == http.NoBody {
		c.release(stop, keep)
		return resp, nil
	}
	if b == nil {
		b = &body{rc: resp.Body}
	}
	b.c, b.stop, b.keep, b.ctx = c, stop, keep, ctx
	resp.Body = b
	return resp, nil
}

// readResponse reads an answer's head from c: by readHead, with the body
// that reads it (its framing set), or, for what readHead does not take, by
// http.ReadResponse (whose body is then resp.Body, and b nil).
func (c *conn) readResponse(req *http.Request) (resp *http.Response, b *body, err error) {
	a, fallback := readHead(c.br, req)
	if fallback == nil {
		return &a.resp, &a.body, nil
	}
	resp, err = http.ReadResponse(fallback, req)
	return resp, nil, err
}

// noAnswer reports whether a read error means the replica closed the
// connection without answering.
func noAnswer(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET)
}

// release ends c's use by one request: back to the pool when its answer was
// read whole and both sides keep the connection, else closed. Only the
// goroutine reading the answer calls it.
func (c *conn) release(stop func() bool, keep bool) {
	if !stop() {
		keep = false // the request was cancelled: its deadline is set on c
	}
	if c.br.Buffered() > 0 {
		keep = false // bytes past the answer: not a connection to trust
	}
	c.dropReader()
	if keep {
		c.t.put(c)
		return
	}
	c.nc.Close()
}

// body is a response's body; it hands its connection back at its end.
type body struct {
	c *conn
	// The answer's framing as readHead read it, or http.ReadResponse's
	// body (rc non-nil; never closed: net/http's Close would read to the
	// end).
	f    framing
	rc   io.ReadCloser
	stop func() bool
	ctx  context.Context
	keep bool
	// state: open, then read to its end or failed (Read released the
	// connection) or closed (Close did). Close may come from another
	// goroutine while a Read waits; whichever moves the state first owns
	// the connection.
	state atomic.Int32
	err   error // how the body ended, for the Reads after: only Read touches it
}

const (
	bodyOpen int32 = iota
	bodyDone
	bodyClosed
)

func (b *body) Read(p []byte) (int, error) {
	switch b.state.Load() {
	case bodyDone:
		return 0, b.err // io.EOF again, or the error it ended with
	case bodyClosed:
		return 0, errBodyClosed
	}
	var (
		n   int
		err error
	)
	if b.rc != nil {
		n, err = b.rc.Read(p)
	} else {
		n, err = b.f.read(b.c.br, p)
	}
	if err == nil {
		return n, nil
	}
	if !b.state.CompareAndSwap(bodyOpen, bodyDone) {
		return n, errBodyClosed // closed meanwhile; Close closed the connection
	}
	if err == io.EOF {
		b.err = err
		b.c.release(b.stop, b.keep)
		return n, err
	}
	b.c.release(b.stop, false)
	if cerr := b.ctx.Err(); cerr != nil {
		err = cerr
	}
	b.err = err
	return n, err
}

// Wait blocks until a Read would not block: a byte of the answer is on the
// connection, or reading it fails (the Read that follows says how). It takes
// nothing, so a reader above that needs a buffer only while it reads (a
// stream's relay between two events) can wait here, on the connection's own
// read buffer. Only the goroutine that reads the body may call it.
func (b *body) Wait() {
	if b.state.Load() == bodyOpen {
		_, _ = b.c.br.Peek(1)
	}
}

// Close closes the connection unless the body was read to its end; a Read
// waiting on another goroutine returns.
func (b *body) Close() error {
	if b.state.CompareAndSwap(bodyOpen, bodyClosed) {
		b.stop()
		b.c.nc.Close()
	}
	return nil
}

var errBodyClosed = errors.New("http: read on closed response body")
