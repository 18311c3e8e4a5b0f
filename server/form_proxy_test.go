package server_test

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/tailgate-dev/tailgate/data"
	"github.com/tailgate-dev/tailgate/policy"
	"github.com/tailgate-dev/tailgate/server/internal/servertest"
	"github.com/tailgate-dev/tailgate/serving/sim"
)

// audioForm is a transcription form with the given parts before its file,
// under the boundary B.
func audioForm(parts ...string) string {
	var b strings.Builder
	for _, p := range parts {
		b.WriteString("--B\r\n" + p + "\r\n")
	}
	b.WriteString("--B\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\nContent-Type: audio/wav\r\n\r\n")
	b.WriteString(strings.Repeat("\x01", 64000)) // two seconds at the engine's default rate
	b.WriteString("\r\n--B--\r\n")
	return b.String()
}

// TestAttachmentModelFieldIsRefusedNotServed: a key allowed only the cheap
// model sends a form whose second model field has an attachment
// disposition, which vLLM's parser reads (last copy wins) and Go's skips.
// The gateway refuses it with a 400 naming model; the premium engine never
// sees it and no row is billed to either model. The same key's plain form
// is served by the cheap engine and billed to it.
func TestAttachmentModelFieldIsRefusedNotServed(t *testing.T) {
	h := servertest.Start(t, servertest.Options{Replicas: 2, Sims: map[int]sim.Config{
		0: {Model: "cheap"}, 1: {Model: "premium"},
	}})
	secret := h.Key(policy.KeyOptions{Tenant: "narrow", Models: []string{"cheap"}})
	const ctype = "multipart/form-data; boundary=B"

	for _, tc := range []struct{ name, form string }{
		{"attachment disposition", audioForm("Content-Disposition: form-data; name=\"model\"\r\n\r\ncheap",
			"Content-Disposition: attachment; name=\"model\"\r\n\r\npremium")},
		{"repeated name parameter", audioForm("Content-Disposition: form-data; name=\"x\"; name=\"model\"\r\n\r\npremium",
			"Content-Disposition: form-data; name=\"model\"\r\n\r\ncheap")},
	} {
		r := h.Do(http.MethodPost, "/v1/audio/transcriptions", secret, ctype, strings.NewReader(tc.form))
		code, _, param := decodeError(t, r)
		r.Body.Close()
		if r.StatusCode != 400 || param != "model" || code != "invalid_request" {
			t.Fatalf("%s: %d %s param %q, want a 400 naming model", tc.name, r.StatusCode, code, param)
		}
	}

	r := h.Do(http.MethodPost, "/v1/audio/transcriptions", secret, ctype,
		strings.NewReader(audioForm("Content-Disposition: form-data; name=\"model\"\r\n\r\ncheap")))
	raw, _ := io.ReadAll(r.Body)
	r.Body.Close()
	if r.StatusCode != 200 || r.Header.Get("X-Tailgate-Replica") != "sim-a" || !strings.Contains(string(raw), `"text"`) {
		t.Fatalf("the plain form: %d from %q: %s", r.StatusCode, r.Header.Get("X-Tailgate-Replica"), raw)
	}

	var ok []data.LedgerRow
	for _, row := range h.LedgerRows() {
		if row.Model == "premium" || row.Upstream == "sim-b" {
			t.Errorf("a row for the premium model: %+v", row)
		}
		if row.Outcome == data.OutcomeOK {
			ok = append(ok, row)
		}
	}
	if len(ok) != 1 || ok[0].Model != "cheap" || ok[0].Upstream != "sim-a" {
		t.Fatalf("billed rows %+v, want the one plain form on cheap", ok)
	}
}
