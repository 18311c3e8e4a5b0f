package hop

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/e2e/testkit"
)

// countingServer is a real HTTP server on loopback that counts the
// connections clients open to it.
type countingServer struct {
	*httptest.Server
	conns, closed atomic.Int64
}

func newCountingServer(t *testing.T, h http.HandlerFunc) *countingServer {
	t.Helper()
	cs := &countingServer{}
	cs.Server = httptest.NewUnstartedServer(h)
	cs.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		switch s {
		case http.StateNew:
			cs.conns.Add(1)
		case http.StateClosed:
			cs.closed.Add(1)
		}
	}
	cs.Start()
	t.Cleanup(cs.Close)
	return cs
}

func newTransport() *Transport {
	d := &net.Dialer{Timeout: 2 * time.Second}
	return &Transport{Dial: d.DialContext, IdleTimeout: 30 * time.Second}
}

func post(t *testing.T, tr http.RoundTripper, ctx context.Context, url, body string) (*http.Response, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Idempotency-Key", "k")
	return tr.RoundTrip(req)
}

func TestAnswersReuseOneConnection(t *testing.T) {
	// Content-Length, chunked (a stream flushed per event) and empty
	// answers, one after the other: each read to its end hands the
	// connection back, so all of them travel on one.
	srv := newCountingServer(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		switch r.URL.Path {
		case "/json":
			w.Header().Set("Content-Length", fmt.Sprint(len(b)+2))
			fmt.Fprintf(w, "<%s>", b)
		case "/sse":
			for i := range 3 {
				fmt.Fprintf(w, "data: %d %s\n\n", i, b)
				w.(http.Flusher).Flush()
			}
		case "/empty":
			w.WriteHeader(http.StatusNoContent)
		}
	})
	tr := newTransport()
	defer tr.CloseIdleConnections()
	for i := range 30 {
		path := []string{"/json", "/sse", "/empty"}[i%3]
		resp, err := post(t, tr, context.Background(), srv.URL+path, fmt.Sprint("body", i))
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		got, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatalf("request %d body: %v", i, err)
		}
		want := map[string]string{
			"/json":  fmt.Sprintf("<body%d>", i),
			"/sse":   fmt.Sprintf("data: 0 body%d\n\ndata: 1 body%d\n\ndata: 2 body%d\n\n", i, i, i),
			"/empty": "",
		}[path]
		if string(got) != want {
			t.Fatalf("request %d to %s: got %q, want %q", i, path, got, want)
		}
	}
	if n := srv.conns.Load(); n != 1 {
		t.Fatalf("30 answers read whole opened %d connections, want 1", n)
	}
}

func TestAnswerClosedEarlyClosesItsConnection(t *testing.T) {
	// 100 KB an answer: more than one read can take, so no answer is read
	// to its end by the first line's read (a short answer, all arrived,
	// would be read whole and its connection rightly kept).
	pad := strings.Repeat("x", 1000)
	srv := newCountingServer(t, func(w http.ResponseWriter, r *http.Request) {
		for i := range 100 {
			fmt.Fprintf(w, "data: %d\n: %s\n\n", i, pad)
			w.(http.Flusher).Flush()
		}
	})
	tr := newTransport()
	defer tr.CloseIdleConnections()
	for i := range 3 {
		resp, err := post(t, tr, context.Background(), srv.URL, "x")
		if err != nil {
			t.Fatal(err)
		}
		line, err := bufio.NewReader(resp.Body).ReadString('\n')
		if err != nil || line != "data: 0\n" {
			t.Fatalf("first line %q, %v", line, err)
		}
		resp.Body.Close()
		if _, err := resp.Body.Read(make([]byte, 1)); err == nil {
			t.Fatal("a closed body still reads")
		}
		_ = i
	}
	// The rest of an unread answer must not be taken for the next
	// answer: each request had a connection of its own.
	if n := srv.conns.Load(); n != 3 {
		t.Fatalf("3 answers closed early used %d connections, want 3", n)
	}
}

