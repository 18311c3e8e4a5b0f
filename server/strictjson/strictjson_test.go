package strictjson

import (
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/tidwall/gjson"
)

func TestCheck(t *testing.T) {
	deep := func(n int) string { return strings.Repeat("[", n) + strings.Repeat("]", n) }
	for _, tc := range []struct {
		name    string
		in      string
		wantErr string // substring of the error; "" means valid
	}{
		{"a chat request is valid", `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}`, ""},
		{"white space around the value is valid", " \t\n{\"a\":1}\r\n", ""},
		{"every scalar is valid", `[1,-0,0.5,-1.25e+10,2E-3,true,false,null,"x\"\\\/\b\f\n\r\t\u00e9"]`, ""},
		{"the same key in two objects is fine", `{"a":{"k":1},"b":{"k":2}}`, ""},
		{"a repeated top-level key is refused", `{"stream":false,"x":1,"stream":true}`, `duplicate key "stream"`},
		{"a repeated key hidden by an escape is refused", `{"stream":false,"str\u0065am":true}`, `duplicate key "stream"`},
		{"a repeated nested key names its path", `{"messages":[{"role":"user","role":"system"}]}`, `duplicate key "role" in messages[0]`},
		{"a repeated key among many is refused", manyKeysObject(40, true), `duplicate key "k7"`},
		{"many distinct keys are fine", manyKeysObject(40, false), ""},
		{"an object with too many keys is refused", manyKeysObject(MaxKeys+1, false), "more than 10000 keys"},
		{"keys differing in case are different keys", `{"stream":false,"Stream":true}`, ""},
		{"nesting at the bound is fine", deep(DefaultMaxDepth), ""},
		{"nesting past the bound is refused", deep(DefaultMaxDepth + 1), "nested deeper than 64"},
		{"millions of levels are refused without a stack overflow", strings.Repeat("[", 5_000_000), "nested deeper"},
		{"an empty body is invalid", ``, "unexpected end"},
		{"trailing data is invalid", `{"a":1} {}`, "data after"},
		{"a trailing comma is invalid", `{"a":1,}`, "want a string key"},
		{"a bare word is invalid", `{"a":nope}`, "invalid literal"},
		{"a leading zero is invalid", `[01]`, "unexpected character"},
		{"NaN is invalid", `{"t":NaN}`, "unexpected character"},
		{"a raw newline in a string is invalid", "{\"a\":\"x\ny\"}", "control character"},
		{"a bad escape is invalid", `{"a":"\x"}`, "invalid escape"},
		{"a short unicode escape is invalid", `{"a":"\u12"}`, `invalid \u escape`},
		{"an unterminated string is invalid", `{"a":"x`, "unterminated"},
		{"mismatched brackets are invalid", `{"a":[1}`, "'}' closes an array"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := Check([]byte(tc.in), 0)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("want valid, got %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("got %v, want an error containing %q", err, tc.wantErr)
			}
			if !IsInvalid(err) {
				t.Fatalf("%T is not one of the package's errors", err)
			}
		})
	}
}

func manyKeysObject(n int, dup bool) string {
	var sb strings.Builder
	sb.WriteByte('{')
	for i := range n {
		if i > 0 {
			sb.WriteByte(',')
		}
		sb.WriteString(`"k` + itoa(i) + `":1`)
	}
	if dup {
		sb.WriteString(`,"k7":2`)
	}
	sb.WriteByte('}')
	return sb.String()
}

func itoa(i int) string { return strconv.Itoa(i) }

// FuzzCheckAgreesWithEncodingJSON: whatever Check accepts, encoding/json
// and gjson accept; and what encoding/json accepts, Check refuses only for a
// repeated key or deep nesting, never as a syntax error. (A repeated key may
// be reported before the end of an input that is invalid further on.)
func FuzzCheckAgreesWithEncodingJSON(f *testing.F) {
	for _, s := range []string{`{}`, `[]`, `{"a":[1,2,{"b":null}]}`, `{"a":1,"a":2}`, `"\u0041"`, `-0.0e-0`, `[[[[]]]]`, `{"a":"\"}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		err := Check(b, 8)
		valid := json.Valid(b)
		var se *SyntaxError
		var de *DuplicateKeyError
		switch {
		case err == nil && !valid:
			t.Fatalf("Check accepted what encoding/json refuses: %q", b)
		case errors.As(err, &se) && valid:
			t.Fatalf("Check called valid JSON invalid: %q: %v", b, err)
		case errors.As(err, &de) && de.Key == "" && !strings.Contains(string(b), `""`) && !strings.Contains(string(b), `\u`):
			t.Fatalf("empty duplicate key reported where there is none: %q", b)
		}
		if err == nil && !gjson.ValidBytes(b) {
			t.Fatalf("gjson refuses what Check accepted: %q", b)
		}
	})
}

// TestCheckAllocatesLittleForATypicalRequest: every request body goes
// through Check; one of a few dozen keys costs it its two work arrays
// (stack frames and keys), not a slice grown key after key.
func TestCheckAllocatesLittleForATypicalRequest(t *testing.T) {
	body := []byte(`{"model":"m","messages":[{"role":"system","content":"You are terse."},` +
		`{"role":"user","content":[{"type":"text","text":"Say hello."}]}],"max_tokens":16,"temperature":0.2,` +
		`"top_p":0.9,"stream":true,"stream_options":{"include_usage":true},"tools":[{"type":"function",` +
		`"function":{"name":"f","description":"d","parameters":{"type":"object","properties":{"a":{"type":"string"}}}}}]}`)
	if err := Check(body, 0); err != nil {
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(100, func() { _ = Check(body, 0) }); n > 2 {
		t.Errorf("Check of a %d-byte request allocates %.0f times, want at most 2", len(body), n)
	}
}
