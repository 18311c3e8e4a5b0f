package server_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/tailgate-dev/tailgate/e2e/testkit"
	"github.com/tailgate-dev/tailgate/policy"
	"github.com/tailgate-dev/tailgate/router"
	"github.com/tailgate-dev/tailgate/server"
	"github.com/tailgate-dev/tailgate/server/connlimit"
	"github.com/tailgate-dev/tailgate/server/internal/servertest"
	"github.com/tailgate-dev/tailgate/serving/sim"
)

// What one tenant can do to another (docs/operations.md): each test here
// is a row of that table.

// slowUpload starts an audio upload that sends its head and holds the rest
// back until release is closed; its status arrives on the channel.
func slowUpload(t *testing.T, h *servertest.Gateway, secret string, size int, release <-chan struct{}) <-chan int {
	t.Helper()
	const ctype = "multipart/form-data; boundary=B"
	head := "--B\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\n" + servertest.SimModel + "\r\n" +
		"--B\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\n\r\n"
	tail := "\r\n--B--\r\n"
	form := head + strings.Repeat("\x01", size-len(head)-len(tail)) + tail
	pr, pw := io.Pipe()
	req, err := http.NewRequest(http.MethodPost, h.Public.URL+"/v1/audio/transcriptions", pr)
	if err != nil {
		t.Fatal(err)
	}
	req.ContentLength = int64(len(form))
	req.Header.Set("Content-Type", ctype)
	req.Header.Set("Authorization", "Bearer "+secret)
	status := make(chan int, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			status <- 0
			return
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		status <- resp.StatusCode
	}()
	go func() {
		defer pw.Close()
		if _, err := pw.Write([]byte(head)); err != nil {
			return
		}
		<-release
		_, _ = pw.Write([]byte(form[len(head):]))
	}()
	return status
}

func errorCode(t *testing.T, r *http.Response) string {
	t.Helper()
	defer r.Body.Close()
	var e struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	_ = json.NewDecoder(r.Body).Decode(&e)
	return e.Error.Code
}

