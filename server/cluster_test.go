package server_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/tailgate-dev/tailgate/policy"
	"github.com/tailgate-dev/tailgate/router"
	"github.com/tailgate-dev/tailgate/server/internal/servertest"
	"github.com/tailgate-dev/tailgate/serving"
	"github.com/tailgate-dev/tailgate/serving/sim"
)

// credentials are the worker credentials the gateways of the tests issued,
// by gateway and replica id: heartbeat beats as a worker does, presenting
// the credential it was given.
var credentials sync.Map // credKey -> string

type credKey struct {
	h  *servertest.Gateway
	id string
}

func heartbeat(h *servertest.Gateway, token string, hb serving.Heartbeat) *http.Response {
	h.T.Helper()
	cred, _ := credentials.Load(credKey{h, hb.ReplicaID})
	s, _ := cred.(string)
	resp, reply, _ := beat(h, token, s, hb)
	if reply.Credential != "" {
		credentials.Store(credKey{h, hb.ReplicaID}, reply.Credential)
	}
	return resp
}

// beat sends one heartbeat with the given worker credential ("" for none)
// and returns the answer, the reply of a 200 and the error message of
// anything else.
func beat(h *servertest.Gateway, token, credential string, hb serving.Heartbeat) (*http.Response, serving.HeartbeatReply, string) {
	h.T.Helper()
	hdr := http.Header{}
	if credential != "" {
		hdr.Set(serving.HeaderWorkerCredential, credential)
	}
	resp, reply, _, msg := beatWith(h, token, hdr, hb)
	return resp, reply, msg
}

// beatWith sends one heartbeat with the cluster token and the headers
// given, and returns the answer, the reply of a 200 and the error code and
// message of anything else.
// testWorkerKey is the key the tests' worker sends; approvals bind its code.
const testWorkerKey = "tgk_test-worker"

// A rogue holding the cluster token cannot take an approval: the approval
// binds the code of the worker that asked, and a beat under the same
// replica id with another key (or none) is refused; the worker itself is
// admitted.
func TestApprovalBindsTheWorkerThatAsked(t *testing.T) {
	h := servertest.Start(t, servertest.Options{})
	engine := tokenCheckingEngine(t)
	if resp, _, code, _ := beatWith(h, servertest.ClusterToken, nil, readyBeat("w1", engine.URL)); resp.StatusCode != http.StatusForbidden || code != "worker_not_approved" {
		t.Fatalf("before the approval: %d %s", resp.StatusCode, code)
	}
	if _, _, err := h.Store.ApproveWorker(t.Context(), "w1", serving.ApprovalCode(testWorkerKey)); err != nil {
		t.Fatal(err)
	}
	for _, rogue := range []string{"tgk_rogue", ""} {
		resp, reply, code, _ := beatWith(h, servertest.ClusterToken, http.Header{serving.HeaderWorkerKey: {rogue}}, readyBeat("w1", engine.URL))
		if resp.StatusCode != http.StatusForbidden || code != "worker_not_approved" || reply.Credential != "" {
			t.Fatalf("a rogue with the cluster token (key %q) after the approval: %d %s, credential %v", rogue, resp.StatusCode, code, reply.Credential != "")
		}
	}
	if resp, reply, code, msg := beatWith(h, servertest.ClusterToken, nil, readyBeat("w1", engine.URL)); resp.StatusCode != 200 || reply.Credential == "" {
		t.Fatalf("the approved worker: %d %s %s", resp.StatusCode, code, msg)
	}
}

