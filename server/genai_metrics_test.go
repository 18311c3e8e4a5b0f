package server_test

import (
	"bufio"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/tailgate-dev/tailgate/policy"
	"github.com/tailgate-dev/tailgate/router"
	"github.com/tailgate-dev/tailgate/server/internal/servertest"
)

// scrapeMetrics reads the admin listener's /metrics as Prometheus does:
// every sample line, by its series (name and labels as written).
func scrapeMetrics(t *testing.T, h *servertest.Gateway) map[string]float64 {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, h.Admin.URL+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+servertest.AdminToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/metrics: %d", resp.StatusCode)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("metrics line %q", line)
		}
		out[line[:i]] = v
	}
	return out
}

// TestGenAIMetricsFollowTheConventions: /metrics carries the OpenTelemetry
// GenAI metrics under their Prometheus names, with the conventions'
// attributes as labels and their recommended buckets: token usage adds up
// to what the ledger billed, by type; durations and time to first token
// count each request, time per output token each stream; a stream broken
// midway is timed under its outcome; the tailgate_* metrics are still there.
func TestGenAIMetricsFollowTheConventions(t *testing.T) {
	broken := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, `data: {"id":"x","object":"chat.completion.chunk","created":1,"model":"`+servertest.SimModel+
			`","choices":[{"index":0,"delta":{"role":"assistant","content":"half"},"finish_reason":null}]}`+"\n\n")
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler) // the connection dies mid-answer
	}))
	t.Cleanup(broken.Close)
	// prefer: sim-a until the broken replica is added.
	h := servertest.Start(t, servertest.Options{Replicas: 1, Router: router.Config{Selector: prefer("broken")}})
	secret := h.Key(policy.KeyOptions{})
	chat := func(stream bool) {
		t.Helper()
		resp := h.Post("/v1/chat/completions", secret, `{"model":"`+servertest.SimModel+`","max_tokens":5,"stream":`+strconv.FormatBool(stream)+
			`,"messages":[{"role":"user","content":"hello there"}]}`)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("chat: %d", resp.StatusCode)
		}
	}
	chat(true)
	chat(true)
	chat(false)
	resp := h.Post("/v1/embeddings", secret, `{"model":"`+servertest.SimModel+`","input":"hello there"}`)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("embeddings: %d", resp.StatusCode)
	}
	embeddings := resp.Header.Get("X-Request-Id")
	// Then the broken replica is chosen: a stream cut after its first token.
	h.AddReplica("broken", broken.URL, "")
	resp = h.Post("/v1/chat/completions", secret, `{"model":"`+servertest.SimModel+`","max_tokens":5,"stream":true,"messages":[{"role":"user","content":"hi"}]}`)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()

	var billed [2]map[string]int64 // by operation: input, output
	billed[0], billed[1] = map[string]int64{}, map[string]int64{}
	for _, row := range h.LedgerRows() {
		op := "chat"
		if row.ID == embeddings {
			op = "embeddings"
		}
		billed[0][op] += row.PromptTokens
		billed[1][op] += row.CompletionTokens
	}
	m := scrapeMetrics(t, h)
	const ok = `gen_ai_operation_name="chat",gen_ai_provider_name="vllm",gen_ai_request_model="tailgate-sim",gen_ai_response_model="tailgate-sim"`
	series := func(name, labels string) float64 {
		t.Helper()
		v, found := m[name+"{"+labels+"}"]
		if !found {
			t.Errorf("no series %s{%s}", name, labels)
		}
		return v
	}
	if got := series("gen_ai_server_request_duration_seconds_count", `error_type="",`+ok); got != 3 {
		t.Errorf("chat requests timed %v, want 3", got)
	}
	for _, name := range []string{"gen_ai_server_time_to_first_token_seconds_count", "gen_ai_server_time_per_output_token_seconds_count"} {
		if got := series(name, ok); got != 2 {
			t.Errorf("%s = %v, want the 2 streams", name, got)
		}
	}
	for i, typ := range []string{"input", "output"} {
		for _, op := range []string{"chat", "embeddings"} {
			labels := `gen_ai_operation_name="` + op + `",gen_ai_provider_name="vllm",gen_ai_request_model="tailgate-sim",gen_ai_response_model="tailgate-sim",gen_ai_token_type="` + typ + `"`
			if billed[i][op] == 0 {
				if _, found := m["gen_ai_client_token_usage_count{"+labels+"}"]; found {
					t.Errorf("%s %s tokens observed, none billed", op, typ)
				}
				continue
			}
			if got := series("gen_ai_client_token_usage_sum", labels); got != float64(billed[i][op]) {
				t.Errorf("%s %s tokens %v, the ledger billed %d", op, typ, got, billed[i][op])
			}
		}
	}
	// The conventions' buckets: each histogram's last boundary.
	for name, le := range map[string]string{
		"gen_ai_server_request_duration_seconds_bucket":      "81.92",
		"gen_ai_server_time_to_first_token_seconds_bucket":   "10",
		"gen_ai_server_time_per_output_token_seconds_bucket": "2.5",
	} {
		labels := ok + `,le="` + le + `"`
		if name == "gen_ai_server_request_duration_seconds_bucket" {
			labels = `error_type="",` + labels
		}
		series(name, labels)
	}
	series("gen_ai_client_token_usage_bucket", `gen_ai_operation_name="chat",gen_ai_provider_name="vllm",gen_ai_request_model="tailgate-sim",gen_ai_response_model="tailgate-sim",gen_ai_token_type="input",le="6.7108864e+07"`)
	// The broken stream: timed under its outcome, the model that answered named.
	if got := series("gen_ai_server_request_duration_seconds_count", `error_type="midstream_error",`+ok); got != 1 {
		t.Errorf("midstream failures timed %v, want 1", got)
	}
	// The contract's metrics keep their names.
	series("tailgate_ttft_seconds_count", `answer="stream",model="tailgate-sim"`)
}
