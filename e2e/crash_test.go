package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/data"
	"github.com/tailgate-dev/tailgate/data/pgtest"
	"github.com/tailgate-dev/tailgate/e2e/testkit"
	"github.com/tailgate-dev/tailgate/policy"
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

// TestTwoGatewaysOnPostgresLoseNothingToSIGKILL is issue 17's done-when
// test: two gateway binaries on one PostgreSQL, sim workers registered with
// both, mixed streaming and JSON load from several tenants (three of them
// with token budgets the load runs out) and a Batch API batch, while each
// gateway in turn is SIGKILLed and restarted on its addresses. Then: every
// answer a client received whole has its ledger row, every stream a kill
// cut after its first token is settled interrupted, no tenant spent past
// its budget, and the batch completed with exactly one result per line,
// each answer billed once.
func TestTwoGatewaysOnPostgresLoseNothingToSIGKILL(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the tailgate binary and a PostgreSQL server")
	}
	url := pgtest.NewDatabase(t)
	filesDir := t.TempDir() // shared, as the README says
	gws := [2]*gatewayProcess{}
	gws[0], gws[1] = startGatewayPair(t, url, "--batch-files-dir", filesDir)
	for i := 1; i <= 2; i++ {
		gws[0].startWorker(fmt.Sprintf("w%d", i), "--gateway", gws[1].admin, "--sim-tpot", "4ms", "--sim-max-seqs", "64")
	}
	gws[0].waitReady("w1", "w2")
	gws[1].waitReady("w1", "w2")

	st, err := data.Open(url)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	newKey := func(tenant string, budget int64) string {
		o := policy.KeyOptions{Tenant: tenant}
		if budget > 0 {
			o.BudgetTokens = &budget
		}
		k, _, err := policy.CreateKey(t.Context(), st, o)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	const budget = 1200
	free := newKey("acme", 0)
	capped := []string{newKey("capped-1", budget), newKey("capped-2", budget), newKey("capped-3", budget)}
	batcher := newKey("batcher", 0)
	time.Sleep(600 * time.Millisecond) // both gateways' key polls

	const lines = 160
	batchID := startBatch(t, strings.TrimSuffix(gws[0].api, "/v1"), batcher, lines)

	load := newKillLoad()
	for round := range 2 {
		g := gws[round]
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		for c := range 8 {
			api := strings.TrimSuffix(gws[c%2].api, "/v1")
			k := free
			if c < 6 {
				k = capped[c%3]
			}
			wg.Go(func() { load.run(ctx, api, k, c, fmt.Sprintf("gateway %d (killed: %d),", c%2, round)) })
		}
		// Kill once this round has answers behind it (a count, not a time:
		// a loaded machine answers slower), and at least 2 s into it.
		load.mu.Lock()
		want := len(load.whole) + 25
		load.mu.Unlock()
		time.Sleep(2 * time.Second)
		testkit.WaitWithin(t, 60*time.Second, "answers before the kill", func() bool {
			load.mu.Lock()
			defer load.mu.Unlock()
			return len(load.whole) >= want
		})
		load.kill()
		if err := g.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		<-g.Done()
		time.Sleep(300 * time.Millisecond) // the other gateway keeps serving meanwhile
		cancel()
		wg.Wait()
		// Back on its addresses, where the workers keep beating.
		gws[round] = startGatewayIn(t, g.dir, "--database", url, "--batch-files-dir", filesDir,
			"--listen", strings.TrimSuffix(strings.TrimPrefix(g.api, "http://"), "/v1"),
			"--admin-listen", strings.TrimPrefix(g.admin, "http://"))
		gws[round].waitReady("w1", "w2")
	}

	// The batch finishes on whichever gateway holds it: the killed one's
	// claim passes to the other once its lease (10 s) ran out.
	var b data.Batch
	testkit.WaitWithin(t, 120*time.Second, "the batch completes", func() bool {
		b, err = st.BatchByID(t.Context(), 0, batchID)
		return err == nil && b.Status == data.BatchCompleted
	})
	// Open rows the kills left are settled by the gateways' reaping.
	var rows []data.LedgerRow
	testkit.WaitWithin(t, 60*time.Second, "no open ledger rows left", func() bool {
		rows, err = st.LedgerRows(t.Context(), data.UsageFilter{})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rows {
			if r.Outcome == data.OutcomeOpen {
				return false
			}
		}
		return true
	})
	byID := map[string]data.LedgerRow{}
	spent := map[string]int64{}
	batchOK := 0
	for _, r := range rows {
		byID[r.ID] = r
		spent[r.Tenant] += r.PromptTokens + r.CompletionTokens
		if r.Tenant == "batcher" && r.Outcome == data.OutcomeOK {
			batchOK++
		}
	}

	load.mu.Lock() // the clients are done; for the race detector
	defer load.mu.Unlock()
	whole, cut, how := load.whole, load.cut, load.how
	if len(whole) < 40 {
		t.Fatalf("only %d answers completed: the load did not run", len(whole))
	}
	for _, id := range whole {
		if r, ok := byID[id]; !ok || r.Outcome != data.OutcomeOK {
			t.Errorf("answer %s received whole (%s) has ledger row %+v (present %v)", id, how[id], r, ok)
		}
	}
	interrupted := 0
	for id := range cut {
		switch r, ok := byID[id]; {
		case !ok:
			t.Errorf("stream %s cut by a kill after its first token has no ledger row", id)
		case r.Outcome == data.OutcomeInterrupted:
			interrupted++
		}
	}
	most := int64(0)
	for _, tn := range []string{"capped-1", "capped-2", "capped-3"} {
		if spent[tn] > budget {
			t.Errorf("tenant %s spent %d tokens of its %d-token budget across two gateways", tn, spent[tn], budget)
		}
		most = max(most, spent[tn])
	}
	if most < budget/3 {
		t.Errorf("the capped tenants spent at most %d of %d tokens: the budgets were not put to the test", most, budget)
	}

	// Every line has exactly one result, in the output or the error file.
	results := batchResults(t, strings.TrimSuffix(gws[0].api, "/v1"), batcher, b)
	okLines := 0
	for n := range lines {
		rs := results[fmt.Sprintf("line-%d", n)]
		if len(rs) != 1 {
			t.Errorf("line-%d has %d results, want exactly one: %v", n, len(rs), rs)
			continue
		}
		switch r := rs[0]; {
		case r.status == 200:
			okLines++
			if row, ok := byID[r.requestID]; !ok || row.Outcome != data.OutcomeOK {
				t.Errorf("line-%d's answer %s has ledger row %+v (present %v)", n, r.requestID, row, ok)
			}
		case r.code != "line_interrupted":
			t.Errorf("line-%d failed: %+v", n, r)
		}
	}
	// A line's answer billed but not yet recorded when its gateway died runs
	// again: at most the lines in flight at each kill (8 per tenant).
	if extra := batchOK - okLines; extra < 0 || extra > 2*8 {
		t.Errorf("the batch's %d answered lines made %d billed answers: lines ran more than once", okLines, batchOK)
	}
	t.Logf("2 kills: %d answers whole, %d streams cut after a token (%d settled interrupted); tenants spent %v (capped: %d each); batch: %d lines, %d answered, %d billed answers",
		len(whole), len(cut), interrupted, spent, budget, lines, okLines, batchOK)
}

