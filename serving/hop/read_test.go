package hop

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"strings"
	"testing"
)

// answerRead is everything a reader of an answer can observe: the
// response's fields, its body as a sequence of reads of 7 bytes (each
// read's bytes and error), its trailer after the body, and the bytes left
// on the connection after it.
type answerRead struct {
	Err                           string
	Status                        string
	StatusCode                    int
	Proto                         string
	ProtoMajor, ProtoMinor        int
	Header, Trailer, TrailerAfter http.Header
	ContentLength                 int64
	TransferEncoding              []string
	Close, NoBody                 bool
	Reads                         []string
	Rest                          string
}

func observe(resp *http.Response, err error, read func([]byte) (int, error), br *bufio.Reader) answerRead {
	var a answerRead
	if err != nil {
		a.Err = err.Error()
		return a
	}
	a.Status, a.StatusCode, a.Proto, a.ProtoMajor, a.ProtoMinor = resp.Status, resp.StatusCode, resp.Proto, resp.ProtoMajor, resp.ProtoMinor
	a.Header, a.Trailer = resp.Header.Clone(), resp.Trailer.Clone()
	a.ContentLength, a.TransferEncoding, a.Close = resp.ContentLength, resp.TransferEncoding, resp.Close
	a.NoBody = resp.Body == http.NoBody
	if a.NoBody {
		read = resp.Body.Read
	}
	for i := 0; i < 1<<16; i++ {
		p := make([]byte, 7)
		n, err := read(p)
		a.Reads = append(a.Reads, fmt.Sprintf("%q %v", p[:n], err))
		if err != nil {
			break
		}
	}
	a.TrailerAfter = resp.Trailer.Clone()
	rest, _ := io.ReadAll(br)
	a.Rest = string(rest)
	return a
}

// readBoth reads raw as http.ReadResponse does and as readHead (with its
// fallback) does, through a read buffer of size bytes.
func readBoth(raw string, size int, method string) (want, got answerRead, taken bool) {
	req, _ := http.NewRequest(method, "http://127.0.0.1:8000/v1/chat/completions", nil)
	wbr := bufio.NewReaderSize(strings.NewReader(raw), size)
	resp, err := http.ReadResponse(wbr, req)
	var read func([]byte) (int, error)
	if err == nil {
		read = resp.Body.Read
	}
	want = observe(resp, err, read, wbr)

	gbr := bufio.NewReaderSize(strings.NewReader(raw), size)
	a, fallback := readHead(gbr, req)
	if fallback != nil {
		resp, err = http.ReadResponse(fallback, req)
		if err == nil {
			read = resp.Body.Read
		}
		if fallback != gbr {
			gbr = fallback
		}
	} else {
		resp, err, taken = &a.resp, nil, true
		read = func(p []byte) (int, error) { return a.body.f.read(gbr, p) }
	}
	got = observe(resp, err, read, gbr)
	return want, got, taken
}

// engineAnswers are answers as the engines the gateway talks to send them:
// vLLM behind uvicorn (lower-case names), the sim engine and the sidecar
// (net/http), a stream, an error, an HTTP/1.0 answer.
var engineAnswers = []string{
	"HTTP/1.1 200 OK\r\ndate: Mon, 07 Dec 2026 23:55:00 GMT\r\nserver: uvicorn\r\ncontent-length: 27\r\ncontent-type: application/json\r\n\r\n" +
		`{"id":"chatcmpl-1","x":"y"}` + "HTTP/1.1 200 OK\r\n",
	"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Sim-Queue-Ms: 0.012\r\nDate: Mon, 07 Dec 2026 23:55:00 GMT\r\nContent-Length: 2\r\n\r\n{}",
	"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\nDate: Mon, 07 Dec 2026 23:55:00 GMT\r\nTransfer-Encoding: chunked\r\n\r\n" +
		"e\r\ndata: {\"a\":1}\n\n\r\n" + "e\r\ndata: [DONE]\n\n\r\n" + "0\r\n\r\n",
	"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nX-Trailer: t\r\n\r\nnext",
	"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n{\"error\":1}",
	"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 2\r\nContent-Length: 3\r\n\r\nbye",
	"HTTP/1.0 200 OK\r\nContent-Length: 5\r\n\r\nhello",
	"HTTP/1.1 200\r\nX-A: 1\r\nx-a: 2\r\nContent-Length: 0\r\n\r\n",
	"HTTP/1.1 200 OK\r\nX-Empty:\r\nX-Spaces: \t v \t\r\nX-Obs: caf\xc3\xa9\r\nContent-Length: 1\r\n\r\nx",
	"HTTP/1.1 200 OK\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n0\r\n\r\n",
}

