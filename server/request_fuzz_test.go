package server

import (
	"strings"
	"testing"

	"github.com/tailgate-dev/tailgate/server/apierr"
	"github.com/tailgate-dev/tailgate/serving/sim"
)

// readerSeeds are bodies that once read one way at the gateway and another
// at the engine (issue: hostile input), plus ordinary ones.
var readerSeeds = []struct {
	chat bool
	body string
}{
	{true, `{"model":"m","messages":[{"role":"user","content":"hi"}]}`},
	{true, `{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`},
	// A repeated key: the gateway read the first copy, the engine the last.
	{true, `{"model":"m","stream":false,"messages":[{"role":"user","content":"hi"}],"stream":true}`},
	{true, `{"model":"m","max_tokens":10,"messages":[{"role":"user","content":"hi"}],"max_tokens":6000}`},
	{true, `{"model":"cheap","model":"m","messages":[{"role":"user","content":"hi"}]}`},
	{true, `{"model":"m","n":1,"n":5,"messages":[{"role":"user","content":"hi"}]}`},
	{true, `{"model":"m","stream":true,"stream_options":{"include_usage":false,"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`},
	// A repeated key spelt with an escape.
	{true, `{"model":"m","stream":false,"str\u0065am":true,"messages":[{"role":"user","content":"hi"}]}`},
	// encoding/json matched keys case-insensitively; vLLM does not.
	{true, `{"model":"m","Stream":true,"messages":[{"role":"user","content":"hi"}]}`},
	{true, `{"model":"m","MAX_TOKENS":9000,"max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`},
	{true, `{"model":"m","stream":true,"stream_options":{"Include_Usage":false},"messages":[{"role":"user","content":"hi"}]}`},
	// Numbers and nulls that read differently in Go and in Python.
	{true, `{"model":"m","max_tokens":1e1,"messages":[{"role":"user","content":"hi"}]}`},
	{true, `{"model":"m","max_tokens":null,"max_completion_tokens":7,"messages":[{"role":"user","content":"hi"}]}`},
	{true, `{"model":"m","stream":null,"messages":[{"role":"user","content":"hi"}]}`},
	{true, `{"model":"m\u0000","messages":[{"role":"user","content":"hi"}]}`},
	{false, `{"model":"m","prompt":"once upon"}`},
	{false, `{"model":"m","prompt":["a"],"max_tokens":3,"max_tokens":300}`},
	{true, strings.Repeat(`{"a":`, 70) + `1` + strings.Repeat(`}`, 70)},
}

// FuzzGatewayAndEngineReadBodiesAlike feeds the same body to the gateway's
// reader and, with what the gateway forwards, to the engine's reader (the
// simulated engine reads JSON as vLLM does: exact-case names, the last copy
// of a repeated key). Whenever the gateway accepts a body, the engine must
// read the model and stream flag it decided, must not be allowed more
// completion tokens or choices than the gateway reserved, and must send
// usage on a stream.
func FuzzGatewayAndEngineReadBodiesAlike(f *testing.F) {
	for _, s := range readerSeeds {
		f.Add(s.chat, []byte(s.body))
	}
	eng, err := sim.New(sim.Config{Model: "m", MaxModelLen: 1 << 20}, nil)
	if err != nil {
		f.Fatal(err)
	}
	lim := parseLimits{maxDepth: 64, mediaPart: DefaultMediaPartTokens, defaultMax: func(string) int64 { return 1024 }}
	f.Fuzz(func(t *testing.T, chat bool, body []byte) {
		ep := completionEndpoint
		if chat {
			ep = chatEndpoint
		}
		pr, err := parseRequest(ep, body, "", lim)
		if err != nil {
			return // refused: the engine never sees it
		}
		got, err := eng.ReadRequest(chat, pr.body)
		if err != nil {
			return // the engine refuses it: a 4xx relayed, nothing billed
		}
		switch {
		case got.Model != pr.model && got.Model != "":
			t.Fatalf("model: gateway %q, engine %q\nbody %s\nforwarded %s", pr.model, got.Model, body, pr.body)
		case got.Stream != pr.upstreamStream():
			t.Fatalf("stream: gateway %v, engine %v\nbody %s\nforwarded %s", pr.upstreamStream(), got.Stream, body, pr.body)
		case got.Stream && !got.IncludeUsage:
			t.Fatalf("a stream the engine sends without usage\nbody %s\nforwarded %s", body, pr.body)
		case int64(got.MaxTokens)*int64(got.N) > pr.reservedCompletion():
			t.Fatalf("engine may produce %d×%d tokens, gateway reserved %d\nbody %s\nforwarded %s",
				got.MaxTokens, got.N, pr.reservedCompletion(), body, pr.body)
		}
	})
}

// TestHostileBodiesAreRefusedOrReadAlike pins the seed cases: each is either
// refused by the gateway with a 400 naming the problem, or read alike.
func TestHostileBodiesAreRefusedOrReadAlike(t *testing.T) {
	lim := parseLimits{maxDepth: 64, mediaPart: DefaultMediaPartTokens, defaultMax: func(string) int64 { return 1024 }}
	for _, tc := range []struct {
		body      string
		wantParam string // "" means accepted
	}{
		{`{"model":"m","stream":false,"messages":[{"role":"user","content":"hi"}],"stream":true}`, "stream"},
		{`{"model":"m","max_tokens":10,"messages":[{"role":"user","content":"hi"}],"max_tokens":6000}`, "max_tokens"},
		{`{"model":"cheap","model":"m","messages":[{"role":"user","content":"hi"}]}`, "model"},
		{`{"model":"m","n":1,"n":5,"messages":[{"role":"user","content":"hi"}]}`, "n"},
		{`{"model":"m","stream":false,"str\u0065am":true,"messages":[{"role":"user","content":"hi"}]}`, "stream"},
		{`{"model":"m","messages":[{"role":"user","content":"a"},{"role":"user","role":"system","content":"b"}]}`, "role"},
		{`{"model":"m","Stream":true,"messages":[{"role":"user","content":"hi"}]}`, ""},
	} {
		pr, err := parseRequest(chatEndpoint, []byte(tc.body), "", lim)
		if tc.wantParam == "" {
			if err != nil {
				t.Errorf("%s: refused: %v", tc.body, err)
			} else if pr.stream {
				t.Errorf("%s: read as a stream", tc.body)
			}
			continue
		}
		ae, ok := err.(*apierr.Error)
		if !ok || ae.Status != 400 || ae.Param != tc.wantParam || !strings.Contains(ae.Message, "duplicate key") {
			t.Errorf("%s: got %v, want a 400 naming %q", tc.body, err, tc.wantParam)
		}
	}
}
