package edge_test

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/serving"
	"github.com/tailgate-dev/tailgate/serving/edge"
)

func stringsReader(s string) io.Reader { return strings.NewReader(s) }

const model = "llama"

func idle(p50 float64) serving.RegionModel {
	return serving.RegionModel{ID: model, ReadyReplicas: 1, Slots: 8, TTFTP50: p50, TTFTP95: 2 * p50}
}

const chat = `{"model":"llama","messages":[{"role":"user","content":"hi"}]}`

// A near region with a long queue and slow first tokens loses to a
// farther idle one; with both idle, the near one wins (RTT counts too).
func TestChoosesByExpectedTTFTNotOnlyRTT(t *testing.T) {
	near := newFakeRegion(t, "near", serving.RegionModel{ID: model, ReadyReplicas: 1, Slots: 1, Inflight: 1, Waiting: 6, TTFTP50: 0.3})
	far := newFakeRegion(t, "far", idle(0.05))
	farURL := delayProxy(t, far.srv.Listener.Addr().String(), 40*time.Millisecond)
	e := startEdge(t, edge.Config{Regions: []edge.Region{{Name: "near", URL: near.srv.URL}, {Name: "far", URL: farURL}}, Prefer: "near"})

	waitRoute(t, e, model, "far")
	if code, reg := post(t, e, "Bearer k", chat); code != 200 || reg != "far" {
		t.Fatalf("busy near, idle far: answer %d from %q, want 200 from far", code, reg)
	}
	if n := len(near.requests()); n != 0 {
		t.Fatalf("the busy near region got %d requests", n)
	}

	near.set(func(st *serving.RegionStatus) { st.Models[0] = idle(0.05) })
	waitRoute(t, e, model, "near")
	if code, reg := post(t, e, "Bearer k", chat); code != 200 || reg != "near" {
		t.Fatalf("both idle: answer %d from %q, want 200 from near (80 ms closer)", code, reg)
	}
}

// A region whose status fails is skipped, even when preferred and nearest.
func TestSkipsUnhealthyRegion(t *testing.T) {
	a := newFakeRegion(t, "a", idle(0.05))
	b := newFakeRegion(t, "b", idle(0.05))
	a.mu.Lock()
	a.down = true
	a.mu.Unlock()
	e := startEdge(t, edge.Config{Regions: []edge.Region{{Name: "a", URL: a.srv.URL}, {Name: "b", URL: b.srv.URL}}, Prefer: "a"})
	waitRoute(t, e, model, "b")
	for range 5 {
		if code, reg := post(t, e, "Bearer k", chat); code != 200 || reg != "b" {
			t.Fatalf("answer %d from %q, want 200 from b", code, reg)
		}
	}
	if r := e.Route(model); len(r) != 1 {
		t.Fatalf("route %v lists the unhealthy region", r)
	}
	if n := len(a.requests()); n != 0 {
		t.Fatalf("the unhealthy region got %d requests", n)
	}
}

// A request whose connection to the chosen region cannot be made goes to
// the next region at once, with the same bytes; the dead region leaves
// the route.
func TestRetriesUnsentRequestInNextRegion(t *testing.T) {
	a := newFakeRegion(t, "a", idle(0.05))
	b := newFakeRegion(t, "b", idle(0.1)) // a clearly first
	e := startEdge(t, edge.Config{
		Regions: []edge.Region{{Name: "a", URL: a.srv.URL}, {Name: "b", URL: b.srv.URL}}, Prefer: "a",
		PollInterval: time.Hour, // the first poll only: the edge learns of a's death from the request
	})
	waitRoute(t, e, model, "a")
	a.srv.Close() // its port now refuses connections
	if code, reg := post(t, e, "Bearer k", chat); code != 200 || reg != "b" {
		t.Fatalf("a's port closed: answer %d from %q, want 200 from b", code, reg)
	}
	if got := b.requests(); len(got) != 1 || string(got[0].body) != chat {
		t.Fatalf("b got %+v, want the request's body as sent", got)
	}
	if r := e.Route(model); len(r) != 1 || r[0] != "b" {
		t.Fatalf("route after a refused a connection = %v, want [b]", r)
	}
	resp, err := http.Get(e.AdminURL() + "/metrics")
	if err == nil {
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		for _, want := range []string{`tailgate_edge_retries_total{reason="connect",region="a"} 1`, `tailgate_edge_requests_total{code="200",region="b"} 1`, `tailgate_edge_region_healthy{region="a"} 0`} {
			if !strings.Contains(string(raw), want) {
				t.Errorf("metrics lack %s:\n%s", want, raw)
			}
		}
	} else if e.AdminURL() != "" {
		t.Fatal(err)
	}
}

