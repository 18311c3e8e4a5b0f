package hop

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net/http"
	"net/http/httputil"
	"net/textproto"
	"unsafe"
)

// readHead reads an answer's head as [http.ReadResponse] does, for the
// answers engines send: HTTP/1.1 or 1.0, a final status (not 1xx, 204 or
// 304) to a request that is not HEAD, a body framed by one Content-Length
// or by Transfer-Encoding: chunked, no Connection, Trailer or Pragma field,
// and fields on one line each, ended by CRLF, of token names and plain
// values; the whole head within br's buffer. For any other answer it
// consumes nothing and returns the reader to read it from with
// http.ReadResponse (fallback): br itself, or, when reading the head failed,
// a reader of what br held followed by that error (so ReadResponse fails as
// it would have on the connection).
//
// The head is copied once; the header's names (canonicalised in place in
// the copy) and values are views of it, and the values' slices cut from
// one array. http.ReadResponse's textproto.Reader, its per-field strings
// and canonical names, its map growing and its transfer reader were 10 of
// the 20 allocations under hop.(*conn).roundTrip in
// BenchmarkGatewayOverhead's memory profile (server package), and 1.5 % of
// the gateway's CPU samples at 1000 JSON requests a second.
//
// The answer holds the response, and its body's framing (n > 0 bytes of
// length, or chunked) in a.body; an empty body is http.NoBody on the
// response.
func readHead(br *bufio.Reader, req *http.Request) (a *answer, fallback *bufio.Reader) {
	if req != nil && req.Method == http.MethodHead {
		return nil, br
	}
	// The head's end: the first empty line; every line ends in CRLF.
	end, lines := 0, 0
	for scanned := 0; end == 0; {
		buf, _ := br.Peek(br.Buffered())
		for end == 0 {
			i := bytes.IndexByte(buf[scanned:], '\n')
			if i < 0 {
				break
			}
			i += scanned
			if i == 0 || buf[i-1] != '\r' {
				return nil, br // a line ended by LF alone
			}
			if i-1 == scanned {
				if scanned == 0 {
					return nil, br // no status line
				}
				end = i + 1
			}
			lines++
			scanned = i + 1
		}
		if end != 0 {
			break
		}
		if br.Buffered() == br.Size() {
			return nil, br // longer than the buffer
		}
		if _, err := br.Peek(br.Buffered() + 1); err != nil {
			held, _ := br.Peek(br.Buffered())
			return nil, bufio.NewReader(io.MultiReader(bytes.NewReader(bytes.Clone(held)), failing{err}))
		}
	}
	fields := lines - 2 // not the status line, nor the empty one
	peeked, _ := br.Peek(end)

	// The status line: "HTTP/1.1 200 OK".
	var major, minor int
	switch {
	case bytes.HasPrefix(peeked, proto11):
		major, minor = 1, 1
	case bytes.HasPrefix(peeked, proto10):
		major, minor = 1, 0
	default:
		return nil, br
	}
	const codeAt = len("HTTP/1.1 ")
	statusEnd := bytes.IndexByte(peeked, '\n') - 1 // at the CR
	if statusEnd < codeAt+3 || !digit(peeked[codeAt]) || !digit(peeked[codeAt+1]) || !digit(peeked[codeAt+2]) ||
		(statusEnd > codeAt+3 && peeked[codeAt+3] != ' ') {
		return nil, br
	}
	code := int(peeked[codeAt]-'0')*100 + int(peeked[codeAt+1]-'0')*10 + int(peeked[codeAt+2]-'0')
	if code < 200 || code > 599 || code == http.StatusNoContent || code == http.StatusNotModified {
		return nil, br
	}

	// The fields, checked and their names canonicalised in place in a copy
	// of the head: [name start, name end, value start, value end].
	if fields > maxFields {
		return nil, br
	}
	var spans [maxFields][4]int
	head := make([]byte, end)
	copy(head, peeked)
	var (
		length  int64 = -1
		chunked bool
		lengths int
	)
	at := statusEnd + 2
	for i := range fields {
		eol := at + bytes.IndexByte(head[at:], '\n') - 1 // at the CR
		line := head[at:eol]
		colon := bytes.IndexByte(line, ':')
		if colon <= 0 {
			return nil, br // no name, or a folded line
		}
		upper := true
		for j, c := range line[:colon] {
			if !tokenByte(c) {
				return nil, br
			}
			if upper && 'a' <= c && c <= 'z' {
				c -= 'a' - 'A'
			} else if !upper && 'A' <= c && c <= 'Z' {
				c += 'a' - 'A'
			}
			line[j] = c
			upper = c == '-'
		}
		vs, ve := colon+1, len(line)
		for vs < ve && (line[vs] == ' ' || line[vs] == '\t') {
			vs++
		}
		for ve > vs && (line[ve-1] == ' ' || line[ve-1] == '\t') {
			ve--
		}
		for _, c := range line[vs:ve] {
			if c < ' ' && c != '\t' || c == 0x7f {
				return nil, br // as textproto: a control byte
			}
		}
		name, value := line[:colon], line[vs:ve]
		switch string(name) {
		case "Connection", "Trailer", "Pragma":
			return nil, br
		case "Transfer-Encoding":
			if chunked || major == 1 && minor == 0 || !bytes.EqualFold(value, chunkedName) {
				return nil, br
			}
			chunked = true
		case "Content-Length":
			// As strconv.ParseUint(value, 10, 63), to 18 digits.
			if lengths > 0 || len(value) == 0 || len(value) > 18 {
				return nil, br
			}
			length, lengths = 0, 1
			for _, c := range value {
				if !digit(c) {
					return nil, br
				}
				length = length*10 + int64(c-'0')
			}
		}
		spans[i] = [4]int{at, at + colon, at + vs, at + ve}
		at = eol + 2
	}
	if length < 0 && !chunked {
		return nil, br // read to the connection's end
	}
	br.Discard(end)

	s := unsafe.String(unsafe.SliceData(head), len(head)) // head is not written again
	a = new(answer)
	h := make(http.Header, fields)
	vals := a.vals[:0]
	if fields > len(a.vals) {
		vals = make([]string, fields)
	}
	vals = vals[:fields]
	for i, sp := range spans[:fields] {
		k := s[sp[0]:sp[1]]
		if chunked && (k == "Transfer-Encoding" || k == "Content-Length") {
			continue // as readTransfer: chunked overrides the length
		}
		vals[i] = s[sp[2]:sp[3]]
		if vv, ok := h[k]; ok {
			h[k] = append(vv, vals[i])
		} else {
			h[k] = vals[i : i+1 : i+1]
		}
	}
	resp := &a.resp
	*resp = http.Response{
		Status:     s[len("HTTP/1.1 "):statusEnd],
		StatusCode: code,
		Proto:      s[:len("HTTP/1.1")],
		ProtoMajor: major,
		ProtoMinor: minor,
		Header:     h,
		Close:      minor == 0, // HTTP/1.0 without Connection: keep-alive
		Request:    req,
	}
	switch {
	case chunked:
		resp.ContentLength = -1
		resp.TransferEncoding = chunkedEncoding
		a.body.f = framing{chunks: httputil.NewChunkedReader(br), resp: resp}
	case length == 0:
		resp.Body = http.NoBody
	default:
		resp.ContentLength = length
		a.body.f = framing{n: length}
	}
	return a, nil
}

