package e2e

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/e2e/testkit"
)

// dialFrom opens a TCP connection to the host:port of url from the
// loopback address from (127.0.0.2, 127.0.0.3, …: other client hosts).
func dialFrom(t *testing.T, from, url string) net.Conn {
	t.Helper()
	addr := strings.TrimPrefix(strings.TrimPrefix(url, "http://"), "https://")
	addr, _, _ = strings.Cut(addr, "/")
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// healthzKeepAlive sends GET /healthz on c without credentials and reads the
// answer, leaving c an idle keep-alive connection.
func healthzKeepAlive(t *testing.T, c net.Conn) {
	t.Helper()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: tailgate\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("healthz: %v", err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.Header.Get("Connection") == "close" {
		t.Fatal("healthz answered with Connection: close; the test needs an idle keep-alive connection")
	}
	_ = c.SetDeadline(time.Time{})
}

// closedByServer reports whether the server closes c within 10 s (a read
// ends in EOF or a reset; anything c still receives is read past).
func closedByServer(c net.Conn) bool {
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err := io.Copy(io.Discard, c)
	var ne net.Error
	return !(errors.As(err, &ne) && ne.Timeout())
}

// trickle starts an unauthenticated POST on c whose body comes one byte at
// a time (at most 200 bytes, one every 50 ms) until c fails.
func trickle(c net.Conn, path string) {
	fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: tailgate\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{", path)
	go func() {
		for range 200 {
			time.Sleep(50 * time.Millisecond)
			if _, err := c.Write([]byte(" ")); err != nil {
				return
			}
		}
	}()
}

// TestConnectionCapKeepsServingAuthenticatedClients: with a cap of 6
// connections, 2 per address, clients without credentials that hold idle
// keep-alive connections and trickle request bodies (the refused ones are
// closed, not drained) do not keep a client with a key out; one address
// cannot hold more than its share, on the public and the admin listener.
func TestConnectionCapKeepsServingAuthenticatedClients(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the tailgate binary")
	}
	g := startGateway(t, "--max-connections", "6", "--max-connections-per-address", "2", "--admin-max-connections", "16")
	g.startFleet(1)
	g.waitReady("w1")

	// Two hosts trickle unauthenticated POSTs, two more hold idle
	// keep-alive connections: 6 connections, the cap.
	var trickling []net.Conn
	for _, from := range []string{"127.0.0.2", "127.0.0.3"} {
		c := dialFrom(t, from, g.api)
		trickle(c, "/v1/chat/completions")
		trickling = append(trickling, c)
	}
	for _, from := range []string{"127.0.0.4", "127.0.0.4", "127.0.0.5", "127.0.0.5"} {
		healthzKeepAlive(t, dialFrom(t, from, g.api))
	}
	// A client with a key is served while they hold on (the client's
	// timeout bounds the wait; before the cap's idle rule it waited the idle
	// connections' 120 s).
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	status, _, body, err := g.chat(ctx, false, 4)
	cancel()
	if err != nil || status != 200 {
		t.Fatalf("authenticated chat with the cap held by clients without a key: %d %v\n%s", status, err, body)
	}
	// The refused POSTs' connections were closed, their bodies not waited for.
	for i, c := range trickling {
		if !closedByServer(c) {
			t.Errorf("trickling POST %d without a key: connection still open after its 401", i)
		}
	}
	if n := g.metric("tailgate_connections_idle_closed_total", `listener="public"`); n < 1 {
		t.Errorf("tailgate_connections_idle_closed_total{listener=public} = %v, want ≥ 1", n)
	}

	// One address: two silent connections are its share, a third is closed
	// at once; another address still gets in.
	for _, listener := range []struct{ name, url string }{{"public", g.api}, {"admin", g.admin}} {
		perAddr := 2 // the admin listener's: 16/8
		for range perAddr {
			dialFrom(t, "127.0.0.6", listener.url)
		}
		if !closedByServer(dialFrom(t, "127.0.0.6", listener.url)) {
			t.Errorf("%s listener: a third connection from one address was kept (share 2)", listener.name)
		}
		if n := g.metric("tailgate_connections_refused_total", `listener="`+listener.name+`"`, `reason="per_address"`); n != 1 {
			t.Errorf("tailgate_connections_refused_total{listener=%s,reason=per_address} = %v, want 1", listener.name, n)
		}
	}
	// An unauthenticated POST to the admin listener is closed too.
	c := dialFrom(t, "127.0.0.7", g.admin)
	trickle(c, "/admin/v1/keys")
	if !closedByServer(c) {
		t.Error("admin listener: trickling POST without the token still open after its 401")
	}
	ctx, cancel = context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if status, _, body, err := g.chat(ctx, false, 4); err != nil || status != 200 {
		t.Fatalf("authenticated chat after the per-address checks: %d %v\n%s", status, err, body)
	}
	if !strings.Contains(g.stderr.String(), "connection refused: its address holds its share") {
		t.Error("no log line for the per-address refusal")
	}
}

// TestStaticUpstreamGivenAsOpenAIBaseURL: `--upstream http://host:port/v1`,
// the form OpenAI clients take, serves like the server's root URL; an
// upstream that does not answer is logged with the reason (at WARN, not at
// every probe) instead of leaving only 404s to go by.
func TestStaticUpstreamGivenAsOpenAIBaseURL(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the tailgate binary")
	}
	simAddr := startSim(t, "--sim-ttft", "1ms", "--sim-tpot", "0s")
	dead := holdPort(t) // listens, never answers HTTP: the probe times out
	dir := t.TempDir()
	gw := startProc(t, "gateway", true, "gateway", "--data", dir, "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
		"--upstream", "http://"+simAddr+"/v1", "--upstream", "http://"+dead+"/v1/")
	var api string
	apiRE := regexp.MustCompile(`API (http://\S+)/v1`)
	gw.scanUntil(func(line string) bool {
		if m := apiRE.FindStringSubmatch(line); m != nil {
			api = m[1]
		}
		return api != ""
	})
	if api == "" {
		t.Fatal("the gateway printed no API address")
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		resp, err := http.Get(api + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("the upstream given as …/v1 never became ready")
		}
		time.Sleep(50 * time.Millisecond)
	}
	key := testkit.LastLine(tailgate(t, "keys", "create", "--data", dir, "--tenant", "acme"))
	req, _ := http.NewRequest(http.MethodPost, api+"/v1/chat/completions",
		strings.NewReader(`{"model":"tailgate-sim","max_tokens":3,"messages":[{"role":"user","content":"hi"}]}`))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("X-Tailgate-Replica") != simAddr {
		t.Fatalf("status %d from replica %q, want 200 from %s", resp.StatusCode, resp.Header.Get("X-Tailgate-Replica"), simAddr)
	}

	// The dead upstream: why it is not ready, once, not every second.
	time.Sleep(3 * time.Second)
	var warns []string
	for _, l := range strings.Split(gw.stderr.String(), "\n") {
		if strings.Contains(l, "replica probe failed") && strings.Contains(l, "replica="+dead) {
			warns = append(warns, l)
		}
	}
	if len(warns) != 1 || !strings.Contains(warns[0], "level=WARN") || !strings.Contains(warns[0], "url=http://"+dead+" ") ||
		!strings.Contains(warns[0], "err=") {
		t.Fatalf("want one WARN line saying why %s is not ready, got %d:\n%s", dead, len(warns), strings.Join(warns, "\n"))
	}
}
