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

// adminPost posts body to the admin API with the admin token.
func adminPost(t *testing.T, h *servertest.Gateway, path, body string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, h.Admin.URL+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+servertest.AdminToken)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// TestAdminKeyCreateRefusesWhatItWouldIgnore: a misspelt field ("rpmm"),
// a repeated one or one of the wrong type is a 400 naming the field, and no
// key is made — ignoring it would make a key without the limit its
// creator asked for.
func TestAdminKeyCreateRefusesWhatItWouldIgnore(t *testing.T) {
	h := servertest.Start(t, servertest.Options{Replicas: 1})
	for _, tc := range []struct {
		name, body, param string
		inMessage         []string
	}{
		{"misspelt limit", `{"tenant":"acme","rpmm":10}`, "rpmm", []string{`unknown field "rpmm"`, "rpm, tpm"}},
		{"misspelt budget", `{"tenant":"acme","budget_token":1000}`, "budget_token", []string{`unknown field "budget_token"`}},
		{"repeated field", `{"tenant":"acme","rpm":10,"rpm":0}`, "rpm", []string{`duplicate key "rpm"`}},
		{"wrong type", `{"tenant":"acme","rpm":"10"}`, "rpm", []string{`field "rpm": want a whole number, not a JSON string`}},
		{"not an object", `["acme"]`, "", []string{"JSON object"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp := adminPost(t, h, "/admin/v1/keys", tc.body)
			defer resp.Body.Close()
			raw, _ := io.ReadAll(resp.Body)
			var e struct {
				Error struct {
					Message string  `json:"message"`
					Param   *string `json:"param"`
					Code    string  `json:"code"`
				} `json:"error"`
			}
			if err := json.Unmarshal(raw, &e); err != nil || resp.StatusCode != http.StatusBadRequest {
				t.Fatalf("status %d body %s, want a 400 error", resp.StatusCode, raw)
			}
			param := ""
			if e.Error.Param != nil {
				param = *e.Error.Param
			}
			if param != tc.param {
				t.Errorf("param %q, want %q (%s)", param, tc.param, raw)
			}
			for _, w := range tc.inMessage {
				if !strings.Contains(e.Error.Message, w) {
					t.Errorf("message %q lacks %q", e.Error.Message, w)
				}
			}
		})
	}
	keys, err := h.Store.Keys(t.Context(), "acme")
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 0 {
		t.Fatalf("refused requests made %d keys", len(keys))
	}

	// The fields spelt right make the key with its limit.
	resp := adminPost(t, h, "/admin/v1/keys", `{"tenant":"acme","rpm":10}`)
	defer resp.Body.Close()
	var created struct {
		Key struct {
			RPM int64 `json:"rpm"`
		} `json:"key"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&created); err != nil || resp.StatusCode != http.StatusCreated || created.Key.RPM != 10 {
		t.Fatalf("status %d, key rpm %d (%v), want 201 and rpm 10", resp.StatusCode, created.Key.RPM, err)
	}

	// Revoking by body is as strict.
	resp2 := adminPost(t, h, "/admin/v1/keys/revoke", `{"reff":"tg-x"}`)
	resp2.Body.Close()
	if resp2.StatusCode != http.StatusBadRequest {
		t.Fatalf("revoke with a misspelt field: status %d, want 400", resp2.StatusCode)
	}
}

// TestAdminKeyCreateRefusesAMoneyBudgetNoPriceReaches: a money budget for
// a tenant none of whose models has a price would never be enforced, so
// the key is refused (400 naming budget_micros and the fix); with a price
// for its model it is made.
func TestAdminKeyCreateRefusesAMoneyBudgetNoPriceReaches(t *testing.T) {
	h := servertest.Start(t, servertest.Options{Replicas: 1,
		Prices: map[string]policy.Price{"tailgate-sim": {InputMicrosPerM: 200_000, OutputMicrosPerM: 600_000}}})
	for _, tc := range []struct {
		name, body string
		status     int
	}{
		{"only unpriced models", `{"tenant":"acme","budget_micros":1000000,"models":["llama"]}`, http.StatusBadRequest},
		{"a priced model", `{"tenant":"beta","budget_micros":1000000,"models":["tailgate-sim"]}`, http.StatusCreated},
		{"every model, some priced", `{"tenant":"gamma","budget_micros":1000000}`, http.StatusCreated},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp := adminPost(t, h, "/admin/v1/keys", tc.body)
			defer resp.Body.Close()
			raw, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tc.status, raw)
			}
			if tc.status == http.StatusBadRequest {
				for _, w := range []string{`"param":"budget_micros"`, `tenant \"acme\" has a money budget (1)`, "(llama)", "--price MODEL=IN,OUT"} {
					if !strings.Contains(string(raw), w) {
						t.Errorf("answer lacks %s: %s", w, raw)
					}
				}
			}
		})
	}
	if keys, _ := h.Store.Keys(t.Context(), "acme"); len(keys) != 0 {
		t.Fatalf("the refused key was made")
	}
}
