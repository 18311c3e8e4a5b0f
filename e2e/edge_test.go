package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/e2e/testkit"
)

// TestEdgeInFrontOfTwoRegions runs `tailgate edge` in front of two
// `tailgate up --region` gateways that hold the same keys (one data
// directory prepared and copied) and each their own ledger. The client's
// key passes the edge untouched and the request is billed in the region
// that served it; the edge prefers the region with the better expected
// first-token time though the other is listed first and preferred; and a
// region SIGKILLed mid-run gets no new requests: every request sent after
// the kill is answered by the other region. The edge speaks HTTP/2
// without TLS (--h2c), which the gateways accept on their public listener.
func TestEdgeInFrontOfTwoRegions(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the binary")
	}
	dirA, dirB := t.TempDir(), t.TempDir()
	tailgate(t, "init", "--data", dirA)
	key := testkit.LastLine(tailgate(t, "keys", "create", "--data", dirA, "--tenant", "travel"))
	if err := os.CopyFS(dirB, os.DirFS(dirA)); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"admin.token", "cluster.token", "edge.token"} {
		if err := os.Chmod(filepath.Join(dirB, f), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// A's first tokens are slow, B's fast; both on loopback, so the round
	// trips are alike and only the regions' TTFT tells them apart.
	a := startUpIn(t, dirA, "--region", "A", "--replicas", "1", "--sim-ttft", "300ms")
	b := startUpIn(t, dirB, "--region", "B", "--replicas", "1", "--sim-ttft", "5ms")
	baseA, baseB := strings.TrimSuffix(a.api, "/v1"), strings.TrimSuffix(b.api, "/v1")
	for _, base := range []string{baseA, baseB} { // each region learns its TTFT
		for range 3 {
			if code, _, body := chatVia(t, base, key); code != 200 {
				t.Fatalf("%s: %d %s", base, code, body)
			}
		}
	}

	edge := startProc(t, "edge", true, "edge", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
		"--region", "A="+baseA, "--region", "B="+baseB, "--prefer", "A", "--poll-interval", "200ms", "--h2c",
		"--edge-token-file", filepath.Join(dirA, "edge.token")) // copied to B with the rest of the directory
	var edgeURL, edgeAdmin string
	edgeLine := regexp.MustCompile(`tailgate edge: (http://\S+) .* admin (http://\S+)`)
	edge.scanUntil(func(line string) bool {
		if m := edgeLine.FindStringSubmatch(line); m != nil {
			edgeURL, edgeAdmin = m[1], m[2]
		}
		return edgeURL != ""
	})
	if edgeURL == "" {
		t.Fatalf("edge printed no address; stderr:\n%s", edge.stderr.String())
	}
	testkit.WaitFor(t, "the edge routes to B, the faster region", func() bool {
		r := edgeRoute(t, edgeAdmin)
		return len(r) == 2 && r[0] == "B"
	})

	// Through the edge: the key reaches B untouched and B bills it.
	if code, region, body := chatVia(t, edgeURL, key); code != 200 || region != "B" {
		t.Fatalf("through the edge: %d from %q: %s; want 200 from B", code, region, body)
	}
	testkit.WaitFor(t, "B's ledger bills the request sent through the edge", func() bool { return usageRequests(t, dirB) == 4 })
	if n := usageRequests(t, dirA); n != 3 {
		t.Fatalf("A's ledger has %d requests, want its 3 direct ones only", n)
	}
	if code, region, body := chatVia(t, edgeURL, key+"x"); code != 401 || region != "B" {
		t.Fatalf("a wrong key through the edge: %d from %q: %s; want B's own 401 (the edge judges no key)", code, region, body)
	}

	// Mid-run, B is SIGKILLed; requests sent after that go to A.
	type result struct {
		sent   time.Time
		code   int
		region string
	}
	var (
		mu      sync.Mutex
		results []result
		stop    = make(chan struct{})
		wg      sync.WaitGroup
	)
	for range 4 {
		wg.Go(func() {
			for i := 0; i < 200; i++ {
				select {
				case <-stop:
					return
				default:
				}
				sent := time.Now()
				code, region, _ := chatVia(t, edgeURL, key)
				mu.Lock()
				results = append(results, result{sent, code, region})
				mu.Unlock()
			}
		})
	}
	answeredBy := func(region string) int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, r := range results {
			if r.code == 200 && r.region == region {
				n++
			}
		}
		return n
	}
	testkit.WaitFor(t, "B answers 20 requests through the edge", func() bool { return answeredBy("B") >= 20 })
	_ = b.Stop(0)
	killed := time.Now()
	testkit.WaitFor(t, "A answers 12 requests sent after the kill", func() bool {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, r := range results {
			if r.sent.After(killed) && r.code == 200 {
				n++
			}
		}
		return n >= 12
	})
	close(stop)
	wg.Wait()
	cut := 0
	for _, r := range results {
		switch {
		case !r.sent.After(killed):
			if r.code != 200 {
				cut++ // in flight at the kill
			}
		case r.code != 200 || r.region != "A":
			t.Errorf("a request sent after B was killed: %d from %q, want 200 from A", r.code, r.region)
		}
	}
	t.Logf("%d requests, %d of them in flight at the kill and cut", len(results), cut)
	if r := edgeRoute(t, edgeAdmin); !slices.Equal(r, []string{"A"}) {
		t.Fatalf("route after the kill = %v, want [A]", r)
	}
	// What A served through the edge is billed in A's ledger.
	fromA := answeredBy("A")
	testkit.WaitFor(t, "A's ledger bills what it served", func() bool { return usageRequests(t, dirA) == int64(3+fromA) })
}

