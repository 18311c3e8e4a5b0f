package server_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"io"
	"mime/multipart"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/data"
	"github.com/tailgate-dev/tailgate/e2e/testkit"
	"github.com/tailgate-dev/tailgate/policy"
	"github.com/tailgate-dev/tailgate/server"
	"github.com/tailgate-dev/tailgate/server/internal/servertest"
	"github.com/tailgate-dev/tailgate/serving/sim"
)

// shapeSim is a gateway before one simulated engine with room for long
// audio and many pairs.
func shapeSim(t *testing.T) *servertest.Gateway {
	return servertest.Start(t, servertest.Options{Replicas: 1, Sim: sim.Config{TTFT: time.Millisecond, TPOT: time.Microsecond, MaxModelLen: 1 << 20}})
}

// reply is one answer: its status, body and request id.
type reply struct {
	status int
	body   string
	id     string
}

func postJSON(h *servertest.Gateway, path, secret, body string) reply {
	resp := h.Post(path, secret, body)
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return reply{resp.StatusCode, string(raw), resp.Header.Get("X-Request-Id")}
}

func (r reply) quota() bool { return r.status == 429 && strings.Contains(r.body, "insufficient_quota") }

// tenantBilled is what the tenant of request id was billed in all.
func tenantBilled(t *testing.T, h *servertest.Gateway, id string) int64 {
	tenant := finalRow(t, h, id).TenantID
	var n int64
	for _, row := range h.LedgerRows() {
		if row.TenantID == tenant {
			n += row.PromptTokens + row.CompletionTokens
		}
	}
	return n
}

// shapeBody builds a body of member m: n inputs of size bytes on its first
// side (one for a single-input key), docs inputs on its second; media: the
// inputs are image parts instead of text.
func shapeBody(m server.ShapeMember, size, docs int, media bool) string {
	text := func(n int) string { return strconv.Quote(strings.Repeat("a", n)) }
	input := func(n int) string {
		if media {
			return `{"content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}}]}`
		}
		return text(n)
	}
	list := func(k, n int) string {
		items := make([]string, k)
		for i := range items {
			items[i] = input(n)
		}
		return "[" + strings.Join(items, ",") + "]"
	}
	b := `{"model":"` + servertest.SimModel + `"`
	switch {
	case m.Keys[0] == "messages":
		content := text(min(size*docs, 200000))
		if media {
			content = `[{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}},{"type":"text","text":"hi"}]`
		}
		b += `,"messages":[{"role":"user","content":` + content + `}]`
	case m.Single && !m.Pairs:
		b += `,"` + m.Keys[0] + `":` + text(min(size*docs, 200000))
	case m.Keys[0] == "tokens":
		b += `,"tokens":[1,2,3]`
	case m.Pairs:
		first := input(size)
		if !m.Single {
			first = "[" + first + "]"
		}
		b += `,"` + m.Keys[0] + `":` + first + `,"` + m.Keys[1] + `":` + list(docs, 1)
	default:
		b += `,"` + m.Keys[0] + `":` + list(docs, size)
	}
	return b + "}"
}

// TestEveryShapeKeepsATenantWithinItsBudget walks the endpoint shapes table:
// for every path and every member of its request union, with text and with
// image parts, a tenant sends the shape until the gateway refuses it for
// its budget; it is never billed past the budget, and a shape whose engine
// run exceeds the budget outright (a long query over many documents, image
// parts) is refused before it runs.
func TestEveryShapeKeepsATenantWithinItsBudget(t *testing.T) {
	h := shapeSim(t)
	const budget = 20000
	for i, m := range server.ShapeTable() {
		for _, media := range []bool{false, true} {
			name := m.Path + "/" + m.Model
			if media {
				if !m.Runs || m.Keys[0] == "input" {
					continue // no media parts in these shapes
				}
				name += "/media"
			}
			t.Run(name, func(t *testing.T) {
				b := int64(budget)
				secret := h.Key(policy.KeyOptions{Tenant: "shape-" + strconv.Itoa(i) + strconv.FormatBool(media), BudgetTokens: &b})
				// A shape that fits: answers until the budget refuses one.
				var last string
				served, refused := 0, false
				for n := 0; n < 60 && !refused && !media; n++ {
					r := postJSON(h, m.Path, secret, shapeBody(m, 200, 10, false))
					last = r.id
					switch {
					case r.status == 200:
						served++
					case r.quota():
						refused = true
					default:
						t.Fatalf("%d %s", r.status, r.body)
					}
				}
				if !media && served == 0 {
					t.Fatal("nothing served: the test needs answers")
				}
				if m.Runs && !media && !refused {
					t.Fatalf("served %d answers and never refused against %d tokens", served, b)
				}
				// A shape the engine would bill past the budget at once: a
				// 20 KB query over 500 documents, or 4 image parts.
				big := shapeBody(m, 20000, 500, media)
				if media {
					big = shapeBody(m, 0, 4, true)
				}
				r := postJSON(h, m.Path, secret, big)
				if m.Runs && !r.quota() && r.status < 400 {
					t.Fatalf("an over-budget %s was served: %d %s", m.Model, r.status, r.body)
				}
				if last == "" {
					last = r.id
				}
				if got := tenantBilled(t, h, last); got > b {
					t.Fatalf("billed %d tokens against a %d-token budget", got, b)
				}
			})
		}
	}
}

