package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"tailgate/data"
	"tailgate/data/pgtest"
	"tailgate/e2e/testkit"
	"tailgate/policy"
)

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
