package server

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/tailgate-dev/tailgate/server/apierr"
)

// A multipart/form-data body (the audio endpoints) is read once, strictly,
// and the engine is sent a form the gateway wrote itself. vLLM reads forms
// with Starlette and python-multipart, which read some forms differently
// from Go's mime/multipart: the last copy of a repeated field wins, the
// disposition type is not checked ("attachment; name=model" is the field
// model), a repeated disposition parameter keeps its last copy, a part
// named by filename*= only has no name. Go's reader takes the first copy,
// skips such parts, and silently decodes quoted-printable parts. So the
// gateway accepts only a form that every reader reads alike, and refuses
// the rest with a 400 naming the field:
//
//   - the request's Content-Type is exactly multipart/form-data with a
//     boundary (1–200 characters of RFC 2046's bchars) and at most
//     charset=utf-8 beside it (Starlette decodes fields with that charset);
//   - the body starts with the boundary line, every line break is CRLF, the
//     closing boundary ends it (a CRLF after it at most), and no part holds
//     a line that starts with the boundary;
//   - each part has one Content-Disposition, of type form-data, with a
//     non-empty name and optionally a filename, each parameter once, no
//     RFC 2231 (name*=) parameter, quoted values without '"', '\', ';' or
//     control characters; at most one Content-Type; no other header (no
//     Content-Transfer-Encoding: Go would decode it, Starlette would not);
//   - each name once in the whole form, file parts included; names,
//     filenames and text fields valid UTF-8; a text field at most 1 MiB
//     (Starlette's limit) and at most maxFormParts parts.
//
// encode then writes the fields the gateway decided on in a fresh form
// with a boundary of its own, so what the engine reads is what the gateway
// read.

const (
	maxFormParts     = 1000    // Starlette's max_fields and max_files
	maxFormFieldSize = 1 << 20 // Starlette's max_part_size for a text field
	maxFormHeaderLen = 4096    // python-multipart refuses longer header lines
)

// form is a multipart/form-data body read by readForm: its parts in order,
// each name once.
type form struct {
	parts []formPart
}

// formPart is one field of a form: a text field, or a file (a part with a
// filename parameter, even an empty one, as Starlette decides).
type formPart struct {
	name     string
	value    []byte // the text or the file's bytes
	file     bool
	filename string
	ctype    string // a file's Content-Type as sent; "" if none
}

// readForm reads body, whose request Content-Type is ctype, as a strict
// multipart form (see above). Its errors are 400s naming the field at
// fault ("" for the form as a whole). The parts' values alias body.
func readForm(body []byte, ctype string) (*form, error) {
	boundary, err := formBoundary(ctype)
	if err != nil {
		return nil, err
	}
	delim := "--" + boundary
	rest, ok := bytes.CutPrefix(body, []byte(delim))
	if !ok {
		return nil, apierr.BadRequest("", "the multipart body must start with its boundary line (--%s)", boundary)
	}
	f := &form{}
	sep := []byte("\r\n" + delim)
	for {
		if end, ok := bytes.CutPrefix(rest, []byte("--")); ok {
			if len(end) != 0 && string(end) != "\r\n" {
				return nil, apierr.BadRequest("", "the multipart body has data after its closing boundary; remove it")
			}
			return f, nil
		}
		if rest, ok = bytes.CutPrefix(rest, []byte("\r\n")); !ok {
			return nil, apierr.BadRequest("", "a multipart boundary line must end with CRLF or --")
		}
		if len(f.parts) == maxFormParts {
			return nil, apierr.BadRequest("", "the form has more than %d parts", maxFormParts)
		}
		var p formPart
		if rest, err = readPartHeaders(rest, &p); err != nil {
			return nil, err
		}
		i := bytes.Index(rest, sep)
		if i < 0 {
			return nil, apierr.BadRequest(p.name, "the multipart body ends inside the part %q; close it with --%s--", p.name, boundary)
		}
		p.value, rest = rest[:i], rest[i+len(sep):]
		if !bytes.HasPrefix(rest, []byte("\r\n")) && !bytes.HasPrefix(rest, []byte("--")) {
			return nil, apierr.BadRequest(p.name, "the part %q holds a line starting with the boundary; use a boundary that is not in the data", p.name)
		}
		if !p.file {
			if len(p.value) > maxFormFieldSize {
				return nil, apierr.BadRequest(p.name, "the form field %s is over %d bytes; send large data as a file", p.name, maxFormFieldSize)
			}
			if !utf8.Valid(p.value) {
				return nil, apierr.BadRequest(p.name, "the form field %s is not valid UTF-8", p.name)
			}
		}
		if f.part(p.name) != nil {
			return nil, apierr.BadRequest(p.name, "the form field %s is given twice; send it once", p.name)
		}
		f.parts = append(f.parts, p)
	}
}