// TestSlowUploadsOfOneKeyDoNotStarveAnotherTenant: a key with a 1-token
// budget sends slow audio uploads. With a requests-per-minute limit of 1,
// its second upload is refused (429) before it reserves a byte. Without
// one, its uploads hold at most its tenant's share of the body budget —
// each counted with the copy the gateway forwards — and the rest are
// refused 429 body_share_exhausted, while another tenant's requests, an
// upload among them, are served at once as they arrive.
func TestSlowUploadsOfOneKeyDoNotStarveAnotherTenant(t *testing.T) {
	const upload = 256 << 10
	h := servertest.Start(t, servertest.Options{Replicas: 1, Server: server.Config{
		MaxBodyBytes: upload, MaxAudioBytes: upload, MaxBodyBytesInFlight: 8 * upload, // per tenant: 2 uploads' worth
		BodyBudgetWait: 100 * time.Millisecond, BodyTimeout: time.Minute,
	}})
	one := int64(1)
	limited := h.Key(policy.KeyOptions{Tenant: "mallory", BudgetTokens: &one, RPM: 1})
	unlimited := h.Key(policy.KeyOptions{Tenant: "mallory", BudgetTokens: &one})
	victim := h.Key(policy.KeyOptions{Tenant: "victim"})
	release := make(chan struct{})
	defer close(release)

	// The rpm-1 key: one upload in flight, the next refused before its body.
	first := slowUpload(t, h, limited, upload, release)
	testkit.WaitWithin(t, 5*time.Second, "the first upload and its copy reserved", func() bool { return bodyBytesInFlight(h) == 2*upload })
	r := h.Do(http.MethodPost, "/v1/audio/transcriptions", limited, "multipart/form-data; boundary=B", strings.NewReader("--B--\r\n"))
	if r.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("the rpm-1 key's second upload: %d, want 429", r.StatusCode)
	}
	r.Body.Close()

	// The unlimited key of the same tenant: its uploads find the tenant's
	// share held by the first, and are refused once their wait is over.
	var refused []<-chan int
	for range 6 {
		refused = append(refused, slowUpload(t, h, unlimited, upload, release))
	}
	for i, st := range refused {
		select {
		case code := <-st:
			if code != http.StatusTooManyRequests {
				t.Fatalf("mallory's upload %d past its share: %d, want 429", i, code)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("mallory's upload %d past its share was never answered", i)
		}
	}
	if got := bodyBytesInFlight(h); got != 2*upload {
		t.Fatalf("%d body bytes in flight with mallory's uploads held, want its share %d", got, 2*upload)
	}

	// The victim is served while all of that is held: a chat request and an
	// upload of its own, neither waiting for mallory's bytes.
	resp := h.Post("/v1/chat/completions", victim, `{"model":"tailgate-sim","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("the victim's chat request while mallory's uploads are held: %d %s", resp.StatusCode, errorCode(t, resp))
	}
	resp.Body.Close()
	vrel := make(chan struct{})
	close(vrel)
	if code := <-slowUpload(t, h, victim, upload, vrel); code != http.StatusOK {
		t.Fatalf("the victim's upload while mallory's are held: %d", code)
	}
	select {
	case code := <-first:
		t.Fatalf("mallory's held upload ended early: %d", code)
	default:
	}
	rows := h.LedgerRows()
	var billed int64
	for _, row := range rows {
		if row.KeyID != "" && row.TenantID != 0 && row.Status == http.StatusTooManyRequests {
			billed += row.PromptTokens + row.CompletionTokens
		}
	}
	if billed != 0 {
		t.Fatalf("refused requests billed %d tokens", billed)
	}
}

// TestOneTenantCannotTakeAnothersHoldSlots: during a cold start a tenant
// whose requests hold its share of the model's hold queue gets 429
// queue_full for the next, while another tenant's request is still held
// and served once the replica is ready.
func TestOneTenantCannotTakeAnothersHoldSlots(t *testing.T) {
	g := servertest.Start(t, servertest.Options{Replicas: 1, Server: server.Config{Hold: server.HoldConfig{Queue: 4}}}) // a tenant's share: 1
	rep := g.Reg.Get("sim-a")
	if rep == nil || !rep.SetState(router.StateStarting, "engine loading") {
		t.Fatal("cannot put the replica back to starting")
	}
	mallory := g.Key(policy.KeyOptions{Tenant: "mallory"})
	victim := g.Key(policy.KeyOptions{Tenant: "victim"})

	held := make(chan *http.Response, 1)
	go func() { held <- g.Post("/v1/chat/completions", mallory, holdBody) }()
	waitHeld(t, g, 1)
	for i := range 4 {
		r := g.Post("/v1/chat/completions", mallory, holdBody)
		if code := errorCode(t, r); r.StatusCode != http.StatusTooManyRequests || code != "queue_full" {
			t.Fatalf("mallory's request %d past its share: %d %q, want 429 queue_full", i+2, r.StatusCode, code)
		}
	}
	theirs := make(chan *http.Response, 1)
	go func() { theirs <- g.Post("/v1/chat/completions", victim, holdBody) }()
	waitHeld(t, g, 2)
	rep.SetState(router.StateReady, "")
	for _, ch := range []chan *http.Response{theirs, held} {
		r := <-ch
		r.Body.Close()
		if r.StatusCode != http.StatusOK {
			t.Fatalf("a held request after the replica was ready: %d", r.StatusCode)
		}
	}
}

// bodies records the JSON bodies engines get, by x-request-id.
type bodies struct {
	mu   sync.Mutex
	seen map[string]seenBody
}

type seenBody struct {
	body map[string]any
	raw  string
}

func (b *bodies) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			raw, _ := io.ReadAll(r.Body)
			r.Body = io.NopCloser(strings.NewReader(string(raw)))
			var m map[string]any
			_ = json.Unmarshal(raw, &m)
			b.mu.Lock()
			b.seen[r.Header.Get("X-Request-Id")] = seenBody{body: m, raw: string(raw)}
			b.mu.Unlock()
		}
		h.ServeHTTP(w, r)
	})
}

// TestTenantsPromptsAreSaltedAndLandByTenant: two tenants send the same
// prompts, some with a cache_salt of their own. Every body an engine gets
// carries its tenant's cache_salt — the same for each of a tenant's
// requests, different between tenants — and never the client's; with
// prefix affinity each tenant's identical prompts land on one replica.
func TestTenantsPromptsAreSaltedAndLandByTenant(t *testing.T) {
	rec := &bodies{seen: map[string]seenBody{}}
	var fleet []servertest.Sim
	for i := range 4 {
		// One fixed latency, long beside loopback's jitter: the replica a
		// prefix hashes to never scores worse than another by the slack.
		eng, err := sim.New(sim.Config{Seed: int64(i + 1), TTFT: 50 * time.Millisecond, TTFTSigma: -1}, nil)
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewUnstartedServer(nil)
		srv.Config = eng.NewServer(nil)
		srv.Config.Handler = rec.wrap(srv.Config.Handler)
		srv.Start()
		t.Cleanup(srv.Close)
		fleet = append(fleet, servertest.Sim{Engine: eng, Server: srv})
	}
	h := servertest.Start(t, servertest.Options{Fleet: fleet, Router: router.Config{Affinity: router.AffinityPrefix}})
	keys := map[string]string{"acme": h.Key(policy.KeyOptions{Tenant: "acme"}), "globex": h.Key(policy.KeyOptions{Tenant: "globex"})}
	const system = `{"role":"system","content":"You are the assistant of a company whose secret plan is purple elephants."}`
	bodiesSent := []string{
		`{"model":"tailgate-sim","max_tokens":2,"messages":[` + system + `,{"role":"user","content":"hi"}]}`,
		`{"model":"tailgate-sim","max_tokens":2,"cache_salt":"mine","messages":[` + system + `,{"role":"user","content":"hi"}]}`,
		`{"model":"tailgate-sim","max_tokens":2,"cache\u005fsalt":"mine","messages":[` + system + `,{"role":"user","content":"hi"}]}`,
		`{"model":"tailgate-sim","max_tokens":2,"stream":true,"messages":[` + system + `,{"role":"user","content":"hi"}]}`,
		`{"model":"tailgate-sim","prompt":"You are the assistant of a company","max_tokens":2,"cache_salt":"mine"}`,
	}
	ids := map[string][]string{}
	landed := map[string]map[string]bool{} // tenant → replicas its chat requests were answered by
	for _, tenant := range []string{"acme", "globex"} {
		landed[tenant] = map[string]bool{}
		for _, b := range bodiesSent {
			path := "/v1/chat/completions"
			if strings.Contains(b, `"prompt"`) {
				path = "/v1/completions"
			}
			// The last request's replica slot is free (it counts in the
			// load scores until its handler has ended).
			testkit.WaitWithin(t, 5*time.Second, "every replica idle", func() bool {
				for _, rep := range h.Reg.Replicas() {
					if rep.Inflight() != 0 {
						return false
					}
				}
				return true
			})
			resp := h.Post(path, keys[tenant], b)
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("%s %s: %d", tenant, b, resp.StatusCode)
			}
			ids[tenant] = append(ids[tenant], resp.Header.Get("X-Request-Id"))
			if path == "/v1/chat/completions" {
				landed[tenant][resp.Header.Get("X-Tailgate-Replica")] = true
			}
		}
		if len(landed[tenant]) != 1 {
			t.Errorf("%s's identical prompts landed on %v, want one replica", tenant, landed[tenant])
		}
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	salts := map[string]string{}
	for tenant, list := range ids {
		for i, id := range list {
			got, ok := rec.seen[id]
			if !ok {
				t.Fatalf("%s request %d reached no engine", tenant, i)
			}
			if strings.Contains(got.raw, "mine") {
				t.Errorf("%s request %d: the client's cache_salt reached the engine: %s", tenant, i, got.raw)
			}
			salt, _ := got.body["cache_salt"].(string)
			if salt == "" {
				t.Fatalf("%s request %d reached the engine without a cache_salt: %s", tenant, i, got.raw)
			}
			if prev, ok := salts[tenant]; ok && prev != salt {
				t.Errorf("%s has two salts: %q and %q", tenant, prev, salt)
			}
			salts[tenant] = salt
		}
	}
	if salts["acme"] == salts["globex"] {
		t.Fatalf("both tenants' prompts carry cache_salt %q", salts["acme"])
	}
}

// TestHugeModelNameLeavesSpansIntact: a request naming a 4 MiB model puts
// none of it in any span (the model is "unknown"), and the next request's
// spans are recorded whole. A client's sampled traceparent from a network
// not trusted with traces starts nothing at sample ratio 0; from a trusted
// one it is continued, without its tracestate.
func TestHugeModelNameLeavesSpansIntact(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(0))))
	t.Cleanup(func() { _ = tp.Shutdown(t.Context()) })
	fleet, seen := tracedFleet(t, sim.Config{TTFT: time.Millisecond, TTFTSigma: -1})
	start := func(cfg server.Config) (*servertest.Gateway, string) {
		cfg.MaxBodyBytes = 8 << 20
		h := servertest.Start(t, servertest.Options{Fleet: fleet, Tracer: tp, Server: cfg})
		return h, h.Key(policy.KeyOptions{})
	}
	send := func(h *servertest.Gateway, secret, model string) *http.Response {
		req, err := http.NewRequest(http.MethodPost, h.Public.URL+"/v1/chat/completions",
			strings.NewReader(`{"model":"`+model+`","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+secret)
		req.Header.Set("Traceparent", clientParent)
		req.Header.Set("Tracestate", "vendor=client-chosen")
		req.Header.Set("Baggage", "user=alice")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}

	// Untrusted: the client's sampled parent does not override ratio 0.
	h, secret := start(server.Config{})
	if r := send(h, secret, servertest.SimModel); r.StatusCode != http.StatusOK {
		t.Fatalf("status %d", r.StatusCode)
	}
	if n := len(exp.GetSpans()); n != 0 {
		t.Fatalf("a client outside --trust-trace-from had %d spans recorded at sample ratio 0", n)
	}
	if got := seen[0].last(); strings.HasPrefix(got, "00-"+clientTraceID) {
		t.Fatalf("the engine continued the untrusted client's trace: %q", got)
	}
	h.Close()

	// Trusted (loopback): continued; the huge name stays out of every span.
	h, secret = start(server.Config{TraceFrom: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}})
	huge := strings.Repeat("m", 4<<20)
	if r := send(h, secret, huge); r.StatusCode != http.StatusNotFound {
		t.Fatalf("a 4 MiB model name: %d, want 404", r.StatusCode)
	}
	r := send(h, secret, servertest.SimModel)
	if r.StatusCode != http.StatusOK {
		t.Fatalf("status %d", r.StatusCode)
	}
	root := requestSpan(t, exp, r.Header.Get("X-Request-Id"))
	if root.Name != "chat tailgate-sim" || root.SpanContext.TraceID().String() != clientTraceID {
		t.Fatalf("the trusted client's request span %q in trace %s, want chat tailgate-sim in %s", root.Name, root.SpanContext.TraceID(), clientTraceID)
	}
	if ts := root.SpanContext.TraceState().String(); ts != "" {
		t.Fatalf("the request span kept the client's tracestate %q", ts)
	}
	var unknown bool
	for _, s := range exp.GetSpans() {
		if len(s.Name) > 256 {
			t.Fatalf("a span named with %d bytes", len(s.Name))
		}
		for _, kv := range s.Attributes {
			if v := kv.Value.Emit(); len(v) > 256 {
				t.Fatalf("span %q attribute %s holds %d bytes", s.Name, kv.Key, len(v))
			}
		}
		unknown = unknown || attr(s, "gen_ai.request.model").AsString() == "unknown"
	}
	if !unknown {
		t.Fatal(`the huge model's span does not say model "unknown"`)
	}
	if got := seen[0].last(); !strings.HasPrefix(got, "00-"+clientTraceID) {
		t.Fatalf("the engine got traceparent %q, want the trusted client's trace", got)
	}
}