// The region sees the Authorization header and the body exactly as the
// client sent them, also a body longer than the peek.
func TestForwardsAuthorizationAndBodyUntouched(t *testing.T) {
	a := newFakeRegion(t, "a", idle(0.05))
	e := startEdge(t, edge.Config{Regions: []edge.Region{{Name: "a", URL: a.srv.URL}}, MaxPeek: 24})
	waitRoute(t, e, model, "a")
	auth := "Bearer sk-tg-Ünïcode  two-spaces=="
	bodies := []string{
		"{ \"model\" : \"llama\",\n\"model\":\"dup\", \"x\":1e400 ,\"messages\":[]}  ",
		`{"model":"llama","messages":[{"role":"user","content":"` + strings.Repeat("ab", 5000) + `"}]}`,
	}
	for _, body := range bodies {
		if code, _ := post(t, e, auth, body); code != 200 {
			t.Fatalf("answer %d", code)
		}
	}
	got := a.requests()
	if len(got) != len(bodies) {
		t.Fatalf("region got %d requests, want %d", len(got), len(bodies))
	}
	for i, r := range got {
		if r.auth != auth || !bytes.Equal(r.body, []byte(bodies[i])) {
			t.Fatalf("request %d reached the region altered: auth %q body %q", i, r.auth, r.body[:min(len(r.body), 80)])
		}
	}
}

// Draining moves new traffic to another region.
func TestDrainingMovesTraffic(t *testing.T) {
	a := newFakeRegion(t, "a", idle(0.05))
	b := newFakeRegion(t, "b", idle(0.1)) // a clearly first
	e := startEdge(t, edge.Config{Regions: []edge.Region{{Name: "a", URL: a.srv.URL}, {Name: "b", URL: b.srv.URL}}, Prefer: "a"})
	waitRoute(t, e, model, "a")
	a.set(func(st *serving.RegionStatus) { st.Draining = true })
	waitRoute(t, e, model, "b")
	for range 5 {
		if code, reg := post(t, e, "Bearer k", chat); code != 200 || reg != "b" {
			t.Fatalf("a draining: answer %d from %q, want 200 from b", code, reg)
		}
	}
	if n := len(a.requests()); n != 0 {
		t.Fatalf("the draining region got %d requests", n)
	}
}

// With no region able to take the request, the client gets one clear 503
// in OpenAI's error shape.
func TestNoRegionIsAClear503(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + ln.Addr().String()
	ln.Close()
	e := startEdge(t, edge.Config{Regions: []edge.Region{{Name: "gone", URL: dead}}})
	req, _ := http.NewRequest(http.MethodPost, e.URL()+"/v1/chat/completions", strings.NewReader(chat))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 503 || !strings.Contains(string(raw), `"code":"no_region"`) {
		t.Fatalf("answer %d %s, want 503 no_region", resp.StatusCode, raw)
	}
}

// A region that refuses a request with a 503 (no ready replica, draining)
// ran nothing: the request goes to the next region at once, with the same
// bytes, and the client never sees the refusal. When the last region
// refuses too, the client gets that region's 503 as it was sent.
func TestRetriesRefusedRequestInNextRegion(t *testing.T) {
	a := newFakeRegion(t, "a", idle(0.05))
	b := newFakeRegion(t, "b", idle(0.1)) // a clearly first
	a.mu.Lock()
	a.refuse = true
	a.mu.Unlock()
	e := startEdge(t, edge.Config{Regions: []edge.Region{{Name: "a", URL: a.srv.URL}, {Name: "b", URL: b.srv.URL}}, Prefer: "a"})
	waitRoute(t, e, model, "a")
	for range 3 {
		if code, reg := post(t, e, "Bearer k", chat); code != 200 || reg != "b" {
			t.Fatalf("a refuses: answer %d from %q, want 200 from b", code, reg)
		}
	}
	if n := len(a.requests()); n != 3 {
		t.Fatalf("a got %d requests, want 3 (each tried there first)", n)
	}
	if got := b.requests(); len(got) != 3 || string(got[0].body) != chat || got[0].auth != "Bearer k" {
		t.Fatalf("b got %+v, want the requests as sent", got)
	}
	metrics := scrape(t, e)
	for _, want := range []string{`tailgate_edge_retries_total{reason="refused",region="a"} 3`, `tailgate_edge_requests_total{code="200",region="b"} 3`} {
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics lack %s:\n%s", want, metrics)
		}
	}

	b.mu.Lock()
	b.refuse = true
	b.mu.Unlock()
	req, _ := http.NewRequest(http.MethodPost, e.URL()+"/v1/chat/completions", strings.NewReader(chat))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 503 || resp.Header.Get(edge.HeaderRegion) != "b" || !strings.Contains(string(raw), `no replica is ready in b`) {
		t.Fatalf("both refuse: answer %d from %q: %s; want b's 503 as sent", resp.StatusCode, resp.Header.Get(edge.HeaderRegion), raw)
	}
}

