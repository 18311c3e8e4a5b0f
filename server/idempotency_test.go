package server_test

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/tailgate-dev/tailgate/data"
	"github.com/tailgate-dev/tailgate/e2e/testkit"
	"github.com/tailgate-dev/tailgate/policy"
	"github.com/tailgate-dev/tailgate/server"
	"github.com/tailgate-dev/tailgate/server/internal/servertest"
	"github.com/tailgate-dev/tailgate/serving/sim"
)

// cutProxy forwards loopback TCP connections to target; the first cut
// connections are closed as soon as the answer's first byte comes back,
// before the client gets any of it: the engine has answered, the client
// sees its connection drop.
func cutProxy(t *testing.T, target string, cut int32) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	var n atomic.Int32
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				u, err := net.Dial("tcp", target)
				if err != nil {
					return
				}
				defer u.Close()
				go func() { _, _ = io.Copy(u, c) }()
				if n.Add(1) <= cut {
					var b [1]byte
					_, _ = u.Read(b[:]) // the answer starts: drop both sides
					return
				}
				_, _ = io.Copy(c, u)
			}()
		}
	}()
	return ln.Addr().String()
}

// billedRows returns the rows that bill something, and the replays.
func billedRows(rows []data.LedgerRow) (billed, replays []data.LedgerRow) {
	for _, r := range rows {
		switch {
		case r.ReplayOf != "":
			replays = append(replays, r)
		case r.PromptTokens+r.CompletionTokens > 0:
			billed = append(billed, r)
		}
	}
	return billed, replays
}

func completed(h *servertest.Gateway) (n int64) {
	for _, e := range h.Engines {
		n += e.Stats().Completed
	}
	return n
}

// The OpenAI SDK's own retry of a JSON request whose connection was cut
// after the engine answered gets the recorded answer: the same completion
// id and content, billed once, the engine run once.
func TestIdempotencySDKRetryAfterCutIsBilledOnce(t *testing.T) {
	h := servertest.Start(t, servertest.Options{})
	key := h.Key(policy.KeyOptions{})
	addr := cutProxy(t, strings.TrimPrefix(h.Public.URL, "http://"), 1)
	client := openai.NewClient(option.WithBaseURL("http://"+addr+"/v1"), option.WithAPIKey(key),
		option.WithMaxRetries(2), option.WithHeader("Idempotency-Key", "order-42"))
	var resp *http.Response
	params := openai.ChatCompletionNewParams{
		Model: servertest.SimModel, Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("bill me once")}, MaxTokens: openai.Int(12),
	}
	chat, err := client.Chat.Completions.New(context.Background(), params, option.WithResponseInto(&resp))
	if err != nil {
		t.Fatal(err)
	}
	if resp.Header.Get("Idempotent-Replayed") != "true" || resp.Header.Get("X-Tailgate-Replay-Of") == "" {
		t.Fatalf("the SDK's retry was not a replay: headers %v", resp.Header)
	}
	if got := completed(h); got != 1 {
		t.Fatalf("the engines completed %d generations, want 1", got)
	}
	// A later retry, straight to the gateway, gets the same answer again.
	direct := h.Client(key, option.WithHeader("Idempotency-Key", "order-42"))
	again, err := direct.Chat.Completions.New(context.Background(), params)
	if err != nil {
		t.Fatal(err)
	}
	if again.ID != chat.ID || again.Choices[0].Message.Content != chat.Choices[0].Message.Content || chat.ID == "" {
		t.Fatalf("replay %q %q, first %q %q", again.ID, again.Choices[0].Message.Content, chat.ID, chat.Choices[0].Message.Content)
	}
	billed, replays := billedRows(h.LedgerRows())
	if len(billed) != 1 || len(replays) != 2 {
		t.Fatalf("%d billed rows and %d replays, want 1 and 2: %+v", len(billed), len(replays), h.LedgerRows())
	}
	for _, r := range replays {
		if r.ReplayOf != billed[0].ID || r.CostMicros != 0 || r.PromptTokens+r.CompletionTokens != 0 || r.Outcome != data.OutcomeOK || r.Model != servertest.SimModel {
			t.Fatalf("replay row %+v, original %s", r, billed[0].ID)
		}
	}
	if billed[0].CompletionTokens != chat.Usage.CompletionTokens {
		t.Fatalf("billed %d completion tokens, the answer says %d", billed[0].CompletionTokens, chat.Usage.CompletionTokens)
	}
}

