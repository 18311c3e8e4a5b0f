package server

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/tailgate-dev/tailgate/server/apierr"
	"github.com/tailgate-dev/tailgate/serving/sim"
)

const formCtype = "multipart/form-data; boundary=B"

// formPartOf is one part of a test form: its header lines and data.
func formPartOf(headers, data string) string { return "--B\r\n" + headers + "\r\n\r\n" + data + "\r\n" }

func dispo(params string) string { return "Content-Disposition: form-data; " + params }

var formFile = formPartOf(dispo(`name="file"; filename="a.wav"`)+"\r\nContent-Type: audio/wav", tinyWAV)

// tinyWAV is a valid WAV file of no samples: RIFF, WAVE, fmt (16 kHz 16-bit
// mono PCM) and an empty data chunk.
const tinyWAV = "RIFF\x24\x00\x00\x00WAVEfmt \x10\x00\x00\x00\x01\x00\x01\x00\x80\x3e\x00\x00\x00\x7d\x00\x00\x02\x00\x10\x00data\x00\x00\x00\x00"

// formSeeds are forms once read one way by the gateway and another by the
// engine (issue 27), plus ordinary ones.
var formSeeds = []struct{ ctype, body string }{
	{formCtype, formPartOf(dispo(`name="model"`), "m") + formFile + "--B--\r\n"},
	{formCtype, formPartOf(dispo(`name="model"`), "m") + formPartOf(dispo(`name="stream"`), "TRUE") + formFile + "--B--\r\n"},
	{formCtype, formPartOf(dispo(`name="model"`), "cheap") + formPartOf(dispo(`name="model"`), "premium") + formFile + "--B--\r\n"},
	{formCtype, formPartOf(dispo(`name="model"`), "cheap") + formPartOf(`Content-Disposition: attachment; name="model"`, "premium") + formFile + "--B--\r\n"},
	{formCtype, formPartOf(dispo(`name="x"; name="model"`), "premium") + formPartOf(dispo(`name="model"`), "cheap") + formFile + "--B--\r\n"},
	{formCtype, formPartOf(dispo(`name="model"`)+"\r\n"+dispo(`name="x"`), "cheap") + formFile + "--B--\r\n"},
	{formCtype, formPartOf(dispo(`name*=UTF-8''model; name="x"`), "premium") + formPartOf(dispo(`name="model"`), "cheap") + formFile + "--B--\r\n"},
	{formCtype, formPartOf(dispo(`name="model"`)+"\r\nContent-Transfer-Encoding: quoted-printable", "pre=6Dium") + formFile + "--B--\r\n"},
	{formCtype, formPartOf(dispo(`name="model"; filename=""`), "premium") + formFile + "--B--\r\n"},
	{formCtype, formPartOf(dispo(`name="model"`), "m") + formPartOf("", "x") + formFile + "--B--\r\n"},
	{formCtype, "\r\n" + formPartOf(dispo(`name="model"`), "m") + formFile + "--B--\r\n" + formPartOf(dispo(`name="model"`), "premium")},
	{formCtype, formPartOf(dispo(`name="model"`), "m\r\n--B \r\n"+dispo(`name="model"`)+"\r\n\r\npremium") + formFile + "--B--"},
	{formCtype + "; charset=latin-1", formPartOf(dispo(`name="model"`), "m\xe9") + formFile + "--B--\r\n"},
	{"multipart/form-data; boundary=A; boundary=B", formPartOf(dispo(`name="model"`), "m") + formFile + "--B--\r\n"},
	{"Multipart/Form-Data; boundary=B", formPartOf(dispo(`name="model"`), "m") + formFile + "--B--\r\n"},
	{formCtype, formPartOf(`Content-Disposition: form-data; name="a;b"`, "v") + formPartOf(dispo(`name=model`), "m") + formFile + "--B--\r\n"},
	{formCtype, formPartOf(dispo(`NAME="model"`), "m") + formPartOf(dispo(`name="prompt"`), "caf\xc3\xa9") + formFile + "--B--\r\n"},
}

