package server_test

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"io"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/data"
	"github.com/tailgate-dev/tailgate/policy"
	"github.com/tailgate-dev/tailgate/server/internal/servertest"
	"github.com/tailgate-dev/tailgate/serving/sim"
)

// publicEndpoint is one public endpoint as a client calls it, for the tests
// that hold every endpoint to the pipeline's promises.
type publicEndpoint struct {
	name, path string
	body       func(stream bool, maxTokens int) string // JSON; nil for a form
	stream     bool                                    // it has a streamed form
	// output matches one piece of generated output on the wire (a delta
	// event's line), counted independently of the gateway's own classifier.
	output *regexp.Regexp
}

var (
	chunkOutput    = regexp.MustCompile(`"(content|text)":"[^"]`)
	responseOutput = regexp.MustCompile(`^event: response\.[a-z_.]*\.delta$`)
	messageOutput  = regexp.MustCompile(`^event: content_block_delta$`)
)

func publicEndpoints() []publicEndpoint {
	m := `"model":"` + servertest.SimModel + `"`
	opt := func(stream bool) string {
		if stream {
			return `,"stream":true`
		}
		return ""
	}
	return []publicEndpoint{
		{"chat", "/v1/chat/completions", func(s bool, n int) string {
			return `{` + m + opt(s) + `,"max_tokens":` + strconv.Itoa(n) + `,"messages":[{"role":"user","content":"hello there"}]}`
		}, true, chunkOutput},
		{"completions", "/v1/completions", func(s bool, n int) string {
			return `{` + m + opt(s) + `,"max_tokens":` + strconv.Itoa(n) + `,"prompt":"hello there"}`
		}, true, chunkOutput},
		{"responses", "/v1/responses", func(s bool, n int) string {
			return `{` + m + opt(s) + `,"max_output_tokens":` + strconv.Itoa(n) + `,"input":"hello there"}`
		}, true, responseOutput},
		{"messages", "/v1/messages", func(s bool, n int) string {
			return `{` + m + opt(s) + `,"max_tokens":` + strconv.Itoa(n) + `,"messages":[{"role":"user","content":"hello there"}]}`
		}, true, messageOutput},
		{"audio", "/v1/audio/transcriptions", nil, true, chunkOutput},
		{"embeddings", "/v1/embeddings", func(bool, int) string { return `{` + m + `,"input":"hello there"}` }, false, nil},
		{"rerank", "/v1/rerank", func(bool, int) string { return `{` + m + `,"query":"hello","documents":["a b","c d"]}` }, false, nil},
		{"score", "/v1/score", func(bool, int) string { return `{` + m + `,"text_1":"hello","text_2":["a b","c d"]}` }, false, nil},
		{"tokenize", "/tokenize", func(bool, int) string { return `{` + m + `,"prompt":"hello there"}` }, false, nil},
	}
}

// wav is a mono 16-bit WAV file of the given seconds at 16 kHz.
func wav(seconds int) []byte {
	n := seconds * 32000
	b := make([]byte, 44+n)
	copy(b, "RIFF")
	binary.LittleEndian.PutUint32(b[4:], uint32(36+n))
	copy(b[8:], "WAVEfmt ")
	binary.LittleEndian.PutUint32(b[16:], 16)
	binary.LittleEndian.PutUint16(b[20:], 1)
	binary.LittleEndian.PutUint16(b[22:], 1)
	binary.LittleEndian.PutUint32(b[24:], 16000)
	binary.LittleEndian.PutUint32(b[28:], 32000)
	binary.LittleEndian.PutUint16(b[32:], 2)
	binary.LittleEndian.PutUint16(b[34:], 16)
	copy(b[36:], "data")
	binary.LittleEndian.PutUint32(b[40:], uint32(n))
	for i := 44; i < len(b); i++ {
		b[i] = byte(i * 7)
	}
	return b
}

