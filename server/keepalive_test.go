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

	"tailgate/policy"
	"tailgate/server/internal/servertest"
)

// TestUpstreamClosingAKeptAliveConnectionIsNotA502: a static vLLM closes an
// idle keep-alive connection after 5 s (uvicorn's timeout_keep_alive); a
// request the gateway writes on it just as it closes was never read by the
// engine, so it is sent again on a fresh connection instead of failing the
// client with a 502. The upstream here is written at the TCP level so it
// closes exactly as the next request arrives — no timer is raced.
func TestUpstreamClosingAKeptAliveConnectionIsNotA502(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		open  []net.Conn
		conns int
		reqs  int
		wg    sync.WaitGroup
	)
	const events = "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"" + servertest.SimModel +
		"\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"Paris\"},\"finish_reason\":\"stop\"}]," +
		"\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1,\"total_tokens\":4}}\n\n" +
		"data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"" + servertest.SimModel +
		"\",\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1,\"total_tokens\":4}}\n\ndata: [DONE]\n\n"
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
				br := bufio.NewReader(c)
				for n := 0; ; n++ {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					mu.Lock()
					reqs++
					mu.Unlock()
					if id == 0 && n == 1 {
						return // the keep-alive timer fired: closed, unread
					}
					_, _ = io.Copy(io.Discard, req.Body)
					_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: "+
						strconv.Itoa(len(events))+"\r\n\r\n"+events)
				}
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
	mu.Lock()
	defer mu.Unlock()
	if conns != 2 || reqs != 3 {
		t.Errorf("upstream saw %d requests on %d connections, want 3 on 2 (the unread one sent again on a new connection)", reqs, conns)
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
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		conns, reqs atomic.Int64
		wg          sync.WaitGroup
		mu          sync.Mutex
		open        []net.Conn
	)
	chunk := func(s string) string { return strconv.FormatInt(int64(len(s)), 16) + "\r\n" + s + "\r\n" }
	const events = "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"" + servertest.SimModel +
		"\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"Paris\"},\"finish_reason\":\"stop\"}]}\n\n" +
		"data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"" + servertest.SimModel +
		"\",\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1,\"total_tokens\":4}}\n\ndata: [DONE]\n\n"
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns.Add(1)
			mu.Lock()
			open = append(open, c)
			mu.Unlock()
			wg.Go(func() {
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(10 * time.Second))
				br := bufio.NewReader(c)
				for {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					reqs.Add(1)
					_, _ = io.Copy(io.Discard, req.Body)
					_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"+chunk(events))
					time.Sleep(20 * time.Millisecond) // the response completes
					_, _ = io.WriteString(c, "0\r\n\r\n")
				}
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
	if got, sent := conns.Load(), reqs.Load(); got != 1 {
		t.Errorf("the engine was dialled %d times for %d answers one after the other, want once", got, sent)
	}
}
