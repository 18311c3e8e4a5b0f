package server

import "net/http"

// agentSessionHeaders are the headers coding agents send, unasked, on every
// request of one conversation, in the order agentSession reads them:
//
//   - X-Session-Affinity: tailgate's own (sessionHeader); OpenCode sends it
//     too, with X-Session-Id, to every provider but its own
//     (sst/opencode packages/opencode/src/session/llm/request.ts@31e22f65,
//     prepare: "x-session-affinity" and "X-Session-Id" set to the session id);
//   - X-Claude-Code-Session-Id: Claude Code's session id, on every Messages
//     request (https://code.claude.com/docs/en/llm-gateway-protocol, request
//     headers a gateway may consume);
//   - session_id: Codex CLI's conversation id
//     (openai/codex codex-rs/codex-api/src/requests/headers.rs@546585f8,
//     build_conversation_headers); its Responses body also carries it as
//     prompt_cache_key, which readResponses reads.
var agentSessionHeaders = [...]string{sessionHeader, "X-Claude-Code-Session-Id", "X-Session-Id", "Session_id"}

// agentSession is the conversation a request belongs to as its client
// names it in a header, "" if none does. Session affinity keys on it
// (scoped to the tenant by its caller), so an agent's follow-up turns find
// the replica that holds their prefix without any setup.
func agentSession(h http.Header) string {
	for _, name := range agentSessionHeaders {
		if v := headerValue(h, name); v != "" {
			return v
		}
	}
	return ""
}
