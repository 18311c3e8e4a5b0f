package gateway

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/data"
	"github.com/tailgate-dev/tailgate/data/pgtest"
	"github.com/tailgate-dev/tailgate/e2e/testkit"
	"github.com/tailgate-dev/tailgate/server"
)

// usageReceiver is a usage webhook's receiver on loopback: it answers 500
// while failing, and otherwise checks each POST's signature and keeps its
// events.
type usageReceiver struct {
	dir string // the gateway's data directory, for webhook.secret

	mu       sync.Mutex
	failing  bool
	failures int
	badSigs  int
	ids      []string
}

func (r *usageReceiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	body, _ := io.ReadAll(req.Body)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.failing {
		r.failures++
		http.Error(w, "receiver down", http.StatusInternalServerError)
		return
	}
	secret, err := os.ReadFile(filepath.Join(r.dir, "webhook.secret"))
	if err != nil || server.SignWebhook([]byte(strings.TrimSpace(string(secret))), req.Header.Get("X-Tailgate-Timestamp"), body) != req.Header.Get("X-Tailgate-Signature") ||
		req.Header.Get("Content-Type") != "application/cloudevents-batch+json" {
		r.badSigs++
		http.Error(w, "bad signature", http.StatusUnauthorized)
		return
	}
	var evs []server.UsageEventJSON
	if err := json.Unmarshal(body, &evs); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	for _, e := range evs {
		r.ids = append(r.ids, e.ID)
	}
}

func (r *usageReceiver) state() (failures int, ids []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.failures, slices.Clone(r.ids)
}

func (r *usageReceiver) setFailing(on bool) {
	r.mu.Lock()
	r.failing = on
	r.mu.Unlock()
}

func TestMain(m *testing.M) {
	code := m.Run()
	pgtest.Stop()
	os.Exit(code)
}

// startUsageGateway opens and runs a gateway on dir delivering usage events
// to url; stop ends it and waits for Run. extra flags follow.
func startUsageGateway(t *testing.T, dir, url string, extra ...string) (stop func(), admin string) {
	t.Helper()
	fs := flag.NewFlagSet("gateway", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var cfg Config
	cfg.RegisterFlags(fs)
	cfg.RegisterMeshFlags(fs)
	if err := fs.Parse(append([]string{"--data", dir, "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--shutdown-grace", "2s",
		"--usage-webhook", url, "--usage-webhook-poll", "20ms"}, extra...)); err != nil {
		t.Fatal(err)
	}
	if err := cfg.Load(fs); err != nil {
		t.Fatal(err)
	}
	cfg.UsageWebhookBackoff = 10 * time.Millisecond
	gw, err := Open(context.Background(), cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- gw.Run(ctx) }()
	return func() {
		cancel()
		if err := <-ran; err != nil {
			t.Errorf("Run: %v", err)
		}
		gw.Close()
	}, "http://" + gw.AdminAddr()
}

// usageSinks reads GET /admin/v1/usage/sinks.
func usageSinks(t *testing.T, admin, dir string) []server.UsageSinkView {
	t.Helper()
	tok, err := os.ReadFile(filepath.Join(dir, "admin.token"))
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest(http.MethodGet, admin+"/admin/v1/usage/sinks", nil)
	req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(tok)))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var page struct{ Data []server.UsageSinkView }
	if err := json.NewDecoder(resp.Body).Decode(&page); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /admin/v1/usage/sinks: %d %v", resp.StatusCode, err)
	}
	return page.Data
}

