package sidecar

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/e2e/testkit"
)

// What a raw engine does with the n-th request (from 0) on a connection.
const (
	answer = iota // a 200 with a JSON body, keeping the connection
	drop          // read the request's headers, then close without a byte
	half          // write the start of a status line, then close
)

// rawEngine is an engine on loopback written at the TCP level, so a test
// can close a kept-alive connection exactly as the next request arrives,
// the way uvicorn does when its keep-alive timer fires then: no sleeps
// racing a timer.
type rawEngine struct {
	ln     net.Listener
	script func(conn, n int) int

	mu    sync.Mutex
	conns int
	reqs  int
	wg    sync.WaitGroup
}

const rawAnswer = `{"id":"cmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"Paris"},"finish_reason":"stop"}]}`

func startRawEngine(t *testing.T, script func(conn, n int) int) *rawEngine {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e := &rawEngine{ln: ln, script: script}
	e.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			e.mu.Lock()
			id := e.conns
			e.conns++
			e.mu.Unlock()
			e.wg.Go(func() { e.serve(c, id) })
		}
	})
	t.Cleanup(func() { ln.Close(); e.wg.Wait() })
	return e
}

func (e *rawEngine) serve(c net.Conn, id int) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second)) // a hung test ends
	br := bufio.NewReader(c)
	for n := 0; ; n++ {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		e.mu.Lock()
		e.reqs++
		e.mu.Unlock()
		switch e.script(id, n) {
		case drop:
			return
		case half:
			_, _ = io.WriteString(c, "HTTP/1.1 200 O")
			return
		}
		_, _ = io.Copy(io.Discard, req.Body)
		_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "+
			strconv.Itoa(len(rawAnswer))+"\r\n\r\n"+rawAnswer)
	}
}

func (e *rawEngine) counts() (conns, reqs int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.conns, e.reqs
}

const chatBody = `{"model":"m","messages":[{"role":"user","content":"capital of France?"}]}`

// TestEngineClosingAKeptAliveConnectionIsNotA502 pins the stale keep-alive
// race: the engine closes an idle connection just as the sidecar writes the
// next request on it. The engine never read that request, so the sidecar
// sends it again on a new connection and the client gets the answer, not a
// 502 engine_error.
func TestEngineClosingAKeptAliveConnectionIsNotA502(t *testing.T) {
	eng := startRawEngine(t, func(_, n int) int {
		if n == 0 {
			return answer
		}
		return drop
	})
	_, sc := startSidecar(t, "http://"+eng.ln.Addr().String(), nil)
	for i := range 2 {
		status, _, body := send(t, context.Background(), http.MethodPost, sc.URL+"/v1/chat/completions", chatBody)
		if status != http.StatusOK || string(body) != rawAnswer {
			t.Fatalf("request %d: %d %s, want 200 with the engine's answer", i+1, status, body)
		}
	}
	if conns, reqs := eng.counts(); conns != 2 || reqs != 3 {
		t.Errorf("engine saw %d requests on %d connections, want 3 on 2 (the second sent again on a new one)", reqs, conns)
	}
}

// TestRequestTheEngineMayHaveReadIsNotSentAgain: only a request that died
// on a kept-alive connection before any byte of an answer is sent again. A
// request the engine began to answer, or one dropped on a new connection,
// is the engine's failure: 502, and the engine saw it once.
func TestRequestTheEngineMayHaveReadIsNotSentAgain(t *testing.T) {
	tests := []struct {
		name   string
		script func(conn, n int) int
		sends  int // requests the client makes; the last one fails
		conns  int // connections the engine should have seen
	}{
		{"answer begun on a kept-alive connection", func(_, n int) int {
			if n == 0 {
				return answer
			}
			return half
		}, 2, 1},
		{"dropped on a new connection", func(int, int) int { return drop }, 1, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			eng := startRawEngine(t, tt.script)
			_, sc := startSidecar(t, "http://"+eng.ln.Addr().String(), nil)
			var status int
			var body []byte
			for range tt.sends {
				status, _, body = send(t, context.Background(), http.MethodPost, sc.URL+"/v1/chat/completions", chatBody)
			}
			if status != http.StatusBadGateway {
				t.Errorf("last request: %d %s, want 502", status, body)
			}
			if conns, reqs := eng.counts(); conns != tt.conns || reqs != tt.sends {
				t.Errorf("engine saw %d requests on %d connections, want %d on %d (nothing sent again)", reqs, conns, tt.sends, tt.conns)
			}
		})
	}
}

// TestIdleEngineConnectionsCloseBeforeTheEngineKeepAlive: the sidecar closes
// a connection to the engine that sat idle for most of the engine's
// keep-alive, so it never writes a request on one the engine is closing.
// The engine here keeps connections forever; any close is the sidecar's.
func TestIdleEngineConnectionsCloseBeforeTheEngineKeepAlive(t *testing.T) {
	var mu sync.Mutex
	closed := 0
	eng := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, rawAnswer)
	}))
	eng.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateClosed {
			mu.Lock()
			closed++
			mu.Unlock()
		}
	}
	eng.Start()
	t.Cleanup(eng.Close)
	_, sc := startSidecar(t, eng.URL, func(c *Config) { c.EngineKeepAlive = 100 * time.Millisecond })
	if status, _, body := send(t, context.Background(), http.MethodPost, sc.URL+"/v1/chat/completions", chatBody); status != http.StatusOK {
		t.Fatalf("%d %s", status, body)
	}
	testkit.WaitFor(t, "the sidecar to close its idle engine connection", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return closed == 1
	})
}
