package server_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/tailgate-dev/tailgate/policy"
	"github.com/tailgate-dev/tailgate/router"
	"github.com/tailgate-dev/tailgate/server/internal/servertest"
	"github.com/tailgate-dev/tailgate/serving/sim"
	"github.com/tailgate-dev/tailgate/web"
)

// attemptView is one attempt as GET /admin/v1/requests shows it.
type attemptView struct {
	N                int      `json:"n"`
	Replica          string   `json:"replica"`
	Role             string   `json:"role"`
	Outcome          string   `json:"outcome"`
	Reason           string   `json:"reason"`
	StartMS          *float64 `json:"start_ms"`
	TTFTMS           *float64 `json:"ttft_ms"`
	EndMS            *float64 `json:"end_ms"`
	PromptTokens     int64    `json:"prompt_tokens"`
	CompletionTokens int64    `json:"completion_tokens"`
}

// requestAttempts reads one request's attempts through the admin API.
func requestAttempts(t *testing.T, h *servertest.Gateway, id string) []attemptView {
	t.Helper()
	var out struct {
		Data []struct {
			Attempts   int           `json:"attempts"`
			AttemptLog []attemptView `json:"attempt_log"`
		} `json:"data"`
	}
	if code := adminGet(t, h, "/admin/v1/requests?id="+id, &out); code != http.StatusOK || len(out.Data) != 1 {
		t.Fatalf("GET /admin/v1/requests?id=%s: %d, %d rows", id, code, len(out.Data))
	}
	if r := out.Data[0]; len(r.AttemptLog) != r.Attempts {
		t.Errorf("request %s: %d attempts in its log, %d counted", id, len(r.AttemptLog), r.Attempts)
	}
	return out.Data[0].AttemptLog
}

// A hedged request's one-request view shows both attempts: the slow first
// one cancelled on its replica, and the hedge that won on the other.
func TestAdminRequestShowsEveryAttemptOfAHedgedRequest(t *testing.T) {
	for _, stream := range []bool{true, false} {
		t.Run(map[bool]string{true: "stream", false: "json"}[stream], func(t *testing.T) {
			h, secret := hedgeHarness(t)
			body := `{"model":"tailgate-sim","max_tokens":4,"messages":[{"role":"user","content":"hedge me"}]}`
			if stream {
				body = `{"model":"tailgate-sim","max_tokens":4,"stream":true,"messages":[{"role":"user","content":"hedge me"}]}`
			}
			resp := h.Post("/v1/chat/completions", secret, body)
			_, _ = io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.Header.Get("X-Tailgate-Hedged") != "true" {
				t.Fatalf("not hedged: %d via %s", resp.StatusCode, resp.Header.Get("X-Tailgate-Replica"))
			}
			as := requestAttempts(t, h, resp.Header.Get("X-Request-Id"))
			if len(as) != 2 {
				t.Fatalf("attempts %+v, want two", as)
			}
			first, hedge := as[0], as[1]
			if first.Replica != "sim-a" || first.Role != "first" || first.Outcome != "cancelled" || first.Reason != "another attempt won" ||
				first.TTFTMS != nil || first.EndMS == nil || first.PromptTokens == 0 {
				t.Errorf("first attempt %+v: want sim-a cancelled (another attempt won) with no first token, its prompt burnt", first)
			}
			if hedge.Replica != "sim-b" || hedge.Role != "hedge" || hedge.Outcome != "won" || hedge.TTFTMS == nil ||
				hedge.EndMS == nil || hedge.CompletionTokens != 4 || *hedge.StartMS <= *first.StartMS {
				t.Errorf("hedge %+v: want sim-b won, started after the first, with its first token and 4 tokens out", hedge)
			}
		})
	}
}

// A request retried after a replica that could not be reached shows the
// failed attempt and why, then the retry that answered.
func TestAdminRequestShowsTheFailedAttemptOfARetriedRequest(t *testing.T) {
	dead := httptest.NewServer(http.NotFoundHandler())
	deadURL := dead.URL
	dead.Close() // connection refused: never reached
	h := servertest.Start(t, servertest.Options{Replicas: 1, Router: router.Config{Selector: prefer("dead")}})
	h.AddReplica("dead", deadURL, "")
	secret := h.Key(policy.KeyOptions{})
	resp := h.Post("/v1/chat/completions", secret, `{"model":"`+servertest.SimModel+`","max_tokens":3,"messages":[{"role":"user","content":"hi"}]}`)
	_, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Tailgate-Replica") != "sim-a" {
		t.Fatalf("%d via %q, want 200 from sim-a", resp.StatusCode, resp.Header.Get("X-Tailgate-Replica"))
	}
	as := requestAttempts(t, h, resp.Header.Get("X-Request-Id"))
	if len(as) != 2 {
		t.Fatalf("attempts %+v, want two", as)
	}
	if a := as[0]; a.Replica != "dead" || a.Role != "first" || a.Outcome != "failed" ||
		!strings.Contains(a.Reason, "not sent") || !strings.Contains(a.Reason, "refused") || a.PromptTokens != 0 {
		t.Errorf("first attempt %+v: want dead failed, not sent (connection refused), nothing burnt", a)
	}
	if a := as[1]; a.Replica != "sim-a" || a.Role != "retry" || a.Outcome != "won" || a.CompletionTokens != 3 {
		t.Errorf("retry %+v: want sim-a won with 3 tokens out", a)
	}
}

