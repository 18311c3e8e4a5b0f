package sim

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestReadFormAsStarletteDoes pins how the engine reads the multipart forms
// whose reading differs between Go's mime/multipart and Starlette with
// python-multipart (the sources are cited in form.go); each case is what
// vLLM's parser yields for the body.
func TestReadFormAsStarletteDoes(t *testing.T) {
	const ct = "multipart/form-data; boundary=B"
	part := func(headers, data string) string { return "--B\r\n" + headers + "\r\n\r\n" + data + "\r\n" }
	cd := func(params string) string { return "Content-Disposition: form-data; " + params }
	for _, tc := range []struct {
		name, ctype, body string
		want              []FormItem // nil with wantErr
		wantErr           string
	}{
		{name: "the last copy of a field is kept beside the first",
			body: part(cd(`name="model"`), "cheap") + part(cd(`name="model"`), "premium") + "--B--\r\n",
			want: []FormItem{{Name: "model", Value: "cheap"}, {Name: "model", Value: "premium"}}},
		{name: "the disposition type is not checked",
			body: part(`Content-Disposition: attachment; name="model"`, "premium") + "--B--",
			want: []FormItem{{Name: "model", Value: "premium"}}},
		{name: "a repeated name parameter: the last wins",
			body: part(cd(`name="x"; name="model"`), "premium") + "--B--",
			want: []FormItem{{Name: "model", Value: "premium"}}},
		{name: "the last Content-Disposition header wins",
			body: part(cd(`name="x"`)+"\r\n"+cd(`name="model"`), "premium") + "--B--",
			want: []FormItem{{Name: "model", Value: "premium"}}},
		{name: "RFC 2231 parameters are ignored",
			body: part(cd(`name*=UTF-8''model; name="x"`), "v") + "--B--",
			want: []FormItem{{Name: "x", Value: "v"}}},
		{name: "a part named only by name* has no name",
			body: part(cd(`name*=UTF-8''model`), "v") + "--B--", wantErr: `"name" must be provided`},
		{name: "an empty filename makes a file",
			body: part(cd(`name="file"; filename=""`)+"\r\nContent-Type: audio/wav\r\nContent-Type: text/plain", "RIFF") + "--B--",
			want: []FormItem{{Name: "file", Value: "RIFF", File: true, ContentType: "audio/wav"}}},
		{name: "a transfer encoding is not decoded",
			body: part(cd(`name="model"`)+"\r\nContent-Transfer-Encoding: quoted-printable", "pre=6Dium") + "--B--",
			want: []FormItem{{Name: "model", Value: "pre=6Dium"}}},
		{name: "keys are lower-cased, quotes hide a semicolon, values are unescaped",
			body: part(`Content-Disposition: form-data; NAME="a;b\"c"`, "v") + "--B--",
			want: []FormItem{{Name: `a;b"c`, Value: "v"}}},
		{name: "leading line breaks and the epilogue are skipped",
			body: "\r\n\r\n" + part(cd(`name=model`), "m") + "--B--\r\ntrailing junk",
			want: []FormItem{{Name: "model", Value: "m"}}},
		{name: "a boundary not followed by CRLF or -- is data",
			body: part(cd(`name="p"`), "a\r\n--Bx\r\n--B \r\nb") + "--B--",
			want: []FormItem{{Name: "p", Value: "a\r\n--Bx\r\n--B \r\nb"}}},
		{name: "a body that ends inside a part keeps the parts before it",
			body: part(cd(`name="model"`), "m") + "--B\r\n" + cd(`name="stream"`) + "\r\n\r\ntrue",
			want: []FormItem{{Name: "model", Value: "m"}}},
		{name: "the request's charset decodes the fields",
			ctype: ct + "; charset=latin-1", body: part(cd(`name="prompt"`), "caf\xe9") + "--B--",
			want: []FormItem{{Name: "prompt", Value: "café"}}},
		{name: "undecodable UTF-8 is read as latin-1",
			body: part(cd(`name="prompt"`), "\xff") + "--B--",
			want: []FormItem{{Name: "prompt", Value: "ÿ"}}},
		{name: "a repeated boundary parameter: the last wins",
			ctype: "multipart/form-data; boundary=A; boundary=B", body: part(cd(`name="m"`), "x") + "--B--",
			want: []FormItem{{Name: "m", Value: "x"}}},
		{name: "a media type in other case is no form at all",
			ctype: "Multipart/Form-Data; boundary=B", body: part(cd(`name="model"`), "m") + "--B--",
			want: []FormItem{}},
		{name: "a header line folded with a tab is an error",
			body: part(cd(`name="m"`)+"\r\n\tx", "v") + "--B--", wantErr: "invalid character"},
		{name: "bare LF line ends are an error",
			body: "--B\n" + cd(`name="m"`) + "\n\nv\n--B--", wantErr: "CR at end of boundary"},
		{name: "a text part over 1 MiB is an error",
			body: part(cd(`name="prompt"`), strings.Repeat("a", 1<<20+1)) + "--B--", wantErr: "maximum size"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctype := tc.ctype
			if ctype == "" {
				ctype = ct
			}
			f, err := ReadForm([]byte(tc.body), ctype)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("got %v, %+v; want an error with %q", err, f, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(f.Items) != len(tc.want) {
				t.Fatalf("got %+v, want %+v", f.Items, tc.want)
			}
			for i := range tc.want {
				if f.Items[i] != tc.want[i] {
					t.Errorf("item %d: got %+v, want %+v", i, f.Items[i], tc.want[i])
				}
			}
		})
	}
}

// TestAudioReadsTheLastModelOfAForm: the engine serves the model named by a
// form's last model field, wherever its disposition says attachment.
func TestAudioReadsTheLastModelOfAForm(t *testing.T) {
	e, err := New(Config{Model: "premium"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(e.NewServer(nil).Handler)
	defer srv.Close()
	body := "--B\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\ncheap\r\n" +
		"--B\r\nContent-Disposition: attachment; name=\"model\"\r\n\r\npremium\r\n" +
		"--B\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\n\r\n" + string(wav(1)) + "\r\n--B--\r\n"
	resp, err := http.Post(srv.URL+"/v1/audio/transcriptions", "multipart/form-data; boundary=B", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: the engine did not read the last model, premium", resp.StatusCode)
	}
}