// formBoundary checks a request's Content-Type and returns its boundary.
func formBoundary(ctype string) (string, error) {
	typ, params, ok := splitParams(ctype)
	if !ok || typ != "multipart/form-data" {
		return "", apierr.BadRequest("", "send the form as multipart/form-data with a boundary (got Content-Type %q)", ctype)
	}
	var boundary string
	for _, kv := range params {
		switch kv[0] {
		case "boundary":
			boundary = kv[1]
		case "charset":
			if !strings.EqualFold(kv[1], "utf-8") {
				return "", apierr.BadRequest("", "a form's charset must be utf-8, not %q", kv[1])
			}
		default:
			return "", apierr.BadRequest("", "the multipart Content-Type has a parameter %q the gateway does not read; send only boundary", kv[0])
		}
	}
	if len(boundary) == 0 || len(boundary) > 200 || strings.TrimLeft(boundary, bchars) != "" {
		return "", apierr.BadRequest("", "the multipart boundary must be 1 to 200 letters, digits or '()+_,-./:=?")
	}
	return boundary, nil
}

// bchars are the characters of a boundary (RFC 2046 §5.1.1, without space).
const bchars = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ'()+_,-./:=?"

// readPartHeaders reads a part's header lines up to the empty line into p
// and returns what follows. A refusal names the part's field when its
// Content-Disposition names one.
func readPartHeaders(rest []byte, p *formPart) ([]byte, error) {
	var disp, problem string
	var hasDisp, hasType bool
	for {
		i := bytes.Index(rest, []byte("\r\n"))
		if i < 0 {
			return nil, apierr.BadRequest("", "a form part's headers do not end")
		}
		line := rest[:i]
		rest = rest[i+2:]
		if len(line) == 0 {
			break
		}
		if problem != "" {
			continue
		}
		name, value, ok := strings.Cut(string(line), ":")
		value = strings.TrimLeft(value, " ")
		switch {
		case len(line) > maxFormHeaderLen || !utf8.Valid(line) || hasCTL(line):
			problem = fmt.Sprintf("has a header with control characters, invalid UTF-8 or over %d bytes", maxFormHeaderLen)
		case !ok:
			problem = "has a header line without a colon"
		case strings.EqualFold(name, "Content-Disposition") && !hasDisp:
			disp, hasDisp = value, true
		case strings.EqualFold(name, "Content-Type") && !hasType:
			p.ctype, hasType = value, true
			if strings.IndexFunc(value, func(r rune) bool { return r >= 0x7f }) >= 0 {
				problem = "has a Content-Type that is not ASCII"
			}
		case strings.EqualFold(name, "Content-Disposition"), strings.EqualFold(name, "Content-Type"):
			problem = "has two " + name + " headers; send one"
		case strings.EqualFold(name, "Content-Transfer-Encoding"):
			problem = "has a Content-Transfer-Encoding; send the data as it is, without one"
		default:
			problem = fmt.Sprintf("has a header %q the gateway does not forward; send only Content-Disposition and Content-Type", name)
		}
	}
	if !hasDisp && problem == "" {
		problem = `has no Content-Disposition; name it with Content-Disposition: form-data; name="..."`
	}
	typ, params, ok := splitParams(disp)
	var hasName bool
	for _, kv := range params {
		switch kv[0] {
		case "name":
			p.name, hasName = kv[1], true
		case "filename":
			p.filename, p.file = kv[1], true
		}
	}
	switch {
	case problem != "":
	case !ok:
		problem = fmt.Sprintf("has a malformed Content-Disposition %q (a parameter given twice, an RFC 2231 name*=, or a quoted value with '\"', '\\' or ';')", disp)
	case !strings.EqualFold(typ, "form-data"):
		problem = fmt.Sprintf("has the disposition %q; it must be form-data", typ)
	case !hasName || p.name == "":
		problem = `has no name; name it with Content-Disposition: form-data; name="..."`
	case len(params) != 1+btoi(p.file):
		problem = "has a Content-Disposition parameter other than name and filename"
	default:
		return rest, nil
	}
	if p.name == "" {
		return nil, apierr.BadRequest("", "a form part %s", problem)
	}
	return nil, apierr.BadRequest(p.name, "the form part %s %s", p.name, problem)
}

