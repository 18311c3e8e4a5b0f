package server

// TEMPORARY: replaced by the strict reader from the form branch at merge.

import (
	"bytes"
	"errors"
	"io"
	"mime"
	"mime/multipart"

	"tailgate/server/apierr"
)

type formField struct {
	name, value     string
	filename, ctype string
	data            []byte
	isFile          bool
}

type form struct{ fields []formField }

func readForm(body []byte, ctype string) (*form, error) {
	mt, params, err := mime.ParseMediaType(ctype)
	if err != nil || mt != "multipart/form-data" || params["boundary"] == "" {
		return nil, apierr.BadRequest("", "send the audio as multipart/form-data")
	}
	mr := multipart.NewReader(bytes.NewReader(body), params["boundary"])
	f := &form{}
	for {
		part, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			return f, nil
		}
		if err != nil {
			return nil, apierr.BadRequest("", "malformed multipart body: %v", err)
		}
		v, err := io.ReadAll(part)
		if err != nil {
			return nil, apierr.BadRequest(part.FormName(), "malformed multipart field")
		}
		ff := formField{name: part.FormName(), filename: part.FileName(), ctype: part.Header.Get("Content-Type")}
		if ff.filename != "" {
			ff.isFile, ff.data = true, v
		} else {
			ff.value = string(v)
		}
		for _, g := range f.fields {
			if g.name == ff.name {
				return nil, apierr.BadRequest(ff.name, "%s is given twice", ff.name)
			}
		}
		f.fields = append(f.fields, ff)
	}
}

func (f *form) value(name string) (string, bool) {
	for _, g := range f.fields {
		if g.name == name && !g.isFile {
			return g.value, true
		}
	}
	return "", false
}

func (f *form) set(name, value string) {
	for i := range f.fields {
		if f.fields[i].name == name {
			f.fields[i] = formField{name: name, value: value}
			return
		}
	}
	f.fields = append(f.fields, formField{name: name, value: value})
}

func (f *form) del(name string) {
	out := f.fields[:0]
	for _, g := range f.fields {
		if g.name != name {
			out = append(out, g)
		}
	}
	f.fields = out
}

func (f *form) file() []byte {
	for _, g := range f.fields {
		if g.isFile {
			return g.data
		}
	}
	return nil
}

func (f *form) encode() ([]byte, string) {
	var b bytes.Buffer
	w := multipart.NewWriter(&b)
	for _, g := range f.fields {
		if g.isFile {
			pw, _ := w.CreateFormFile(g.name, g.filename)
			pw.Write(g.data)
			continue
		}
		w.WriteField(g.name, g.value)
	}
	w.Close()
	return b.Bytes(), w.FormDataContentType()
}
