package hop

import (
	"bufio"
	"bytes"
	"net/http"
	"strings"
	"testing"
)

// TestRequestsGoOutAsRequestWriteWritesThem: the bytes an engine receives
// are Request.Write's, byte for byte, for the requests hop writes itself,
// and those it does not take are left to Request.Write.
func TestRequestsGoOutAsRequestWriteWritesThem(t *testing.T) {
	post := func(body string, h map[string]string) func() *http.Request {
		return func() *http.Request {
			var rd *strings.Reader
			if body != "" {
				rd = strings.NewReader(body)
			}
			var req *http.Request
			if rd != nil {
				req, _ = http.NewRequest(http.MethodPost, "http://127.0.0.1:8000/v1/chat/completions?x=1", rd)
			} else {
				req, _ = http.NewRequest(http.MethodPost, "http://127.0.0.1:8000/v1/chat/completions", http.NoBody)
			}
			for k, v := range h {
				req.Header.Set(k, v)
			}
			return req
		}
	}
	for _, tc := range []struct {
		name  string
		req   func() *http.Request
		taken bool
	}{
		{"chat", post(`{"model":"m"}`, map[string]string{"Content-Type": "application/json", "X-Request-Id": "req_1",
			"X-Idempotency-Key": "req_1-1", "Authorization": "Bearer t", "Accept": "text/event-stream", "Traceparent": "00-ab-cd-01"}), true},
		{"no body", post("", map[string]string{"X-Request-Id": "req_2"}), true},
		{"get", func() *http.Request {
			r, _ := http.NewRequest(http.MethodGet, "http://localhost/metrics", nil)
			return r
		}, true},
		{"own user agent", post(`{}`, map[string]string{"User-Agent": "x"}), false},
		{"value with a line break", post(`{}`, map[string]string{"X-A": "a\nb"}), false},
		{"connection close", func() *http.Request { r := post(`{}`, nil)(); r.Close = true; return r }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var want bytes.Buffer
			if err := tc.req().Write(&want); err != nil {
				t.Fatal(err)
			}
			var got bytes.Buffer
			bw := bufio.NewWriter(&got)
			ok, err := writeHead(bw, tc.req())
			if err != nil {
				t.Fatal(err)
			}
			bw.Flush()
			if ok != tc.taken {
				t.Fatalf("taken %v, want %v", ok, tc.taken)
			}
			if ok && got.String() != want.String() {
				t.Errorf("wrote\n%q\nRequest.Write writes\n%q", got.String(), want.String())
			}
		})
	}
}