// FuzzGatewayAndEngineReadFormsAlike feeds the same multipart body to the
// gateway's reader and to the engine's (the simulated engine reads forms as
// vLLM's Starlette and python-multipart do: every part, the last of a name
// wins, the disposition type unchecked). Whenever the gateway accepts a
// form, the engine must read the same parts from it, and from the form the
// gateway forwards the same parts with the model and stream the gateway
// decided.
func FuzzGatewayAndEngineReadFormsAlike(f *testing.F) {
	for _, s := range formSeeds {
		f.Add(s.ctype, []byte(s.body))
	}
	f.Fuzz(func(t *testing.T, ctype string, body []byte) {
		read, err := readForm(body, ctype)
		if err != nil {
			return // refused: the engine never sees it
		}
		var pr parsedRequest
		fwdType, err := readAudioForm(&pr, body, ctype)
		if err != nil || pr.model == "" {
			return // refused for its model or stream
		}
		orig, err := sim.ReadForm(body, ctype)
		if err != nil {
			t.Fatalf("the gateway accepts a form the engine refuses (%v)\nctype %q\nbody %q", err, ctype, body)
		}
		if diff := formDiff(read, orig); diff != "" {
			t.Fatalf("the engine reads the sent form otherwise: %s\nctype %q\nbody %q", diff, ctype, body)
		}
		fwd, err := sim.ReadForm(pr.body, fwdType)
		if err != nil {
			t.Fatalf("the engine refuses the forwarded form (%v)\nforwarded %q", err, pr.body)
		}
		decided, _ := readForm(pr.body, fwdType)
		if diff := formDiff(decided, fwd); diff != "" {
			t.Fatalf("the engine reads the forwarded form otherwise: %s\nforwarded %q", diff, pr.body)
		}
		if m, _, _ := fwd.Value("model"); m != pr.model {
			t.Fatalf("model: gateway %q, engine %q\nbody %q", pr.model, m, body)
		}
		if s, _, _ := fwd.Value("stream"); (s == "true") != pr.stream {
			t.Fatalf("stream: gateway %v, engine %q\nbody %q", pr.stream, s, body)
		}
		if u, _, _ := fwd.Value("stream_include_usage"); pr.stream && u != "true" {
			t.Fatalf("a stream forwarded without stream_include_usage: %q\nbody %q", u, body)
		}
		// The fields the gateway decides: the rest go as they came.
		decides := func(name string) bool {
			switch name {
			case "model", "stream", "stream_include_usage", "stream_continuous_usage_stats", "priority", "max_completion_tokens":
				return true
			}
			return false
		}
		others := func(f *form) (n int) {
			for _, p := range f.parts {
				if !decides(p.name) {
					n++
				}
			}
			return n
		}
		for _, p := range read.parts {
			if decides(p.name) {
				continue
			}
			if q := decided.part(p.name); q == nil || !bytes.Equal(q.value, p.value) || q.file != p.file || q.filename != p.filename {
				t.Fatalf("the forwarded form changed %s\nbody %q\nforwarded %q", p.name, body, pr.body)
			}
		}
		if others(decided) != others(read) {
			t.Fatalf("the forwarded form has %d parts the gateway did not decide, the sent one %d", others(decided), others(read))
		}
	})
}

// formDiff says how the engine's reading e of a form differs from the
// gateway's g, or "".
func formDiff(g *form, e *sim.Form) string {
	if len(g.parts) != len(e.Items) {
		return "a different number of parts"
	}
	for i, p := range g.parts {
		it := e.Items[i]
		ctype := ""
		if p.file {
			ctype = p.ctype
		}
		if it.Name != p.name || it.Value != string(p.value) || it.File != p.file || it.Filename != p.filename || it.ContentType != ctype {
			return "part " + p.name
		}
	}
	return ""
}

