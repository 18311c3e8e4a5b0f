package sim

import (
	"bytes"
	"errors"
	"strings"
	"unicode/utf8"
)

// vLLM reads a multipart form (the audio endpoints) with Starlette's
// MultiPartParser over python-multipart's MultipartParser, and FastAPI
// takes each field of the request model from the resulting FormData. The
// simulated engine reads forms the same way, so a gateway that reads a form
// differently from vLLM reads it differently from the simulated engine too
// (server's FuzzGatewayAndEngineReadFormsAlike). Sources:
//
//   - encode/starlette@cb8f84f5 starlette/requests.py (_get_form: only a
//     Content-Type whose type is exactly b"multipart/form-data" is parsed),
//     starlette/formparsers.py (MultiPartParser: charset from the request's
//     Content-Type, default utf-8, undecodable bytes read as latin-1; the
//     last Content-Disposition header of a part wins; a part without a name
//     parameter is an error; a part with a filename parameter, even an
//     empty one, is a file; a text part over 1 MiB is an error; every part
//     is kept, in order), starlette/datastructures.py (ImmutableMultiDict:
//     a name's last part wins; Headers.get: a file's first Content-Type
//     header wins);
//   - Kludex/python-multipart@bdb2b4f0 python_multipart/multipart.py
//     (parse_options_header, _parseparam: the disposition type is not
//     checked, parameters go to a dict, so the last copy wins, keys are
//     lower-cased, "key*" parameters are ignored; MultipartParser: leading
//     CR/LF skipped, CRLF line ends, header names are tokens, at most 8
//     headers of at most 4224 bytes a part, only spaces skipped before a
//     value, a part ends at CRLF--boundary followed by CRLF or "--",
//     anything after the closing boundary ignored, and a body that ends
//     early keeps the parts completed before it).

// Form is a multipart form as vLLM reads it: every part, in order.
type Form struct {
	Items []FormItem
}

// FormItem is one part of a Form.
type FormItem struct {
	Name        string
	Value       string // a text field's value or a file's bytes
	File        bool   // the part had a filename parameter
	Filename    string
	ContentType string // a file's Content-Type ("" if none)
}

// Get returns the last part named name, as FormData[name] does.
func (f *Form) Get(name string) (FormItem, bool) {
	for i := len(f.Items) - 1; i >= 0; i-- {
		if f.Items[i].Name == name {
			return f.Items[i], true
		}
	}
	return FormItem{}, false
}

// Value returns the text field name as FastAPI gives it to a request model:
// the last part's value, with an empty string taken as absent (the field's
// default). file is true when that last part is a file.
func (f *Form) Value(name string) (v string, ok, file bool) {
	it, ok := f.Get(name)
	if !ok || (!it.File && it.Value == "") {
		return "", false, false
	}
	return it.Value, true, it.File
}

const (
	formMaxPartSize   = 1 << 20    // MultiPartParser.max_part_size
	formMaxHeaders    = 8          // DEFAULT_MAX_HEADER_COUNT
	formMaxHeaderSize = 4096 + 128 // DEFAULT_MAX_HEADER_SIZE
	formMaxBoundary   = 256        // MAX_BOUNDARY_LENGTH
	formMaxParts      = 1000       // max_fields and max_files
)

// ReadForm reads body, sent with Content-Type ctype, as vLLM does. A body
// of another Content-Type is an empty form; errors are what Starlette
// answers with a 400.
func ReadForm(body []byte, ctype string) (*Form, error) {
	ctype = latin1String([]byte(ctype)) // Starlette's Headers decode latin-1
	typ, _ := parseOptionsHeader(ctype)
	switch typ {
	case "multipart/form-data":
	case "application/x-www-form-urlencoded":
		return nil, errors.New("the simulated engine does not read url-encoded forms")
	default:
		return &Form{}, nil
	}
	_, params := parseOptionsHeader(ctype)
	charset, ok := params["charset"]
	if !ok {
		charset = "utf-8"
	}
	switch strings.ReplaceAll(strings.ToLower(charset), "_", "-") {
	case "utf-8", "utf8", "u8", "utf":
		charset = "utf-8"
	case "latin-1", "latin1", "iso-8859-1", "iso8859-1", "l1", "8859", "cp819", "latin", "ascii", "us-ascii":
		// An ASCII decode that fails falls back to latin-1: the same text.
		charset = "latin-1"
	default:
		return nil, errors.New("the simulated engine does not model the charset " + charset)
	}
	boundary, ok := params["boundary"]
	if !ok {
		return nil, errors.New("Missing boundary in multipart.")
	}
	if len(boundary) > formMaxBoundary {
		return nil, errors.New("Boundary length exceeds maximum")
	}
	p := &formParser{charset: charset}
	if err := p.parse(body, append([]byte("\r\n--"), latin1Bytes(boundary)...)); err != nil {
		return nil, err
	}
	return &Form{Items: p.items}, nil
}

type formParser struct {
	charset     string
	items       []FormItem
	files       int
	fields      int
	disposition *string // the part's last Content-Disposition
	contentType *string // the part's first Content-Type
	headers     int
	cur         FormItem
}

