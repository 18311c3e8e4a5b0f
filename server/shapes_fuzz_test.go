package server

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/tailgate-dev/tailgate/serving/sim"
)

// FuzzShapesReserveWhatTheEngineBills builds bodies that mix the members of
// each endpoint's request union (every key field of the table, present or
// not, each a string or a list of strings of fuzzed sizes), reads each as
// the gateway does and sends what it forwards to the simulated engine:
// whenever the gateway accepts a body, the engine bills no more prompt
// tokens than the gateway reserved.
func FuzzShapesReserveWhatTheEngineBills(f *testing.F) {
	eng, err := sim.New(sim.Config{TTFT: time.Microsecond, TTFTSigma: -1, MaxModelLen: 1 << 22}, nil)
	if err != nil {
		f.Fatal(err)
	}
	// Seeds the engine accepts (one member each) and one naming them all.
	f.Add(uint8(2), uint16(0b11), []byte{3, 50, 20, 10})                                    // queries + documents
	f.Add(uint8(2), uint16(0b101), []byte{3, 50, 0, 0, 20, 10})                             // queries + items
	f.Add(uint8(2), uint16(0b11000), []byte{0, 0, 0, 0, 0, 0, 3, 50, 20, 10})               // data_1 + data_2
	f.Add(uint8(2), uint16(0b1100000), []byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 3, 50, 20, 10}) // text_1 + text_2
	f.Add(uint8(2), uint16(0b1111111), []byte{9, 9, 9, 9, 9, 9})                            // every member at once
	f.Add(uint8(1), uint16(0b11), []byte{3, 50, 20, 10})                                    // rerank
	f.Add(uint8(0), uint16(0b1), []byte{20, 10})                                            // embeddings input
	f.Add(uint8(0), uint16(0b10), []byte{0, 0, 30, 20})                                     // embeddings messages
	f.Fuzz(func(t *testing.T, which uint8, mask uint16, sizes []byte) {
		sh := &shapes[int(which)%len(shapes)]
		var keys []string
		for _, m := range sh.members {
			for _, k := range m.keys {
				if !contains(keys, k) {
					keys = append(keys, k)
				}
			}
		}
		size := func(i int) int {
			if len(sizes) == 0 {
				return 1
			}
			return int(sizes[i%len(sizes)])
		}
		var b strings.Builder
		b.WriteString(`{"model":"tailgate-sim"`)
		for i, k := range keys {
			if mask&(1<<i) == 0 {
				continue
			}
			b.WriteString(`,"` + k + `":`)
			n, l := size(2*i), size(2*i+1)
			switch {
			case k == "messages":
				b.WriteString(`[{"role":"user","content":` + strconv.Quote(strings.Repeat("m", n*l)) + `}]`)
			case k == "tokens":
				b.WriteString(`[1,2,3]`)
			case n%3 == 0 || k == "query" || k == "prompt": // one string
				b.WriteString(strconv.Quote(strings.Repeat("x", l*8)))
			default: // a list of n%40 strings
				items := make([]string, n%40)
				for j := range items {
					items[j] = strconv.Quote(strings.Repeat("y", l*(j%3+1)))
				}
				b.WriteString("[" + strings.Join(items, ",") + "]")
			}
		}
		b.WriteString("}")
		body := []byte(b.String())
		var ep endpoint
		for _, e := range endpoints {
			if e.path == sh.paths[0] {
				ep = e
			}
		}
		lim := parseLimits{maxDepth: 64, mediaPart: DefaultMediaPartTokens, defaultMax: func(string) int64 { return 16 }}
		pr, err := ep.read(ep, body, "application/json", lim)
		if err != nil {
			return // refused: the engine never sees it
		}
		req := httptest.NewRequest(http.MethodPost, ep.path, strings.NewReader(string(pr.body)))
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		eng.Handler().ServeHTTP(rec, req)
		if rec.Code != http.StatusOK {
			return // the engine refused it: nothing billed
		}
		u := gjson.GetBytes(rec.Body.Bytes(), "usage")
		billed := max(u.Get("prompt_tokens").Int(), u.Get("total_tokens").Int())
		if billed > pr.promptBound {
			t.Fatalf("the engine billed %d prompt tokens, the gateway reserved %d\nbody %s", billed, pr.promptBound, body)
		}
	})
}
