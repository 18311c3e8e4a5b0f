package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/data"
	"github.com/tailgate-dev/tailgate/data/pgtest"
	"github.com/tailgate-dev/tailgate/e2e/testkit"
)

// docsCurl is the shell block of docs/api.md's section on idempotent requests.
var docsCurl = regexp.MustCompile("(?s)## Idempotent requests.*?```sh\n(.*?)```")

// TestIdempotencyOnTheBinary runs docs/api.md's curl example twice against
// `tailgate gateway` (the second answer is the first's, replayed, billed
// once), then SIGKILLs the gateway in the middle of a keyed stream and
// sends the client's retry, with the same key, to the restarted gateway:
// the answer completes, and the key's requests are billed once.
func TestIdempotencyOnTheBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the tailgate binary")
	}
	raw, err := os.ReadFile("../docs/api.md")
	if err != nil {
		t.Fatal(err)
	}
	m := docsCurl.FindSubmatch(raw)
	if m == nil {
		t.Fatal("docs/api.md has no curl example of Idempotency-Key")
	}
	sim := startSim(t, "--sim-ttft", "5ms", "--sim-tpot", "20ms")
	work := t.TempDir()
	dir := filepath.Join(work, "tailgate-data")
	g := startGatewayIn(t, dir, "--upstream", "http://"+sim)
	if err := os.WriteFile(filepath.Join(dir, "demo.key"), []byte(g.key+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	base := strings.TrimSuffix(g.api, "/v1")
	block := strings.ReplaceAll(string(m[1]), "http://127.0.0.1:8080", base)
	curl := func() (http.Header, string) {
		cmd := exec.Command("bash", "-e", "-o", "pipefail", "-c", block)
		cmd.Dir = work
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("%s: %v\n%s", block, err, out)
		}
		resp, err := http.ReadResponse(bufio.NewReader(strings.NewReader(string(out))), nil)
		if err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		var body struct{ ID string }
		if err := json.NewDecoder(resp.Body).Decode(&body); err != nil || resp.StatusCode != 200 {
			t.Fatalf("%d %v\n%s", resp.StatusCode, err, out)
		}
		return resp.Header, body.ID
	}
	h1, id1 := curl()
	h2, id2 := curl()
	if id1 == "" || id2 != id1 || h1.Get("Idempotent-Replayed") != "" || h2.Get("Idempotent-Replayed") != "true" || h2.Get("X-Tailgate-Replay-Of") != h1.Get("X-Request-Id") {
		t.Fatalf("first %q %v\nsecond %q %v", id1, h1, id2, h2)
	}

	// A keyed stream, cut by the gateway's death after a few events.
	body := `{"model":"tailgate-sim","stream":true,"max_tokens":60,"ignore_eos":true,"messages":[{"role":"user","content":"a long answer"}]}`
	send := func(ctx context.Context, api string) *http.Response {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, api+"/chat/completions", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+g.key)
		req.Header.Set("Idempotency-Key", "crash-1")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != 200 {
			t.Fatalf("stream: %d", resp.StatusCode)
		}
		return resp
	}
	resp := send(context.Background(), g.api)
	first := resp.Header.Get("X-Request-Id")
	sc := bufio.NewScanner(resp.Body)
	for events := 0; events < 15 && sc.Scan(); {
		if strings.HasPrefix(sc.Text(), "data: ") {
			events++
		}
	}
	if err := g.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-g.Done()
	resp.Body.Close()

	g2 := startGatewayIn(t, dir, "--upstream", "http://"+sim)
	resp = send(context.Background(), g2.api)
	retry := resp.Header.Get("X-Request-Id")
	var last string
	sc = bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			last = d
		}
	}
	resp.Body.Close()
	if last != "[DONE]" {
		t.Fatalf("the retry on the restarted gateway ended with %q", last)
	}

	st, err := data.Open(filepath.Join(dir, "tailgate.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var rows map[string]data.LedgerRow
	testkit.WaitWithin(t, 10*time.Second, "both requests' final rows", func() bool {
		all, err := st.LedgerRows(t.Context(), data.UsageFilter{})
		if err != nil {
			t.Fatal(err)
		}
		rows = map[string]data.LedgerRow{}
		for _, r := range all {
			rows[r.ID] = r
		}
		return rows[retry].Outcome == data.OutcomeOK && rows[first].Outcome != "" && rows[first].Outcome != data.OutcomeOpen
	})
	orig, again := rows[first], rows[retry]
	if again.ReplayOf != first || again.PromptTokens+again.CompletionTokens+again.CostMicros != 0 {
		t.Fatalf("the retry's row %+v: want replay_of %s, billed 0 (the interrupted run %+v billed it)", again, first, orig)
	}
	if orig.Outcome != data.OutcomeInterrupted || orig.CompletionTokens == 0 {
		t.Fatalf("the killed run's row %+v: want interrupted, billed what its client received", orig)
	}
	// Docs' pair: one billed, one replay of it.
	billed := 0
	for _, r := range rows {
		if r.ReplayOf == "" && r.PromptTokens+r.CompletionTokens > 0 {
			billed++
		}
	}
	if billed != 2 { // the docs' first answer and the interrupted stream
		t.Fatalf("%d billed rows, want 2: %+v", billed, rows)
	}
}

// TestIdempotencyAcrossGatewaysOnPostgres: two gateways share PostgreSQL. A
// retry that lands on the other gateway gets the first one's answer; one
// that arrives while the first gateway still runs the stream waits for it
// and gets the same events; one whose first gateway was SIGKILLed
// mid-stream takes the key over once that gateway's lease ran out, and the
// key is billed once.
func TestIdempotencyAcrossGatewaysOnPostgres(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the tailgate binary and a PostgreSQL server")
	}
	url := pgtest.NewDatabase(t)
	sim := startSim(t, "--sim-ttft", "5ms", "--sim-tpot", "20ms")
	gA, gB := startGatewayPair(t, url, "--upstream", "http://"+sim)
	key := gA.key
	body := `{"model":"tailgate-sim","stream":true,"max_tokens":60,"ignore_eos":true,"messages":[{"role":"user","content":"across gateways"}]}`
	send := func(api, idem string) *http.Response {
		req, _ := http.NewRequest(http.MethodPost, api+"/chat/completions", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("Idempotency-Key", idem)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	testkit.WaitWithin(t, 10*time.Second, "both gateways know the key", func() bool {
		r := send(gB.api, "warm-up")
		r.Body.Close()
		return r.StatusCode == 200
	})
	events := func(r *http.Response, n int) []string {
		var evs []string
		sc := bufio.NewScanner(r.Body)
		var id string
		for (n == 0 || len(evs) < n) && sc.Scan() {
			if v, ok := strings.CutPrefix(sc.Text(), "id: "); ok {
				id = v
			}
			if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
				evs = append(evs, id+" "+d)
			}
		}
		return evs
	}

	// Running on A when its retry reaches B: B waits and gives A's events.
	a := send(gA.api, "live-1")
	head := events(a, 3)
	b := send(gB.api, "live-1")
	fromB := events(b, 0)
	b.Body.Close()
	fromA := append(head, events(a, 0)...)
	a.Body.Close()
	if b.Header.Get("Idempotent-Replayed") != "true" || len(fromB) != len(fromA) || len(fromA) < 60 {
		t.Fatalf("B gave %d events (replayed %q), A %d", len(fromB), b.Header.Get("Idempotent-Replayed"), len(fromA))
	}
	for i := range fromA {
		if fromA[i] != fromB[i] {
			t.Fatalf("event %d: A %q, B %q", i, fromA[i], fromB[i])
		}
	}

	// A killed mid-stream: B takes the key over once A's lease ran out.
	a = send(gA.api, "dead-1")
	dead := a.Header.Get("X-Request-Id")
	events(a, 15)
	if err := gA.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-gA.Done()
	a.Body.Close()
	b = send(gB.api, "dead-1")
	rerun := b.Header.Get("X-Request-Id")
	all := events(b, 0)
	b.Body.Close()
	if len(all) == 0 || !strings.HasSuffix(all[len(all)-1], " [DONE]") {
		t.Fatalf("B's retry ended with %v", all)
	}

	st, err := data.Open(url)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var rows map[string]data.LedgerRow
	testkit.WaitWithin(t, 30*time.Second, "the rows of both keys settled", func() bool {
		list, err := st.LedgerRows(t.Context(), data.UsageFilter{})
		if err != nil {
			t.Fatal(err)
		}
		rows = map[string]data.LedgerRow{}
		for _, r := range list {
			rows[r.ID] = r
		}
		return rows[rerun].Outcome == data.OutcomeOK && rows[dead].Outcome == data.OutcomeInterrupted
	})
	var billedLive, replays int
	for _, r := range rows {
		switch {
		case r.ReplayOf != "":
			replays++
		case r.PromptTokens+r.CompletionTokens > 0 && r.ID != dead:
			billedLive++
		}
	}
	// warm-up (1 run and its replays), live-1 (1 run), dead-1 (the
	// interrupted run; its rerun is a replay_of row billed 0).
	if billedLive != 2 || rows[rerun].ReplayOf != dead || rows[rerun].CostMicros+rows[rerun].CompletionTokens != 0 || rows[dead].CompletionTokens == 0 {
		t.Fatalf("billed runs %d (want warm-up and live-1), rerun %+v, interrupted %+v", billedLive, rows[rerun], rows[dead])
	}
}