// send sends ep's request (streamed or not) with secret.
func (ep publicEndpoint) send(h *servertest.Gateway, secret string, stream bool, maxTokens int) *http.Response {
	if ep.body != nil {
		return h.Post(ep.path, secret, ep.body(stream, maxTokens))
	}
	var b bytes.Buffer
	mw := multipart.NewWriter(&b)
	mw.WriteField("model", servertest.SimModel)
	if stream {
		mw.WriteField("stream", "true")
	}
	fw, _ := mw.CreateFormFile("file", "a.wav")
	fw.Write(wav(15)) // 30 words: two a second
	mw.Close()
	return h.Do(http.MethodPost, ep.path, secret, mw.FormDataContentType(), &b)
}

// finalRow waits for request id's final ledger row.
func finalRow(t *testing.T, h *servertest.Gateway, id string) data.LedgerRow {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		for _, row := range h.LedgerRows() {
			if row.ID == id && row.Outcome != data.OutcomeOpen {
				return row
			}
		}
	}
	t.Fatalf("no final ledger row for %s", id)
	return data.LedgerRow{}
}

// TestEveryEndpointBillsAtLeastWhatAClientReceived: a client that reads a
// stream's output and goes away before its last events is billed at least
// the output it received, on every endpoint that streams — the Responses
// and Messages streams report usage only in their last events, and were
// billed nothing when cut before them.
func TestEveryEndpointBillsAtLeastWhatAClientReceived(t *testing.T) {
	h := servertest.Start(t, servertest.Options{Replicas: 1, Sim: sim.Config{TTFT: 5 * time.Millisecond, TPOT: 10 * time.Millisecond}})
	secret := h.Key(policy.KeyOptions{Tenant: "cut"})
	for _, ep := range publicEndpoints() {
		if !ep.stream {
			continue
		}
		t.Run(ep.name, func(t *testing.T) {
			resp := ep.send(h, secret, true, 60)
			if resp.StatusCode != 200 {
				raw, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				t.Fatalf("%d %s", resp.StatusCode, raw)
			}
			id := resp.Header.Get("X-Request-Id")
			received := 0
			sc := bufio.NewScanner(resp.Body)
			for received < 20 && sc.Scan() {
				if ep.output.MatchString(sc.Text()) {
					received++
				}
			}
			resp.Body.Close() // gone before the last events
			if received < 20 {
				t.Fatalf("only %d output events before the stream ended", received)
			}
			row := finalRow(t, h, id)
			if row.CompletionTokens < int64(received) || row.PromptTokens <= 0 {
				t.Fatalf("received %d output tokens, billed %d+%d (%s)", received, row.PromptTokens, row.CompletionTokens, row.Outcome)
			}
		})
	}
}

