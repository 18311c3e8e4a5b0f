package server_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/data"
	"github.com/tailgate-dev/tailgate/policy"
	"github.com/tailgate-dev/tailgate/server"
	"github.com/tailgate-dev/tailgate/server/internal/servertest"
	"github.com/tailgate-dev/tailgate/serving/sim"
)

// busyGateway is a gateway in front of one simulated engine with a few
// slots, whose admission capacity is one request: a second request waits in
// the admission queue while the first runs (interactive ones may use the
// headroom q gives them).
func busyGateway(t *testing.T, q policy.QueueConfig) *servertest.Gateway {
	t.Helper()
	return servertest.Start(t, servertest.Options{Replicas: 1,
		Sim:    sim.Config{MaxSeqs: 4, TPOT: 2 * time.Millisecond, TTFTSigma: -1},
		Server: server.Config{AdmitCapacity: 1, Admission: q}})
}

// block starts a long streamed request with secret and returns once its
// first bytes arrived (it holds the model's one slot); cancel ends it.
func block(t *testing.T, g *servertest.Gateway, secret string) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, g.Public.URL+"/v1/chat/completions",
		strings.NewReader(`{"model":"tailgate-sim","stream":true,"max_tokens":20000,"ignore_eos":true,"messages":[{"role":"user","content":"hold"}]}`))
	req.Header.Set("Authorization", "Bearer "+secret)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		cancel()
		t.Fatalf("blocker: status %d", resp.StatusCode)
	}
	if _, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _, _ = io.Copy(io.Discard, resp.Body); resp.Body.Close() }()
	stopped := func() { cancel(); <-done }
	t.Cleanup(stopped)
	return stopped
}

// queued reads tailgate_admission_queue_length for class.
func queued(t *testing.T, g *servertest.Gateway, class string) int {
	t.Helper()
	mfs, err := g.Metrics.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "tailgate_admission_queue_length" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "class" && l.GetValue() == class {
					return int(m.GetGauge().GetValue())
				}
			}
		}
	}
	t.Fatalf("no tailgate_admission_queue_length{class=%q}", class)
	return 0
}

// waitQueued waits (bounded) until n requests of class wait.
func waitQueued(t *testing.T, g *servertest.Gateway, class string, n int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); queued(t, g, class) != n; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d %s requests queued, want %d", queued(t, g, class), class, n)
		}
	}
}

// answer is what a client got.
type answer struct {
	name      string
	status    int
	id        string
	priority  string
	code      string
	retryWait string
}

// send posts a short chat request as secret with the given priority
// header ("" for none).
func send(ctx context.Context, g *servertest.Gateway, name, secret, priority string) answer {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, g.Public.URL+"/v1/chat/completions",
		strings.NewReader(`{"model":"tailgate-sim","max_tokens":2,"messages":[{"role":"user","content":"`+name+`"}]}`))
	req.Header.Set("Authorization", "Bearer "+secret)
	if priority != "" {
		req.Header.Set("X-Tailgate-Priority", priority)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return answer{name: name, code: err.Error()}
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	a := answer{name: name, status: resp.StatusCode, id: resp.Header.Get("X-Request-Id"),
		priority: resp.Header.Get("X-Tailgate-Priority"), retryWait: resp.Header.Get("Retry-After")}
	if resp.StatusCode != http.StatusOK {
		a.code = string(body)
	}
	return a
}

// sendQueued sends requests one after another, each once the one before
// is seen waiting in the queue of its class, and returns their answers once
// release (called after the last is queued) lets them run.
func sendQueued(t *testing.T, g *servertest.Gateway, release func(), reqs ...[4]string) []answer {
	t.Helper()
	var (
		wg  sync.WaitGroup
		mu  sync.Mutex
		out []answer
	)
	want := map[string]int{}
	for _, r := range reqs { // name, secret, header, class it queues as
		wg.Add(1)
		go func() {
			defer wg.Done()
			a := send(context.Background(), g, r[0], r[1], r[2])
			mu.Lock()
			out = append(out, a)
			mu.Unlock()
		}()
		want[r[3]]++
		waitQueued(t, g, r[3], want[r[3]])
	}
	release()
	wg.Wait()
	return out
}