// The same key with another body is refused with 422 naming the conflict;
// nothing runs.
func TestIdempotencyKeyReusedForAnotherBodyIs422(t *testing.T) {
	h := servertest.Start(t, servertest.Options{})
	key := h.Key(policy.KeyOptions{})
	send := func(body string) *http.Response {
		req, _ := http.NewRequest(http.MethodPost, h.Public.URL+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("Idempotency-Key", "k-1")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { resp.Body.Close() })
		return resp
	}
	if r := send(`{"model":"tailgate-sim","messages":[{"role":"user","content":"a"}],"max_tokens":3}`); r.StatusCode != 200 {
		t.Fatalf("first: %d", r.StatusCode)
	}
	r := send(`{"model":"tailgate-sim","messages":[{"role":"user","content":"b"}],"max_tokens":3}`)
	var e struct {
		Error struct{ Code, Param, Type string }
	}
	_ = json.NewDecoder(r.Body).Decode(&e)
	if r.StatusCode != http.StatusUnprocessableEntity || e.Error.Code != "idempotency_key_reused" || e.Error.Param != "Idempotency-Key" {
		t.Fatalf("reused key: %d %+v", r.StatusCode, e)
	}
	if got := completed(h); got != 1 {
		t.Fatalf("the engines completed %d generations, want 1", got)
	}
	// Another tenant's same key is its own.
	other := h.Key(policy.KeyOptions{Tenant: "globex"})
	c := h.Client(other, option.WithHeader("Idempotency-Key", "k-1"))
	if _, err := c.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{
		Model: servertest.SimModel, Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("b")}, MaxTokens: openai.Int(3),
	}); err != nil {
		t.Fatalf("another tenant's key: %v", err)
	}
}

// A retry that arrives while the first request still runs waits for its
// answer: the engine runs once, both get the same completion.
func TestIdempotencyConcurrentRetryWaits(t *testing.T) {
	h := servertest.Start(t, servertest.Options{Replicas: 1, Sim: sim.Config{TPOT: 40 * time.Millisecond}})
	key := h.Key(policy.KeyOptions{})
	c := h.Client(key, option.WithHeader("Idempotency-Key", "same"))
	params := openai.ChatCompletionNewParams{
		Model: servertest.SimModel, Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("a slow answer")}, MaxTokens: openai.Int(40),
	}
	var wg sync.WaitGroup
	var first *openai.ChatCompletion
	var firstErr error
	wg.Go(func() { first, firstErr = c.Chat.Completions.New(context.Background(), params) })
	testkit.WaitWithin(t, 10*time.Second, "the first request generating", func() bool { return h.Engines[0].Stats().Running == 1 })
	var resp *http.Response
	second, err := c.Chat.Completions.New(context.Background(), params, option.WithResponseInto(&resp))
	wg.Wait()
	if err != nil || firstErr != nil {
		t.Fatal(err, firstErr)
	}
	if h.Engines[0].Stats().Completed != 1 {
		t.Fatalf("the engine completed %d generations, want 1", h.Engines[0].Stats().Completed)
	}
	if second.ID != first.ID || second.Choices[0].Message.Content != first.Choices[0].Message.Content || resp.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("second %q, first %q, replayed %q", second.ID, first.ID, resp.Header.Get("Idempotent-Replayed"))
	}
	billed, replays := billedRows(h.LedgerRows())
	if len(billed) != 1 || len(replays) != 1 {
		t.Fatalf("%d billed rows and %d replays, want 1 and 1", len(billed), len(replays))
	}
}

// sseEvent is one event of a stream as a client parses it.
type sseEvent struct{ id, data string }

// readEvents parses SSE events from r until it ends, or until stop says so
// after an event.
func readEvents(t *testing.T, r io.Reader, stop func([]sseEvent) bool) []sseEvent {
	t.Helper()
	var evs []sseEvent
	var cur sseEvent
	buf := make([]byte, 0, 4096)
	tmp := make([]byte, 4096)
	for {
		n, err := r.Read(tmp)
		buf = append(buf, tmp[:n]...)
		for {
			i := strings.Index(string(buf), "\n")
			if i < 0 {
				break
			}
			line := string(buf[:i])
			buf = buf[i+1:]
			switch {
			case line == "":
				if cur.data != "" {
					evs = append(evs, cur)
					if stop != nil && stop(evs) {
						return evs
					}
				}
				cur = sseEvent{}
			case strings.HasPrefix(line, "id: "):
				cur.id = line[4:]
			case strings.HasPrefix(line, "data: "):
				cur.data = line[6:]
			}
		}
		if err != nil {
			return evs
		}
	}
}