// TestForwardedClientsGetTheirOwnShare: behind a trusted proxy every client
// is the proxy's address; each forwarded client is held to its own share
// of the connection cap (one more request is refused 429), another client
// through the same proxy is served, and X-Forwarded-For from a peer that is
// not a trusted proxy names nobody.
func TestForwardedClientsGetTheirOwnShare(t *testing.T) {
	const upload = 64 << 10
	for _, tc := range []struct {
		name    string
		trusted string
		refused bool
	}{{"trusted proxy", "127.0.0.1/32", true}, {"untrusted peer", "10.0.0.0/8", false}} {
		t.Run(tc.name, func(t *testing.T) {
			h := servertest.Start(t, servertest.Options{Replicas: 1, Server: server.Config{
				MaxAudioBytes: upload, BodyTimeout: time.Minute,
				TrustedProxies: []netip.Prefix{netip.MustParsePrefix(tc.trusted)},
			}})
			lim, err := connlimit.New(connlimit.Config{Listener: "public", Max: 64, PerAddress: 2}, nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			h.Srv.SetClients(lim)
			secret := h.Key(policy.KeyOptions{})
			release := make(chan struct{})
			var once sync.Once
			free := func() { once.Do(func() { close(release) }) }
			defer free()
			var held []<-chan int
			for range 2 {
				held = append(held, forwardedUpload(t, h, secret, "203.0.113.7", upload, release))
			}
			// Each holds its form twice (as read, and its copy ahead).
			testkit.WaitWithin(t, 5*time.Second, "the two uploads in flight", func() bool { return bodyBytesInFlight(h) >= 4*upload })
			third := forwardedPost(t, h, secret, "203.0.113.7")
			other := forwardedPost(t, h, secret, "198.51.100.9")
			if other != http.StatusOK {
				t.Fatalf("another client through the proxy: %d, want 200", other)
			}
			switch {
			case tc.refused && third != http.StatusTooManyRequests:
				t.Fatalf("the client's third request past its share: %d, want 429", third)
			case !tc.refused && third != http.StatusOK:
				t.Fatalf("a spoofed X-Forwarded-For from an untrusted peer: %d, want 200", third)
			}
			free()
			for _, st := range held {
				if code := <-st; code != http.StatusOK {
					t.Fatalf("a held upload: %d", code)
				}
			}
			if code := forwardedPost(t, h, secret, "203.0.113.7"); code != http.StatusOK {
				t.Fatalf("the client after its uploads ended: %d", code)
			}
		})
	}
}

func forwardedPost(t *testing.T, h *servertest.Gateway, secret, client string) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, h.Public.URL+"/v1/chat/completions",
		strings.NewReader(`{"model":"tailgate-sim","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+secret)
	// What a client wrote itself stands left of what its proxy appended.
	req.Header.Set("X-Forwarded-For", "192.0.2.1, "+client)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// forwardedUpload is slowUpload through a proxy that names client.
func forwardedUpload(t *testing.T, h *servertest.Gateway, secret, client string, size int, release <-chan struct{}) <-chan int {
	t.Helper()
	const ctype = "multipart/form-data; boundary=B"
	head := "--B\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\n" + servertest.SimModel + "\r\n" +
		"--B\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\n\r\n"
	tail := "\r\n--B--\r\n"
	form := head + strings.Repeat("\x01", size-len(head)-len(tail)) + tail
	pr, pw := io.Pipe()
	req, err := http.NewRequest(http.MethodPost, h.Public.URL+"/v1/audio/transcriptions", pr)
	if err != nil {
		t.Fatal(err)
	}
	req.ContentLength = int64(len(form))
	req.Header.Set("Content-Type", ctype)
	req.Header.Set("Authorization", "Bearer "+secret)
	req.Header.Set("X-Forwarded-For", client)
	status := make(chan int, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			status <- 0
			return
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		status <- resp.StatusCode
	}()
	go func() {
		defer pw.Close()
		if _, err := pw.Write([]byte(head)); err != nil {
			return
		}
		<-release
		_, _ = pw.Write([]byte(form[len(head):]))
	}()
	return status
}