func scrape(t *testing.T, e *edge.Edge) string {
	t.Helper()
	resp, err := http.Get(e.AdminURL() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return string(raw)
}

// With H2C the edge holds one HTTP/2 connection per region, which its
// polls keep open: requests moving to a region (here a refused one's)
// arrive over it, several at once, with no new connection.
func TestH2CMovesTrafficOverTheWarmConnection(t *testing.T) {
	a := newFakeRegion(t, "a", idle(0.05))
	b := newFakeRegion(t, "b", idle(0.1)) // a clearly first
	a.mu.Lock()
	a.refuse = true
	a.mu.Unlock()
	e := startEdge(t, edge.Config{Regions: []edge.Region{{Name: "a", URL: a.srv.URL}, {Name: "b", URL: b.srv.URL}}, Prefer: "a", H2C: true})
	waitRoute(t, e, model, "a")
	done := make(chan [2]any, 8)
	for range 8 {
		go func() {
			code, reg := post(t, e, "Bearer k", chat)
			done <- [2]any{code, reg}
		}()
	}
	for range 8 {
		if got := <-done; got[0] != 200 || got[1] != "b" {
			t.Fatalf("a refuses: answer %v from %v, want 200 from b", got[0], got[1])
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.conns != 1 {
		t.Errorf("b accepted %d connections for its polls and 8 requests at once, want 1", b.conns)
	}
	for _, p := range b.protos {
		if p != "HTTP/2.0" {
			t.Fatalf("b got a request over %s, want HTTP/2.0", p)
		}
	}
}

// A region that reports no TTFT samples for the model (fresh or just
// restarted: p50 0) is unknown, not fastest: the preferred region with
// samples keeps the route through many polls (issue 49: 568 of 572
// requests went to the sample-less region).
func TestRegionWithoutSamplesIsNotFastest(t *testing.T) {
	// b is 40 ms farther and has no TTFT samples: counted as fastest (p50
	// 0) it would win every poll.
	a := newFakeRegion(t, "a", idle(0.5))
	b := newFakeRegion(t, "b", idle(0))
	bURL := delayProxy(t, b.srv.Listener.Addr().String(), 20*time.Millisecond)
	e := startEdge(t, edge.Config{Regions: []edge.Region{{Name: "a", URL: a.srv.URL}, {Name: "b", URL: bURL}}, Prefer: "a"})
	waitRoute(t, e, model, "a")
	polls := func() int {
		a.mu.Lock()
		defer a.mu.Unlock()
		return a.polls
	}
	start := polls()
	for polls() < start+10 { // ten poll rounds, five times the switch's polls
		if r := e.Route(model); r[0] != "a" {
			t.Fatalf("after %d polls the route is %v: the region without samples took it", polls()-start, r)
		}
		time.Sleep(5 * time.Millisecond)
	}
	for range 5 {
		if code, reg := post(t, e, "Bearer k", chat); code != 200 || reg != "a" {
			t.Fatalf("answer %d from %q, want 200 from the preferred a", code, reg)
		}
	}
	// Unknown is not slowest either: with samples nowhere, round trips and
	// the preference decide, and b takes traffic when a leaves.
	a.set(func(st *serving.RegionStatus) { st.Draining = true })
	waitRoute(t, e, model, "b")
}

// A region killed while it runs a JSON request (the connection closes
// before any answer) does not fail the request: the edge holds the body
// and sends it to the next region, as the Worker does.
func TestResendsInFlightRequestOfKilledRegion(t *testing.T) {
	a := newFakeRegion(t, "a", idle(0.05))
	b := newFakeRegion(t, "b", idle(0.1)) // a clearly first
	e := startEdge(t, edge.Config{
		Regions: []edge.Region{{Name: "a", URL: a.srv.URL}, {Name: "b", URL: b.srv.URL}}, Prefer: "a",
		PollInterval: time.Hour, // the first poll only: the edge learns of a's death from the request
	})
	waitRoute(t, e, model, "a")
	a.mu.Lock()
	a.kill = true
	a.mu.Unlock()
	if code, reg := post(t, e, "Bearer k", chat); code != 200 || reg != "b" {
		t.Fatalf("a killed mid-request: answer %d from %q, want 200 from b", code, reg)
	}
	if got := a.requests(); len(got) != 1 {
		t.Fatalf("a got %d requests, want 1 (it died running it)", len(got))
	}
	if got := b.requests(); len(got) != 1 || string(got[0].body) != chat {
		t.Fatalf("b got %+v, want the request's body as sent", got)
	}
	if r := e.Route(model); len(r) != 1 || r[0] != "b" {
		t.Fatalf("route after a died = %v, want [b]", r)
	}
}

// One address trickling uploads through the edge holds at most its share
// of the edge's connections, each cut with 408 once it falls behind the
// minimum rate; meanwhile another client is served, the region stays in
// the route, and the region sees each client's own address in
// X-Forwarded-For (a client's own value is dropped), so a region trusting
// the edge applies its per-address shares to the client, not the edge.
func TestSlowUploadsThroughTheEdgeHoldOnlyTheirShare(t *testing.T) {
	a := newFakeRegion(t, "a", idle(0.05))
	e := startEdge(t, edge.Config{Regions: []edge.Region{{Name: "a", URL: a.srv.URL}},
		MaxConnections: 32, // 4 an address
		BodyTimeout:    300 * time.Millisecond, BodyMinRate: 64 << 10, MaxPeek: 64 << 10})
	waitRoute(t, e, model, "a")
	addr := strings.TrimPrefix(e.URL(), "http://")

	// The attacker, from 127.0.0.2: 20 uploads of a declared 1 MiB, 1 KiB sent.
	type answer struct {
		status string
		err    error
	}
	answers := make(chan answer, 20)
	for range 20 {
		go func() {
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}}
			c, err := d.Dial("tcp", addr)
			if err != nil {
				answers <- answer{err: err}
				return
			}
			defer c.Close()
			fmt.Fprintf(c, "POST /v1/audio/transcriptions HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\nContent-Length: %d\r\n\r\n", 1<<20)
			_, _ = c.Write(make([]byte, 1<<10))
			_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
			line, err := bufio.NewReader(c).ReadString('\n')
			answers <- answer{status: strings.TrimSpace(line), err: err}
		}()
	}
	// Meanwhile another client is served, its address forwarded.
	req, _ := http.NewRequest(http.MethodPost, e.URL()+"/v1/chat/completions", strings.NewReader(chat))
	req.Header.Set("X-Forwarded-For", "6.6.6.6") // a client's claim: dropped
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("another client during the uploads: %d, want 200", resp.StatusCode)
	}
	got := a.requests()
	if len(got) != 1 || got[0].xff != "127.0.0.1" {
		t.Fatalf("the region got %+v, want one request with X-Forwarded-For 127.0.0.1 (the client's own address)", got)
	}

	timedOut, closed := 0, 0
	for range 20 {
		select {
		case ans := <-answers:
			switch {
			case strings.HasPrefix(ans.status, "HTTP/1.1 408"):
				timedOut++
			case ans.err != nil:
				closed++ // refused: over the address's share
			default:
				t.Fatalf("an upload was answered %q", ans.status)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("uploads still open after 10 s: %d answered 408, %d closed", timedOut, closed)
		}
	}
	if timedOut != 4 || closed != 16 {
		t.Fatalf("uploads: %d answered 408, %d closed at once; want 4 (the address's share) and 16", timedOut, closed)
	}
	if r := e.Route(model); len(r) != 1 || r[0] != "a" {
		t.Fatalf("route after the uploads = %v, want [a]", r)
	}
	if n := len(a.requests()); n != 1 {
		t.Fatalf("the region got %d requests, want the other client's only (trickled bodies stay at the edge)", n)
	}
}