// admissionOrder returns the answers' names in the order the gateway
// admitted them: by when each left the gateway stage (arrival plus the
// gateway stage, which holds the queue wait), from the ledger.
func admissionOrder(t *testing.T, g *servertest.Gateway, as []answer) []string {
	t.Helper()
	byID := map[string]data.LedgerRow{}
	for _, r := range g.LedgerRows() {
		byID[r.ID] = r
	}
	slices.SortFunc(as, func(a, b answer) int {
		ra, rb := byID[a.id], byID[b.id]
		return ra.Time.Add(ra.Stages.Gateway).Compare(rb.Time.Add(rb.Stages.Gateway))
	})
	var names []string
	for _, a := range as {
		if a.status != http.StatusOK {
			t.Fatalf("%s: status %d: %s", a.name, a.status, a.code)
		}
		names = append(names, a.name)
	}
	return names
}

// TestInteractiveIsAdmittedAheadOfQueuedWork: while the model's capacity is
// taken, batch and standard requests that arrived first still wait when an
// interactive one arrives; it runs first, then standard, then batch, each
// class in arrival order.
func TestInteractiveIsAdmittedAheadOfQueuedWork(t *testing.T) {
	g := busyGateway(t, policy.QueueConfig{Headroom: -1})
	key := g.Key(policy.KeyOptions{Class: policy.ClassInteractive})
	release := block(t, g, key)
	as := sendQueued(t, g, release,
		[4]string{"b1", key, "batch", "batch"},
		[4]string{"s1", key, "standard", "standard"},
		[4]string{"b2", key, "batch", "batch"},
		[4]string{"s2", key, "standard", "standard"},
		[4]string{"i1", key, "", "interactive"},
	)
	if got, want := admissionOrder(t, g, as), []string{"i1", "s1", "s2", "b1", "b2"}; !slices.Equal(got, want) {
		t.Fatalf("admitted in order %v, want %v", got, want)
	}
	for _, r := range g.LedgerRows() {
		if r.Status == http.StatusOK && r.QueueWait < 0 {
			t.Errorf("row %s has no queue wait", r.ID)
		}
	}
}

// TestInteractiveUsesTheHeadroom: with headroom, an interactive request is
// admitted at once while the capacity is taken and a standard one waits.
func TestInteractiveUsesTheHeadroom(t *testing.T) {
	g := busyGateway(t, policy.QueueConfig{Headroom: 1, MaxWait: time.Minute})
	key := g.Key(policy.KeyOptions{Class: policy.ClassInteractive})
	release := block(t, g, key)
	done := make(chan answer, 1)
	go func() { done <- send(context.Background(), g, "s", key, "standard") }()
	waitQueued(t, g, "standard", 1)
	// The blocker still holds the capacity and the standard request waits:
	// the interactive one is answered all the same.
	if a := send(context.Background(), g, "i", key, ""); a.status != http.StatusOK {
		t.Fatalf("interactive: %d %s", a.status, a.code)
	}
	if n := queued(t, g, "standard"); n != 1 {
		t.Fatalf("%d standard requests queued after the interactive one, want 1", n)
	}
	release()
	if a := <-done; a.status != http.StatusOK {
		t.Fatalf("standard: %d %s", a.status, a.code)
	}
}

// TestTenantsTakeTurnsWithinAClass: tenant a queues six standard requests,
// then tenant b three; they are admitted alternately while both wait.
func TestTenantsTakeTurnsWithinAClass(t *testing.T) {
	g := busyGateway(t, policy.QueueConfig{MaxWait: time.Minute})
	a := g.Key(policy.KeyOptions{Tenant: "a"})
	b := g.Key(policy.KeyOptions{Tenant: "b"})
	release := block(t, g, g.Key(policy.KeyOptions{Tenant: "c"}))
	var reqs [][4]string
	for i := range 6 {
		reqs = append(reqs, [4]string{fmt.Sprintf("a%d", i), a, "", "standard"})
	}
	for i := range 3 {
		reqs = append(reqs, [4]string{fmt.Sprintf("b%d", i), b, "", "standard"})
	}
	got := admissionOrder(t, g, sendQueued(t, g, release, reqs...))
	want := []string{"a0", "b0", "a1", "b1", "a2", "b2", "a3", "a4", "a5"}
	if !slices.Equal(got, want) {
		t.Fatalf("admitted in order %v, want %v", got, want)
	}
}