// TestNoEndpointTakesATenantPastItsBudget: requests of every endpoint, sent
// until the tenant's budget refuses them, never bill it past the budget —
// each reserves its worst case first — and a rerank whose pairs could not
// fit is refused before it runs.
func TestNoEndpointTakesATenantPastItsBudget(t *testing.T) {
	h := servertest.Start(t, servertest.Options{Replicas: 1, Sim: sim.Config{TTFT: time.Millisecond, TPOT: time.Millisecond}})
	const budget = 300
	for _, ep := range publicEndpoints() {
		for _, stream := range []bool{false, true} {
			if stream && !ep.stream {
				continue
			}
			name := ep.name
			if stream {
				name += "-stream"
			}
			t.Run(name, func(t *testing.T) {
				b := int64(budget)
				if ep.body == nil {
					b = 10 * budget // 15 s of audio reserve 750 prompt tokens
				}
				secret := h.Key(policy.KeyOptions{Tenant: "budget-" + name, BudgetTokens: &b})
				served, refused, first := 0, false, ""
				for i := 0; i < 100 && !refused; i++ {
					resp := ep.send(h, secret, stream, 40)
					raw, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					switch {
					case resp.StatusCode == 200:
						served++
						if first == "" {
							first = resp.Header.Get("X-Request-Id")
						}
					// insufficient_quota; billing_error in the Messages API's shape.
					case resp.StatusCode == 429 && (strings.Contains(string(raw), "insufficient_quota") || strings.Contains(string(raw), `"billing_error"`)):
						refused = true
					default:
						t.Fatalf("%d %s", resp.StatusCode, raw)
					}
				}
				if served == 0 {
					t.Fatal("nothing served: the test needs answers")
				}
				row := finalRow(t, h, first)
				if row.PromptTokens+row.CompletionTokens > 0 && !refused {
					t.Fatalf("served %d answers of %d+%d tokens and never refused against %d", served, row.PromptTokens, row.CompletionTokens, b)
				}
				tenant := row.TenantID
				var billed int64
				for _, row := range h.LedgerRows() {
					if row.TenantID == tenant {
						billed += row.PromptTokens + row.CompletionTokens
					}
				}
				if billed > b {
					t.Fatalf("billed %d tokens against a %d-token budget (%d answers)", billed, b, served)
				}
			})
		}
	}
	t.Run("rerank-pairs", func(t *testing.T) {
		b := int64(60000)
		secret := h.Key(policy.KeyOptions{Tenant: "pairs", BudgetTokens: &b})
		docs := make([]string, 500)
		for i := range docs {
			docs[i] = `"doc"`
		}
		body := `{"model":"` + servertest.SimModel + `","query":"` + strings.Repeat("long query ", 1000) + `","documents":[` + strings.Join(docs, ",") + `]}`
		resp := h.Post("/v1/rerank", secret, body)
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 429 || !strings.Contains(string(raw), "insufficient_quota") {
			t.Fatalf("500 pairs of an 11,000-byte query against 60,000 tokens: %d %s", resp.StatusCode, raw)
		}
	})
}

// finalEvent matches the line that ends an endpoint's answer: what a client
// holds a whole answer by.
var finalEvent = map[string]*regexp.Regexp{
	"responses": regexp.MustCompile(`^event: response\.completed$`),
	"messages":  regexp.MustCompile(`^event: message_stop$`),
}

var doneLine = regexp.MustCompile(`^data: \[DONE\]$`)

// TestNoEndpointDeliversAnAnswerItCannotBill: with the database full, no
// endpoint delivers a whole answer whose ledger row was not written — a JSON
// answer is withheld (503 ledger_unavailable), a stream is cut before its
// final event — and once space returns every answer delivered has its row.
func TestNoEndpointDeliversAnAnswerItCannotBill(t *testing.T) {
	for _, ep := range publicEndpoints() {
		for _, stream := range []bool{false, true} {
			if stream && !ep.stream {
				continue
			}
			name := ep.name
			if stream {
				name += "-stream"
			}
			t.Run(name, func(t *testing.T) {
				h := servertest.Start(t, servertest.Options{Replicas: 1, Sim: sim.Config{TTFT: time.Millisecond, TPOT: time.Millisecond}})
				secret := h.Key(policy.KeyOptions{Tenant: "full"})
				final := finalEvent[ep.name]
				if final == nil {
					final = doneLine
				}
				var delivered []string
				send := func() (id string, whole, refused bool) {
					resp := ep.send(h, secret, stream, 8)
					raw, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					id = resp.Header.Get("X-Request-Id")
					switch {
					// ledger_unavailable; the Messages API's shape has no code, only the message.
					case resp.StatusCode == 503 && (strings.Contains(string(raw), "ledger_unavailable") || strings.Contains(string(raw), "its ledger cannot write")):
						return id, false, true
					case resp.StatusCode != 200:
						t.Fatalf("%d %s", resp.StatusCode, raw)
					case !stream:
						return id, true, false
					}
					for _, line := range strings.Split(string(raw), "\n") {
						if final.MatchString(strings.TrimRight(line, "\r")) {
							return id, true, false
						}
					}
					return id, false, false // cut before its final event
				}
				if _, whole, _ := send(); !whole {
					t.Fatal("no whole answer before the fill")
				}
				if err := h.Store.SetMaxPageCount(1); err != nil {
					t.Fatal(err)
				}
				refused := false
				for i := 0; i < 400 && !refused; i++ {
					id, whole, r := send()
					refused = r
					if whole {
						delivered = append(delivered, id)
					}
				}
				if !refused {
					t.Fatal("the database never filled")
				}
				if err := h.Store.SetMaxPageCount(1 << 30); err != nil {
					t.Fatal(err)
				}
				rows := map[string]data.LedgerRow{}
				for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
					if h.Ledger.Healthy() == nil {
						break
					}
				}
				for _, row := range h.LedgerRows() {
					rows[row.ID] = row
				}
				for _, id := range delivered {
					if row, ok := rows[id]; !ok || row.Outcome != data.OutcomeOK {
						t.Fatalf("answer %s was delivered whole without its ledger row (%+v)", id, row)
					}
				}
			})
		}
	}
}