// The dashboard's request detail lists every attempt, not only the winner:
// a hedged request shows the cancelled first attempt on the slow replica
// and the hedge that won on the fast one.
func TestDashboardRequestDetailShowsEveryAttempt(t *testing.T) {
	h, secret := hedgeHarness(t)
	resp := h.Post("/v1/chat/completions", secret, hiStreamBody)
	_, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	id := resp.Header.Get("X-Request-Id")
	if resp.Header.Get("X-Tailgate-Hedged") != "true" {
		t.Fatalf("not hedged: %d via %s", resp.StatusCode, resp.Header.Get("X-Tailgate-Replica"))
	}
	ui := httptest.NewServer(h.Srv.Admin(web.Handler()))
	t.Cleanup(ui.Close)

	b := startBrowser(t, 1400, 900)
	b.navigate(ui.URL + "/ui/#token=" + servertest.AdminToken)
	row := `[...document.querySelectorAll("#requests tbody tr.clickable")].find(r => r.textContent.includes("` + id + `"))`
	b.waitFor("the hedged request", row)
	b.eval(row+`.click()`, nil)
	var attempts []string
	b.eval(`[...document.querySelectorAll("#request-detail table.attempts tbody tr")].map(r => r.innerText.replace(/\s+/g, " "))`, &attempts)
	if len(attempts) != 2 ||
		!strings.Contains(attempts[0], "sim-a first cancelled") || !strings.Contains(attempts[0], "another attempt won") ||
		!strings.Contains(attempts[1], "sim-b hedge won") {
		t.Errorf("the request detail's attempts: %q; want sim-a's first attempt cancelled and sim-b's hedge won", attempts)
	}
	b.screenshot("request-attempts.png")
}

// An attempt waiting for its first token on a replica that is ejected
// meanwhile (a probe or a heartbeat found it hung) gives up at once and the
// request goes to another replica — not after the first-token deadline.
// sim-a takes 30 s to its first token (the deadline is longer); it is
// ejected once the request waits there; the answer comes from sim-b, and
// the request's log says why the first attempt failed.
func TestAttemptOnAnEjectedReplicaGoesElsewhere(t *testing.T) {
	h := servertest.Start(t, servertest.Options{Sims: map[int]sim.Config{0: {TTFT: 30 * time.Second}}})
	secret := h.Key(policy.KeyOptions{})
	var a *router.Replica
	for _, rep := range h.Reg.Replicas() {
		if rep.ID == "sim-a" {
			a = rep
		}
	}
	// sim-b pushed back for a moment, so the request goes to sim-a; it is
	// back by the time sim-a is ejected.
	back := time.Now().Add(2 * time.Second)
	for _, rep := range h.Reg.Replicas() {
		if rep.ID == "sim-b" {
			rep.BackOff(back)
		}
	}
	type answer struct {
		resp *http.Response
		body string
	}
	got := make(chan answer, 1)
	go func() {
		resp := h.Post("/v1/chat/completions", secret, `{"model":"tailgate-sim","max_tokens":4,"messages":[{"role":"user","content":"eject me"}]}`)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		got <- answer{resp, string(b)}
	}()
	for deadline := time.Now().Add(10 * time.Second); a.Inflight() == 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the request never reached sim-a")
		}
	}
	time.Sleep(time.Until(back))
	h.Reg.Eject(a, "test")
	var ans answer
	select {
	case ans = <-got:
	case <-time.After(20 * time.Second):
		t.Fatal("no answer 20 s after sim-a was ejected: the attempt there kept waiting")
	}
	if ans.resp.StatusCode != http.StatusOK || ans.resp.Header.Get("X-Tailgate-Replica") != "sim-b" {
		t.Fatalf("%d via %q: %s; want 200 from sim-b", ans.resp.StatusCode, ans.resp.Header.Get("X-Tailgate-Replica"), ans.body)
	}
	as := requestAttempts(t, h, ans.resp.Header.Get("X-Request-Id"))
	if len(as) != 2 || as[0].Replica != "sim-a" || as[0].Outcome != "failed" || !strings.Contains(as[0].Reason, "ejected") {
		t.Errorf("attempts %+v, want sim-a failed for its ejection, then sim-b", as)
	}
}
