package server_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/tailgate-dev/tailgate/policy"
	"github.com/tailgate-dev/tailgate/server/internal/servertest"
)

// TestNoReplicaSaysWhyEachReplicaIsOut: a model whose replicas are all out
// is answered 503 no_replica naming the model, how many replicas it has,
// and each one's state and reason — what an operator would look up first.
func TestNoReplicaSaysWhyEachReplicaIsOut(t *testing.T) {
	h := servertest.Start(t, servertest.Options{Replicas: 2})
	secret := h.Key(policy.KeyOptions{})
	reps := h.Reg.Replicas()
	h.Reg.Eject(reps[0], "connection refused")
	h.Reg.Drain(reps[1], "worker shutting down")

	resp := h.Post("/v1/chat/completions", secret, `{"model":"`+servertest.SimModel+`","messages":[{"role":"user","content":"hi"}]}`)
	msg, code := errorOf(t, resp)
	if resp.StatusCode != 503 || code != "no_replica" {
		t.Fatalf("status %d code %q: %s", resp.StatusCode, code, msg)
	}
	for _, w := range []string{`"` + servertest.SimModel + `"`, "2 replicas", reps[0].ID + " ejected (connection refused)",
		reps[1].ID + " draining (worker shutting down)"} {
		if !strings.Contains(msg, w) {
			t.Errorf("the message does not say %q:\n  %s", w, msg)
		}
	}
}

// TestUnknownModelListsTheKeysModels: a model nobody serves is answered
// 404 model_not_found with the served models this key may use, and the
// endpoint that lists them.
func TestUnknownModelListsTheKeysModels(t *testing.T) {
	h := servertest.Start(t, servertest.Options{Replicas: 1})
	resp := h.Post("/v1/chat/completions", h.Key(policy.KeyOptions{}), `{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}`)
	msg, code := errorOf(t, resp)
	if resp.StatusCode != 404 || code != "model_not_found" {
		t.Fatalf("status %d code %q: %s", resp.StatusCode, code, msg)
	}
	for _, w := range []string{`"gpt-4o"`, `this key may use "` + servertest.SimModel + `"`, "GET /v1/models"} {
		if !strings.Contains(msg, w) {
			t.Errorf("the message does not say %q:\n  %s", w, msg)
		}
	}
}

func errorOf(t *testing.T, resp *http.Response) (msg, code string) {
	t.Helper()
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var body struct {
		Error struct {
			Message string `json:"message"`
			Code    string `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal(raw, &body); err != nil {
		t.Fatalf("not an OpenAI error: %s", raw)
	}
	return body.Error.Message, body.Error.Code
}
