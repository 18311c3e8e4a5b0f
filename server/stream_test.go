package server_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"

	"github.com/tailgate-dev/tailgate/policy"
	"github.com/tailgate-dev/tailgate/router"
	"github.com/tailgate-dev/tailgate/server"
	"github.com/tailgate-dev/tailgate/server/internal/servertest"
	"github.com/tailgate-dev/tailgate/serving/sim"
)

func TestMeteringIsExactUnderMixedConcurrentLoad(t *testing.T) {
	h := servertest.Start(t, servertest.Options{Replicas: 3, Sim: sim.Config{TTFT: 2 * time.Millisecond, TPOT: 200 * time.Microsecond}})
	client := h.Client(h.Key(policy.KeyOptions{}))
	var (
		wg                 sync.WaitGroup
		mu                 sync.Mutex
		prompt, completion int64
	)
	for i := range 150 {
		wg.Go(func() {
			ctx := context.Background()
			content := fmt.Sprintf("request number %d %s", i, strings.Repeat("pad ", i%17))
			params := openai.ChatCompletionNewParams{
				Model:     servertest.SimModel,
				Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage(content)},
				MaxTokens: openai.Int(int64(5 + i%30)),
			}
			var u openai.CompletionUsage
			switch i % 3 {
			case 0:
				resp, err := client.Chat.Completions.New(ctx, params)
				if err != nil {
					t.Error(err)
					return
				}
				u = resp.Usage
			case 1: // stream, usage asked for
				params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
				s := client.Chat.Completions.NewStreaming(ctx, params)
				var acc openai.ChatCompletionAccumulator
				for s.Next() {
					acc.AddChunk(s.Current())
				}
				if err := s.Err(); err != nil {
					t.Error(err)
					return
				}
				u = acc.Usage
			case 2: // stream, no usage asked: count what arrived
				s := client.Chat.Completions.NewStreaming(ctx, params)
				words := 0
				for s.Next() {
					c := s.Current()
					if c.JSON.Usage.Valid() && c.Usage.TotalTokens > 0 {
						t.Error("usage chunk delivered although not asked for")
					}
					for _, ch := range c.Choices {
						words += len(strings.Fields(ch.Delta.Content))
						if ch.FinishReason == "stop" {
							words++ // the EOS token: counted, no text (as from vLLM)
						}
					}
				}
				if err := s.Err(); err != nil {
					t.Error(err)
					return
				}
				u = openai.CompletionUsage{PromptTokens: int64(sim.ChatPromptTokens(content)), CompletionTokens: int64(words)}
			}
			mu.Lock()
			prompt += u.PromptTokens
			completion += u.CompletionTokens
			mu.Unlock()
		})
	}
	wg.Wait()
	var lp, lc int64
	rows := h.LedgerRows()
	for _, r := range rows {
		lp += r.PromptTokens
		lc += r.CompletionTokens
	}
	if len(rows) != 150 || lp != prompt || lc != completion {
		t.Fatalf("ledger: %d rows, %d prompt, %d completion; clients received %d prompt, %d completion over 150 requests",
			len(rows), lp, lc, prompt, completion)
	}
	for _, rep := range h.Reg.Replicas() {
		if rep.Inflight() != 0 {
			t.Fatalf("replica %s inflight %d after load", rep.ID, rep.Inflight())
		}
	}
}

func TestClientDisconnectCancelsUpstream(t *testing.T) {
	h := servertest.Start(t, servertest.Options{Replicas: 1, Sim: sim.Config{TTFT: time.Millisecond, TPOT: 50 * time.Millisecond}})
	secret := h.Key(policy.KeyOptions{})
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, h.Public.URL+"/v1/chat/completions",
		strings.NewReader(`{"model":"tailgate-sim","stream":true,"max_tokens":200,"messages":[{"role":"user","content":"long"}]}`))
	req.Header.Set("Authorization", "Bearer "+secret)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 512)
	if _, err := resp.Body.Read(buf); err != nil { // the first event arrived
		t.Fatal(err)
	}
	cancel()
	resp.Body.Close()
	deadline := time.Now().Add(5 * time.Second)
	for h.Engines[0].Stats().Aborted != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("engine never saw the cancel: %+v", h.Engines[0].Stats())
		}
		time.Sleep(5 * time.Millisecond)
	}
	var row = waitRow(t, h)
	if row.Outcome != "client_cancelled" || row.CompletionTokens >= 200 {
		t.Fatalf("ledger row %+v", row)
	}
}

func waitRow(t *testing.T, h *servertest.Gateway) (row struct {
	Outcome          string
	CompletionTokens int64
}) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if rows := h.LedgerRows(); len(rows) > 0 {
			row.Outcome, row.CompletionTokens = string(rows[0].Outcome), rows[0].CompletionTokens
			return row
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("no ledger row")
	return row
}

func TestKeepAliveWhileFirstTokenIsSlow(t *testing.T) {
	h := servertest.Start(t, servertest.Options{Replicas: 1, Sim: sim.Config{TTFT: 400 * time.Millisecond, TTFTSigma: -1},
		Server: server.Config{KeepAlive: 50 * time.Millisecond}})
	resp := h.Post("/v1/chat/completions", h.Key(policy.KeyOptions{}),
		`{"model":"tailgate-sim","stream":true,"max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`)
	defer resp.Body.Close()
	payloads, comments := readSSE(t, resp.Body)
	if comments == 0 {
		t.Fatal("no keep-alive comment during a 400ms first token with a 50ms keep-alive")
	}
	if payloads[len(payloads)-1] != "[DONE]" || len(payloads) < 3 {
		t.Fatalf("stream after keep-alives: %q", payloads)
	}
}

func TestDeadReplicaIsRetriedElsewhereAndEjected(t *testing.T) {
	// Round robin, so every replica is tried within the first requests.
	h := servertest.Start(t, servertest.Options{Replicas: 1, DeadUpstreams: 2, Router: router.Config{Selector: &router.RoundRobin{}}})
	secret := h.Key(policy.KeyOptions{})
	for i := range 10 {
		resp := h.Post("/v1/chat/completions", secret, hiBody)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("request %d: %d", i, resp.StatusCode)
		}
	}
	for _, rep := range h.Reg.Replicas() {
		if strings.HasPrefix(rep.ID, "dead") && rep.State().String() != "ejected" {
			t.Fatalf("%s is %s, want ejected", rep.ID, rep.State())
		}
	}
	var retried int
	for _, r := range h.LedgerRows() {
		if r.Attempts > 1 {
			retried++
		}
		if strings.HasPrefix(r.Upstream, "dead") {
			t.Fatalf("row served by a dead replica: %+v", r)
		}
	}
	if retried == 0 {
		t.Fatal("no request needed a retry; the dead replicas were never tried")
	}
}

func TestSlowBodyIsCutOff(t *testing.T) {
	h := servertest.Start(t, servertest.Options{Server: server.Config{BodyTimeout: 200 * time.Millisecond}})
	secret := h.Key(policy.KeyOptions{})
	conn, err := net.Dial("tcp", h.Public.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"model\":", secret)
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 4096)
	n, _ := conn.Read(buf)
	if !strings.Contains(string(buf[:n]), "408") {
		t.Fatalf("a client that stops sending its body got: %q", buf[:n])
	}
	// The gateway still serves others.
	resp := h.Post("/v1/chat/completions", secret, hiBody)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("after a slow client: %d", resp.StatusCode)
	}
}