// parse runs MultipartParser._internal_write over the whole body as one
// chunk; boundary is b"\r\n--" + the boundary.
func (p *formParser) parse(data, boundary []byte) error {
	i := 0
	// START: skip leading CR/LF to the next '-'.
	if i < len(data) && (data[i] == '\r' || data[i] == '\n') {
		j := bytes.IndexByte(data, '-')
		if j < 0 {
			return nil
		}
		i = j
	}
	if i >= len(data) {
		return nil
	}
	// START_BOUNDARY: "--boundary" then CRLF, or "--" for an empty form.
	for k := 2; k < len(boundary); k++ {
		if i >= len(data) {
			return nil
		}
		if data[i] != boundary[k] {
			return errors.New("Expected boundary character")
		}
		i++
	}
	if i >= len(data) {
		return nil
	}
	switch data[i] {
	case '-':
		if i+1 < len(data) && data[i+1] != '-' {
			return errors.New("Did not find - at end of boundary")
		}
		return nil
	case '\r':
		if i+1 < len(data) && data[i+1] != '\n' {
			return errors.New("Did not find LF at end of boundary")
		}
		i += 2
	default:
		return errors.New("Did not find CR at end of boundary")
	}
	for i < len(data) {
		p.beginPart()
		var err error
		if i, err = p.readHeaders(data, i); err != nil || i >= len(data) {
			return err
		}
		// PART_DATA: up to CRLF--boundary followed by CRLF or "--".
		start, from := i, i
		for {
			k := bytes.Index(data[from:], boundary)
			if k < 0 {
				return p.partData(data[start:]) // the body ends inside the part
			}
			k += from
			after := k + len(boundary)
			if after >= len(data) {
				return p.partData(data[start:k])
			}
			c := data[after]
			if c != '\r' && c != '-' {
				from = after
				continue
			}
			if after+1 >= len(data) {
				return p.partData(data[start:k])
			}
			if c == '\r' && data[after+1] == '\n' || c == '-' && data[after+1] == '-' {
				if err := p.partData(data[start:k]); err != nil {
					return err
				}
				p.items = append(p.items, p.cur) // on_part_end
				if c == '-' {
					return nil // END: the epilogue is discarded
				}
				i = after + 2
				break
			}
			from = after + 1
		}
	}
	return nil
}

func (p *formParser) beginPart() {
	p.cur = FormItem{}
	p.disposition, p.contentType, p.headers = nil, nil, 0
}

// readHeaders reads a part's header lines from data[i:] through the empty
// line, then runs on_headers_finished; it returns where the data starts,
// or len(data) if the body ends first.
func (p *formParser) readHeaders(data []byte, i int) (int, error) {
	for {
		if i >= len(data) {
			return i, nil
		}
		if data[i] == '\r' { // HEADERS_ALMOST_DONE
			if i+1 >= len(data) {
				return len(data), nil
			}
			if data[i+1] != '\n' {
				return 0, errors.New("Did not find LF at end of headers")
			}
			return i + 2, p.headersFinished()
		}
		p.headers++
		if p.headers > formMaxHeaders {
			return 0, errors.New("Maximum header count exceeded")
		}
		colon := bytes.IndexByte(data[i:], ':')
		end, size := len(data), len(data)-i
		if colon >= 0 {
			end, size = i+colon, colon+1
		}
		if size > formMaxHeaderSize {
			return 0, errors.New("Maximum header size exceeded")
		}
		for _, c := range data[i:end] {
			if !isPyToken(c) {
				return 0, errors.New("Found invalid character in header")
			}
		}
		if colon < 0 {
			return len(data), nil
		}
		if end == i {
			return 0, errors.New("Found 0-length header")
		}
		field := strings.ToLower(string(data[i:end]))
		i = end + 1
		for i < len(data) && data[i] == ' ' { // HEADER_VALUE_START
			size++
			if size > formMaxHeaderSize {
				return 0, errors.New("Maximum header size exceeded")
			}
			i++
		}
		cr := bytes.IndexByte(data[i:], '\r')
		if cr < 0 {
			return len(data), nil
		}
		if size+cr > formMaxHeaderSize {
			return 0, errors.New("Maximum header size exceeded")
		}
		value := latin1String(data[i : i+cr])
		i += cr + 1
		if i >= len(data) {
			return i, nil
		}
		if data[i] != '\n' {
			return 0, errors.New("Did not find LF character at end of header")
		}
		i++
		switch field { // on_header_end
		case "content-disposition":
			p.disposition = &value
		case "content-type":
			if p.contentType == nil {
				p.contentType = &value
			}
		}
	}
}

// headersFinished is MultiPartParser.on_headers_finished.
func (p *formParser) headersFinished() error {
	var disp string
	if p.disposition != nil {
		disp = *p.disposition
	}
	_, options := parseOptionsHeader(disp)
	name, ok := options["name"]
	if !ok {
		return errors.New(`The Content-Disposition header field "name" must be provided.`)
	}
	p.cur.Name = p.decode(latin1Bytes(name))
	if fn, ok := options["filename"]; ok {
		p.files++
		if p.files > formMaxParts {
			return errors.New("Too many files.")
		}
		p.cur.File, p.cur.Filename = true, p.decode(latin1Bytes(fn))
		if p.contentType != nil {
			p.cur.ContentType = *p.contentType
		}
		return nil
	}
	p.fields++
	if p.fields > formMaxParts {
		return errors.New("Too many fields.")
	}
	return nil
}

