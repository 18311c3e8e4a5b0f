package sim

import (
	"bufio"
	"context"
	"encoding/json"
	"hash/fnv"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
)

// start runs an engine for cfg behind a loopback HTTP server.
func start(t testing.TB, cfg Config) (*Engine, *httptest.Server) {
	t.Helper()
	e, err := New(cfg, nil)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	srv := httptest.NewServer(e.Handler())
	t.Cleanup(srv.Close)
	return e, srv
}

// post sends body to url and returns the status and the whole answer.
func post(t testing.TB, url, body string) (int, http.Header, []byte) {
	t.Helper()
	return postCtx(t, context.Background(), url, body)
}

func postCtx(t testing.TB, ctx context.Context, url, body string) (int, http.Header, []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Errorf("POST %s: %v", url, err)
		return 0, nil, nil
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Errorf("read answer: %v", err)
	}
	return resp.StatusCode, resp.Header, b
}

func get(t testing.TB, url string) (int, []byte) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read answer: %v", err)
	}
	return resp.StatusCode, b
}

// events splits an SSE body into its data payloads, failing on anything that
// is not a "data: …" line followed by a blank line. The queue-time comment
// event is skipped.
func events(t testing.TB, body []byte) []string {
	t.Helper()
	var out []string
	sc := bufio.NewScanner(strings.NewReader(string(body)))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, queueComment) {
			if !sc.Scan() || sc.Text() != "" {
				t.Fatalf("comment %q not followed by a blank line", line)
			}
			continue
		}
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			t.Fatalf("line %q is not a data line in:\n%s", line, body)
		}
		out = append(out, data)
		if !sc.Scan() || sc.Text() != "" {
			t.Fatalf("event %q not followed by a blank line", data)
		}
	}
	return out
}

// readEvent reads one SSE data event from a live stream, skipping comments.
func readEvent(t testing.TB, r *bufio.Reader) string {
	t.Helper()
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("read event: %v", err)
		}
		if _, err := r.ReadString('\n'); err != nil {
			t.Fatalf("read event end: %v", err)
		}
		if !strings.HasPrefix(line, ":") {
			return strings.TrimSuffix(strings.TrimPrefix(line, "data: "), "\n")
		}
	}
}

func decode(t testing.TB, s string) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(s), &m); err != nil {
		t.Fatalf("decode %q: %v", s, err)
	}
	return m
}

// naturalLength is the documented completion length without a cap, computed
// with the standard library's FNV rather than the package's own.
func naturalLength(text string) int {
	h := fnv.New32a()
	h.Write([]byte(text))
	return 16 + int(h.Sum32()%113)
}

// metricValue returns the value of the series whose exposition line starts
// with prefix (name and labels), or -1.
func metricValue(t testing.TB, body []byte, prefix string) float64 {
	t.Helper()
	for line := range strings.Lines(string(body)) {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), prefix+" "); ok {
			v, err := strconv.ParseFloat(rest, 64)
			if err != nil {
				t.Fatalf("metric %s: %v", prefix, err)
			}
			return v
		}
	}
	return -1
}
