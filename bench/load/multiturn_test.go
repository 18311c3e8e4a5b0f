package load

import (
	"encoding/json"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestMultiturnConversationRepeatsItsHistory: a seeded conversation's turn
// k+1 sends turn k's messages whole and then adds to them — so the engine's
// prefix cache can serve turn k's prompt — names its session by
// prompt_cache_key on every turn, and the same seed sends the same bytes.
func TestMultiturnConversationRepeatsItsHistory(t *testing.T) {
	m := MultiturnOptions{Turns: "uniform:6:6"}.withDefaults()
	d, err := m.validate()
	if err != nil {
		t.Fatal(err)
	}
	conv := func(seed uint64, session string) *conversation {
		return newConversation(rand.New(rand.NewPCG(seed, 0)), d, m, "tailgate-sim", session)
	}
	type msg struct{ Role, Content string }
	type body struct {
		Messages       []msg
		PromptCacheKey string `json:"prompt_cache_key"`
		Stream         bool
	}
	parse := func(b []byte) body {
		t.Helper()
		var out body
		if err := json.Unmarshal(b, &out); err != nil {
			t.Fatal(err)
		}
		return out
	}
	c := conv(1, "s1-c0-0")
	if c.turns != 6 {
		t.Fatalf("turns = %d, want 6 (uniform:6:6)", c.turns)
	}
	prev := parse(c.body(0))
	if len(prev.Messages) != 2 || prev.Messages[0].Role != "system" || prev.Messages[1].Role != "user" {
		t.Fatalf("turn 1 sends %+v, want a system prompt and a user message", prev.Messages)
	}
	if n := len(strings.Fields(prev.Messages[0].Content)); n < m.System {
		t.Errorf("system prompt of %d words, want at least %d", n, m.System)
	}
	for k := 1; k < c.turns; k++ {
		cur := parse(c.body(k))
		if cur.PromptCacheKey != "s1-c0-0" || !cur.Stream {
			t.Errorf("turn %d: prompt_cache_key %q, stream %v; want the conversation's session, streamed", k+1, cur.PromptCacheKey, cur.Stream)
		}
		if len(cur.Messages) != len(prev.Messages)+2 || !slices.Equal(cur.Messages[:len(prev.Messages)], prev.Messages) {
			t.Fatalf("turn %d does not start with turn %d's %d messages and add an answer and a message: %d messages", k+1, k, len(prev.Messages), len(cur.Messages))
		}
		if a, u := cur.Messages[len(prev.Messages)], cur.Messages[len(prev.Messages)+1]; a.Role != "assistant" || u.Role != "user" || u.Content == "" {
			t.Fatalf("turn %d adds %s then %s, want assistant then a user message", k+1, a.Role, u.Role)
		}
		prev = cur
	}
	if string(conv(1, "s1-c0-0").body(3)) != string(c.body(3)) {
		t.Error("the same seed sent a different turn")
	}
	if other := conv(2, "s1-c0-1"); string(other.body(0)) == string(c.body(0)) {
		t.Error("two seeds sent the same first turn")
	}
}

// TestMultiturnVerdict: the verdict passes when the session mode's
// follow-up p95 is at most 0.7× off's with imbalance at most 1.25 and no
// errors in any mode, and fails (an error, so exit status 1) otherwise.
func TestMultiturnVerdict(t *testing.T) {
	modes := func(sessionP95, imbalance float64, errs int) []multiturnMode {
		off := multiturnMode{Mode: "off", FollowUp: Summary{N: 100, P95: 200}, Turns: 100, Errors: map[string]int{}, Imbalance: 1.05}
		prefix := multiturnMode{Mode: "prefix", FollowUp: Summary{N: 100, P95: 180}, Turns: 100, Errors: map[string]int{}, Imbalance: 1.1}
		session := multiturnMode{Mode: "session", FollowUp: Summary{N: 100, P95: sessionP95}, Turns: 100, Errors: map[string]int{}, Imbalance: imbalance,
			HitRate: map[string]float64{"r1": 0.8, "r0": 0.5},
			Routes:  map[string]float64{"placed": 20, "stayed": 70, "moved_load": 8, "moved_gone": 2}}
		if errs > 0 {
			prefix.Errors["timeout"] = errs
		}
		return []multiturnMode{off, prefix, session}
	}
	for _, tc := range []struct {
		name       string
		p95, imb   float64
		errs       int
		pass       bool
		wantInText string
	}{
		{"faster within the bound", 140, 1.25, 0, true, "= 0.70 (max 0.7), imbalance 1.25 (max 1.25): PASS"},
		{"not fast enough", 142, 1.05, 0, false, "= 0.71 (max 0.7), imbalance 1.05 (max 1.25): FAIL"},
		{"a hot spot", 100, 1.26, 0, false, "imbalance 1.26 (max 1.25): FAIL"},
		{"errors in another mode", 100, 1.05, 3, false, "PASS"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out strings.Builder
			err := writeMultiturn(&out, modes(tc.p95, tc.imb, tc.errs))
			if (err == nil) != tc.pass {
				t.Errorf("writeMultiturn error %v, want pass %v", err, tc.pass)
			}
			if !strings.Contains(out.String(), tc.wantInText) {
				t.Errorf("output lacks %q:\n%s", tc.wantInText, out.String())
			}
			if !strings.Contains(out.String(), "1.10      -") || !strings.Contains(out.String(), "10%\n") {
				t.Errorf("the moved column is not '-' for prefix and 10%% (8 + 2 of 100 routes) for session:\n%s", out.String())
			}
			if !strings.Contains(out.String(), "50% 80%") {
				t.Errorf("session's hit rates are not listed in replica order:\n%s", out.String())
			}
			if tc.errs > 0 && (err == nil || !strings.Contains(err.Error(), "prefix: 3 timeout")) {
				t.Errorf("error %v does not name prefix's 3 timeouts", err)
			}
		})
	}
}