func TestConnectionTheReplicaClosedWhileIdleIsReplaced(t *testing.T) {
	// The replica closes a connection after each answer without saying so
	// (no Connection: close), as an engine timing out idle connections
	// does just before the next request: the request is sent again on a
	// new connection when it carries an idempotency key, and fails —
	// never sent twice silently — when it does not.
	var served atomic.Int64
	url := rawServer(t, func(c net.Conn) {
		req, err := http.ReadRequest(bufio.NewReader(c))
		if err != nil {
			return
		}
		io.Copy(io.Discard, req.Body)
		served.Add(1)
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		time.Sleep(20 * time.Millisecond) // the client pools it meanwhile
	})
	tr := newTransport()
	defer tr.CloseIdleConnections()
	read := func(resp *http.Response, err error) string {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	if got := read(post(t, tr, context.Background(), url, "a")); got != "ok" {
		t.Fatalf("got %q", got)
	}
	time.Sleep(100 * time.Millisecond) // the server has closed the pooled connection
	if got := read(post(t, tr, context.Background(), url, "b")); got != "ok" {
		t.Fatalf("got %q", got)
	}
	if n := served.Load(); n != 2 {
		t.Fatalf("the server answered %d requests, want 2", n)
	}

	time.Sleep(100 * time.Millisecond)
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader("c"))
	resp, err := tr.RoundTrip(req) // no idempotency key
	if err == nil {
		resp.Body.Close()
		t.Fatal("a request without an idempotency key was sent again on a new connection")
	}
	if !errors.Is(err, errStale) {
		t.Fatalf("error %v does not say the replica closed the connection", err)
	}
}

func TestEveryDeadPooledConnectionIsPassedOver(t *testing.T) {
	// An engine that stopped closed every connection in the pool at once.
	// A request with an idempotency key goes past all of them to a fresh
	// connection, as net/http's transport does; it must not fail on the
	// second dead one (the sidecar would answer 502 instead of retrying).
	const pooled = 4
	var served atomic.Int64
	release := make(chan struct{})
	url := rawServer(t, func(c net.Conn) {
		req, err := http.ReadRequest(bufio.NewReader(c))
		if err != nil {
			return
		}
		io.Copy(io.Discard, req.Body)
		if served.Add(1) <= pooled {
			<-release // hold the first answers so each takes its own connection
		}
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		time.Sleep(20 * time.Millisecond) // the client pools it, then it is closed
	})
	tr := newTransport()
	defer tr.CloseIdleConnections()
	var wg sync.WaitGroup
	for range pooled {
		wg.Go(func() {
			resp, err := post(t, tr, context.Background(), url, "a")
			if err != nil {
				t.Error(err)
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		})
	}
	testkit.WaitFor(t, "every held request on its own connection", func() bool { return served.Load() == pooled })
	close(release)
	wg.Wait()
	time.Sleep(100 * time.Millisecond) // the server has closed all pooled connections
	resp, err := post(t, tr, context.Background(), url, "b")
	if err != nil {
		t.Fatalf("with %d dead pooled connections: %v, want an answer on a fresh one", pooled, err)
	}
	resp.Body.Close()
	if n := served.Load(); n != pooled+1 {
		t.Fatalf("the server answered %d requests, want %d", n, pooled+1)
	}
}

func TestCancelledRequestReturnsAtOnce(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	srv := newCountingServer(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/mid" {
			io.WriteString(w, "data: first\n\n")
			w.(http.Flusher).Flush()
		}
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	tr := newTransport()
	defer tr.CloseIdleConnections()

	// Waiting for the head.
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(50*time.Millisecond, cancel)
	_, err := post(t, tr, ctx, srv.URL+"/head", "x")
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled while waiting for the head: %v, want context.Canceled", err)
	}

	// Waiting in the body.
	ctx, cancel = context.WithCancel(context.Background())
	resp, err := post(t, tr, ctx, srv.URL+"/mid", "x")
	if err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(resp.Body)
	if line, _ := br.ReadString('\n'); line != "data: first\n" {
		t.Fatalf("first line %q", line)
	}
	time.AfterFunc(50*time.Millisecond, cancel)
	_, err = io.ReadAll(br)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled while reading the body: %v, want context.Canceled", err)
	}
	resp.Body.Close()

	// Closed from another goroutine while a read waits.
	resp, err = post(t, tr, context.Background(), srv.URL+"/mid", "x")
	if err != nil {
		t.Fatal(err)
	}
	time.AfterFunc(50*time.Millisecond, func() { resp.Body.Close() })
	if _, err := io.ReadAll(resp.Body); err == nil {
		t.Fatal("a read waiting on a body closed meanwhile returned no error")
	}

	// None of those connections is pooled: the next request works.
	release2 := newCountingServer(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "fine") })
	resp, err = post(t, tr, context.Background(), release2.URL, "x")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "fine" {
		t.Fatalf("got %q", b)
	}
	if n := len(tr.idle[hostPort(strings.TrimPrefix(srv.URL, "http://"))]); n != 0 {
		t.Fatalf("%d cancelled connections were pooled", n)
	}
}