// TestFieldsTheEngineActsOnSayWhatTheGatewayDecided: the engine's priority
// field never reaches it (a batch-class key would jump its queue), Responses
// is sent store: false, and the stored-response features the gateway
// neither bills nor binds to a tenant are refused, naming the field.
func TestFieldsTheEngineActsOnSayWhatTheGatewayDecided(t *testing.T) {
	sims := servertest.StartSims(t, 1, sim.Config{TTFT: time.Millisecond, TPOT: time.Millisecond}, nil)
	target, _ := url.Parse(sims[0].Server.URL)
	var (
		mu   sync.Mutex
		seen []string
	)
	proxy := httputil.NewSingleHostReverseProxy(target)
	rec := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		seen = append(seen, r.URL.Path+" "+string(body))
		mu.Unlock()
		r.Body = io.NopCloser(bytes.NewReader(body))
		r.ContentLength = int64(len(body))
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(rec.Close)
	h := servertest.Start(t, servertest.Options{Replicas: -1})
	h.AddReplica("rec", rec.URL, servertest.SimModel)
	secret := h.Key(policy.KeyOptions{Tenant: "fields"})
	m := `"model":"` + servertest.SimModel + `"`

	for _, tc := range []struct{ path, body string }{
		{"/v1/chat/completions", `{` + m + `,"priority":-100,"max_tokens":3,"messages":[{"role":"user","content":"hi"}]}`},
		{"/v1/responses", `{` + m + `,"priority":-100,"max_output_tokens":3,"input":"hi"}`},
		{"/v1/embeddings", `{` + m + `,"priority":-100,"input":"hi"}`},
	} {
		resp := h.Post(tc.path, secret, tc.body)
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %d %s", tc.path, resp.StatusCode, raw)
		}
	}
	mu.Lock()
	for _, s := range seen {
		if strings.Contains(s, `"priority"`) {
			t.Errorf("the engine was sent a priority: %s", s)
		}
		if strings.HasPrefix(s, "/v1/responses ") && !strings.Contains(s, `"store":false`) {
			t.Errorf("a Responses request went without store: false: %s", s)
		}
	}
	if len(seen) != 3 {
		t.Errorf("the engine saw %d requests, want 3", len(seen))
	}
	mu.Unlock()

	for _, tc := range []struct{ field, body string }{
		{"background", `{` + m + `,"input":"hi","background":true}`},
		{"store", `{` + m + `,"input":"hi","store":true}`},
		{"previous_response_id", `{` + m + `,"input":"hi","previous_response_id":"resp_123"}`},
		{"conversation", `{` + m + `,"input":"hi","conversation":"conv_1"}`},
	} {
		resp := h.Post("/v1/responses", secret, tc.body)
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 400 || !strings.Contains(string(raw), `"param":"`+tc.field+`"`) {
			t.Errorf("%s: %d %s, want 400 naming it", tc.field, resp.StatusCode, raw)
		}
	}
}