func beatWith(h *servertest.Gateway, token string, hdr http.Header, hb serving.Heartbeat) (*http.Response, serving.HeartbeatReply, string, string) {
	h.T.Helper()
	body, _ := json.Marshal(hb)
	req, _ := http.NewRequest(http.MethodPost, h.Admin.URL+serving.HeartbeatPath, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set(serving.HeaderWorkerKey, testWorkerKey) // the worker's own key, unless hdr says otherwise
	for k, v := range hdr {
		req.Header[k] = v
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.T.Fatal(err)
	}
	defer resp.Body.Close()
	var reply serving.HeartbeatReply
	var e struct {
		Error struct {
			Message string `json:"message"`
			Code    string `json:"code"`
		} `json:"error"`
	}
	if resp.StatusCode == http.StatusOK {
		_ = json.NewDecoder(resp.Body).Decode(&reply)
	} else {
		_ = json.NewDecoder(resp.Body).Decode(&e)
	}
	return resp, reply, e.Error.Code, e.Error.Message
}

// tokenCheckingEngine serves a sim engine that insists on the cluster token,
// as a sidecar does.
func tokenCheckingEngine(t *testing.T) *httptest.Server {
	eng, err := sim.New(sim.Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+servertest.ClusterToken {
			http.Error(w, `{"error":{"message":"no token"}}`, 401)
			return
		}
		eng.Handler().ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv
}

func TestHeartbeatRegistersReplicaAndLeaseExpires(t *testing.T) {
	h := servertest.Start(t, servertest.Options{Server: openRegistration, Replicas: 1, Health: 50 * time.Millisecond})
	h.Reg.Remove("sim-a") // only the registered worker serves
	secret := h.Key(policy.KeyOptions{})
	engine := tokenCheckingEngine(t)

	if resp := heartbeat(h, "wrong", serving.Heartbeat{ReplicaID: "w1", Address: engine.URL, Models: []string{servertest.SimModel}, State: "ready"}); resp.StatusCode != 401 {
		t.Fatalf("heartbeat with a wrong cluster token: %d", resp.StatusCode)
	}
	if resp := heartbeat(h, servertest.ClusterToken, serving.Heartbeat{ReplicaID: "w1", Address: "not a url", State: "ready"}); resp.StatusCode != 400 {
		t.Fatalf("heartbeat with a bad address: %d", resp.StatusCode)
	}
	// Warming: registered, not routed to.
	heartbeat(h, servertest.ClusterToken, serving.Heartbeat{ReplicaID: "w1", Address: engine.URL, Models: []string{servertest.SimModel}, State: "warming", Engine: "sim"})
	resp := h.Post("/v1/chat/completions", secret, hiBody)
	resp.Body.Close()
	if resp.StatusCode != 503 {
		t.Fatalf("request while the only replica warms: %d, want 503", resp.StatusCode)
	}
	// Ready: routed to, with the cluster token.
	if resp := heartbeat(h, servertest.ClusterToken, serving.Heartbeat{ReplicaID: "w1", Address: engine.URL, Models: []string{servertest.SimModel}, State: "ready", Engine: "sim",
		Load: serving.Load{Waiting: 2, Running: 5, KVCacheUsage: 0.5}}); resp.StatusCode != 200 {
		t.Fatalf("heartbeat: %d", resp.StatusCode)
	}
	resp = h.Post("/v1/chat/completions", secret, hiBody)
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("X-Tailgate-Replica") != "w1" {
		t.Fatalf("request to the registered replica: %d via %q", resp.StatusCode, resp.Header.Get("X-Tailgate-Replica"))
	}
	// The admin API shows it with its load.
	req, _ := http.NewRequest(http.MethodGet, h.Admin.URL+"/admin/v1/replicas", nil)
	req.Header.Set("Authorization", "Bearer "+servertest.AdminToken)
	aresp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var list struct {
		Data []map[string]any `json:"data"`
	}
	_ = json.NewDecoder(aresp.Body).Decode(&list)
	aresp.Body.Close()
	if len(list.Data) != 1 || list.Data[0]["state"] != "ready" || list.Data[0]["engine_waiting"] != 2.0 || list.Data[0]["kv_cache_usage"] != 0.5 {
		t.Fatalf("replicas: %+v", list.Data)
	}
	// Lease: with no more heartbeats the replica is lost (lease 3.5s by
	// default): still listed, never routed to.
	deadline := time.Now().Add(10 * time.Second)
	for h.Reg.Get("w1").State() != router.StateLost {
		if time.Now().After(deadline) {
			t.Fatal("replica not lost 10s after its last heartbeat")
		}
		time.Sleep(20 * time.Millisecond)
	}
	resp = h.Post("/v1/chat/completions", secret, hiBody)
	resp.Body.Close()
	if resp.StatusCode != 503 {
		t.Fatalf("request after the only replica's lease expired: %d, want 503 (no ready replica)", resp.StatusCode)
	}
	// The admin API still lists it, lost, with why; an operator forgets it.
	list.Data = nil
	adminGet(t, h, "/admin/v1/replicas", &list)
	if len(list.Data) != 1 || list.Data[0]["state"] != "lost" || list.Data[0]["ready"] != false ||
		!strings.Contains(fmt.Sprint(list.Data[0]["reason"]), "no heartbeat") || list.Data[0]["lost_for_seconds"] == nil {
		t.Fatalf("replicas after the lease ended: %+v", list.Data)
	}
	for _, want := range []int{http.StatusNoContent, http.StatusNotFound} {
		req, _ := http.NewRequest(http.MethodDelete, h.Admin.URL+"/admin/v1/replicas/w1", nil)
		req.Header.Set("Authorization", "Bearer "+servertest.AdminToken)
		dresp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		dresp.Body.Close()
		if dresp.StatusCode != want {
			t.Fatalf("DELETE /admin/v1/replicas/w1: %d, want %d", dresp.StatusCode, want)
		}
	}
	if h.Reg.Get("w1") != nil {
		t.Fatal("forgotten replica still listed")
	}
}

// TestDeleteReplicaRefusesALiveOne: forgetting is for lost replicas; a
// live one is refused with what to do instead.
func TestDeleteReplicaRefusesALiveOne(t *testing.T) {
	h := servertest.Start(t, servertest.Options{Replicas: 1})
	req, _ := http.NewRequest(http.MethodDelete, h.Admin.URL+"/admin/v1/replicas/sim-a", nil)
	req.Header.Set("Authorization", "Bearer "+servertest.AdminToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var body struct {
		Error struct{ Code, Message string } `json:"error"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusConflict || body.Error.Code != "replica_not_lost" || !strings.Contains(body.Error.Message, "/admin/v1/workers/") {
		t.Fatalf("DELETE of a ready replica: %d %+v", resp.StatusCode, body.Error)
	}
	if h.Reg.Get("sim-a") == nil {
		t.Fatal("a ready replica was forgotten")
	}
}

func TestEngineTimingFromSidecarReachesLedger(t *testing.T) {
	h := servertest.Start(t, servertest.Options{Server: openRegistration, Replicas: 1})
	h.Reg.Remove("sim-a")
	// A stand-in sidecar that reports the engine timings per the wire contract.
	fake := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Stream bool `json:"stream"`
		}
		_ = json.NewDecoder(r.Body).Decode(&req)
		if !req.Stream {
			w.Header().Set(serving.HeaderEngineTTFT, "7.5")
			w.Header().Set(serving.HeaderEngineQueue, "1.25")
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"a"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`))
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = w.Write([]byte(`data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}` + "\n\n"))
		_, _ = w.Write([]byte(serving.TimingComment + "engine_ttft_ms=7.5 engine_queue_ms=1.25\n\n"))
		_, _ = w.Write([]byte(`data: {"choices":[{"index":0,"delta":{"content":"a"}}]}` + "\n\n"))
		_, _ = w.Write([]byte(`data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}` + "\n\n"))
		_, _ = w.Write([]byte("data: [DONE]\n\n"))
	}))
	defer fake.Close()
	heartbeat(h, servertest.ClusterToken, serving.Heartbeat{ReplicaID: "w1", Address: fake.URL, Models: []string{servertest.SimModel}, State: "ready"})
	secret := h.Key(policy.KeyOptions{})

	resp := h.Post("/v1/chat/completions", secret, hiBody)
	resp.Body.Close()
	st := resp.Header.Get("Server-Timing")
	for _, want := range []string{"engine_ttft;dur=7.500", "engine_queue;dur=1.250", "network;dur="} {
		if !bytes.Contains([]byte(st), []byte(want)) {
			t.Fatalf("Server-Timing %q lacks %q", st, want)
		}
	}
	resp = h.Post("/v1/chat/completions", secret, `{"model":"tailgate-sim","stream":true,"messages":[{"role":"user","content":"hi"}]}`)
	payloads, comments := readSSE(t, resp.Body)
	resp.Body.Close()
	if comments != 0 {
		t.Fatalf("the sidecar's timing comment reached the client: %q", payloads)
	}
	for _, r := range h.LedgerRows() {
		if r.Stages.EngineTTFT != 7500*time.Microsecond || r.Stages.EngineQueue != 1250*time.Microsecond ||
			r.Stages.Network < 0 || r.Stages.Network != max(r.Stages.UpstreamTTFT-r.Stages.EngineTTFT, 0) {
			t.Fatalf("stages %+v (stream %v)", r.Stages, r.Stream)
		}
	}
}

