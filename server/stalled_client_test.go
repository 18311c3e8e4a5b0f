package server_test

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"syscall"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"

	"github.com/tailgate-dev/tailgate/data"
	"github.com/tailgate-dev/tailgate/policy"
	"github.com/tailgate-dev/tailgate/server"
	"github.com/tailgate-dev/tailgate/server/internal/servertest"
	"github.com/tailgate-dev/tailgate/serving/sim"
)

// TestClientThatStopsReadingIsCutAndReleased: a client that sends a
// streaming request and then never reads (a tiny receive buffer, so the
// gateway's writes block) holds nothing for long: after the write timeout
// the stream is cut, the key's only concurrency slot and the replica's
// in-flight count are free again, and the ledger says why.
func TestClientThatStopsReadingIsCutAndReleased(t *testing.T) {
	h := servertest.Start(t, servertest.Options{
		Replicas: 1,
		Sim:      sim.Config{Model: servertest.SimModel, TTFT: time.Millisecond, TPOT: 0, MaxModelLen: 1 << 22},
		Server:   server.Config{ClientWriteTimeout: 300 * time.Millisecond},
	})
	secret := h.Key(policy.KeyOptions{MaxConcurrency: 1})

	u, _ := url.Parse(h.Public.URL)
	d := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
		if err != nil {
			return err
		}
		return serr
	}}
	conn, err := d.DialContext(t.Context(), "tcp", u.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	body := `{"model":"` + servertest.SimModel + `","stream":true,"max_tokens":2000000,"ignore_eos":true,"messages":[{"role":"user","content":"talk forever"}]}`
	fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
		u.Host, secret, len(body), body)
	// ... and never read.

	// The request must first be in (a busy machine can take a while to
	// read it), then be cut.
	deadline := time.Now().Add(20 * time.Second)
	for h.Inflight() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the request never reached the gateway's handler")
		}
		time.Sleep(time.Millisecond)
	}
	for h.Inflight() > 0 || len(h.Reg.Replicas()) == 0 || h.Reg.Replicas()[0].Inflight() > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("still held after 20 s: gateway in flight %v, replica in flight %d", h.Inflight(), h.Reg.Replicas()[0].Inflight())
		}
		time.Sleep(20 * time.Millisecond)
	}
	rows := h.LedgerRows()
	if len(rows) != 1 || rows[0].Outcome != data.OutcomeClientCancelled || rows[0].Error != data.ClassClientStalled || rows[0].CompletionTokens == 0 {
		t.Fatalf("ledger %+v, want one client_stalled row billed for what was sent", rows)
	}
	// The key's one concurrency slot is free again.
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	c := h.Client(secret)
	if _, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
		Model: servertest.SimModel, MaxTokens: openai.Int(5), Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")},
	}); err != nil {
		t.Fatalf("the slot was not released: %v", err)
	}
}