// TestStreamsEndWhenTheirRowCannotBeKeptCurrent: a stream running when the
// ledger stops writing is ended with an in-band ledger_unavailable error
// (no [DONE]) instead of running on unrecorded, and once the ledger is back
// its row says so, billed at least what the client received.
func TestStreamsEndWhenTheirRowCannotBeKeptCurrent(t *testing.T) {
	h := servertest.Start(t, servertest.Options{Replicas: 1, Sim: sim.Config{TTFT: time.Millisecond, TPOT: 5 * time.Millisecond}})
	secret := h.Key(policy.KeyOptions{Tenant: "long"})
	resp := h.Post("/v1/chat/completions", secret, `{"model":"`+servertest.SimModel+`","stream":true,"max_tokens":3000,"ignore_eos":true,"messages":[{"role":"user","content":"go on"}]}`)
	if resp.StatusCode != 200 {
		t.Fatalf("%d", resp.StatusCode)
	}
	defer resp.Body.Close()
	id := resp.Header.Get("X-Request-Id")
	sc := bufio.NewScanner(resp.Body)
	received := 0
	for received < 5 && sc.Scan() {
		if chunkOutput.MatchString(sc.Text()) {
			received++
		}
	}
	if err := h.Store.SetMaxPageCount(1); err != nil {
		t.Fatal(err)
	}
	short := `{"model":"` + servertest.SimModel + `","max_tokens":2,"messages":[{"role":"user","content":"` + strings.Repeat("padding ", 200) + `"}]}`
	for i := 0; i < 400 && h.Ledger.Healthy() == nil; i++ {
		r := h.Post("/v1/chat/completions", secret, short)
		io.Copy(io.Discard, r.Body)
		r.Body.Close()
	}
	if h.Ledger.Healthy() == nil {
		t.Fatal("the database never filled")
	}
	var tail []string
	for sc.Scan() {
		line := sc.Text()
		if chunkOutput.MatchString(line) {
			received++
		}
		if line != "" {
			tail = append(tail, line)
		}
	}
	if len(tail) == 0 || !strings.Contains(tail[len(tail)-1], "ledger_unavailable") {
		t.Fatalf("the stream did not end with ledger_unavailable: last lines %q", tail[max(0, len(tail)-3):])
	}
	if received >= 3000 {
		t.Fatal("the stream ran to its end unrecorded")
	}
	if err := h.Store.SetMaxPageCount(1 << 30); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); h.Ledger.Healthy() != nil && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
	}
	row := finalRow(t, h, id)
	if row.Error != data.ClassLedgerUnavailable || row.CompletionTokens < int64(received) {
		t.Fatalf("row %s/%s billed %d, the client received %d", row.Outcome, row.Error, row.CompletionTokens, received)
	}
}

// TestKeyStoreDownIsA503NotA500: a key the gateway must look up while its
// database cannot be asked is answered 503 ledger_unavailable (try again),
// as a request it could not bill — not a 500.
func TestKeyStoreDownIsA503NotA500(t *testing.T) {
	h := servertest.Start(t, servertest.Options{Replicas: 1})
	secret := h.Key(policy.KeyOptions{Tenant: "down"})
	// A well-formed secret the gateway has not seen: it must be looked up.
	last := secret[len(secret)-1]
	unseen := secret[:len(secret)-1] + map[bool]string{true: "a", false: "b"}[last != 'a']
	if err := h.Store.Close(); err != nil {
		t.Fatal(err)
	}
	resp := h.Post("/v1/chat/completions", unseen, `{"model":"`+servertest.SimModel+`","messages":[{"role":"user","content":"hi"}]}`)
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 503 || !strings.Contains(string(raw), "ledger_unavailable") {
		t.Fatalf("key store down: %d %s, want 503 ledger_unavailable", resp.StatusCode, raw)
	}
}
