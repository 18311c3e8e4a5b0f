package server_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/policy"
	"github.com/tailgate-dev/tailgate/server/internal/servertest"
)

// adminCall sends body (if any) to the admin API with the admin token and
// returns the status and the body.
func adminCall(t *testing.T, h *servertest.Gateway, method, path, body string) (int, []byte) {
	t.Helper()
	req, _ := http.NewRequest(method, h.Admin.URL+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+servertest.AdminToken)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, raw
}

// chat sends hiBody with secret and returns the status and the error body
// (empty on success).
func chat(t *testing.T, h *servertest.Gateway, secret string) (int, string, string) {
	t.Helper()
	resp := h.Post("/v1/chat/completions", secret, hiBody)
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusOK {
		io.Copy(io.Discard, resp.Body)
		return resp.StatusCode, "", ""
	}
	var e struct {
		Error struct {
			Message string `json:"message"`
			Code    string `json:"code"`
		} `json:"error"`
	}
	raw, _ := io.ReadAll(resp.Body)
	if err := json.Unmarshal(raw, &e); err != nil {
		t.Fatalf("status %d, not an error body: %s", resp.StatusCode, raw)
	}
	return resp.StatusCode, e.Error.Code, e.Error.Message
}

// until polls cond every 10ms for at most 2s (the gateway under test
// polls key changes every 50ms).
func until(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for range 200 {
		if cond() {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("%s: not within 2s", what)
}

// TestKeyEditReachesARunningGateway: PATCH /admin/v1/keys/:ref changes a
// live key: a lowered RPM answers 429 once the gateway picks it up; an
// expiry in the past answers 401 saying the key expired and when (not the
// unknown key's message); extending it makes the key work again. Unknown
// fields, a secret in the URL and a revoked key are refused.
func TestKeyEditReachesARunningGateway(t *testing.T) {
	h := servertest.Start(t, servertest.Options{Replicas: 1})
	secret := h.Key(policy.KeyOptions{})
	prefix := secret[:11]
	if code, _, msg := chat(t, h, secret); code != 200 {
		t.Fatalf("before the edit: %d %s", code, msg)
	}

	if code, raw := adminCall(t, h, http.MethodPatch, "/admin/v1/keys/"+prefix, `{"rpm":1}`); code != 200 || !strings.Contains(string(raw), `"rpm":1`) {
		t.Fatalf("PATCH rpm: %d %s", code, raw)
	}
	until(t, "lowered rpm refuses", func() bool {
		code, errCode, _ := chat(t, h, secret)
		return code == http.StatusTooManyRequests && errCode == "rate_limit_exceeded"
	})

	code, raw := adminCall(t, h, http.MethodPatch, "/admin/v1/keys/"+prefix, `{"rpm":0,"expires":"2020-01-31T00:00:00Z"}`)
	if code != 200 || !strings.Contains(string(raw), `"expired":true`) || !strings.Contains(string(raw), `"expires_at":"2020-01-31T00:00:00Z"`) {
		t.Fatalf("PATCH expires: %d %s", code, raw)
	}
	var msg string
	until(t, "expired key refused", func() bool {
		var c int
		var errCode string
		c, errCode, msg = chat(t, h, secret)
		return c == http.StatusUnauthorized && errCode == "expired_api_key"
	})
	if !strings.Contains(msg, "expired at 2020-01-31T00:00:00Z") {
		t.Errorf("expired key's message %q does not say when", msg)
	}
	unknown, _, _, _ := policy.NewSecret()
	if c, errCode, m := chat(t, h, unknown); c != 401 || errCode != "invalid_api_key" || strings.Contains(m, "expired") {
		t.Errorf("unknown key: %d %s %q", c, errCode, m)
	}

	if code, raw := adminCall(t, h, http.MethodPatch, "/admin/v1/keys/"+prefix, `{"expires":"30d"}`); code != 200 || !strings.Contains(string(raw), `"expired":false`) {
		t.Fatalf("PATCH extend: %d %s", code, raw)
	}
	until(t, "extended key works", func() bool { c, _, _ := chat(t, h, secret); return c == 200 })

	for _, tc := range []struct {
		name, path, body string
		status           int
		inBody           string
	}{
		{"misspelt field", "/admin/v1/keys/" + prefix, `{"rpmm":1}`, 400, `unknown field \"rpmm\"`},
		{"nothing to change", "/admin/v1/keys/" + prefix, `{}`, 400, "nothing to change"},
		{"bad expiry", "/admin/v1/keys/" + prefix, `{"expires":"soon"}`, 400, `"param":"expires"`},
		{"secret in the URL", "/admin/v1/keys/" + secret, `{"rpm":1}`, 400, "never put a key's secret in a URL"},
		{"unknown key", "/admin/v1/keys/tg-nosuchk", `{"rpm":1}`, 404, "key_not_found"},
	} {
		if code, raw := adminCall(t, h, http.MethodPatch, tc.path, tc.body); code != tc.status || !strings.Contains(string(raw), tc.inBody) {
			t.Errorf("%s: %d %s, want %d with %s", tc.name, code, raw, tc.status, tc.inBody)
		}
	}
	if code, raw := adminCall(t, h, http.MethodGet, "/admin/v1/keys", ""); code != 200 || !strings.Contains(string(raw), `"rpm":0`) {
		t.Errorf("refused edits changed the key: %s", raw)
	}
	if code, _ := adminCall(t, h, http.MethodDelete, "/admin/v1/keys/"+prefix, ""); code != 200 {
		t.Fatalf("revoke: %d", code)
	}
	if code, raw := adminCall(t, h, http.MethodPatch, "/admin/v1/keys/"+prefix, `{"rpm":5}`); code != http.StatusConflict || !strings.Contains(string(raw), "key_revoked") {
		t.Errorf("edit of a revoked key: %d %s", code, raw)
	}
}

// TestKeyCreateWithExpiry: POST /admin/v1/keys takes "expires" and lists
// it; an expiry in the past is refused.
func TestKeyCreateWithExpiry(t *testing.T) {
	h := servertest.Start(t, servertest.Options{Replicas: 1})
	code, raw := adminCall(t, h, http.MethodPost, "/admin/v1/keys", `{"tenant":"acme","expires":"2099-01-31T00:00:00Z"}`)
	if code != 201 || !strings.Contains(string(raw), `"expires_at":"2099-01-31T00:00:00Z"`) {
		t.Fatalf("create: %d %s", code, raw)
	}
	if code, raw := adminCall(t, h, http.MethodPost, "/admin/v1/keys", `{"tenant":"acme","expires":"2020-01-31T00:00:00Z"}`); code != 400 || !strings.Contains(string(raw), "not in the future") {
		t.Errorf("create expired: %d %s", code, raw)
	}
}

// TestTenantBudgetThroughTheAdminAPI: GET /admin/v1/tenants/:name shows
// the budget, what was spent and what is reserved; PATCH lowers the budget
// and the next request that does not fit is refused with
// insufficient_quota; unknown fields and tenants are refused.
func TestTenantBudgetThroughTheAdminAPI(t *testing.T) {
	h := servertest.Start(t, servertest.Options{Replicas: 1})
	secret := h.Key(policy.KeyOptions{Tenant: "small"})
	if code, _, msg := chat(t, h, secret); code != 200 {
		t.Fatalf("first request: %d %s", code, msg)
	}
	type view struct {
		Name           string `json:"name"`
		BudgetTokens   int64  `json:"budget_tokens"`
		SpentTokens    int64  `json:"spent_tokens"`
		ReservedTokens *int64 `json:"reserved_tokens"`
		ReservedMicros *int64 `json:"reserved_micros"`
	}
	var v view
	until(t, "spend settled", func() bool {
		code, raw := adminCall(t, h, http.MethodGet, "/admin/v1/tenants/small", "")
		if code != 200 || json.Unmarshal(raw, &v) != nil {
			t.Fatalf("GET tenant: %d %s", code, raw)
		}
		return v.SpentTokens > 0
	})
	if v.Name != "small" || v.BudgetTokens != 0 || v.ReservedTokens == nil || *v.ReservedTokens != 0 || v.ReservedMicros == nil {
		t.Fatalf("tenant view %+v", v)
	}

	code, raw := adminCall(t, h, http.MethodPatch, "/admin/v1/tenants/small", `{"budget_tokens":`+itoa(v.SpentTokens+1)+`}`)
	if code != 200 || json.Unmarshal(raw, &v) != nil || v.BudgetTokens != v.SpentTokens+1 {
		t.Fatalf("PATCH budget: %d %s", code, raw)
	}
	until(t, "lowered budget refuses", func() bool {
		code, errCode, _ := chat(t, h, secret)
		return code == http.StatusTooManyRequests && errCode == "insufficient_quota"
	})
	code, raw = adminCall(t, h, http.MethodGet, "/admin/v1/tenants", "")
	if code != 200 || !strings.Contains(string(raw), `"name":"small"`) || !strings.Contains(string(raw), `"reserved_micros":0`) {
		t.Errorf("GET tenants: %d %s", code, raw)
	}
	// Raising it again serves the tenant.
	if code, raw := adminCall(t, h, http.MethodPatch, "/admin/v1/tenants/small", `{"budget_tokens":0}`); code != 200 {
		t.Fatalf("PATCH unlimited: %d %s", code, raw)
	}
	until(t, "unlimited again", func() bool { c, _, _ := chat(t, h, secret); return c == 200 })

	for _, tc := range []struct {
		name, path, body string
		status           int
		inBody           string
	}{
		{"misspelt field", "/admin/v1/tenants/small", `{"budget_token":5}`, 400, `unknown field \"budget_token\"`},
		{"negative", "/admin/v1/tenants/small", `{"budget_tokens":-5}`, 400, "negative"},
		{"nothing to change", "/admin/v1/tenants/small", `{}`, 400, "nothing to change"},
		{"unknown tenant", "/admin/v1/tenants/smal", `{"budget_tokens":5}`, 404, "tenant_not_found"},
	} {
		if code, raw := adminCall(t, h, http.MethodPatch, tc.path, tc.body); code != tc.status || !strings.Contains(string(raw), tc.inBody) {
			t.Errorf("%s: %d %s, want %d with %s", tc.name, code, raw, tc.status, tc.inBody)
		}
	}
	if code, _ := adminCall(t, h, http.MethodGet, "/admin/v1/tenants/smal", ""); code != 404 {
		t.Errorf("GET unknown tenant: %d", code)
	}
}

func itoa(n int64) string { b, _ := json.Marshal(n); return string(b) }

// TestUsageCountsRejectedApart: a refused request (a model the key may not
// use) shows in /admin/v1/usage as rejected, not as a request.
func TestUsageCountsRejectedApart(t *testing.T) {
	h := servertest.Start(t, servertest.Options{Replicas: 1})
	secret := h.Key(policy.KeyOptions{Models: []string{servertest.SimModel}})
	if code, _, msg := chat(t, h, secret); code != 200 {
		t.Fatalf("ok request: %d %s", code, msg)
	}
	resp := h.Post("/v1/chat/completions", secret, strings.Replace(hiBody, servertest.SimModel, "other-model", 1))
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("other model: %d, want 403", resp.StatusCode)
	}
	var got struct {
		Data []struct {
			Model    string `json:"model"`
			Requests int64  `json:"requests"`
			Rejected int64  `json:"rejected"`
		} `json:"data"`
	}
	until(t, "both rows in usage", func() bool {
		code, raw := adminCall(t, h, http.MethodGet, "/admin/v1/usage", "")
		if code != 200 || json.Unmarshal(raw, &got) != nil {
			t.Fatalf("usage: %d %s", code, raw)
		}
		return len(got.Data) == 2
	})
	for _, r := range got.Data {
		want := [2]int64{1, 0}
		if r.Model == "other-model" {
			want = [2]int64{0, 1}
		}
		if [2]int64{r.Requests, r.Rejected} != want {
			t.Errorf("%s: requests %d rejected %d, want %v", r.Model, r.Requests, r.Rejected, want)
		}
	}
}
