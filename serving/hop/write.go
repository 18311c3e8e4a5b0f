package hop

import (
	"bufio"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
)

// writeHead writes req's request line and header as [http.Request.Write]
// does — Host, User-Agent (Go's default unless set), Content-Length, the
// other fields sorted by name — and then its body. It takes only the
// requests the gateway sends (a body of known length or none, no trailer,
// no transfer encoding, no Connection: close, an ASCII host, fields
// without line breaks) and reports false, writing nothing, for any other:
// the caller writes those with Request.Write. Request.Write's formatting
// (fmt.Fprintf of each line, a transferWriter, the body's LimitReader) was
// 6 allocations of every request in BenchmarkGatewayOverhead's pprof
// (net/http.(*Request).write under hop.(*conn).writeRequest).
func writeHead(bw *bufio.Writer, req *http.Request) (ok bool, err error) {
	u := req.URL
	host := req.Host
	if host == "" {
		host = u.Host
	}
	hasBody := req.Body != nil && req.Body != http.NoBody
	if req.Method == "" || req.Method == http.MethodConnect || u.Opaque != "" || req.Close ||
		len(req.TransferEncoding) > 0 || req.Trailer != nil || (hasBody && req.ContentLength <= 0) ||
		!plainHost(host) {
		return false, nil
	}
	if _, set := req.Header["User-Agent"]; set {
		return false, nil
	}
	var keysBuf [16]string
	keys := keysBuf[:0]
	for k, vv := range req.Header {
		switch k {
		case "Host", "User-Agent", "Content-Length", "Transfer-Encoding", "Trailer":
			continue
		}
		if !plainField(k) {
			return false, nil
		}
		for _, v := range vv {
			if !plainField(v) || strings.TrimSpace(v) != v {
				return false, nil
			}
		}
		keys = append(keys, k)
	}
	ruri := u.RequestURI()
	for i := 0; i < len(ruri); i++ {
		if ruri[i] < ' ' || ruri[i] == 0x7f {
			return false, nil
		}
	}
	slices.Sort(keys)

	bw.WriteString(req.Method)
	bw.WriteByte(' ')
	bw.WriteString(ruri)
	bw.WriteString(" HTTP/1.1\r\nHost: ")
	bw.WriteString(host)
	bw.WriteString("\r\nUser-Agent: Go-http-client/1.1\r\n")
	switch m := req.Method; {
	case req.ContentLength > 0:
		var num [20]byte
		bw.WriteString("Content-Length: ")
		bw.Write(strconv.AppendInt(num[:0], req.ContentLength, 10))
		bw.WriteString("\r\n")
	case m == http.MethodPost || m == http.MethodPut || m == http.MethodPatch:
		bw.WriteString("Content-Length: 0\r\n") // as Request.Write: an empty body said so
	}
	for _, k := range keys {
		for _, v := range req.Header[k] {
			bw.WriteString(k)
			bw.WriteString(": ")
			bw.WriteString(v)
			bw.WriteString("\r\n")
		}
	}
	_, err = bw.WriteString("\r\n")
	if hasBody {
		if err == nil {
			var n int64
			n, err = io.Copy(bw, io.LimitReader(req.Body, req.ContentLength))
			if err == nil && n != req.ContentLength {
				err = io.ErrUnexpectedEOF // the body was shorter than its length
			}
		}
		if cerr := req.Body.Close(); err == nil {
			err = cerr
		}
	}
	return true, err
}

// plainHost: a host Request.Write sends as it is (ASCII, no zone, no
// character a Host header may not hold).
func plainHost(h string) bool {
	if h == "" {
		return false
	}
	for i := 0; i < len(h); i++ {
		c := h[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case c == '.' || c == '-' || c == ':' || c == '[' || c == ']' || c == '_':
		default:
			return false
		}
	}
	return true
}

// plainField: a header name or value with no control character (which
// Request.Write would rewrite).
func plainField(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < ' ' && c != '\t' || c == 0x7f {
			return false
		}
	}
	return true
}