// TestFullQueueIsRefusedWith429: past the queue's bound a request is
// refused at once with 429 queue_full and a Retry-After; those that waited
// run once capacity frees.
func TestFullQueueIsRefusedWith429(t *testing.T) {
	g := busyGateway(t, policy.QueueConfig{MaxQueue: 2, MaxQueuePerTenant: 2, MaxWait: time.Minute})
	key := g.Key(policy.KeyOptions{})
	release := block(t, g, key)
	results := make(chan answer, 2)
	for i := range 2 {
		go func() { results <- send(context.Background(), g, "w", key, "") }()
		waitQueued(t, g, "standard", i+1)
	}
	a := send(context.Background(), g, "over", key, "")
	if a.status != http.StatusTooManyRequests || !strings.Contains(a.code, `"code":"queue_full"`) || a.retryWait == "" {
		t.Fatalf("third request: %d (Retry-After %q) %s, want 429 queue_full with Retry-After", a.status, a.retryWait, a.code)
	}
	release()
	for range 2 {
		if a := <-results; a.status != http.StatusOK {
			t.Errorf("queued request: %d %s", a.status, a.code)
		}
	}
}

// TestQueueWaitRunsOutWith408: a request that waits longer than the bound
// gets 408 queue_timeout, its ledger row says so, and its reservation is
// back with its tenant.
func TestQueueWaitRunsOutWith408(t *testing.T) {
	g := busyGateway(t, policy.QueueConfig{MaxWait: 50 * time.Millisecond})
	key := g.Key(policy.KeyOptions{Tenant: "late"})
	release := block(t, g, g.Key(policy.KeyOptions{Tenant: "first"}))
	a := send(context.Background(), g, "late", key, "")
	if a.status != http.StatusRequestTimeout || !strings.Contains(a.code, `"code":"queue_timeout"`) {
		t.Fatalf("status %d %s, want 408 queue_timeout", a.status, a.code)
	}
	release()
	row := rowOf(t, g, a.id)
	if row.Status != http.StatusRequestTimeout || row.Error != "queue_timeout" || row.Priority != "standard" || row.Upstream != "" {
		t.Fatalf("ledger row %+v", row)
	}
	if _, reserved := g.Gate.TenantState(row.TenantID); reserved != (data.Spend{}) {
		t.Fatalf("tenant still holds %+v after its request timed out in the queue", reserved)
	}
}

// TestClientLeavingTheQueue: a client that goes away while its request
// waits leaves the queue at once (while the capacity is still taken), its
// reservation is released and its ledger row records a 499 that reached no
// replica.
func TestClientLeavingTheQueue(t *testing.T) {
	g := busyGateway(t, policy.QueueConfig{MaxWait: time.Minute})
	key := g.Key(policy.KeyOptions{Tenant: "gone"})
	release := block(t, g, g.Key(policy.KeyOptions{Tenant: "first"}))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan answer, 1)
	go func() { done <- send(ctx, g, "gone", key, "") }()
	waitQueued(t, g, "standard", 1)
	cancel()
	<-done
	waitQueued(t, g, "standard", 0)
	var row data.LedgerRow
	for deadline := time.Now().Add(10 * time.Second); row.ID == ""; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no ledger row for the request that left the queue")
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = g.Ledger.Flush(ctx)
		rows, err := g.Store.LedgerRows(ctx, data.UsageFilter{Tenant: "gone"})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		if len(rows) > 0 {
			row = rows[0]
		}
	}
	if row.Status != 499 || row.Outcome != data.OutcomeClientCancelled || row.Upstream != "" || row.Attempts != 0 || row.QueueWait < 0 {
		t.Fatalf("ledger row %+v, want 499 client_cancelled before any replica, with its queue wait", row)
	}
	if _, reserved := g.Gate.TenantState(row.TenantID); reserved != (data.Spend{}) {
		t.Fatalf("tenant still holds %+v after its client left the queue", reserved)
	}
	release()
}