// TestReplicasShowWhyAnEngineFailed: the admin API shows a failed
// replica's reason and the engine's last error lines its worker sent, cut
// to the wire contract's bounds.
func TestReplicasShowWhyAnEngineFailed(t *testing.T) {
	h := servertest.Start(t, servertest.Options{Server: openRegistration, Replicas: 1})
	var lines []string
	for i := range 30 {
		lines = append(lines, fmt.Sprintf("line %d", i))
	}
	lines[29] = "vllm: error: " + strings.Repeat("é", 600)
	reason := "engine cannot start: 3 starts in a row failed, the last: engine exited while starting: exit status 2"
	if resp := heartbeat(h, servertest.ClusterToken, serving.Heartbeat{ReplicaID: "w1", Address: "http://127.0.0.1:1",
		Models: []string{servertest.SimModel}, State: "failed", Reason: reason, Engine: "vllm", EngineLog: lines}); resp.StatusCode != 200 {
		t.Fatalf("heartbeat: %d", resp.StatusCode)
	}
	req, _ := http.NewRequest(http.MethodGet, h.Admin.URL+"/admin/v1/replicas", nil)
	req.Header.Set("Authorization", "Bearer "+servertest.AdminToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var list struct {
		Data []struct {
			ID        string   `json:"id"`
			State     string   `json:"state"`
			Reason    string   `json:"reason"`
			EngineLog []string `json:"engine_log"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		t.Fatal(err)
	}
	for _, r := range list.Data {
		if r.ID != "w1" {
			continue
		}
		if r.State != "failed" || r.Reason != reason {
			t.Errorf("state %q reason %q", r.State, r.Reason)
		}
		if len(r.EngineLog) != serving.MaxEngineLogLines || r.EngineLog[0] != "line 10" {
			t.Fatalf("engine_log %q, want the last %d lines", r.EngineLog, serving.MaxEngineLogLines)
		}
		last := r.EngineLog[len(r.EngineLog)-1]
		if len(last) > serving.MaxEngineLogLine || !strings.HasPrefix(last, "vllm: error: é") || !utf8.ValidString(last) {
			t.Errorf("last line of %d bytes, valid UTF-8 %v: not cut to the bound", len(last), utf8.ValidString(last))
		}
		return
	}
	t.Fatalf("w1 not listed: %+v", list.Data)
}

// TestReplicasShowTheEngineSignals: what a worker's sidecar scraped of its
// engine — why requests wait, preemptions, the prefix cache counters, the
// sleep state — is in the admin API, with the prefix cache hit rate and the
// slot count the router learnt; a sleeping engine's replica shows why it is
// not ready.
func TestReplicasShowTheEngineSignals(t *testing.T) {
	h := servertest.Start(t, servertest.Options{Server: openRegistration, Replicas: 1})
	asleep := "engine asleep (vLLM sleep level 1: weights offloaded to CPU); POST /wake_up to the engine wakes it"
	for _, hb := range []serving.Heartbeat{
		{ReplicaID: "w1", Address: "http://127.0.0.1:1", Models: []string{servertest.SimModel}, State: "ready", Engine: "vllm",
			Load: serving.Load{Waiting: 3, Running: 10, WaitingByReason: &serving.WaitReasons{Capacity: 2, Deferred: 1},
				Preemptions: 9, PrefixCacheQueries: 200000, PrefixCacheHits: 120000, SleepState: serving.SleepAwake}},
		{ReplicaID: "w2", Address: "http://127.0.0.1:2", Models: []string{servertest.SimModel}, State: "warming", Reason: asleep, Engine: "vllm",
			Load: serving.Load{SleepState: serving.SleepWeightsOffloaded}},
	} {
		if resp := heartbeat(h, servertest.ClusterToken, hb); resp.StatusCode != 200 {
			t.Fatalf("heartbeat %s: %d", hb.ReplicaID, resp.StatusCode)
		}
	}
	req, _ := http.NewRequest(http.MethodGet, h.Admin.URL+"/admin/v1/replicas", nil)
	req.Header.Set("Authorization", "Bearer "+servertest.AdminToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var list struct {
		Data []map[string]any `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		t.Fatal(err)
	}
	rows := map[string]map[string]any{}
	for _, r := range list.Data {
		rows[r["id"].(string)] = r
	}
	w1, w2 := rows["w1"], rows["w2"]
	if w1 == nil || w2 == nil {
		t.Fatalf("replicas: %+v", list.Data)
	}
	for k, want := range map[string]any{
		"engine_waiting":             3.0,
		"engine_waiting_by_reason":   map[string]any{"capacity": 2.0, "deferred": 1.0},
		"engine_preemptions_total":   9.0,
		"prefix_cache_queries_total": 200000.0,
		"prefix_cache_hits_total":    120000.0,
		"prefix_cache_hit_rate":      0.6,
		"engine_sleep_state":         "awake",
		"engine_slots":               10.0, // the one beat: requests wait for capacity behind 10 running
	} {
		if got := w1[k]; fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("w1 %s = %v, want %v", k, got, want)
		}
	}
	if w2["state"] != "warming" || w2["ready"] != false || w2["reason"] != asleep || w2["engine_sleep_state"] != "weights_offloaded" {
		t.Errorf("sleeping replica: state %v ready %v reason %q sleep state %v", w2["state"], w2["ready"], w2["reason"], w2["engine_sleep_state"])
	}
	if _, ok := w2["engine_waiting_by_reason"]; ok {
		t.Errorf("w2 shows waiting by reason its engine did not report: %v", w2["engine_waiting_by_reason"])
	}
}

// readyz returns the status of the admin listener's GET /readyz, asked
// without a token as a probe asks.
func readyz(t *testing.T, h *servertest.Gateway) int {
	t.Helper()
	resp, err := http.Get(h.Admin.URL + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestReadyzDoesNotWaitForAReplica: a gateway no replica serves yet is not
// healthy (/healthz 503) but is ready to take registrations (/readyz 200,
// no token) — a probe on /healthz would keep the workers, who register
// through the gateway, out for ever.
func TestReadyzDoesNotWaitForAReplica(t *testing.T) {
	h := servertest.Start(t, servertest.Options{Replicas: 1})
	h.Reg.Remove("sim-a")
	resp, err := http.Get(h.Public.URL + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("/healthz with no replica: %d, want 503", resp.StatusCode)
	}
	if code := readyz(t, h); code != http.StatusOK {
		t.Fatalf("/readyz with no replica: %d, want 200", code)
	}
	// And a worker (approved) can register through it at once.
	if _, _, err := h.Store.ApproveWorker(t.Context(), "w1", serving.ApprovalCode(testWorkerKey)); err != nil {
		t.Fatal(err)
	}
	engine := tokenCheckingEngine(t)
	if resp := heartbeat(h, servertest.ClusterToken, serving.Heartbeat{ReplicaID: "w1", Address: engine.URL, Models: []string{servertest.SimModel}, State: "ready", Engine: "sim"}); resp.StatusCode != 200 {
		t.Fatalf("heartbeat: %d", resp.StatusCode)
	}
}
