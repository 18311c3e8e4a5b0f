package strictjson

import (
	"bytes"
	"errors"
	"io"
	"testing"

	"github.com/go-json-experiment/json/jsontext"
)

// readsWithJSONText reads b as one JSON value with jsontext, the JSON v2
// tokenizer, which (unlike encoding/json) refuses duplicate object names on
// its own: a second oracle, for the duplicate check. Invalid UTF-8 is let
// through, as Check and encoding/json let it through. (Go 1.26 has
// encoding/json/jsontext only under GOEXPERIMENT=jsonv2; this is the same
// package from the module graph.)
func readsWithJSONText(b []byte) (dup bool, err error) {
	dec := jsontext.NewDecoder(bytes.NewReader(b), jsontext.AllowInvalidUTF8(true))
	if _, err = dec.ReadValue(); err != nil {
		var se *jsontext.SyntacticError
		return errors.As(err, &se) && errors.Is(err, jsontext.ErrDuplicateName), err
	}
	if _, err := dec.ReadToken(); err != io.EOF {
		return false, errors.New("more than one value")
	}
	return false, nil
}

// FuzzCheckAgreesWithJSONText: Check and jsontext accept the same bodies
// (within Check's depth bound), and refuse a repeated key alike.
func FuzzCheckAgreesWithJSONText(f *testing.F) {
	for _, s := range []string{`{}`, `[]`, `{"a":[1,2,{"b":null}]}`, `{"a":1,"a":2}`, `{"a":1,"\u0061":2}`,
		`{"a":{"b":1},"c":{"b":2}}`, `[{"x":1},{"x":1}]`, `"\u0041"`, `-0.0e-0`, `[[[[]]]]`, `{"a":"\"}`, `{"é":1,"\u00e9":2}`, `{"\ud800":1,"\udfff":2}`, "{\"\xff\":1,\"\xfe\":2}"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		err := Check(b, DefaultMaxDepth)
		var depth *DepthError
		var many *TooManyKeysError
		if errors.As(err, &depth) || errors.As(err, &many) {
			return // bounds jsontext does not have
		}
		dup, jerr := readsWithJSONText(b)
		var de *DuplicateKeyError
		switch {
		case err == nil && jerr != nil:
			t.Fatalf("Check accepted what jsontext refuses: %q: %v", b, jerr)
		case err != nil && jerr == nil:
			t.Fatalf("Check refused what jsontext accepts: %q: %v", b, err)
		case dup && !errors.As(err, &de):
			t.Fatalf("jsontext found a repeated name Check did not: %q: Check says %v", b, err)
		case errors.As(err, &de) && !dup:
			t.Fatalf("Check found a repeated key jsontext did not: %q: %v; jsontext: %v", b, err, jerr)
		}
	})
}