// answer is an answer readHead read, in one allocation: the response, its
// body (hop's, which the round trip completes) and the values of up to
// eight header fields (engines send about five).
type answer struct {
	resp http.Response
	body body
	vals [8]string
}

// maxFields bounds the fields of a head readHead takes (engines send about
// five).
const maxFields = 32

var (
	proto11       = []byte("HTTP/1.1 ")
	proto10       = []byte("HTTP/1.0 ")
	chunkedName   = []byte("chunked")
	singleCRLF    = []byte("\r\n")
	doubleCRLF    = []byte("\r\n\r\n")
	errTrailerEOF = errors.New("http: unexpected EOF reading trailer")

	// chunkedEncoding is every chunked answer's TransferEncoding, as
	// readTransfer sets it; nothing writes to it.
	chunkedEncoding = []string{"chunked"}
)

func digit(c byte) bool { return '0' <= c && c <= '9' }

// tokenByte reports whether c may be in a field name (RFC 7230's tchar),
// as textproto's validHeaderFieldByte.
func tokenByte(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	switch c {
	case '!', '#', '$', '%', '&', '\'', '*', '+', '-', '.', '^', '_', '`', '|', '~':
		return true
	}
	return false
}

// failing is a reader that fails with err.
type failing struct{ err error }

func (r failing) Read([]byte) (int, error) { return 0, r.err }

// framing is how a body readHead took is delimited: n bytes left of its
// length, or its chunks. Its Read is net/http's body's for the same
// framing: the last bytes come with io.EOF, a body cut short is
// io.ErrUnexpectedEOF, a chunked body's trailer is read at its end (into
// resp.Trailer).
type framing struct {
	n      int64
	chunks io.Reader
	resp   *http.Response
}

func (f *framing) read(br *bufio.Reader, p []byte) (int, error) {
	if f.chunks != nil {
		n, err := f.chunks.Read(p)
		if err == io.EOF {
			f.chunks = nil // read to its end: EOF from now on
			if terr := readTrailer(br, f.resp); terr != nil {
				err = terr
			}
		}
		return n, err
	}
	if f.n <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > f.n {
		p = p[:f.n]
	}
	n, err := br.Read(p)
	f.n -= int64(n)
	switch {
	case err == io.EOF && f.n > 0:
		err = io.ErrUnexpectedEOF
	case err == nil && n > 0 && f.n == 0:
		err = io.EOF
	}
	return n, err
}

// readTrailer reads what follows a chunked body's last chunk, as net/http's
// body.readTrailer does: an empty line, or trailer fields (merged into
// resp.Trailer).
func readTrailer(br *bufio.Reader, resp *http.Response) error {
	buf, err := br.Peek(2)
	if bytes.Equal(buf, singleCRLF) {
		br.Discard(2)
		return nil
	}
	if len(buf) < 2 {
		return errTrailerEOF
	}
	if err != nil {
		return err
	}
	if !seeUpcomingDoubleCRLF(br) {
		return errors.New("http: suspiciously long trailer after chunked body")
	}
	hdr, err := textproto.NewReader(br).ReadMIMEHeader()
	if err != nil {
		if err == io.EOF {
			return errTrailerEOF
		}
		return err
	}
	if resp.Trailer == nil {
		resp.Trailer = http.Header(hdr)
	} else {
		for k, vv := range hdr {
			resp.Trailer[k] = vv
		}
	}
	return nil
}

// seeUpcomingDoubleCRLF: the trailer ends within br's buffer (net/http's
// bound on a trailer's size).
func seeUpcomingDoubleCRLF(r *bufio.Reader) bool {
	for peekSize := 4; ; peekSize++ {
		buf, err := r.Peek(peekSize)
		if bytes.HasSuffix(buf, doubleCRLF) {
			return true
		}
		if err != nil {
			return false
		}
	}
}