// TestPriorityHeaderCannotRaiseTheKeysClass: a batch key asking for
// interactive runs as batch; an interactive key may ask for batch; a class
// that does not exist is a 400.
func TestPriorityHeaderCannotRaiseTheKeysClass(t *testing.T) {
	g := servertest.Start(t, servertest.Options{Replicas: 1})
	batchKey := g.Key(policy.KeyOptions{Class: policy.ClassBatch})
	interactive := g.Key(policy.KeyOptions{Class: policy.ClassInteractive})
	for _, tc := range []struct{ secret, header, want string }{
		{batchKey, "interactive", "batch"},
		{batchKey, "", "batch"},
		{interactive, "batch", "batch"},
		{interactive, "", "interactive"},
		{interactive, "standard", "standard"},
	} {
		a := send(context.Background(), g, "x", tc.secret, tc.header)
		if a.status != http.StatusOK || a.priority != tc.want {
			t.Errorf("header %q: status %d, ran as %q, want %q", tc.header, a.status, a.priority, tc.want)
			continue
		}
		if row := rowOf(t, g, a.id); row.Priority != tc.want {
			t.Errorf("header %q: ledger says %q, want %q", tc.header, row.Priority, tc.want)
		}
	}
	if a := send(context.Background(), g, "x", interactive, "urgent"); a.status != http.StatusBadRequest || !strings.Contains(a.code, "interactive, standard or batch") {
		t.Errorf("unknown class: %d %s, want 400 naming the classes", a.status, a.code)
	}
}

func rowOf(t *testing.T, g *servertest.Gateway, id string) data.LedgerRow {
	t.Helper()
	for _, r := range g.LedgerRows() {
		if r.ID == id {
			return r
		}
	}
	t.Fatalf("no ledger row %s", id)
	return data.LedgerRow{}
}

// TestAdminKeyClass: the admin API creates a key with a class, shows it,
// edits it, and refuses a class that does not exist; a request made with
// the key runs as its class.
func TestAdminKeyClass(t *testing.T) {
	g := servertest.Start(t, servertest.Options{Replicas: 1})
	resp := adminPost(t, g, "/admin/v1/keys", `{"tenant":"acme","class":"batch"}`)
	var created struct {
		Secret string         `json:"secret"`
		Key    server.KeyView `json:"key"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&created); err != nil || resp.StatusCode != http.StatusCreated {
		t.Fatalf("create: %d %v", resp.StatusCode, err)
	}
	resp.Body.Close()
	if created.Key.Class != "batch" {
		t.Fatalf("created key shows class %q, want batch", created.Key.Class)
	}
	if a := send(context.Background(), g, "x", created.Secret, "interactive"); a.priority != "batch" {
		t.Fatalf("request ran as %q, want batch", a.priority)
	}

	patch := func(body string) (*http.Response, server.KeyView) {
		req, _ := http.NewRequest(http.MethodPatch, g.Admin.URL+"/admin/v1/keys/"+created.Key.ID, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+servertest.AdminToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out struct {
			Key server.KeyView `json:"key"`
		}
		_ = json.NewDecoder(resp.Body).Decode(&out)
		return resp, out.Key
	}
	if resp, k := patch(`{"class":"interactive"}`); resp.StatusCode != http.StatusOK || k.Class != "interactive" {
		t.Fatalf("edit: %d, class %q", resp.StatusCode, k.Class)
	}
	// A running gateway applies the edit within its poll interval.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		a := send(context.Background(), g, "x", created.Secret, "")
		if a.priority == "interactive" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the edit requests still run as %q", a.priority)
		}
	}
	if resp, _ := patch(`{"class":"urgent"}`); resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("edit to an unknown class: %d, want 400", resp.StatusCode)
	}
	resp = adminPost(t, g, "/admin/v1/keys", `{"tenant":"acme","class":"urgent"}`)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("create with an unknown class: %d, want 400", resp.StatusCode)
	}
}