// TestScoreShapesAreSizedAsTheEngineRunsThem: vLLM's ScoreRequest is a
// union of four request models; each is sized pair by pair, and a body
// naming fields of two is refused — a 40 KB query over 500 items, or as
// data_1/data_2, was served and billed 5,002,000 tokens against 60,000.
func TestScoreShapesAreSizedAsTheEngineRunsThem(t *testing.T) {
	h := shapeSim(t)
	b := int64(60000)
	secret := h.Key(policy.KeyOptions{Tenant: "score-shapes", BudgetTokens: &b})
	items := strings.TrimSuffix(strings.Repeat(`"a",`, 500), ",")
	query := strconv.Quote(strings.Repeat("q", 40000))
	for _, tc := range []struct{ name, body, want string }{
		{"queries/items", `{"model":"` + servertest.SimModel + `","queries":` + query + `,"items":[` + items + `]}`, "insufficient_quota"},
		{"data_1/data_2", `{"model":"` + servertest.SimModel + `","data_1":` + query + `,"data_2":[` + items + `]}`, "insufficient_quota"},
		{"text_1/text_2 beside queries/documents", `{"model":"` + servertest.SimModel + `","text_1":"a","text_2":["b"],"queries":` + query + `,"documents":[` + items + `]}`, `"param":"text_1"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := postJSON(h, "/v1/score", secret, tc.body)
			if r.status == 200 || !strings.Contains(r.body, tc.want) {
				t.Fatalf("want %s, got %d %s", tc.want, r.status, r.body)
			}
			if got := tenantBilled(t, h, r.id); got > b {
				t.Fatalf("billed %d against %d", got, b)
			}
		})
	}
}

// wavFile is a WAV of seconds of 8 kHz 8-bit mono PCM; junk puts a JUNK
// chunk of 0xFF bytes before fmt (as recorders reserve room for a header),
// where a reader at fixed offsets finds a byte rate of 4 GB/s.
func wavFile(seconds int, junk bool) []byte {
	var b bytes.Buffer
	chunk := func(id string, body []byte) {
		b.WriteString(id)
		binary.Write(&b, binary.LittleEndian, uint32(len(body)))
		b.Write(body)
	}
	b.WriteString("RIFF\x00\x00\x00\x00WAVE")
	if junk {
		chunk("JUNK", bytes.Repeat([]byte{0xff}, 28))
	}
	fmtc := make([]byte, 16)
	binary.LittleEndian.PutUint16(fmtc[0:], 1)
	binary.LittleEndian.PutUint16(fmtc[2:], 1)
	binary.LittleEndian.PutUint32(fmtc[4:], 8000)
	binary.LittleEndian.PutUint32(fmtc[8:], 8000)
	binary.LittleEndian.PutUint16(fmtc[12:], 1)
	binary.LittleEndian.PutUint16(fmtc[14:], 8)
	chunk("fmt ", fmtc)
	chunk("data", bytes.Repeat([]byte{0x80}, seconds*8000))
	out := b.Bytes()
	binary.LittleEndian.PutUint32(out[4:], uint32(len(out)-8))
	return out
}

// oggOpus is an Ogg Opus stream of seconds of 20 ms CELT packets of 40
// bytes (16 kbit/s speech).
func oggOpus(seconds int) []byte {
	var b bytes.Buffer
	page := func(packets [][]byte) {
		b.WriteString("OggS\x00\x00")
		b.Write(make([]byte, 8))          // granule
		b.WriteString("\x01\x00\x00\x00") // serial
		b.Write(make([]byte, 8))          // sequence, CRC (not checked)
		b.WriteByte(byte(len(packets)))
		for _, p := range packets {
			b.WriteByte(byte(len(p)))
		}
		for _, p := range packets {
			b.Write(p)
		}
	}
	page([][]byte{[]byte("OpusHead\x01\x01\x38\x01\x80\x3e\x00\x00\x00\x00\x00")})
	page([][]byte{[]byte("OpusTags\x00\x00\x00\x00\x00\x00\x00\x00")})
	pkt := append([]byte{19 << 3}, bytes.Repeat([]byte{0x55}, 39)...)
	for range seconds {
		ps := make([][]byte, 50)
		for i := range ps {
			ps[i] = pkt
		}
		page(ps)
	}
	return b.Bytes()
}

// flacFile is a FLAC header stating seconds at 16 kHz, then frames of
// silence (a few bytes: lossless silence compresses to almost nothing).
func flacFile(seconds int) []byte {
	si := make([]byte, 34)
	total := uint64(seconds) * 16000
	si[10], si[11] = 0x03, 0xe8 // 16000 Hz in 20 bits; mono, and bits per sample 1 (ignored)
	si[13] = byte(total>>32) & 0x0f
	binary.BigEndian.PutUint32(si[14:18], uint32(total))
	out := append([]byte("fLaC\x80\x00\x00\x22"), si...)
	return append(out, bytes.Repeat([]byte{0xff, 0xf8, 0, 0}, 64)...)
}

// mp3File is seconds of MPEG-1 Layer III frames at 32 kbit/s, 44.1 kHz.
func mp3File(seconds int) []byte {
	frame := make([]byte, 144*32000/44100)
	binary.BigEndian.PutUint32(frame, 0xfffb1000)
	return bytes.Repeat(frame, seconds*44100/1152+1)
}

// postAudio posts a transcription or translation of file.
func postAudio(h *servertest.Gateway, path, secret string, file []byte, fields ...string) reply {
	var b bytes.Buffer
	mw := multipart.NewWriter(&b)
	mw.WriteField("model", servertest.SimModel)
	for i := 0; i+1 < len(fields); i += 2 {
		mw.WriteField(fields[i], fields[i+1])
	}
	fw, _ := mw.CreateFormFile("file", "audio")
	fw.Write(file)
	mw.Close()
	resp := h.Do(http.MethodPost, path, secret, mw.FormDataContentType(), &b)
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return reply{resp.StatusCode, string(raw), resp.Header.Get("X-Request-Id")}
}

// TestAudioContainersAreReservedForTheirLength: every audio container the
// gateway reads is reserved for the audio the engine decodes from it; a
// tenant whose budget holds less than its length's tokens is refused before
// it runs — a JUNK-first WAV of 600 s was read as 1 s and billed 15× the
// budget, an Ogg Opus file at 16 kbit/s was taken at 64 kbit/s.
func TestAudioContainersAreReservedForTheirLength(t *testing.T) {
	h := shapeSim(t)
	for _, tc := range []struct {
		name string
		file []byte
	}{
		{"wav", wavFile(600, false)},
		{"junk-first wav", wavFile(600, true)},
		{"ogg opus 16 kbit/s", oggOpus(600)},
		{"flac", flacFile(600)},
		{"mp3 32 kbit/s", mp3File(600)},
		{"unread container", bytes.Repeat([]byte{0x11}, 600*16000/8)}, // 600 s at 16 kbit/s
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, path := range []string{"/v1/audio/transcriptions", "/v1/audio/translations"} {
				b := int64(20000) // 600 s are 30,000 prompt tokens
				secret := h.Key(policy.KeyOptions{Tenant: "audio-" + tc.name + path, BudgetTokens: &b})
				r := postAudio(h, path, secret, tc.file)
				if !r.quota() {
					t.Fatalf("%s: 600 s against 20,000 tokens: %d %s", path, r.status, r.body)
				}
			}
		})
	}
	t.Run("a WAV without fmt and data is refused", func(t *testing.T) {
		secret := h.Key(policy.KeyOptions{Tenant: "audio-nofmt"})
		r := postAudio(h, "/v1/audio/transcriptions", secret, []byte("RIFF\x04\x00\x00\x00WAVE"))
		if r.status != 400 || !strings.Contains(r.body, `"param":"file"`) {
			t.Fatalf("%d %s", r.status, r.body)
		}
	})
}

// TestAudioAnswersWithoutUsageAreBilledTheirDuration: a translation and a
// response_format=text transcription carry no usage; they are billed the
// audio the engine decoded (300 s: 15,000 prompt tokens and more), not an
// estimate from the file's bytes — 300 s were billed 51.
func TestAudioAnswersWithoutUsageAreBilledTheirDuration(t *testing.T) {
	h := shapeSim(t)
	secret := h.Key(policy.KeyOptions{Tenant: "audio-usage"})
	for _, tc := range []struct {
		name, path string
		fields     []string
	}{
		{"translation", "/v1/audio/translations", nil},
		{"translation as text", "/v1/audio/translations", []string{"response_format", "text"}},
		{"transcription as text", "/v1/audio/transcriptions", []string{"response_format", "text"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := postAudio(h, tc.path, secret, wavFile(300, true), tc.fields...)
			if r.status != 200 {
				t.Fatalf("%d %s", r.status, r.body)
			}
			if row := finalRow(t, h, r.id); row.PromptTokens < 50*300 {
				t.Fatalf("300 s of audio billed %d prompt tokens, want at least %d", row.PromptTokens, 50*300)
			}
		})
	}
}

// TestShapeErrorsNameTheField: a field the gateway does not read, or one it
// cannot size, is a 400 naming it.
func TestShapeErrorsNameTheField(t *testing.T) {
	h := shapeSim(t)
	secret := h.Key(policy.KeyOptions{Tenant: "shape-errors"})
	m := `{"model":"` + servertest.SimModel + `",`
	for _, tc := range []struct{ path, body, param string }{
		{"/v1/embeddings", m + `"input":"a","chat_template":"{% for i in range(99999) %}x{% endfor %}"}`, "chat_template"},
		{"/v1/embeddings", m + `"input":"a","messages":[{"role":"user","content":"b"}]}`, "messages"},
		{"/v1/embeddings", m + `"input":"a","something_new":1}`, "something_new"},
		{"/v1/rerank", m + `"query":"a","documents":["b"],"padding":"max_length"}`, "padding"},
		{"/v1/score", m + `"queries":"a"}`, "queries"},
		{"/v1/score", m + `"queries":"a","documents":["b"],"items":["c"]}`, "items"},
		{"/tokenize", m + `"prompt":"a","messages":[]}`, "messages"},
	} {
		r := postJSON(h, tc.path, secret, tc.body)
		var e struct{ Error struct{ Param string } }
		_ = json.Unmarshal([]byte(r.body), &e)
		if r.status != 400 || e.Error.Param != tc.param {
			t.Errorf("%s %s: %d %s, want 400 naming %s", tc.path, tc.body, r.status, r.body, tc.param)
		}
	}
	r := postAudio(h, "/v1/audio/transcriptions", secret, wavFile(1, false), "use_beam_search", "true")
	if r.status != 400 || !strings.Contains(r.body, `"param":"use_beam_search"`) {
		t.Errorf("beam search: %d %s", r.status, r.body)
	}
}

// TestAbortBeforeTheFirstTokenIsBilledThePrompt: a client that sends a long
// prompt and goes away before the first token, once its request reached
// the engine, is billed the prompt the engine was given to prefill — 8 of
// 9 such streams were billed nothing.
func TestAbortBeforeTheFirstTokenIsBilledThePrompt(t *testing.T) {
	h := servertest.Start(t, servertest.Options{Replicas: 1, Sim: sim.Config{TTFT: 10 * time.Second, TTFTSigma: -1}})
	secret := h.Key(policy.KeyOptions{Tenant: "abort"})
	body := `{"model":"` + servertest.SimModel + `","stream":true,"messages":[{"role":"user","content":"` + strings.Repeat("word ", 14000) + `"}]}`
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, h.Public.URL+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+secret)
	req.Header.Set("Content-Type", "application/json")
	done := make(chan struct{})
	go func() {
		defer close(done)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}()
	testkit.WaitWithin(t, 10*time.Second, "the engine holds the request", func() bool {
		s := h.Engines[0].Stats()
		return s.Running+s.Waiting > 0
	})
	cancel()
	<-done
	var row data.LedgerRow
	testkit.WaitWithin(t, 10*time.Second, "the request's ledger row", func() bool {
		for _, r := range h.LedgerRows() {
			if r.Outcome == data.OutcomeClientCancelled {
				row = r
				return true
			}
		}
		return false
	})
	if row.PromptTokens < 14000/4 {
		t.Fatalf("a 70 KB prompt the engine held was billed %d prompt tokens when its client left", row.PromptTokens)
	}
}