func keyedStream(t *testing.T, ctx context.Context, h *servertest.Gateway, secret, key, lastID string) *http.Response {
	t.Helper()
	body := `{"model":"tailgate-sim","messages":[{"role":"user","content":"stream and resume"}],"max_tokens":24,"stream":true,"stream_options":{"include_usage":true}}`
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, h.Public.URL+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+secret)
	req.Header.Set("Idempotency-Key", key)
	if lastID != "" {
		req.Header.Set("Last-Event-ID", lastID)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("stream: %d %s", resp.StatusCode, b)
	}
	return resp
}

// A keyed stream cut mid-way runs on; the client that reconnects with the
// same key and Last-Event-ID gets every event after that one, live, and
// the stream is billed once, generated once. Once it is whole, the same key
// replays it from its record, ids and all.
func TestIdempotencyStreamResumesAfterCut(t *testing.T) {
	h := servertest.Start(t, servertest.Options{Replicas: 1, Sim: sim.Config{TPOT: 30 * time.Millisecond}})
	key := h.Key(policy.KeyOptions{})

	ctx, cancel := context.WithCancel(context.Background())
	resp := keyedStream(t, ctx, h, key, "s-1", "")
	head := readEvents(t, resp.Body, func(evs []sseEvent) bool { return len(evs) == 3 })
	cancel()
	resp.Body.Close()
	if len(head) != 3 || head[2].id == "" {
		t.Fatalf("first events %+v", head)
	}
	reqID := resp.Header.Get("X-Request-Id")
	if head[2].id != reqID+":3" {
		t.Fatalf("event id %q, want %s:3", head[2].id, reqID)
	}

	resp = keyedStream(t, context.Background(), h, key, "s-1", head[2].id)
	tail := readEvents(t, resp.Body, nil)
	resp.Body.Close()
	if resp.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("resumed stream not marked: %v", resp.Header)
	}
	all := append(head, tail...)
	for i, ev := range all {
		if want := reqID + ":" + strconv.Itoa(i+1); ev.id != want {
			t.Fatalf("event %d has id %q, want %q (events %+v)", i, ev.id, want, all)
		}
	}
	if all[len(all)-1].data != "[DONE]" {
		t.Fatalf("resumed stream ends with %q", all[len(all)-1].data)
	}
	if st := h.Engines[0].Stats(); st.Completed != 1 || st.Aborted != 0 {
		t.Fatalf("engine stats %+v, want one generation, none aborted", st)
	}

	// Whole now: the same key replays the record from the start.
	resp = keyedStream(t, context.Background(), h, key, "s-1", "")
	again := readEvents(t, resp.Body, nil)
	resp.Body.Close()
	if len(again) != len(all) {
		t.Fatalf("replay has %d events, the stream %d", len(again), len(all))
	}
	for i := range all {
		if again[i] != all[i] {
			t.Fatalf("replay event %d = %+v, stream %+v", i, again[i], all[i])
		}
	}
	billed, replays := billedRows(h.LedgerRows())
	if len(billed) != 1 || len(replays) != 2 || billed[0].ID != reqID || billed[0].Outcome != data.OutcomeOK {
		t.Fatalf("%d billed rows (%+v) and %d replays, want 1 (%s, ok) and 2", len(billed), billed, len(replays), reqID)
	}
}