// chatVia posts a chat request to base with key and returns the status,
// the region that answered (X-Tailgate-Region) and the body.
func chatVia(t *testing.T, base, key string) (int, string, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, base+"/v1/chat/completions",
		strings.NewReader(`{"model":"tailgate-sim","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err.Error()
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get("X-Tailgate-Region"), string(raw)
}

// edgeRoute is the regions the edge would try for tailgate-sim now.
func edgeRoute(t *testing.T, admin string) []string {
	t.Helper()
	resp, err := http.Get(admin + "/edge/v1/regions")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var v struct {
		Routes map[string][]string `json:"routes"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		t.Fatal(err)
	}
	return v.Routes["tailgate-sim"]
}

// usageRequests is the requests the ledger in dir billed to tenant travel.
func usageRequests(t *testing.T, dir string) int64 {
	t.Helper()
	var usage []struct {
		Requests int64 `json:"requests"`
	}
	if err := json.Unmarshal([]byte(tailgate(t, "usage", "--data", dir, "--tenant", "travel", "--json")), &usage); err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, u := range usage {
		n += u.Requests
	}
	return n
}

// TestSlowUploadsThroughTheEdgeDoNotStarveTheRegion: one address trickling
// uploads through `tailgate edge` (bodies past --max-peek, then stalled)
// holds only its share of the edge's connections, each cut at the body
// deadline; the region behind it (a gateway at --max-connections 50, so 6
// connections an address, the edge's included) keeps answering the edge's
// polls and serves another client throughout.
func TestSlowUploadsThroughTheEdgeDoNotStarveTheRegion(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the binary")
	}
	dir := t.TempDir()
	tailgate(t, "init", "--data", dir)
	key := testkit.LastLine(tailgate(t, "keys", "create", "--data", dir, "--tenant", "calm"))
	a := startUpIn(t, dir, "--region", "A", "--replicas", "1", "--max-connections", "50")
	edge := startProc(t, "edge", true, "edge", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
		"--region", "A="+strings.TrimSuffix(a.api, "/v1"), "--poll-interval", "100ms", "--edge-token-file", filepath.Join(dir, "edge.token"),
		"--max-connections", "32", "--max-peek", "65536", "--body-timeout", "3s", "--body-min-rate", "65536")
	var edgeURL, edgeAdmin string
	edgeLine := regexp.MustCompile(`tailgate edge: (http://\S+) .* admin (http://\S+)`)
	edge.scanUntil(func(line string) bool {
		if m := edgeLine.FindStringSubmatch(line); m != nil {
			edgeURL, edgeAdmin = m[1], m[2]
		}
		return edgeURL != ""
	})
	if edgeURL == "" {
		t.Fatalf("edge printed no address; stderr:\n%s", edge.stderr.String())
	}
	testkit.WaitFor(t, "the edge routes to A", func() bool { return slices.Equal(edgeRoute(t, edgeAdmin), []string{"A"}) })

	// The attacker, from 127.0.0.2: 12 uploads of a declared 4 MiB, 128 KiB
	// sent (past the peek: each opens a connection to the region), then
	// nothing.
	var wg sync.WaitGroup
	var ended sync.WaitGroup
	for range 12 {
		wg.Add(1)
		ended.Add(1)
		go func() {
			defer ended.Done()
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}}
			c, err := d.Dial("tcp", strings.TrimPrefix(edgeURL, "http://"))
			if err != nil {
				wg.Done()
				return
			}
			defer c.Close()
			fmt.Fprintf(c, "POST /v1/audio/transcriptions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: multipart/form-data; boundary=b\r\nContent-Length: %d\r\n\r\n", key, 4<<20)
			_, _ = c.Write(make([]byte, 128<<10))
			wg.Done()
			_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
			_, _ = io.Copy(io.Discard, c)
		}()
	}
	wg.Wait()
	// For 3 s, another client is served and the region stays routed.
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		if code, region, body := chatVia(t, edgeURL, key); code != 200 || region != "A" {
			t.Fatalf("another client during the uploads: %d from %q: %s; want 200 from A", code, region, body)
		}
		if r := edgeRoute(t, edgeAdmin); !slices.Equal(r, []string{"A"}) {
			t.Fatalf("the edge's route during the uploads = %v: the region refused its polls", r)
		}
	}
	done := make(chan struct{})
	go func() { ended.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("trickled uploads still open 20 s after they stalled")
	}
}
