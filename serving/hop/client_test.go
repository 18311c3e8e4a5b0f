package hop

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestBothClientsBehaveAlike is the behaviour table both upstream clients
// (--upstream-client hop and nethttp) must pass: what the gateway relies on
// of its client to replicas, each row run against real loopback servers.
func TestBothClientsBehaveAlike(t *testing.T) {
	read := func(t *testing.T, tr http.RoundTripper, url, body string) string {
		t.Helper()
		resp, err := post(t, tr, context.Background(), url, body)
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
	rows := []struct {
		name string
		run  func(t *testing.T, tr http.RoundTripper)
	}{
		{"answers in turn reuse one kept-alive connection", func(t *testing.T, tr http.RoundTripper) {
			srv := newCountingServer(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
			for range 3 {
				if got := read(t, tr, srv.URL, "x"); got != "ok" {
					t.Fatalf("got %q, want ok", got)
				}
			}
			if n := srv.conns.Load(); n != 1 {
				t.Fatalf("3 requests in turn opened %d connections, want 1", n)
			}
		}},
		{"informational answers are skipped and EOF repeats", func(t *testing.T, tr http.RoundTripper) {
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
			resp, err := post(t, tr, context.Background(), url, "x")
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			if resp.StatusCode != 200 || string(b) != "hello" || err != nil {
				t.Fatalf("got %d %q %v, want 200 \"hello\"", resp.StatusCode, b, err)
			}
			for range 2 {
				if n, err := resp.Body.Read(make([]byte, 8)); n != 0 || err != io.EOF {
					t.Fatalf("a read after the end: %d, %v; want 0, EOF", n, err)
				}
			}
		}},
		{"a chunked answer arrives event by event", func(t *testing.T, tr http.RoundTripper) {
			next := make(chan struct{})
			srv := newCountingServer(t, func(w http.ResponseWriter, r *http.Request) {
				io.WriteString(w, "data: one\n\n")
				w.(http.Flusher).Flush()
				select { // the second event only once the client read the first
				case <-next:
				case <-r.Context().Done():
					return
				}
				io.WriteString(w, "data: two\n\n")
			})
			resp, err := post(t, tr, context.Background(), srv.URL, "x")
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			br := bufio.NewReader(resp.Body)
			if line, err := br.ReadString('\n'); line != "data: one\n" || err != nil {
				t.Fatalf("first line %q, %v", line, err)
			}
			close(next)
			rest, err := io.ReadAll(br)
			if string(rest) != "\ndata: two\n\n" || err != nil {
				t.Fatalf("rest %q, %v", rest, err)
			}
		}},
		{"a replica that closes mid-body is an error, not a short answer", func(t *testing.T, tr http.RoundTripper) {
			url := rawServer(t, func(c net.Conn) {
				req, err := http.ReadRequest(bufio.NewReader(c))
				if err != nil {
					return
				}
				io.Copy(io.Discard, req.Body)
				io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")
			})
			resp, err := post(t, tr, context.Background(), url, "x")
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			if string(b) != "abc" || !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Fatalf("got %q, %v; want \"abc\" and an unexpected EOF", b, err)
			}
		}},
		{"a kept-alive connection the replica closed is replaced for a replayable request", func(t *testing.T, tr http.RoundTripper) {
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
			for _, body := range []string{"a", "b"} {
				if got := read(t, tr, url, body); got != "ok" {
					t.Fatalf("got %q", got)
				}
				time.Sleep(100 * time.Millisecond) // the server has closed the pooled connection
			}
			if n := served.Load(); n != 2 {
				t.Fatalf("the server answered %d requests, want 2", n)
			}
		}},
		{"cancelling the context ends the wait for the head and the body", func(t *testing.T, tr http.RoundTripper) {
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
			ctx, cancel := context.WithCancel(context.Background())
			time.AfterFunc(50*time.Millisecond, cancel)
			if _, err := post(t, tr, ctx, srv.URL+"/head", "x"); !errors.Is(err, context.Canceled) {
				t.Fatalf("cancelled while waiting for the head: %v, want context.Canceled", err)
			}
			ctx, cancel = context.WithCancel(context.Background())
			resp, err := post(t, tr, ctx, srv.URL+"/mid", "x")
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			br := bufio.NewReader(resp.Body)
			if line, _ := br.ReadString('\n'); line != "data: first\n" {
				t.Fatalf("first line %q", line)
			}
			time.AfterFunc(50*time.Millisecond, cancel)
			if _, err := io.ReadAll(br); !errors.Is(err, context.Canceled) {
				t.Fatalf("cancelled while reading the body: %v, want context.Canceled", err)
			}
		}},
		{"an unreachable replica is an error", func(t *testing.T, tr http.RoundTripper) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			addr := ln.Addr().String()
			ln.Close()
			if resp, err := post(t, tr, context.Background(), "http://"+addr+"/", "x"); err == nil {
				resp.Body.Close()
				t.Fatal("a request to a closed port got an answer")
			}
		}},
		{"headers and status reach the caller as sent", func(t *testing.T, tr http.RoundTripper) {
			srv := newCountingServer(t, func(w http.ResponseWriter, r *http.Request) {
				b, _ := io.ReadAll(r.Body)
				w.Header().Set("Retry-After", "3")
				w.WriteHeader(http.StatusTooManyRequests)
				io.WriteString(w, r.Header.Get("Content-Type")+" "+string(b))
			})
			resp, err := post(t, tr, context.Background(), srv.URL, `{"a":1}`)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != 429 || resp.Header.Get("Retry-After") != "3" || string(b) != `application/json {"a":1}` {
				t.Fatalf("got %d %v %q", resp.StatusCode, resp.Header, b)
			}
		}},
	}
	for _, c := range []Client{Hop, NetHTTP} {
		for _, row := range rows {
			t.Run(string(c)+"/"+row.name, func(t *testing.T) {
				tr := newTransport().RoundTripper(c, 16)
				defer tr.(interface{ CloseIdleConnections() }).CloseIdleConnections()
				if _, isHop := tr.(*Transport); isHop != (c == Hop) {
					t.Fatalf("client %s built a %T", c, tr)
				}
				row.run(t, tr)
			})
		}
	}
}

func TestParseClient(t *testing.T) {
	for in, want := range map[string]Client{"": Hop, "hop": Hop, "nethttp": NetHTTP} {
		if got, err := ParseClient(in); got != want || err != nil {
			t.Errorf("ParseClient(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := ParseClient("net/http"); err == nil || !strings.Contains(err.Error(), "want hop or nethttp") {
		t.Errorf("ParseClient(net/http) = %v; want an error naming the choices", err)
	}
}