// Every generating endpoint honours the key: the second request is the
// first's answer replayed, byte for byte, and the engine is asked once. An
// audio form is the same request whatever boundary its client drew. On the
// Messages API a reused key is refused in Anthropic's error shape.
func TestIdempotencyOnEveryGeneratingEndpoint(t *testing.T) {
	h := servertest.Start(t, servertest.Options{Replicas: 1})
	var got []string
	fakeEngine(t, h, "vllm", vllmLike(t, &got))
	secret := h.Key(policy.KeyOptions{})
	send := func(path, ctype, key string, body []byte) (*http.Response, string) {
		req, _ := http.NewRequest(http.MethodPost, h.Public.URL+path, strings.NewReader(string(body)))
		req.Header.Set("Authorization", "Bearer "+secret)
		req.Header.Set("Content-Type", ctype)
		req.Header.Set("Idempotency-Key", key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp, string(raw)
	}
	form := func(boundary string) []byte {
		var b strings.Builder
		for _, p := range [][2]string{{`name="model"`, "broken"}, {`name="file"; filename="a.wav"`, strings.Repeat("\x01", 512)}} {
			b.WriteString("--" + boundary + "\r\nContent-Disposition: form-data; " + p[0] + "\r\n\r\n" + p[1] + "\r\n")
		}
		b.WriteString("--" + boundary + "--\r\n")
		return []byte(b.String())
	}
	for i, tc := range []struct{ path, body string }{
		{"/v1/embeddings", `{"model":"broken","input":"hello"}`},
		{"/v1/responses", `{"model":"broken","input":"hi"}`},
		{"/v1/responses", `{"model":"broken","input":"hi","stream":true}`},
		{"/v1/rerank", `{"model":"broken","query":"q","documents":["a","b"]}`},
		{"/v1/score", `{"model":"broken","text_1":"a","text_2":"b"}`},
		{"/v1/messages", `{"model":"broken","max_tokens":50,"stream":true,"messages":[{"role":"user","content":"hi"}]}`},
		{"/v1/audio/transcriptions", ""},
	} {
		key := "ep-" + strconv.Itoa(i)
		ctype, body, again := "application/json", []byte(tc.body), []byte(tc.body)
		if tc.body == "" {
			ctype, body, again = "multipart/form-data; boundary=first", form("first"), form("second")
		}
		before := len(got)
		r1, b1 := send(tc.path, ctype, key, body)
		if tc.body == "" {
			ctype = "multipart/form-data; boundary=second"
		}
		r2, b2 := send(tc.path, ctype, key, again)
		if r1.StatusCode != 200 || r2.StatusCode != 200 || b1 != b2 || b1 == "" || r2.Header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("%s: %d %q then %d %q (replayed %q)", tc.path, r1.StatusCode, b1, r2.StatusCode, b2, r2.Header.Get("Idempotent-Replayed"))
		}
		if len(got) != before+1 {
			t.Fatalf("%s: the engine was asked %d times, want once", tc.path, len(got)-before)
		}
	}
	r, body := send("/v1/messages", "application/json", "ep-5", []byte(`{"model":"broken","max_tokens":9,"messages":[{"role":"user","content":"other"}]}`))
	if r.StatusCode != http.StatusUnprocessableEntity || !strings.Contains(body, `"type":"error"`) || !strings.Contains(body, "Idempotency-Key") {
		t.Fatalf("messages, reused key: %d %s", r.StatusCode, body)
	}
}

// A keyed stream nobody reads any more is cancelled once
// IdempotencyAbandon passed (499, the engine aborts it), and its key is
// given up: the next request with it runs anew.
func TestIdempotencyAbandonedStreamIsCancelled(t *testing.T) {
	h := servertest.Start(t, servertest.Options{Replicas: 1, Sim: sim.Config{TPOT: 50 * time.Millisecond},
		Server: server.Config{IdempotencyAbandon: 200 * time.Millisecond}})
	key := h.Key(policy.KeyOptions{})
	ctx, cancel := context.WithCancel(context.Background())
	resp := keyedStream(t, ctx, h, key, "gone", "")
	first := resp.Header.Get("X-Request-Id")
	readEvents(t, resp.Body, func(evs []sseEvent) bool { return len(evs) == 2 })
	cancel()
	resp.Body.Close()
	testkit.WaitWithin(t, 10*time.Second, "the engine aborting the abandoned stream", func() bool { return h.Engines[0].Stats().Aborted == 1 })
	resp = keyedStream(t, context.Background(), h, key, "gone", "")
	all := readEvents(t, resp.Body, nil)
	resp.Body.Close()
	if resp.Header.Get("Idempotent-Replayed") != "" || len(all) == 0 || all[len(all)-1].data != "[DONE]" {
		t.Fatalf("the retry of an abandoned stream: replayed %q, %d events", resp.Header.Get("Idempotent-Replayed"), len(all))
	}
	rows := h.LedgerRows()
	for _, r := range rows {
		if r.ID == first && (r.Outcome != data.OutcomeClientCancelled || r.Status != 499) {
			t.Fatalf("the abandoned stream's row %+v", r)
		}
	}
}
