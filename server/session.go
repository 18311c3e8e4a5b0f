package server

import (
	"hash/fnv"

	"github.com/tidwall/gjson"
)

// Session affinity: a request may name its conversation so the router keeps
// the conversation's turns on one replica, whose engine has its prefix
// cached (router.AffinitySession). The name comes from, first found:
//
//   - the x-session-affinity header;
//   - prompt_cache_key (OpenAI's chat, completions and responses);
//   - user (OpenAI's end-user id, the same three);
//   - metadata.user_id (Anthropic's messages).
//
// Only a hash of it is kept, mixed with the tenant and the model, so two
// tenants' "alice" are two sessions; the name is never logged.

// sessionHeader is the header that names a request's session.
const sessionHeader = "X-Session-Affinity"

// sessionName hashes the first of fields that is a non-empty string; 0
// when none is.
func sessionName(fields ...gjson.Result) uint64 {
	for _, f := range fields {
		if f.Type == gjson.String && f.Str != "" {
			return hashString(f.Str)
		}
	}
	return 0
}

// hashString hashes a session's name; 0 for "".
func hashString(s string) uint64 {
	if s == "" {
		return 0
	}
	h := fnv.New64a()
	h.Write([]byte(s))
	return h.Sum64()
}

// sessionKey is the router's Hint.Session of cl: its header's name, else
// its body's, scoped to its tenant and model; 0 when it names none.
func (cl *call) sessionKey(pr *parsedRequest) uint64 {
	name := cl.session
	if name == 0 {
		name = pr.session
	}
	if name == 0 {
		return 0
	}
	h := fnv.New64a()
	var b [8]byte
	for i := range b {
		b[i] = byte(name >> (8 * i))
	}
	h.Write(b[:])
	if cl.principal != nil {
		h.Write([]byte(cl.principal.Tenant))
	}
	h.Write([]byte{0})
	h.Write([]byte(pr.model))
	return h.Sum64() | 1 // never 0: that means no session
}

// prefixKey is the router's Hint.Prefix of cl: its prompt's leading part,
// scoped to its tenant (0 when the prompt has none). Engines keep one
// tenant's cached prefixes from another's (cache_salt, salt.go), so two
// tenants' identical system prompts share no cache to meet at, and
// affinity keeps each tenant's on its own replica.
func (cl *call) prefixKey(pr *parsedRequest) uint64 {
	if pr.prefix == 0 || cl.principal == nil {
		return pr.prefix
	}
	// FNV-1a inline: the hash package's would allocate on the hot path.
	h := uint64(14695981039346656037)
	for _, v := range [2]uint64{pr.prefix, uint64(cl.principal.TenantID)} {
		for range 8 {
			h = (h ^ (v & 0xff)) * 1099511628211
			v >>= 8
		}
	}
	return h | 1
}