// TestUsageWebhookLosesNothingWhileItsReceiverFails: the receiver takes
// the first events, then answers 500 for a while — across a restart of the
// gateway, with more requests billed while no gateway runs — and then
// recovers. It then has every event, each once (the restarted gateway
// resumes from the cursor in the database, not from the start), in the
// order they were billed, every POST signed with DIR/webhook.secret; an
// event billed afterwards follows. Real HTTP on loopback, a real SQLite
// file written by another Store as by a second process.
func TestUsageWebhookLosesNothingWhileItsReceiverFails(t *testing.T) {
	dir := t.TempDir()
	recv := &usageReceiver{dir: dir}
	sink := httptest.NewServer(recv)
	defer sink.Close()

	stop, _ := startUsageGateway(t, dir, sink.URL)
	db, err := data.Open(filepath.Join(dir, "tailgate.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	tn, err := db.EnsureTenant(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	bill := func(from, to int) {
		t.Helper()
		var rows []data.LedgerRow
		for i := from; i < to; i++ {
			id := fmt.Sprintf("req_%04d", i)
			rows = append(rows, data.LedgerRow{ID: id, TenantID: tn.ID, KeyID: "key_x", Model: "m", Endpoint: "/v1/chat/completions",
				PromptTokens: 3, CompletionTokens: int64(i), CostMicros: 10, Status: 200, Outcome: data.OutcomeOK, Stages: data.UnknownStages()})
			want = append(want, id+".v1")
		}
		if err := db.InsertLedger(ctx, rows); err != nil {
			t.Fatal(err)
		}
	}
	bill(0, 3)
	testkit.WaitWithin(t, 10*time.Second, "the first events delivered", func() bool { _, ids := recv.state(); return len(ids) >= 3 })
	recv.setFailing(true)
	bill(3, 5)
	testkit.WaitWithin(t, 10*time.Second, "the receiver to refuse 3 deliveries", func() bool { n, _ := recv.state(); return n >= 3 })
	stop()

	bill(5, 8) // while no gateway runs
	failed, _ := recv.state()
	stop, admin := startUsageGateway(t, dir, sink.URL)
	defer func() { stop() }()
	testkit.WaitWithin(t, 10*time.Second, "the restarted gateway to retry", func() bool { n, _ := recv.state(); return n >= failed+2 })
	if v := usageSinks(t, admin, dir); len(v) != 1 || v[0].URL != sink.URL || v[0].LastError != "status 500" || v[0].Cursor != "3" {
		t.Errorf("sinks while the receiver fails: %+v, want its URL, cursor 3 (the events it took) and the 500", v)
	}
	recv.setFailing(false)
	testkit.WaitWithin(t, 10*time.Second, "every event delivered", func() bool { _, ids := recv.state(); return len(ids) >= len(want) })
	bill(8, 9)
	testkit.WaitWithin(t, 10*time.Second, "the event billed after recovery", func() bool { _, ids := recv.state(); return len(ids) >= len(want) })

	testkit.WaitWithin(t, 10*time.Second, "the last delivery recorded", func() bool {
		v := usageSinks(t, admin, dir)
		return len(v) == 1 && v[0].Cursor == "9" && v[0].LastError == "" && v[0].DeliveredAt != nil
	})
	_, ids := recv.state()
	if !slices.Equal(ids, want) {
		t.Errorf("received %v\nwant     %v", ids, want)
	}
	recv.mu.Lock()
	bad := recv.badSigs
	recv.mu.Unlock()
	if bad != 0 {
		t.Errorf("%d POSTs had a bad signature or content type", bad)
	}
}

// TestUsageWebhookOfGatewaysSharingPostgreSQL: two gateways on one
// PostgreSQL database deliver to the same receiver, one at a time. The
// first, which holds the sink, stops while events are billed through a
// third Store; the other takes over from the cursor in the database: the
// receiver has every event, in order (a batch in flight when the holder
// stopped may come again, deduplicated by id).
func TestUsageWebhookOfGatewaysSharingPostgreSQL(t *testing.T) {
	db := pgtest.NewDatabase(t)
	dirA, dirB := t.TempDir(), t.TempDir()
	recv := &usageReceiver{dir: dirA}
	sink := httptest.NewServer(recv)
	defer sink.Close()
	stopA, _ := startUsageGateway(t, dirA, sink.URL, "--database", db)
	// The gateways of one receiver sign with one secret.
	secret, err := os.ReadFile(filepath.Join(dirA, "webhook.secret"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dirB, "webhook.secret"), secret, 0o600); err != nil {
		t.Fatal(err)
	}

	store, err := data.Open(db)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	ctx := context.Background()
	tn, err := store.EnsureTenant(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	bill := func(from, to int) {
		t.Helper()
		for i := from; i < to; i++ {
			id := fmt.Sprintf("req_%04d", i)
			row := data.LedgerRow{ID: id, TenantID: tn.ID, KeyID: "key_x", Model: "m", PromptTokens: 1, CompletionTokens: 1,
				Status: 200, Outcome: data.OutcomeOK, Stages: data.UnknownStages()}
			if err := store.InsertLedger(ctx, []data.LedgerRow{row}); err != nil {
				t.Fatal(err)
			}
			want = append(want, id+".v1")
		}
	}
	delivered := func(n int) func() bool {
		return func() bool { _, ids := recv.state(); return len(firstSeen(ids)) >= n }
	}
	bill(0, 20)
	// A, alone so far, holds the sink.
	testkit.WaitWithin(t, 20*time.Second, "the first events delivered", delivered(20))
	stopB, _ := startUsageGateway(t, dirB, sink.URL, "--database", db)
	defer stopB()
	bill(20, 30)
	stopA()
	bill(30, 40)
	testkit.WaitWithin(t, 20*time.Second, "the rest delivered by the other gateway", delivered(40))
	_, ids := recv.state()
	if got := firstSeen(ids); !slices.Equal(got, want) {
		t.Errorf("received (repeats removed) %v\nwant %v", got, want)
	}
}

// firstSeen is ids without repeats, each where it first came.
func firstSeen(ids []string) []string {
	seen := make(map[string]bool, len(ids))
	var out []string
	for _, id := range ids {
		if !seen[id] {
			seen[id] = true
			out = append(out, id)
		}
	}
	return out
}
