package e2e

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"tailgate/data"
	"tailgate/policy"
)

// TestSIGKILLLosesNoAnswer kills the real gateway (SIGKILL) under mixed
// streaming and JSON load, restarts it on the same data, and checks the
// ledger: every answer a client received whole has its row (it was
// committed before the answer's last bytes), and every stream the kill cut
// after its first token arrived has a row too — interrupted, billed at what
// it had received — once the open row had its moment to be written.
func TestSIGKILLLosesNoAnswer(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the tailgate binary")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	simAddr := ln.Addr().String()
	ln.Close()
	sim := startProc(t, "tailgate sim", false, "sim", "--listen", simAddr, "--model", "tailgate-sim",
		"--sim-ttft", "5ms", "--sim-tpot", "4ms", "--sim-max-seqs", "64")
	_ = sim
	dir := t.TempDir()
	const kills = 4
	load := newKillLoad()
	// Two of the clients spend a tenant's token budget that runs out
	// during the run: kills lose the gateway's in-memory reservations, yet
	// what the ledger says was spent never passes the budget.
	key, capped := "", ""
	budget := int64(1500)
	for round := range kills + 1 {
		gw := startProc(t, "tailgate gateway", true, "gateway", "--data", dir, "--listen", "127.0.0.1:0",
			"--admin-listen", "127.0.0.1:0", "--upstream", "http://"+simAddr)
		var api string
		gw.scanUntil(func(line string) bool {
			if m := apiLine.FindStringSubmatch(line); m != nil {
				api = strings.TrimSuffix(m[1], "/v1")
			}
			return api != ""
		})
		if api == "" {
			t.Fatalf("gateway printed no API address:\n%s", gw.stderr.String())
		}
		waitHealthy(t, api)
		if key == "" {
			st, err := data.Open(filepath.Join(dir, "tailgate.db"))
			if err != nil {
				t.Fatal(err)
			}
			key, _, err = policy.CreateKey(t.Context(), st, policy.KeyOptions{Tenant: "acme"})
			if err == nil {
				capped, _, err = policy.CreateKey(t.Context(), st, policy.KeyOptions{Tenant: "capped", BudgetTokens: &budget})
			}
			st.Close()
			if err != nil {
				t.Fatal(err)
			}
			time.Sleep(300 * time.Millisecond) // the gateway's key poll
		}
		if round == kills {
			break // the last start only settles what the last kill left
		}
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		for w := range 6 {
			k := key
			if w < 2 {
				k = capped
			}
			wg.Go(func() { load.run(ctx, api, k, w, "") })
		}
		time.Sleep(time.Duration(700+300*round) * time.Millisecond)
		load.kill()
		if err := gw.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		<-gw.Done()
		time.Sleep(100 * time.Millisecond) // let clients see their connections die
		cancel()
		wg.Wait()
	}

	st, err := data.Open(filepath.Join(dir, "tailgate.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	rows, err := st.LedgerRows(t.Context(), data.UsageFilter{})
	if err != nil {
		t.Fatal(err)
	}
	byID := map[string]data.LedgerRow{}
	for _, r := range rows {
		byID[r.ID] = r
	}
	load.mu.Lock() // the clients are done; for the race detector
	defer load.mu.Unlock()
	whole, cut := load.whole, load.cut
	if len(whole) < 20 {
		t.Fatalf("only %d answers completed: the load did not run", len(whole))
	}
	for _, ep := range killEndpoints {
		if load.wholeOf[ep.path] == 0 {
			t.Errorf("no answer of %s completed: the load did not test it", ep.path)
		}
	}
	missing := 0
	for _, id := range whole {
		if r, ok := byID[id]; !ok || r.Outcome != data.OutcomeOK {
			missing++
			t.Errorf("answer %s received whole has ledger row %+v (present %v)", id, r, ok)
		}
	}
	interrupted, maxLag := 0, 0
	for id, received := range cut {
		r, ok := byID[id]
		switch {
		case !ok:
			t.Errorf("stream %s cut by a kill after its first token has no ledger row", id)
		case r.Outcome == data.OutcomeInterrupted:
			interrupted++
			if r.CompletionTokens == 0 {
				t.Errorf("interrupted stream %s billed no output", id)
			}
			// The open row follows the client within openRowEvery (100 ms)
			// and the ledger's batching: at 4 ms a token, ~30 tokens; the
			// bound leaves room for a loaded machine.
			lag := received - int(r.CompletionTokens)
			maxLag = max(maxLag, lag)
			if lag > 75 {
				t.Errorf("interrupted stream %s: received %d output events, billed %d", id, received, r.CompletionTokens)
			}
		case r.Outcome == data.OutcomeOpen:
			t.Errorf("stream %s still open after restarts", id)
		}
	}
	var spent int64
	for _, r := range rows {
		if r.Tenant == "capped" {
			spent += r.PromptTokens + r.CompletionTokens
		}
	}
	if spent > budget {
		t.Errorf("tenant capped spent %d tokens of its %d-token budget", spent, budget)
	}
	if spent < budget/3 {
		t.Errorf("tenant capped spent only %d of %d tokens: the budget was not put to the test", spent, budget)
	}
	t.Logf("%d kills: %d answers whole (%d without a row), %d streams cut after a token (%d settled interrupted, received − billed at most %d tokens); capped tenant spent %d of %d tokens",
		kills, len(whole), missing, len(cut), interrupted, maxLag, spent, budget)
}

// killLoad is a mixed load of streams and JSON answers judged against the
// moment of a gateway kill: the request ids answered whole, and the streams
// the kill cut well after their first token (so they had an open row).
type killLoad struct {
	mu       sync.Mutex
	killedAt time.Time
	whole    []string
	cut      map[string]int    // a cut stream's output events received
	how      map[string]string // a whole answer's note
	wholeOf  map[string]int    // answers whole per endpoint
}

func newKillLoad() *killLoad {
	return &killLoad{cut: map[string]int{}, how: map[string]string{}, wholeOf: map[string]int{}}
}

// kill notes that the gateway is being killed now.
func (l *killLoad) kill() {
	l.mu.Lock()
	l.killedAt = time.Now()
	l.mu.Unlock()
}

// run is client w's requests to api with key until ctx ends (2,000 at
// most): every other one streamed, JSON answers short, streams 0.4–1.6 s
// (long enough to be cut). note describes a whole answer (the time since
// the kill is added).
func (l *killLoad) run(ctx context.Context, api, key string, w int, note string) {
	for i := 0; ctx.Err() == nil && i < 2000; i++ {
		stream := (w+i)%2 == 0
		n := 10 + (w*7+i)%40
		if stream {
			n = 100 + (w*37+i*11)%300
		}
		ep := killEndpoints[(w+i/2)%len(killEndpoints)]
		id, ok, firstAt, received := oneRequest(ctx, api, key, stream, n, ep)
		if id == "" {
			continue
		}
		l.mu.Lock()
		killed := l.killedAt
		switch {
		case ok:
			l.whole = append(l.whole, id)
			l.wholeOf[ep.path]++
			l.how[id] = fmt.Sprintf("%s stream %v, answered %v after the kill", note, stream, time.Since(killed))
		case stream && !firstAt.IsZero() && !killed.IsZero() && killed.Sub(firstAt) > 200*time.Millisecond:
			l.cut[id] = received
		}
		l.mu.Unlock()
	}
}

// killEndpoint is an endpoint the kill load sends to: its body (stream and
// output cap to fill in), a line carrying output and the line that ends a
// whole stream.
type killEndpoint struct {
	path, body   string
	output, last string
}

// killEndpoints: chat, and the Responses and Messages APIs, whose streams
// report usage only in their last events.
var killEndpoints = []killEndpoint{
	{"/v1/chat/completions", `{"model":"tailgate-sim","stream":%v,"max_tokens":%d,"ignore_eos":true,"messages":[{"role":"user","content":"count"}]}`, `"content":"`, "data: [DONE]"},
	{"/v1/responses", `{"model":"tailgate-sim","stream":%v,"max_output_tokens":%d,"input":"count"}`, "event: response.output_text.delta", "event: response.completed"},
	{"/v1/messages", `{"model":"tailgate-sim","stream":%v,"max_tokens":%d,"messages":[{"role":"user","content":"count"}]}`, "event: content_block_delta", "event: message_stop"},
}

// oneRequest sends one request of ep and reports its request id, whether
// the answer arrived whole, and when a stream's first token arrived.
func oneRequest(ctx context.Context, api, key string, stream bool, maxTokens int, ep killEndpoint) (id string, whole bool, firstAt time.Time, received int) {
	body := fmt.Sprintf(ep.body, stream, maxTokens)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, api+ep.path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", false, time.Time{}, 0
	}
	defer resp.Body.Close()
	id = resp.Header.Get("X-Request-Id")
	if resp.StatusCode != 200 {
		return "", false, time.Time{}, 0
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	if !stream {
		var n int
		for sc.Scan() {
			n += len(sc.Bytes())
		}
		return id, sc.Err() == nil && n > 0 && int64(n) >= 0 && resp.ContentLength >= 0, time.Time{}, 0
	}
	for sc.Scan() {
		line := sc.Text()
		if strings.Contains(line, ep.output) && !strings.Contains(line, `"content":""`) {
			received++
			if firstAt.IsZero() {
				firstAt = time.Now()
			}
		}
		if line == ep.last {
			return id, true, firstAt, received
		}
	}
	return id, false, firstAt, received
}

func waitHealthy(t *testing.T, api string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		resp, err := http.Get(api + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("%s not healthy after 30 s", api)
}