// oddAnswers are answers readHead leaves to http.ReadResponse, or that are
// malformed or cut short: the result must be the same.
var oddAnswers = []string{
	"",
	"HTTP/1.1 200 OK\r\n",
	"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nabc",
	"HTTP/1.1 200 OK\r\nContent-Le",
	"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nx",
	"HTTP/1.1 204 No Content\r\n\r\n",
	"HTTP/1.1 304 Not Modified\r\nContent-Length: 3\r\n\r\n",
	"HTTP/1.1 200 OK\r\n\r\nto the end",
	"HTTP/1.0 200 OK\r\n\r\nto the end",
	"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 1\r\n\r\nx",
	"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 1\r\n\r\nx",
	"HTTP/1.1 200 OK\r\nTrailer: X-T\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nX-T: 1\r\n\r\n",
	"HTTP/1.1 200 OK\r\nPragma: no-cache\r\nContent-Length: 0\r\n\r\n",
	"HTTP/1.1 200 OK\nContent-Length: 1\n\nx",
	"HTTP/1.1 200 OK\r\nX-Folded: a\r\n b\r\nContent-Length: 1\r\n\r\nx",
	"HTTP/1.1 200 OK\r\n X-Lead: a\r\nContent-Length: 1\r\n\r\nx",
	"HTTP/1.1 200 OK\r\nX Bad: a\r\nContent-Length: 1\r\n\r\nx",
	"HTTP/1.1 200 OK\r\n: a\r\nContent-Length: 1\r\n\r\nx",
	"HTTP/1.1 200 OK\r\nNoColon\r\nContent-Length: 1\r\n\r\nx",
	"HTTP/1.1 200 OK\r\nX-Ctl: a\x01b\r\nContent-Length: 1\r\n\r\nx",
	"HTTP/1.1 200 OK\r\nX-Cr: a\r\r\nContent-Length: 1\r\n\r\nx",
	"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\nx",
	"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nxx",
	"HTTP/1.1 200 OK\r\nContent-Length: +1\r\n\r\nx",
	"HTTP/1.1 200 OK\r\nContent-Length: \r\n\r\nx",
	"HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999\r\n\r\nx",
	"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\nx",
	"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
	"HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 1\r\n\r\nx",
	"HTTP/1.1 200 OK\r\nTransfer-Encoding: CHUNKED\r\n\r\n1\r\nx\r\n0\r\n\r\n",
	"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel",
	"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n",
	"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n",
	"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nX-T: 1\r\n",
	"HTTP/2.0 200 OK\r\nContent-Length: 0\r\n\r\n",
	"HTTP/1.1 20 OK\r\nContent-Length: 0\r\n\r\n",
	"HTTP/1.1 2000 OK\r\nContent-Length: 0\r\n\r\n",
	"HTTP/1.1  200 OK\r\nContent-Length: 0\r\n\r\n",
	"HTTP/1.1 200\rX\r\nContent-Length: 0\r\n\r\n",
	"HTTP/1.1 +12 OK\r\nContent-Length: 0\r\n\r\n",
	"HTTP/1.1 999 Odd\r\nContent-Length: 0\r\n\r\n",
	"\r\nHTTP/1.1 200 OK\r\n\r\n",
	"garbage\r\n\r\n",
	"HTTP/1.1 200 OK\r\nX-Long: " + strings.Repeat("v", 5000) + "\r\nContent-Length: 1\r\n\r\nx",
}

// TestAnswersReadAsReadResponseReadsThem: what the gateway sees of an
// answer — status, header, length, framing, close, body bytes read by
// read, errors, trailer, what is left on the connection — is
// http.ReadResponse's, for the answers engines send (which readHead
// takes) and for odd, malformed and truncated ones, at several read
// buffer sizes.
func TestAnswersReadAsReadResponseReadsThem(t *testing.T) {
	for _, size := range []int{16, 64, 4096} {
		for i, raw := range append(append([]string{}, engineAnswers...), oddAnswers...) {
			for _, method := range []string{http.MethodPost, http.MethodHead} {
				want, got, taken := readBoth(raw, size, method)
				if !reflect.DeepEqual(got, want) {
					t.Errorf("answer %d (%q), buffer %d, %s:\n got %+v\nwant %+v", i, raw, size, method, got, want)
				}
				if i < len(engineAnswers) && size == 4096 && method == http.MethodPost && !taken {
					t.Errorf("engine answer %d (%q) was left to http.ReadResponse", i, raw)
				}
			}
		}
	}
}

func FuzzAnswersReadAsReadResponseReadsThem(f *testing.F) {
	for _, raw := range engineAnswers {
		f.Add(raw, uint16(4096))
	}
	for _, raw := range oddAnswers {
		f.Add(raw, uint16(64))
	}
	f.Fuzz(func(t *testing.T, raw string, size uint16) {
		want, got, _ := readBoth(raw, 16+int(size%8192), http.MethodPost)
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%q:\n got %+v\nwant %+v", raw, got, want)
		}
	})
}

// BenchmarkReadAnswer reads a JSON answer's head and body as the sim engine
// sends it: http.ReadResponse against readHead.
func BenchmarkReadAnswer(b *testing.B) {
	raw := []byte(engineAnswers[1])
	for _, bc := range []struct {
		name string
		read func(br *bufio.Reader, req *http.Request, p []byte)
	}{
		{"ReadResponse", func(br *bufio.Reader, req *http.Request, p []byte) {
			resp, err := http.ReadResponse(br, req)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := io.ReadFull(resp.Body, p[:resp.ContentLength]); err != nil {
				b.Fatal(err)
			}
			_ = resp.Header["Content-Type"]
		}},
		{"readHead", func(br *bufio.Reader, req *http.Request, p []byte) {
			a, fallback := readHead(br, req)
			if fallback != nil {
				b.Fatal("not taken")
			}
			if _, err := a.body.f.read(br, p[:a.resp.ContentLength]); err != io.EOF {
				b.Fatal(err)
			}
			_ = a.resp.Header["Content-Type"]
		}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			req, _ := http.NewRequest(http.MethodPost, "http://127.0.0.1:8000/v1/chat/completions", nil)
			rd := bytes.NewReader(raw)
			br := bufio.NewReaderSize(rd, 32<<10)
			p := make([]byte, 64)
			b.ReportAllocs()
			for b.Loop() {
				rd.Reset(raw)
				br.Reset(rd)
				bc.read(br, req, p)
			}
		})
	}
}
