package server_test

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/data"
	"github.com/tailgate-dev/tailgate/policy"
	"github.com/tailgate-dev/tailgate/server/internal/servertest"
	"github.com/tailgate-dev/tailgate/serving/sim"
)

// TestFullDiskFailsClosedAndRecovers: when the database fills mid-load, the
// gateway stops starting answers it could not bill (503
// ledger_unavailable, /healthz 503, tailgate_ledger_up 0), and once space
// returns it serves again without a restart; every answer a client got has
// its ledger row.
func TestFullDiskFailsClosedAndRecovers(t *testing.T) {
	h := servertest.Start(t, servertest.Options{Replicas: 1})
	secret := h.Key(policy.KeyOptions{})
	body := `{"model":"` + servertest.SimModel + `","max_tokens":5,"messages":[{"role":"user","content":"` + strings.Repeat("padding ", 200) + `"}]}`
	post := func() (int, string) {
		resp := h.Post("/v1/chat/completions", secret, body)
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(raw)
	}
	healthz := func() int {
		resp, err := http.Get(h.Public.URL + "/healthz")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	answered := 0
	for range 3 {
		if code, raw := post(); code != 200 {
			t.Fatalf("before the fill: %d %s", code, raw)
		}
		answered++
	}

	// Fill: no page may be added any more.
	if err := h.Store.SetMaxPageCount(1); err != nil {
		t.Fatal(err)
	}
	refused, afterFill := 0, 0
	for i := 0; i < 400 && refused < 5; i++ {
		code, raw := post()
		switch {
		case code == 200:
			answered++
			afterFill++
			if refused > 0 {
				t.Fatalf("an answer was served after the gateway had refused for a full ledger")
			}
		case code == 503 && strings.Contains(raw, `"ledger_unavailable"`):
			refused++
		default:
			t.Fatalf("while full: %d %s", code, raw)
		}
	}
	if refused == 0 {
		t.Fatalf("the database never filled (%d answers after the fill)", afterFill)
	}
	if healthz() != 503 || gauge(t, h, "tailgate_ledger_up") != 0 || readyz(t, h) != 503 {
		t.Fatal("/healthz, /readyz and tailgate_ledger_up must say the ledger is down")
	}
	t.Logf("%d answers between the fill and the first refusal (the writes that found the disk full)", afterFill)

	// Space returns: the gateway recovers by itself.
	if err := h.Store.SetMaxPageCount(1 << 30); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		code, _ := post()
		if code == 200 {
			answered++
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("still %d 15 s after space returned", code)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if healthz() != 200 {
		t.Fatal("/healthz still 503 after recovery")
	}
	ok := 0
	for _, r := range h.LedgerRows() {
		if r.Outcome == data.OutcomeOK {
			ok++
		}
	}
	if ok != answered {
		t.Fatalf("%d answers served, %d ok ledger rows", answered, ok)
	}
}

func gauge(t *testing.T, h *servertest.Gateway, name string) float64 {
	t.Helper()
	mfs, err := h.Metrics.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) > 0 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

// TestAnswerWhoseRowCannotBeCommittedIsNotDelivered: the ledger fails after
// a request was admitted (the file system goes read-only while its answer
// is generated). A
// JSON answer is then withheld — the client gets 503 ledger_unavailable and
// is billed nothing — and a stream is cut before [DONE] with the same error,
// billed at what it delivered. On the old code both were delivered whole
// and the rows held in memory only.
func TestAnswerWhoseRowCannotBeCommittedIsNotDelivered(t *testing.T) {
	const tokens = 12
	h := servertest.Start(t, servertest.Options{Replicas: 1,
		Sim: sim.Config{TPOT: 100 * time.Millisecond, TTFTSigma: -1}})
	secret := h.Key(policy.KeyOptions{})
	ask := func(stream bool) string {
		return fmt.Sprintf(`{"model":%q,"max_tokens":%d,"ignore_eos":true,"stream":%t,"messages":[{"role":"user","content":"hello"}]}`,
			servertest.SimModel, tokens, stream)
	}

	type answer struct {
		code int
		body string
	}
	jsonDone := make(chan answer, 1)
	go func() {
		resp := h.Post("/v1/chat/completions", secret, ask(false))
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		jsonDone <- answer{resp.StatusCode, string(raw)}
	}()
	resp := h.Post("/v1/chat/completions", secret, ask(true))
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	first, err := br.ReadString('\n')
	if err != nil || !strings.HasPrefix(first, "data: ") {
		t.Fatalf("first line of the stream: %q, %v", first, err)
	}
	// Both admitted and generating (the ledger was healthy then); now the
	// disk fills.
	// (Both on the replica: past admission, where a ledger already failing
	// would have refused them.)
	deadline := time.Now().Add(10 * time.Second)
	for h.Reg.Get("sim-a").Inflight() < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("on the replica %d, want 2", h.Reg.Get("sim-a").Inflight())
		}
		time.Sleep(5 * time.Millisecond)
	}
	// The file system goes read-only: no row can be written, not even a
	// stream's final row over its open one (which a full disk would still
	// take: an update in place needs no new page).
	if err := h.Store.SetReadOnly(true); err != nil {
		t.Fatal(err)
	}
	rest, _ := io.ReadAll(br)
	stream := first + string(rest)
	j := <-jsonDone

	if j.code != http.StatusServiceUnavailable || !strings.Contains(j.body, `"ledger_unavailable"`) {
		t.Errorf("JSON answer whose row could not be committed: %d %s; want 503 ledger_unavailable", j.code, j.body)
	}
	if strings.Contains(j.body, `"choices"`) {
		t.Errorf("the withheld JSON answer reached the client: %s", j.body)
	}
	if strings.Contains(stream, "data: [DONE]") || !strings.Contains(stream, `"ledger_unavailable"`) {
		t.Errorf("stream whose row could not be committed ended:\n%s\nwant no [DONE] and a ledger_unavailable error event", stream)
	}
	delivered := strings.Count(stream, `"content":"`) - strings.Count(stream, `"content":""`)

	// Writes work again; the rows land.
	if err := h.Store.SetReadOnly(false); err != nil {
		t.Fatal(err)
	}
	var withheld, cut *data.LedgerRow
	for deadline := time.Now().Add(15 * time.Second); withheld == nil || cut == nil; {
		if time.Now().After(deadline) {
			t.Fatalf("ledger rows after recovery: withheld %+v, cut %+v; want the JSON request's and the stream's final rows", withheld, cut)
		}
		time.Sleep(20 * time.Millisecond)
		withheld, cut = nil, nil
		rows := h.LedgerRows()
		for i, r := range rows {
			switch {
			case r.Stream && r.Outcome != data.OutcomeOpen:
				cut = &rows[i]
			case !r.Stream:
				withheld = &rows[i]
			}
		}
	}
	if withheld.Outcome != data.OutcomeWithheld || withheld.Error != data.ClassLedgerUnavailable ||
		withheld.PromptTokens+withheld.CompletionTokens != 0 || withheld.CostMicros != 0 || withheld.HedgeOverheadTokens == 0 {
		t.Errorf("withheld JSON answer's row: %+v; want outcome withheld, nothing billed, its tokens as overhead", *withheld)
	}
	if cut.Outcome != data.OutcomeMidstream || cut.Error != data.ClassLedgerUnavailable || cut.CompletionTokens < int64(delivered) {
		t.Errorf("cut stream's row: %+v; want midstream_error/ledger_unavailable billing at least the %d tokens delivered", *cut, delivered)
	}
}