// TestMultiturnSessionHeader: with --session-header AGENT each turn carries
// that agent's session header, spelled as the agent sends it, naming the
// conversation, and no prompt_cache_key (the header alone names the
// session); with none, no agent header and the body's prompt_cache_key.
func TestMultiturnSessionHeader(t *testing.T) {
	type seen struct {
		header http.Header
		key    string
	}
	got := make(chan seen, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body struct {
			PromptCacheKey string `json:"prompt_cache_key"`
		}
		_ = json.NewDecoder(r.Body).Decode(&body)
		got <- seen{header: r.Header.Clone(), key: body.PromptCacheKey}
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "data: {}\n\ndata: [DONE]\n\n")
	}))
	defer srv.Close()
	c := &fanoutClient{hc: srv.Client(), base: srv.URL + "/v1", key: "k", model: "tailgate-sim", timeout: 10 * time.Second}

	for _, tc := range []struct {
		agent string
		want  []string // the headers that must name the session
	}{
		{"claude-code", []string{"X-Claude-Code-Session-Id"}},
		{"codex", []string{"Session_id"}},
		{"opencode", []string{"X-Session-Affinity", "X-Session-Id"}},
		{"none", nil},
	} {
		t.Run(tc.agent, func(t *testing.T) {
			m := MultiturnOptions{Turns: "uniform:3:3", SessionHeader: tc.agent}.withDefaults()
			d, err := m.validate()
			if err != nil {
				t.Fatal(err)
			}
			conv := newConversation(rand.New(rand.NewPCG(1, 0)), d, m, "tailgate-sim", "s1-c0-0")
			conv.agent = m.SessionHeader
			for k := range conv.turns {
				if _, err := c.turn(t.Context(), conv.body(k), conv.header()); err != nil {
					t.Fatalf("turn %d: %v", k+1, err)
				}
				s := <-got
				for _, name := range tc.want {
					if v := s.header.Get(name); v != "s1-c0-0" {
						t.Errorf("turn %d: %s = %q, want the conversation's session s1-c0-0", k+1, name, v)
					}
				}
				if tc.want != nil && s.key != "" {
					t.Errorf("turn %d: prompt_cache_key %q sent with %s's header, want the header alone", k+1, s.key, tc.agent)
				}
				if tc.want == nil {
					if s.key != "s1-c0-0" {
						t.Errorf("turn %d: prompt_cache_key %q, want s1-c0-0", k+1, s.key)
					}
					for _, name := range []string{"X-Claude-Code-Session-Id", "Session_id", "X-Session-Affinity", "X-Session-Id"} {
						if v := s.header.Get(name); v != "" {
							t.Errorf("turn %d: %s: %q sent with no agent named", k+1, name, v)
						}
					}
				}
			}
		})
	}
	if _, err := (MultiturnOptions{SessionHeader: "cursor"}).withDefaults().validate(); err == nil || !strings.Contains(err.Error(), "--session-header") {
		t.Errorf("an unknown agent: error %v, want one naming --session-header", err)
	}
}
