package server_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/policy"
	"github.com/tailgate-dev/tailgate/server/internal/servertest"
)

// rawEngine starts an engine written at the TCP level, so that a test
// decides exactly when it reads, writes and closes: serve handles one
// connection (id counts connections from 0, in accept order) and returns
// when it is done with it. It returns a gateway whose one replica, "raw",
// is that engine, and the number of connections the engine accepted so far.
func rawEngine(t *testing.T, serve func(id int, c net.Conn, br *bufio.Reader)) (*servertest.Gateway, func() int) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		open  []net.Conn
		conns int
		wg    sync.WaitGroup
	)
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			id := conns
			conns++
			open = append(open, c)
			mu.Unlock()
			wg.Go(func() {
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(10 * time.Second))
				serve(id, c, bufio.NewReader(c))
			})
		}
	})
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range open {
			c.Close() // the gateway's idle ones
		}
		mu.Unlock()
		wg.Wait()
	})
	h := servertest.Start(t, servertest.Options{Replicas: 1})
	h.Reg.Remove(h.Reg.Replicas()[0].ID)
	h.AddReplica("raw", "http://"+ln.Addr().String(), "")
	return h, func() int {
		mu.Lock()
		defer mu.Unlock()
		return conns
	}
}

// rawEvents is a short answer as the engine streams it: "Paris", then the
// usage chunk, then [DONE].
const rawEvents = "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"" + servertest.SimModel +
	"\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"Paris\"},\"finish_reason\":\"stop\"}]," +
	"\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1,\"total_tokens\":4}}\n\n" +
	"data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"" + servertest.SimModel +
	"\",\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1,\"total_tokens\":4}}\n\ndata: [DONE]\n\n"

// TestUpstreamClosingAKeptAliveConnectionIsNotA502: a static vLLM closes an
// idle keep-alive connection after 5 s (uvicorn's timeout_keep_alive); a
// request the gateway writes on it just as it closes was never read by the
// engine, so it is sent again on a fresh connection instead of failing the
// client with a 502. The upstream here is written at the TCP level so it
// closes exactly as the next request arrives — no timer is raced.
func TestUpstreamClosingAKeptAliveConnectionIsNotA502(t *testing.T) {
	var reqs atomic.Int64
	h, conns := rawEngine(t, func(id int, c net.Conn, br *bufio.Reader) {
		for n := 0; ; n++ {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			reqs.Add(1)
			if id == 0 && n == 1 {
				return // the keep-alive timer fired: closed, unread
			}
			_, _ = io.Copy(io.Discard, req.Body)
			_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: "+
				strconv.Itoa(len(rawEvents))+"\r\n\r\n"+rawEvents)
		}
	})
	secret := h.Key(policy.KeyOptions{})
	body := `{"model":"` + servertest.SimModel + `","stream":true,"max_tokens":5,"messages":[{"role":"user","content":"capital of France?"}]}`
	for i := range 2 {
		resp := h.Post("/v1/chat/completions", secret, body)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), "Paris") {
			t.Fatalf("request %d: %d %s", i+1, resp.StatusCode, b)
		}
	}
	if conns() != 2 || reqs.Load() != 3 {
		t.Errorf("upstream saw %d requests on %d connections, want 3 on 2 (the unread one sent again on a new connection)", reqs.Load(), conns())
	}
}

// TestFinishedAnswersKeepTheirEngineConnection: an answer read to its
// [DONE] leaves its connection to the engine open for the next request. The
// gateway used to close it as soon as [DONE] was read — before the end of
// the chunked body, which uvicorn writes when the response is complete, a
// moment later — and a connection closed before its body's end is torn
// down: every request, JSON or stream, dialled the engine again (a TCP
// handshake and two transport goroutines each; over the mesh, more). The
// engine here is written at the TCP level so that the end of the body comes
// in a write of its own, after [DONE], as uvicorn sends it.
func TestFinishedAnswersKeepTheirEngineConnection(t *testing.T) {
	chunk := func(s string) string { return strconv.FormatInt(int64(len(s)), 16) + "\r\n" + s + "\r\n" }
	h, conns := rawEngine(t, func(_ int, c net.Conn, br *bufio.Reader) {
		for {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			_, _ = io.Copy(io.Discard, req.Body)
			_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"+chunk(rawEvents))
			time.Sleep(20 * time.Millisecond) // the response completes
			_, _ = io.WriteString(c, "0\r\n\r\n")
		}
	})
	secret := h.Key(policy.KeyOptions{})
	const n = 5
	for i := range n {
		for _, stream := range []bool{false, true} {
			body := fmt.Sprintf(`{"model":%q,"stream":%t,"max_tokens":5,"messages":[{"role":"user","content":"capital of France?"}]}`, servertest.SimModel, stream)
			resp := h.Post("/v1/chat/completions", secret, body)
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), "Paris") {
				t.Fatalf("request %d (stream %t): %d %s", i+1, stream, resp.StatusCode, b)
			}
		}
	}
	if got := conns(); got != 1 {
		t.Errorf("the engine was dialled %d times for %d answers one after the other, want once", got, 2*n)
	}
}
