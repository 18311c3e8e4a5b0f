package server_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/tailgate-dev/tailgate/policy"
	"github.com/tailgate-dev/tailgate/server"
	"github.com/tailgate-dev/tailgate/server/internal/servertest"
)

func usageEventsPage(t *testing.T, h *servertest.Gateway, query string) server.UsageEventsPage {
	t.Helper()
	code, raw := adminCall(t, h, http.MethodGet, "/admin/v1/usage/events"+query, "")
	if code != http.StatusOK {
		t.Fatalf("GET /admin/v1/usage/events%s: %d %s", query, code, raw)
	}
	var p server.UsageEventsPage
	if err := json.Unmarshal(raw, &p); err != nil {
		t.Fatalf("%s: %v", raw, err)
	}
	return p
}

func pageIDs(p server.UsageEventsPage) []string {
	out := make([]string, len(p.Data))
	for i, e := range p.Data {
		out[i] = e.ID
	}
	return out
}

// TestUsageEventsPullIsStableFromACursor: each answered request is one
// usage event whose id is its x-request-id plus ".v1", in the order they
// were billed, with what it billed. The same cursor read twice gives the
// same ids; paging one event at a time with next_cursor gives the same
// list; a cursor at the end answers no events and itself as next_cursor.
func TestUsageEventsPullIsStableFromACursor(t *testing.T) {
	h := servertest.Start(t, servertest.Options{Replicas: 1})
	secret := h.Key(policy.KeyOptions{Tenant: "acme"})
	var want []string
	for range 3 {
		resp := h.Post("/v1/chat/completions", secret, hiBody)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("chat: %d", resp.StatusCode)
		}
		want = append(want, resp.Header.Get("x-request-id")+".v1")
	}
	if err := h.Ledger.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}

	first := usageEventsPage(t, h, "")
	if got := pageIDs(first); !slices.Equal(got, want) {
		t.Fatalf("events: %v, want %v", got, want)
	}
	if again := usageEventsPage(t, h, "?after="); !slices.Equal(pageIDs(again), want) || again.NextCursor != first.NextCursor {
		t.Errorf("second read from the start: %v next %q, want %v next %q", pageIDs(again), again.NextCursor, want, first.NextCursor)
	}
	e := first.Data[0]
	if e.SpecVersion != "1.0" || e.Type != "tailgate.usage.v1" || e.Source != "tailgate" || e.Subject != "acme" ||
		e.Data.Tenant != "acme" || e.Data.Model != "tailgate-sim" || e.Data.Status != 200 || e.Data.Outcome != "ok" ||
		e.Data.PromptTokens == 0 || e.Data.CompletionTokens == 0 || e.Data.TotalTokens != e.Data.PromptTokens+e.Data.CompletionTokens ||
		e.Data.KeyID == "" || e.Data.Version != 1 || e.Time.IsZero() || e.Data.Endpoint != "/v1/chat/completions" {
		t.Errorf("event: %+v", e)
	}

	var paged []string
	cursor := ""
	for range 10 {
		p := usageEventsPage(t, h, "?limit=1&after="+cursor)
		paged = append(paged, pageIDs(p)...)
		cursor = p.NextCursor
		if !p.HasMore {
			break
		}
	}
	if !slices.Equal(paged, want) {
		t.Errorf("paged one at a time: %v, want %v", paged, want)
	}
	end := usageEventsPage(t, h, "?after="+first.NextCursor)
	if len(end.Data) != 0 || end.NextCursor != first.NextCursor || end.HasMore {
		t.Errorf("at the end: %+v, want no events and the same cursor", end)
	}

	for _, q := range []string{"?after=x", "?after=-1", "?limit=0", "?limit=1001"} {
		if code, raw := adminCall(t, h, http.MethodGet, "/admin/v1/usage/events"+q, ""); code != http.StatusBadRequest {
			t.Errorf("GET …%s: %d %s, want 400", q, code, raw)
		}
	}
}

// A retry answered from its Idempotency-Key's record is an event of its own
// that bills nothing and names the request whose answer it replayed, so a
// billing system can tell a client's retry from a second request.
func TestUsageEventOfAReplayNamesItsOriginal(t *testing.T) {
	h := servertest.Start(t, servertest.Options{Replicas: 1})
	secret := h.Key(policy.KeyOptions{Tenant: "acme"})
	var ids []string
	for range 2 {
		req, _ := http.NewRequest(http.MethodPost, h.Public.URL+"/v1/chat/completions", strings.NewReader(hiBody))
		req.Header.Set("Authorization", "Bearer "+secret)
		req.Header.Set("Idempotency-Key", "order-7")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("chat: %d", resp.StatusCode)
		}
		ids = append(ids, resp.Header.Get("x-request-id"))
	}
	if err := h.Ledger.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	page := usageEventsPage(t, h, "")
	if len(page.Data) != 2 {
		t.Fatalf("events: %v, want the run and its replay", pageIDs(page))
	}
	run, replay := page.Data[0].Data, page.Data[1].Data
	if run.Replay || run.ReplayOf != "" || run.CompletionTokens == 0 {
		t.Errorf("the run's event: %+v", run)
	}
	if !replay.Replay || replay.ReplayOf != run.RequestID || replay.CostMicros != 0 || replay.CompletionTokens != 0 {
		t.Errorf("the replay's event: %+v, want replay of %s billing nothing", replay, run.RequestID)
	}
}