// splitParams splits a header value "type; key=value; key=\"value\"" as a
// strict reader does: keys are tokens (compared in lower case), each once,
// none with '*' (RFC 2231); a value is a token or a quoted string without
// '"', '\', ';' or control characters. ok is false for anything else; the
// parameters read until then are returned all the same (a repeated one with
// its last value, as Starlette reads it), to name the field in an error.
func splitParams(v string) (typ string, params [][2]string, ok bool) {
	pieces := strings.Split(v, ";")
	typ = strings.TrimSpace(pieces[0])
	ok = isToken(strings.ReplaceAll(typ, "/", ""))
	for _, piece := range pieces[1:] {
		key, val, found := strings.Cut(piece, "=")
		key, val = strings.ToLower(strings.TrimSpace(key)), strings.TrimSpace(val)
		if !found || !isToken(key) || strings.Contains(key, "*") {
			return typ, params, false
		}
		if len(val) >= 2 && val[0] == '"' && val[len(val)-1] == '"' {
			val = val[1 : len(val)-1]
			if strings.ContainsAny(val, "\"\\") || hasCTL([]byte(val)) {
				return typ, params, false
			}
		} else if !isToken(val) {
			return typ, params, false
		}
		seen := false
		for i := range params {
			if params[i][0] == key {
				params[i][1], seen, ok = val, true, false
			}
		}
		if !seen {
			params = append(params, [2]string{key, val})
		}
	}
	return typ, params, ok
}

// isToken reports whether s is a non-empty RFC 2045 token.
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c >= 0x7f || strings.IndexByte(`()<>@,;:\"/[]?=`, c) >= 0 {
			return false
		}
	}
	return true
}

func hasCTL(b []byte) bool {
	for _, c := range b {
		if c < ' ' || c == 0x7f {
			return true
		}
	}
	return false
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// part returns the part named name, or nil.
func (f *form) part(name string) *formPart {
	for i := range f.parts {
		if f.parts[i].name == name {
			return &f.parts[i]
		}
	}
	return nil
}

// value returns the text field name's value; ok is false when the form has
// no such field or name is a file.
func (f *form) value(name string) (v string, ok bool) {
	p := f.part(name)
	if p == nil || p.file {
		return "", false
	}
	return string(p.value), true
}

// set sets the text field name to value, in its place if the form has it
// (a file of that name becomes a text field), else at the end. name must be
// a name readForm would accept.
func (f *form) set(name, value string) {
	if p := f.part(name); p != nil {
		*p = formPart{name: name, value: []byte(value)}
		return
	}
	f.parts = append(f.parts, formPart{name: name, value: []byte(value)})
}

// del removes the field or file name, if the form has it.
func (f *form) del(name string) {
	for i := range f.parts {
		if f.parts[i].name == name {
			f.parts = append(f.parts[:i], f.parts[i+1:]...)
			return
		}
	}
}

// encode writes the form afresh: one part per field in order, each with
// only its Content-Disposition (and a file's filename and Content-Type),
// under a new random boundary that occurs in none of them. It returns the
// body and its Content-Type.
func (f *form) encode() (body []byte, ctype string) {
	boundary := f.newBoundary()
	n := len(boundary) + 8
	for _, p := range f.parts {
		n += len(boundary) + len(p.name) + len(p.filename) + len(p.ctype) + len(p.value) + 96
	}
	b := make([]byte, 0, n)
	for _, p := range f.parts {
		b = append(b, "--"...)
		b = append(b, boundary...)
		b = append(b, "\r\nContent-Disposition: form-data; name=\""...)
		b = append(b, p.name...)
		b = append(b, '"')
		if p.file {
			b = append(b, "; filename=\""...)
			b = append(b, p.filename...)
			b = append(b, '"')
			if p.ctype != "" {
				b = append(b, "\r\nContent-Type: "...)
				b = append(b, p.ctype...)
			}
		}
		b = append(b, "\r\n\r\n"...)
		b = append(b, p.value...)
		b = append(b, "\r\n"...)
	}
	b = append(b, "--"...)
	b = append(b, boundary...)
	b = append(b, "--\r\n"...)
	return b, "multipart/form-data; boundary=" + boundary
}

// newBoundary returns a random boundary found in none of f's parts.
func (f *form) newBoundary() string {
	for {
		var r [16]byte
		_, _ = rand.Read(r[:])
		boundary := "tailgate-" + hex.EncodeToString(r[:])
		clash := false
		for _, p := range f.parts {
			clash = clash || bytes.Contains(p.value, []byte(boundary)) || strings.Contains(p.name+p.filename+p.ctype, boundary)
		}
		if !clash {
			return boundary
		}
	}
}

// file returns the bytes of the form's file part named "file" (the audio),
// or of its first file part; nil if it has none.
func (f *form) file() []byte {
	if p := f.part("file"); p != nil && p.file {
		return p.value
	}
	for _, p := range f.parts {
		if p.file {
			return p.value
		}
	}
	return nil
}
