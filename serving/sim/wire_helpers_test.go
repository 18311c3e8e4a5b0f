package sim

import (
	"bytes"
	"encoding/binary"
	"io"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
)

// The wire tests compare whole answers, byte for byte, after replacing what
// differs between runs: random ids, timestamps, the queue time and the
// thinking signature. What remains is vLLM's wire format: field names,
// their order, nulls, event framing.

var normalizers = []struct {
	re   *regexp.Regexp
	with string
}{
	{regexp.MustCompile(`chatcmpl-tool-[0-9a-f]{32}`), "chatcmpl-tool-ID"},
	{regexp.MustCompile(`\b(chatcmpl|cmpl|embd|rerank|score|trsc|trsl)-[0-9a-f]{32}`), "$1-ID"},
	{regexp.MustCompile(`\b(resp|msg|fc|call)_[0-9a-f]{32}`), "${1}_ID"},
	{regexp.MustCompile(`modelperm-[0-9a-f]{32}`), "modelperm-ID"},
	{regexp.MustCompile(`"(created|created_at)":\d+`), `"$1":0`},
	{regexp.MustCompile(`"signature":"[0-9a-f]{32}"`), `"signature":"SIG"`},
	{regexp.MustCompile(`: sim-queue-ms=[0-9.]+`), ": sim-queue-ms=Q"},
}

func normalize(s string) string {
	for _, n := range normalizers {
		s = n.re.ReplaceAllString(s, n.with)
	}
	return s
}

// wireCase is one request and the answer it must get.
type wireCase struct {
	name   string
	cfg    Config
	path   string
	body   string
	ctype  string // "" means application/json
	status int    // 0 means 200
	want   string // normalized; SSE streams as sent, "\n\n" between events
}

// run posts c's body to an engine for c.cfg and compares the normalized
// answer with c.want.
func (c wireCase) run(t *testing.T) {
	t.Helper()
	_, srv := start(t, c.cfg)
	ctype := c.ctype
	if ctype == "" {
		ctype = "application/json"
	}
	status, _, body := postAs(t, srv.URL+c.path, ctype, c.body)
	want := c.status
	if want == 0 {
		want = http.StatusOK
	}
	if status != want {
		t.Fatalf("status %d, want %d: %s", status, want, body)
	}
	if got := normalize(string(body)); got != c.want {
		t.Errorf("answer differs\n got: %s\nwant: %s", quoteLines(got), quoteLines(c.want))
	}
}

// quoteLines shows an SSE stream one event a line.
func quoteLines(s string) string {
	return "\n  " + strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n\n", "\n  ")
}

// postAs posts body with the given Content-Type.
func postAs(t testing.TB, url, ctype, body string) (int, http.Header, []byte) {
	t.Helper()
	resp, err := http.Post(url, ctype, strings.NewReader(body))
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read answer: %v", err)
	}
	return resp.StatusCode, resp.Header, b
}

// multipartForm returns a form with the fields and, unless file is nil, an
// audio file, and its Content-Type.
func multipartForm(t testing.TB, file []byte, fields ...string) (body, ctype string) {
	t.Helper()
	var b bytes.Buffer
	mw := multipart.NewWriter(&b)
	for i := 0; i+1 < len(fields); i += 2 {
		_ = mw.WriteField(fields[i], fields[i+1])
	}
	if file != nil {
		fw, err := mw.CreateFormFile("file", "audio.wav")
		if err != nil {
			t.Fatal(err)
		}
		_, _ = fw.Write(file)
	}
	_ = mw.Close()
	return b.String(), mw.FormDataContentType()
}

// wav returns a WAV file of the given seconds at 8 kHz, 8-bit mono: a
// header that says 8000 bytes a second, and silence.
func wav(seconds float64) []byte {
	n := int(seconds * 8000)
	b := make([]byte, 44+n)
	copy(b, "RIFF")
	binary.LittleEndian.PutUint32(b[4:], uint32(36+n))
	copy(b[8:], "WAVEfmt ")
	binary.LittleEndian.PutUint32(b[16:], 16)
	binary.LittleEndian.PutUint16(b[20:], 1)    // PCM
	binary.LittleEndian.PutUint16(b[22:], 1)    // mono
	binary.LittleEndian.PutUint32(b[24:], 8000) // sample rate
	binary.LittleEndian.PutUint32(b[28:], 8000) // byte rate
	binary.LittleEndian.PutUint16(b[32:], 1)    // block align
	binary.LittleEndian.PutUint16(b[34:], 8)    // bits per sample
	copy(b[36:], "data")
	binary.LittleEndian.PutUint32(b[40:], uint32(n))
	return b
}

// startWith starts an engine for cfg and returns its server.
func startWith(t *testing.T, cfg Config) *httptest.Server {
	t.Helper()
	_, srv := start(t, cfg)
	return srv
}
