package e2e

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"tailgate/data"
	"tailgate/data/pgtest"
)

// TestPostgresOutageFailsClosedAndRecovers: PostgreSQL stops under load.
// The gateway answers 503 ledger_unavailable (and /healthz 503) instead of
// serving what it could not bill; once PostgreSQL is back it serves again
// by itself, and every answer a client received has its ledger row.
func TestPostgresOutageFailsClosedAndRecovers(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the tailgate binary and a PostgreSQL server")
	}
	pg := pgtest.Dedicated(t)
	url := pg.NewDatabase()
	p := startUp(t, "--database", url, "--replicas", "1", "--sim-ttft", "1ms", "--sim-tpot", "0s")
	healthz := strings.TrimSuffix(p.api, "/v1") + "/healthz"
	client := &http.Client{Timeout: 30 * time.Second}

	type result struct {
		status int
		code   string
		id     string
	}
	call := func() result {
		req, _ := http.NewRequest(http.MethodPost, p.api+"/chat/completions", strings.NewReader(
			`{"model":"tailgate-sim","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`))
		req.Header.Set("Authorization", "Bearer "+p.demoKey)
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			return result{}
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var e struct {
			Error struct {
				Code string `json:"code"`
			} `json:"error"`
		}
		_ = json.Unmarshal(body, &e)
		return result{status: resp.StatusCode, code: e.Error.Code, id: resp.Header.Get("x-request-id")}
	}
	health := func() int {
		resp, err := client.Get(healthz)
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}

	var (
		mu       sync.Mutex
		answered []string // request ids of 200 answers
		refused  int      // 503 ledger_unavailable
		other    []result
		stop     = make(chan struct{})
		wg       sync.WaitGroup
	)
	for range 4 {
		wg.Go(func() {
			for i := 0; i < 100_000; i++ {
				select {
				case <-stop:
					return
				default:
				}
				r := call()
				mu.Lock()
				switch {
				case r.status == 200:
					answered = append(answered, r.id)
				case r.status == 503 && r.code == "ledger_unavailable":
					refused++
				case r.status != 0:
					other = append(other, r)
				}
				mu.Unlock()
				if r.status != 200 {
					time.Sleep(20 * time.Millisecond)
				}
			}
		})
	}
	count := func() (int, int) {
		mu.Lock()
		defer mu.Unlock()
		return len(answered), refused
	}
	waitFor := func(what string, d time.Duration, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(d)
		for !cond() {
			if time.Now().After(deadline) {
				close(stop)
				wg.Wait()
				t.Fatalf("%s: not within %v\ngateway stderr:\n%s", what, d, p.stderr.String())
			}
			time.Sleep(50 * time.Millisecond)
		}
	}

	waitFor("answers before the outage", 30*time.Second, func() bool { n, _ := count(); return n >= 20 })
	pg.Stop()
	waitFor("503 ledger_unavailable while PostgreSQL is down", 30*time.Second, func() bool { _, r := count(); return r >= 5 })
	waitFor("/healthz 503 while PostgreSQL is down", 30*time.Second, func() bool { return health() == 503 })
	before, _ := count()
	pg.Start()
	waitFor("answers again after PostgreSQL came back", 60*time.Second, func() bool { n, _ := count(); return n >= before+20 })
	waitFor("/healthz 200 after PostgreSQL came back", 30*time.Second, func() bool { return health() == 200 })
	close(stop)
	wg.Wait()

	mu.Lock()
	defer mu.Unlock()
	if len(other) > 0 {
		t.Errorf("%d answers were neither 200 nor 503 ledger_unavailable, e.g. %+v", len(other), other[0])
	}
	st, err := data.Open(url)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	// Rows queued during the outage land once it is over: wait for them,
	// bounded.
	var missing []string
	deadline := time.Now().Add(20 * time.Second)
	for {
		rows, err := st.LedgerRows(context.Background(), data.UsageFilter{})
		if err != nil {
			t.Fatal(err)
		}
		billed := make(map[string]bool, len(rows))
		for _, r := range rows {
			if r.Status == 200 && r.Outcome == data.OutcomeOK {
				billed[r.ID] = true
			}
		}
		missing = missing[:0]
		for _, id := range answered {
			if !billed[id] {
				missing = append(missing, id)
			}
		}
		if len(missing) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if len(missing) > 0 {
		t.Fatalf("%d of %d answers the clients received have no ledger row, e.g. %s", len(missing), len(answered), missing[0])
	}
	t.Logf("%d answers, %d refused with 503 ledger_unavailable during the outage", len(answered), refused)
}