func TestTraceSaysWhenTheRequestWasWrittenAndWhetherItDialled(t *testing.T) {
	srv := newCountingServer(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	tr := newTransport()
	defer tr.CloseIdleConnections()
	for i := range 2 {
		var dialled, wrote, first, reused bool
		ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{
			ConnectStart:         func(string, string) { dialled = true },
			WroteRequest:         func(info httptrace.WroteRequestInfo) { wrote = info.Err == nil },
			GotFirstResponseByte: func() { first = true },
			GotConn:              func(info httptrace.GotConnInfo) { reused = info.Reused },
		})
		resp, err := post(t, tr, ctx, srv.URL, "x")
		if err != nil {
			t.Fatal(err)
		}
		io.ReadAll(resp.Body)
		resp.Body.Close()
		if dialled != (i == 0) || reused != (i == 1) || !wrote || !first {
			t.Fatalf("request %d: dialled %v reused %v wrote %v first byte %v", i, dialled, reused, wrote, first)
		}
	}
}

func TestRequestToAnUnreachableReplicaIsNotWritten(t *testing.T) {
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := ln.Addr().String()
	ln.Close()
	var wrote bool
	ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{
		WroteRequest: func(httptrace.WroteRequestInfo) { wrote = true },
	})
	tr := newTransport()
	if _, err := post(t, tr, ctx, "http://"+addr+"/", "x"); err == nil {
		t.Fatal("a request to a closed port succeeded")
	}
	if wrote {
		t.Fatal("the trace says a request to a closed port was written")
	}
}

func TestIdleConnectionsAreClosedAfterTheTimeout(t *testing.T) {
	srv := newCountingServer(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	tr := newTransport()
	tr.IdleTimeout = 50 * time.Millisecond
	resp, err := post(t, tr, context.Background(), srv.URL, "x")
	if err != nil {
		t.Fatal(err)
	}
	io.ReadAll(resp.Body)
	resp.Body.Close()
	deadline := time.Now().Add(5 * time.Second)
	for srv.closed.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("an idle connection was still open 5 s after its 50 ms idle timeout")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestOtherSchemesGoToTheFallback(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "tls") }))
	defer srv.Close()
	tr := newTransport()
	if _, err := post(t, tr, context.Background(), srv.URL, "x"); err == nil {
		t.Fatal("an https request without a fallback succeeded")
	}
	tr.Fallback = srv.Client().Transport
	resp, err := post(t, tr, context.Background(), srv.URL, "x")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "tls" {
		t.Fatalf("got %q", b)
	}
}