// startBatch uploads a file of n chat requests (custom ids line-0…) and
// starts a batch on it through api, returning its id.
func startBatch(t *testing.T, api, key string, n int) string {
	t.Helper()
	var file bytes.Buffer
	for i := range n {
		fmt.Fprintf(&file, `{"custom_id":"line-%d","method":"POST","url":"/v1/chat/completions","body":{"model":"tailgate-sim","max_tokens":60,"ignore_eos":true,"messages":[{"role":"user","content":"line %d"}]}}`+"\n", i, i)
	}
	var form bytes.Buffer
	mw := multipart.NewWriter(&form)
	_ = mw.WriteField("purpose", "batch")
	fw, _ := mw.CreateFormFile("file", "in.jsonl")
	_, _ = fw.Write(file.Bytes())
	_ = mw.Close()
	var up struct {
		ID string `json:"id"`
	}
	apiJSON(t, http.MethodPost, api+"/v1/files", key, mw.FormDataContentType(), &form, &up)
	var bt struct {
		ID string `json:"id"`
	}
	apiJSON(t, http.MethodPost, api+"/v1/batches", key, "application/json",
		strings.NewReader(`{"input_file_id":"`+up.ID+`","endpoint":"/v1/chat/completions","completion_window":"24h"}`), &bt)
	return bt.ID
}

type lineResult struct {
	status    int
	requestID string
	code      string
}

// batchResults reads a finished batch's output and error files: each
// custom id's results.
func batchResults(t *testing.T, api, key string, b data.Batch) map[string][]lineResult {
	t.Helper()
	out := map[string][]lineResult{}
	for _, f := range []string{b.OutputFileID, b.ErrorFileID} {
		if f == "" {
			continue
		}
		req, _ := http.NewRequest(http.MethodGet, api+"/v1/files/"+f+"/content", nil)
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("file %s: %d %s", f, resp.StatusCode, raw)
		}
		for line := range strings.SplitSeq(strings.TrimSpace(string(raw)), "\n") {
			var l struct {
				CustomID string `json:"custom_id"`
				Response *struct {
					StatusCode int    `json:"status_code"`
					RequestID  string `json:"request_id"`
				} `json:"response"`
				Error *struct {
					Code string `json:"code"`
				} `json:"error"`
			}
			if err := json.Unmarshal([]byte(line), &l); err != nil {
				t.Fatalf("file %s line %q: %v", f, line, err)
			}
			var r lineResult
			if l.Response != nil {
				r.status, r.requestID = l.Response.StatusCode, l.Response.RequestID
			}
			if l.Error != nil {
				r.code = l.Error.Code
			}
			out[l.CustomID] = append(out[l.CustomID], r)
		}
	}
	return out
}

// apiJSON sends one request with key and decodes a 200 answer into v.
func apiJSON(t *testing.T, method, url, key, contentType string, body io.Reader, v any) {
	t.Helper()
	req, _ := http.NewRequest(method, url, body)
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", contentType)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("%s %s: %d %s", method, url, resp.StatusCode, raw)
	}
	if err := json.Unmarshal(raw, v); err != nil {
		t.Fatalf("%s %s: %v\n%s", method, url, err, raw)
	}
}