// TestMultipartAmbiguitiesAreRefused: each form a reader could read two
// ways is refused with a 400 naming the field (the form as a whole: none).
func TestMultipartAmbiguitiesAreRefused(t *testing.T) {
	for _, tc := range []struct {
		name, ctype, body string
		param             string
	}{
		{"a repeated field", formCtype, formPartOf(dispo(`name="model"`), "cheap") + formPartOf(dispo(`name="model"`), "premium") + formFile + "--B--", "model"},
		{"a repeated file", formCtype, formPartOf(dispo(`name="model"`), "m") + formFile + formFile + "--B--", "file"},
		{"a field repeated as a file", formCtype, formPartOf(dispo(`name="model"`), "m") + formPartOf(dispo(`name="model"; filename="x"`), "premium") + formFile + "--B--", "model"},
		{"an attachment disposition", formCtype, formPartOf(dispo(`name="model"`), "cheap") + formPartOf(`Content-Disposition: attachment; name="model"`, "premium") + formFile + "--B--", "model"},
		{"a repeated name parameter", formCtype, formPartOf(dispo(`name="x"; name="model"`), "premium") + formFile + "--B--", "model"},
		{"a repeated filename parameter", formCtype, formPartOf(dispo(`name="file"; filename="a"; filename="b"`), "RIFF") + "--B--", "file"},
		{"two Content-Disposition headers", formCtype, formPartOf(dispo(`name="model"`)+"\r\n"+dispo(`name="x"`), "m") + "--B--", "model"},
		{"an RFC 2231 name", formCtype, formPartOf(dispo(`name*=UTF-8''model`), "premium") + "--B--", ""},
		{"an RFC 2231 filename", formCtype, formPartOf(dispo(`name="file"; filename*=UTF-8''a.wav`), "RIFF") + "--B--", "file"},
		{"a quoted-printable part", formCtype, formPartOf(dispo(`name="model"`)+"\r\nContent-Transfer-Encoding: quoted-printable", "pre=6Dium") + "--B--", "model"},
		{"a base64 part", formCtype, formPartOf(dispo(`name="file"; filename="a.wav"`)+"\r\nContent-Transfer-Encoding: base64", "UklGRg==") + "--B--", "file"},
		{"a part without a name", formCtype, formPartOf(`Content-Disposition: form-data`, "x") + "--B--", ""},
		{"a part with an empty name", formCtype, formPartOf(dispo(`name=""`), "x") + "--B--", ""},
		{"a part without a disposition", formCtype, formPartOf("Content-Type: text/plain", "x") + "--B--", ""},
		{"a folded header", formCtype, formPartOf(dispo(`name="model"`)+"\r\n\tx", "m") + "--B--", "model"},
		{"a quoted value with a backslash", formCtype, formPartOf(dispo(`name="mo\"del"`), "m") + "--B--", ""},
		{"a boundary line inside a part", formCtype, formPartOf(dispo(`name="model"`), "m\r\n--B \r\n"+dispo(`name="model"`)+"\r\n\r\npremium") + "--B--", "model"},
		{"a preamble", formCtype, "\r\n" + formPartOf(dispo(`name="model"`), "m") + "--B--", ""},
		{"an epilogue", formCtype, formPartOf(dispo(`name="model"`), "m") + "--B--\r\n" + formPartOf(dispo(`name="model"`), "premium"), ""},
		{"bare LF line ends", formCtype, "--B\n" + dispo(`name="model"`) + "\n\nm\n--B--", ""},
		{"a body that does not end", formCtype, formPartOf(dispo(`name="model"`), "m"), "model"},
		{"a field that is not UTF-8", formCtype, formPartOf(dispo(`name="model"`), "m\xff") + "--B--", "model"},
		{"a charset other than utf-8", formCtype + "; charset=latin-1", formPartOf(dispo(`name="model"`), "m") + "--B--", ""},
		{"a repeated boundary", "multipart/form-data; boundary=A; boundary=B", formPartOf(dispo(`name="model"`), "m") + "--B--", ""},
		{"a media type in capitals", "Multipart/Form-Data; boundary=B", formPartOf(dispo(`name="model"`), "m") + "--B--", ""},
		{"no boundary", "multipart/form-data", formPartOf(dispo(`name="model"`), "m") + "--B--", ""},
		{"model as a file", formCtype, formPartOf(dispo(`name="model"; filename="m"`), "premium") + formFile + "--B--", "model"},
		{"stream not a boolean", formCtype, formPartOf(dispo(`name="model"`), "m") + formPartOf(dispo(`name="stream"`), "1") + "--B--", "stream"},
	} {
		var pr parsedRequest
		_, err := readAudioForm(&pr, []byte(tc.body), tc.ctype)
		var ae *apierr.Error
		if !errors.As(err, &ae) || ae.Status != 400 || ae.Param != tc.param {
			t.Errorf("%s: got %v (param %q), want a 400 naming %q", tc.name, err, paramOf(ae), tc.param)
		} else if strings.TrimSpace(ae.Message) == "" {
			t.Errorf("%s: a 400 without a message", tc.name)
		}
	}
	// The ordinary form is read: model and stream, the file as sent.
	var pr parsedRequest
	ctype, err := readAudioForm(&pr, []byte(formSeeds[1].body), formCtype)
	if err != nil || pr.model != "m" || !pr.stream || !strings.HasPrefix(ctype, "multipart/form-data; boundary=tailgate-") {
		t.Fatalf("an ordinary form: %v %+v %q", err, pr, ctype)
	}
	if !bytes.Contains(pr.body, []byte("name=\"stream\"\r\n\r\ntrue\r\n")) || !bytes.Contains(pr.body, []byte(tinyWAV)) {
		t.Fatalf("forwarded %q", pr.body)
	}
}

func paramOf(ae *apierr.Error) string {
	if ae == nil {
		return ""
	}
	return ae.Param
}

// TestFormEditsAndEncodes pins the form's small API: set replaces in place
// or appends, del removes, encode writes exactly the fields in order.
func TestFormEditsAndEncodes(t *testing.T) {
	f, err := readForm([]byte(formSeeds[1].body), formCtype)
	if err != nil {
		t.Fatal(err)
	}
	f.set("model", "other")
	f.set("stream_include_usage", "true")
	f.del("stream")
	body, ctype := f.encode()
	g, err := readForm(body, ctype)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range g.parts {
		names = append(names, p.name)
	}
	if got := strings.Join(names, ","); got != "model,file,stream_include_usage" {
		t.Fatalf("fields %s", got)
	}
	if v, ok := g.value("model"); !ok || v != "other" {
		t.Fatalf("model %q", v)
	}
	if p := g.part("file"); p == nil || !p.file || p.filename != "a.wav" || p.ctype != "audio/wav" || string(p.value) != tinyWAV {
		t.Fatalf("file %+v", p)
	}
}

// readAudioForm reads an audio request's form as the pipeline does
// (readAudio) into pr and returns the forwarded form's Content-Type.
func readAudioForm(pr *parsedRequest, body []byte, ctype string) (string, error) {
	got, err := readAudio(endpoint{path: "/v1/audio/transcriptions"}, body, ctype, parseLimits{defaultMax: func(string) int64 { return 16 }})
	if err != nil {
		return "", err
	}
	*pr = *got
	return got.ctype, nil
}
