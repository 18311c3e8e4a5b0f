package edge_test

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/serving"
	"github.com/tailgate-dev/tailgate/serving/edge"
)

// fakeRegion is a regional gateway's public listener as the edge sees it:
// the status endpoint, and every other request recorded and answered 200.
// It stands in for a gateway (package edge may not import server); the
// gateway's own status is tested in package server.
type fakeRegion struct {
	name string
	srv  *httptest.Server

	mu     sync.Mutex
	status serving.RegionStatus
	down   bool // status answers 503
	refuse bool // requests are answered 503 no_replica (and recorded)
	kill   bool // requests are read, recorded and their connection closed unanswered: a region killed mid-request
	got    []recorded
	conns  int // connections accepted
	polls  int // status polls received
	protos []string
}

type recorded struct {
	auth string
	xff  string // X-Forwarded-For
	body []byte
}

func newFakeRegion(t *testing.T, name string, m serving.RegionModel) *fakeRegion {
	f := &fakeRegion{name: name, status: serving.RegionStatus{Region: name, Models: []serving.RegionModel{m}}}
	f.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.protos = append(f.protos, r.Proto)
		if r.URL.Path == serving.RegionStatusPath {
			f.polls++
			if r.Header.Get("Authorization") != "Bearer "+edgeToken {
				http.Error(w, `{"error":{"code":"invalid_edge_token"}}`, http.StatusUnauthorized)
				return
			}
			if f.down {
				http.Error(w, "down", http.StatusServiceUnavailable)
				return
			}
			_ = json.NewEncoder(w).Encode(f.status)
			return
		}
		body, _ := io.ReadAll(r.Body)
		f.got = append(f.got, recorded{r.Header.Get("Authorization"), r.Header.Get("X-Forwarded-For"), body})
		if f.kill {
			panic(http.ErrAbortHandler) // closes the connection without an answer
		}
		w.Header().Set("Content-Type", "application/json")
		if f.refuse {
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = io.WriteString(w, `{"error":{"message":"no replica is ready in `+name+`","type":"server_error","param":null,"code":"no_replica"}}`)
			return
		}
		_, _ = io.WriteString(w, `{"served_by":"`+name+`"}`)
	}))
	// As a gateway's public listener: HTTP/1 and HTTP/2 without TLS.
	f.srv.Config.Protocols = new(http.Protocols)
	f.srv.Config.Protocols.SetHTTP1(true)
	f.srv.Config.Protocols.SetUnencryptedHTTP2(true)
	f.srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			f.mu.Lock()
			f.conns++
			f.mu.Unlock()
		}
	}
	f.srv.Start()
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeRegion) set(fn func(st *serving.RegionStatus)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(&f.status)
}

func (f *fakeRegion) requests() []recorded {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]recorded(nil), f.got...)
}

// delayProxy forwards TCP connections to target on loopback, holding each
// chunk for delay in each direction: a link whose round trip is 2×delay
// longer.
func delayProxy(t *testing.T, target string, delay time.Duration) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	pipe := func(dst, src net.Conn) {
		defer wg.Done()
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 {
				time.Sleep(delay)
				if _, werr := dst.Write(buf[:n]); werr != nil {
					break
				}
			}
			if err != nil {
				break
			}
		}
		dst.Close()
		src.Close()
	}
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			wg.Add(2)
			go pipe(u, c)
			go pipe(c, u)
		}
	})
	return "http://" + ln.Addr().String()
}

// edgeToken is the regions' edge token in these tests: a fakeRegion
// refuses a status poll without it, as a gateway does.
const edgeToken = "tge-test-edge"

// startEdge opens and runs an edge on loopback until the test ends.
func startEdge(t *testing.T, cfg edge.Config) *edge.Edge {
	t.Helper()
	cfg.Listen, cfg.AdminListen = "127.0.0.1:0", "127.0.0.1:0"
	if cfg.StatusToken == "" {
		cfg.StatusToken = edgeToken
	}
	if cfg.PollInterval == 0 {
		cfg.PollInterval = 30 * time.Millisecond
	}
	if cfg.SwitchPolls == 0 {
		cfg.SwitchPolls = 2
	}
	e, err := edge.Open(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
		e.Close()
	})
	return e
}

// waitRoute waits (at most 5 s) until model's route starts with want.
func waitRoute(t *testing.T, e *edge.Edge, model, want string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		r := e.Route(model)
		if len(r) > 0 && r[0] == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("route of %q is %v, want %s first", model, r, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// post sends body through the edge and returns the region that answered.
func post(t *testing.T, e *edge.Edge, auth, body string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, e.URL()+"/v1/chat/completions", stringsReader(body))
	req.Header.Set("Content-Type", "application/json")
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, resp.Header.Get(edge.HeaderRegion)
}
