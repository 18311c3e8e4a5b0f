package strictjson

import (
	"encoding/binary"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/tidwall/gjson"
)

// special must find every quote, backslash and control byte at every place
// in a word, and nothing else.
func TestSpecialFindsExactlyTheSpecialBytes(t *testing.T) {
	for _, fill := range []byte{'a', ' ', 0x7f, 0x80, 0xff, 0x21, '\\' + 1, '"' + 1} {
		for v := range 256 {
			for pos := range 8 {
				var w [8]byte
				for i := range w {
					w[i] = fill
				}
				w[pos] = byte(v)
				want := v == '"' || v == '\\' || v < 0x20
				if got := special(binary.LittleEndian.Uint64(w[:])) != 0; got != want {
					t.Fatalf("byte %#x at %d among %#x: special %v, want %v", v, pos, fill, got, want)
				}
			}
		}
	}
}

// A long string is checked eight bytes at a time: what ends or breaks it
// is found at every offset, with the offset the byte-wise scan gave.
func TestCheckLongStringsAtEveryOffset(t *testing.T) {
	for n := range 40 {
		plain := strings.Repeat("x", n)
		for _, tc := range []struct {
			body    string
			wantErr string
		}{
			{`{"a":"` + plain + `"}`, ""},
			{`{"a":"` + plain + `\"\\\n\u00e9"}`, ""},
			{`{"a":"` + plain + "\x01" + `"}`, "invalid JSON at byte " + strconv.Itoa(6+n) + ": control character in a string"},
			{`{"a":"` + plain + `\q"}`, "invalid JSON at byte " + strconv.Itoa(7+n) + ": invalid escape"},
			{`{"a":"` + plain, "invalid JSON at byte " + strconv.Itoa(6+n) + ": unterminated string"},
			{`{"a":"` + plain + `\`, "invalid JSON at byte " + strconv.Itoa(7+n) + ": unterminated string"},
		} {
			err := Check([]byte(tc.body), 0)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("%q: %v", tc.body, err)
			case tc.wantErr != "" && (err == nil || err.Error() != tc.wantErr):
				t.Fatalf("%q: got %v, want %s", tc.body, err, tc.wantErr)
			}
		}
	}
}

// walkBodies are checked bodies whose members the walk must find as gjson
// finds them.
var walkBodies = []string{
	`{}`, `[]`, ` { } `, `[ ]`,
	`{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}`,
	`{"a":"x\"y\\","b":"\\\\","c":"\\\"","d":[1,-2.5e3,true,false,null,{"e":[[]]}],"f":{}}`,
	` { "mod\u0065l" : "m\u00e9" , "n" : 2 , "p" : [ "a" , [1, 2] , { "k" : "]}" } ] } `,
	"{\"t\":\"tab\\tq\\\"\",\"u\":\"\xff\xfe\",\"\xffk\":1}",
	`["a",{"b":"c"},[1,[2,[3]]],"}]",-0,1e5]`,
	`{"content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"data:x"}},"s",{"t\u0079pe":"input_audio"}]}`,
}

// Members and Elements find what gjson's walk of the same value finds: the
// same keys (escapes decoded) and the same values byte for byte, nested
// values included.
func TestWalkFindsWhatGJSONFinds(t *testing.T) {
	for _, body := range walkBodies {
		if err := Check([]byte(body), 0); err != nil {
			t.Fatalf("%q: %v", body, err)
		}
		compareWalk(t, body)
	}
}

func compareWalk(t *testing.T, raw string) {
	t.Helper()
	v := gjson.Parse(raw)
	var want [][2]string
	v.ForEach(func(k, v gjson.Result) bool {
		want = append(want, [2]string{k.Str, v.Raw})
		return true
	})
	var got [][2]string
	switch {
	case v.IsObject():
		Members([]byte(raw), func(k, v []byte) bool {
			got = append(got, [2]string{string(k), string(v)})
			return true
		})
	case v.IsArray():
		Elements([]byte(raw), func(v []byte) bool {
			got = append(got, [2]string{"", string(v)})
			return true
		})
	default:
		return
	}
	if len(got) != len(want) {
		t.Fatalf("%q: walk found %q, gjson %q", raw, got, want)
	}
	for i := range got {
		// Of an escaped key with invalid UTF-8 in it, gjson keeps the bad
		// bytes, the walk (as Check compares keys) reads each as U+FFFD.
		if got[i][1] != want[i][1] || got[i][0] != want[i][0] && utf8.ValidString(want[i][0]) {
			t.Fatalf("%q: member %d: walk %q, gjson %q", raw, i, got[i], want[i])
		}
		compareWalk(t, got[i][1])
	}
}

// FuzzWalkAgreesWithGJSON: on every body Check accepts, the walk finds
// what gjson finds.
func FuzzWalkAgreesWithGJSON(f *testing.F) {
	for _, s := range walkBodies {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if Check(b, DefaultMaxDepth) != nil {
			return
		}
		compareWalk(t, string(b))
	})
}

// BenchmarkCheckLongString: the strict check of a 256 KB prompt.
func BenchmarkCheckLongString(b *testing.B) {
	body := []byte(`{"messages":[{"role":"user","content":"` + strings.Repeat("The quick brown fox jumps over the lazy dog. ", 256<<10/45) + `"}]}`)
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if err := Check(body, 0); err != nil {
			b.Fatal(err)
		}
	}
}