func TestConcurrentRequestsGetTheirOwnAnswers(t *testing.T) {
	srv := newCountingServer(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		for range 4 {
			w.Write(b)
			w.(http.Flusher).Flush()
		}
	})
	tr := newTransport()
	defer tr.CloseIdleConnections()
	var wg sync.WaitGroup
	errs := make(chan error, 400)
	for g := range 8 {
		wg.Go(func() {
			for i := range 50 {
				msg := fmt.Sprintf("[%d.%d]", g, i)
				resp, err := post(t, tr, context.Background(), srv.URL, msg)
				if err != nil {
					errs <- err
					return
				}
				b, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				if err != nil || !bytes.Equal(b, bytes.Repeat([]byte(msg), 4)) {
					errs <- fmt.Errorf("%s got %q, %v", msg, b, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if n := srv.conns.Load(); n > 8 {
		t.Fatalf("8 clients opened %d connections", n)
	}
}

func TestInformationalAnswersAreSkippedAndEOFRepeats(t *testing.T) {
	url := rawServer(t, func(c net.Conn) {
		br := bufio.NewReader(c)
		for {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			io.Copy(io.Discard, req.Body)
			io.WriteString(c, "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n"+
				"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello")
		}
	})
	tr := newTransport()
	defer tr.CloseIdleConnections()
	for range 2 {
		resp, err := post(t, tr, context.Background(), url, "x")
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 || string(b) != "hello" || err != nil {
			t.Fatalf("got %d %q %v, want 200 \"hello\"", resp.StatusCode, b, err)
		}
		if n, err := resp.Body.Read(make([]byte, 8)); n != 0 || err != io.EOF {
			t.Fatalf("a read after the end: %d, %v; want 0, EOF", n, err)
		}
		resp.Body.Close()
	}
}

// rawServer serves each connection to a loopback listener with handle,
// written at the TCP level (for what net/http's server would not send), and
// returns its URL. The connection is closed when handle returns.
func rawServer(t *testing.T, handle func(c net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				handle(c)
			}()
		}
	}()
	return "http://" + ln.Addr().String() + "/"
}

func TestWaitReturnsWhenTheNextByteCameAndTakesNothing(t *testing.T) {
	next := make(chan struct{})
	srv := newCountingServer(t, func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "data: 1\n\n")
		w.(http.Flusher).Flush()
		if r.URL.Path == "/hold" { // until the request is cancelled
			<-r.Context().Done()
			return
		}
		select {
		case <-next:
		case <-r.Context().Done():
			return
		}
		io.WriteString(w, "data: 2\n\n")
	})
	tr := newTransport()
	defer tr.CloseIdleConnections()
	waitOn := func(resp *http.Response) { resp.Body.(interface{ Wait() }).Wait() }

	resp, err := post(t, tr, context.Background(), srv.URL, "x")
	if err != nil {
		t.Fatal(err)
	}
	first := make([]byte, len("data: 1\n\n"))
	if _, err := io.ReadFull(resp.Body, first); err != nil || string(first) != "data: 1\n\n" {
		t.Fatalf("first event %q, %v", first, err)
	}
	waited := make(chan struct{})
	go func() { waitOn(resp); close(waited) }()
	close(next) // the engine sends the rest only now: the wait ends on it
	testkit.WaitWithin(t, 5*time.Second, "Wait returned once the next event was on the connection", func() bool {
		select {
		case <-waited:
			return true
		default:
			return false
		}
	})
	rest, err := io.ReadAll(resp.Body)
	if err != nil || string(rest) != "data: 2\n\n" {
		t.Fatalf("after Wait the body read %q, %v; want the whole second event", rest, err)
	}
	waitOn(resp) // read to its end: returns at once
	resp.Body.Close()

	// A cancelled request ends the wait; the read after it says so, and
	// the connection is not kept.
	ctx, cancel := context.WithCancel(context.Background())
	resp, err = post(t, tr, ctx, srv.URL+"/hold", "x")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(resp.Body, first); err != nil {
		t.Fatal(err)
	}
	time.AfterFunc(50*time.Millisecond, cancel)
	waitOn(resp)
	if _, err := resp.Body.Read(first); !errors.Is(err, context.Canceled) {
		t.Fatalf("the read after a cancelled wait: %v, want context.Canceled", err)
	}
	resp.Body.Close()
	if n := len(tr.idle[hostPort(strings.TrimPrefix(srv.URL, "http://"))]); n != 0 {
		t.Fatalf("%d pooled connections after a cancelled answer, want 0", n)
	}
}
