package server

import (
	"net/http"
	"testing"
)

// TestAgentSessionReadsWhatAgentsSend: each agent's own header, as it sends
// it, names the conversation; tailgate's header wins over the others.
func TestAgentSessionReadsWhatAgentsSend(t *testing.T) {
	for _, tc := range []struct {
		agent  string
		header map[string]string
		want   string
	}{
		{"Claude Code", map[string]string{"X-Claude-Code-Session-Id": "cc-1"}, "cc-1"},
		{"Codex CLI", map[string]string{"session_id": "codex-1"}, "codex-1"},
		{"OpenCode", map[string]string{"x-session-affinity": "ses_1", "X-Session-Id": "ses_1"}, "ses_1"},
		{"tailgate's own first", map[string]string{"X-Session-Affinity": "mine", "X-Claude-Code-Session-Id": "cc-1"}, "mine"},
		{"none", map[string]string{"User-Agent": "curl"}, ""},
	} {
		t.Run(tc.agent, func(t *testing.T) {
			h := http.Header{}
			for k, v := range tc.header {
				h.Set(k, v) // canonicalized as net/http's server does
			}
			if got := agentSession(h); got != tc.want {
				t.Errorf("agentSession = %q, want %q", got, tc.want)
			}
		})
	}
}