func (p *formParser) partData(b []byte) error {
	if !p.cur.File && len(b) > formMaxPartSize {
		return errors.New("Part exceeded maximum size of 1024KB.")
	}
	if p.cur.File {
		p.cur.Value = string(b)
	} else {
		p.cur.Value = p.decode(b)
	}
	return nil
}

// decode is _user_safe_decode: the charset, else latin-1.
func (p *formParser) decode(b []byte) string {
	if p.charset == "utf-8" && utf8.Valid(b) {
		return string(b)
	}
	return latin1String(b)
}

// parseOptionsHeader is python-multipart's parse_options_header over a
// str: the type (lower-cased only when there are no parameters) and the
// parameters, the last copy of each winning.
func parseOptionsHeader(value string) (string, map[string]string) {
	if value == "" {
		return "", map[string]string{}
	}
	if !strings.Contains(value, ";") {
		return strings.TrimSpace(pyLower(value)), map[string]string{}
	}
	plist := pyParseParam(value)
	options := map[string]string{}
	for _, seg := range plist[1:] {
		key, val, _ := strings.Cut(seg, "=")
		if strings.Contains(key, "*") {
			continue
		}
		if len(val) >= 2 && val[0] == '"' && val[len(val)-1] == '"' {
			val = strings.ReplaceAll(strings.ReplaceAll(val[1:len(val)-1], `\\`, `\`), `\"`, `"`)
		}
		if r := []rune(val); key == "filename" && (len(r) >= 3 && string(r[1:3]) == `:\` || strings.HasPrefix(val, `\\`)) {
			val = val[strings.LastIndex(val, `\`)+1:]
		}
		options[key] = val
	}
	return plist[0], options
}

// pyParseParam is _parseparam (email.message._parseparam): split at ';'
// outside double quotes, keys lower-cased, around '=' trimmed. Indices are
// Python's, so str.find and str.count keep their semantics.
func pyParseParam(s string) []string {
	s = ";" + s
	var plist []string
	start := 0
	for pyFind(s, ";", start, len(s)) == start {
		start++
		end := pyFind(s, ";", start, len(s))
		ind, diff := start, 0
		for end > 0 {
			diff += pyCount(s, `"`, ind, end) - pyCount(s, `\"`, ind, end)
			if diff%2 == 0 {
				break
			}
			end, ind = ind, pyFind(s, ";", end+1, len(s))
		}
		if end < 0 {
			end = len(s)
		}
		var f string
		if i := pyFind(s, "=", start, end); i == -1 {
			f = pySlice(s, start, end)
		} else {
			f = pyLower(strings.TrimRight(pySlice(s, start, i), pyWhitespace)) + "=" + strings.TrimLeft(pySlice(s, i+1, end), pyWhitespace)
		}
		plist = append(plist, strings.Trim(f, pyWhitespace))
		start = end
	}
	return plist
}

// pyWhitespace is what str.strip() removes from ASCII text (the header was
// decoded as latin-1; U+0085 and U+00A0 are whitespace too).
const pyWhitespace = " \t\n\r\x0b\x0c\x1c\x1d\x1e\x1f\u0085\u00a0"

// pyBounds resolves a Python slice's start and end against n.
func pyBounds(start, end, n int) (int, int) {
	if start < 0 {
		start = max(start+n, 0)
	}
	if end < 0 {
		end = max(end+n, 0)
	}
	return min(start, n), min(end, n)
}

func pySlice(s string, start, end int) string {
	start, end = pyBounds(start, end, len(s))
	if start >= end {
		return ""
	}
	return s[start:end]
}

// pyFind is s.find(sub, start, end); -1 if absent.
func pyFind(s, sub string, start, end int) int {
	a, b := pyBounds(start, end, len(s))
	if a > b {
		return -1
	}
	if i := strings.Index(s[a:b], sub); i >= 0 {
		return a + i
	}
	return -1
}

// pyCount is s.count(sub, start, end).
func pyCount(s, sub string, start, end int) int {
	a, b := pyBounds(start, end, len(s))
	if a > b {
		return 0
	}
	return strings.Count(s[a:b], sub)
}

// pyLower lower-cases as str.lower() does for latin-1 text.
func pyLower(s string) string { return strings.ToLower(s) }

func isPyToken(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

// latin1String decodes b as latin-1.
func latin1String(b []byte) string {
	r := make([]rune, len(b))
	for i, c := range b {
		r[i] = rune(c)
	}
	return string(r)
}

// latin1Bytes encodes s, a latin-1 decoded string, back to its bytes.
func latin1Bytes(s string) []byte {
	b := make([]byte, 0, len(s))
	for _, r := range s {
		b = append(b, byte(r))
	}
	return b
}
