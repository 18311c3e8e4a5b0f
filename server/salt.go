package server

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"strconv"
	"sync/atomic"

	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"

	"github.com/tailgate-dev/tailgate/server/apierr"
)

// Tenants share no prefix cache.
//
// An engine with automatic prefix caching answers a prompt whose start it
// has cached sooner: a tenant could time its own requests to learn whether
// another tenant sent a given system prompt. vLLM closes this with the
// request field cache_salt (vllm/entrypoints/openai/protocol.py: on chat,
// completions and responses requests, "must be a non-empty string if
// provided"): it is an extra key of the first block's hash
// (vllm/v1/core/kv_cache_utils.py, generate_block_hash_extra_keys: the
// salt when start_token_idx == 0), and every later block chains that hash,
// so differently salted prompts share no cached block.
//
// The gateway sets cache_salt on every JSON request it forwards to the
// tenant's own salt — an HMAC of the tenant's id under a gateway secret
// (Config.CacheSaltSecret, DIR/cache_salt.key) — replacing whatever the
// client sent: a client cannot choose another tenant's salt, nor learn its
// own. A tenant's requests still share their cache with each other. An
// engine that does not know the field ignores it (vLLM's request models
// allow extra fields; its Anthropic /v1/messages model drops unknown ones,
// so there the engine's cache stays shared: see docs/operations.md). A
// multipart audio form is forwarded without a client's cache_salt field.

// cacheSalts derives and remembers tenants' salts: the latest tenant of
// each slot (by its id), one pointer read a request while the tenants in
// flight hold different slots; a tenant whose slot another took has its
// salt derived again (an HMAC, about a microsecond). (A sync.Map of every
// tenant cost its loads 0.09 % of the gateway's CPU at 1000 req/s:
// /work/wt/profile tg3.script, cacheSalts.of.)
type cacheSalts struct {
	secret []byte
	slots  [saltSlots]atomic.Pointer[tenantSalt] // by tenant id modulo saltSlots
}

// saltSlots is how many tenants' salts are remembered at most.
const saltSlots = 1024

// tenantSalt is a tenant's salt.
type tenantSalt struct {
	tenant int64
	salt   string
}

// of returns the tenant's salt: 22 characters of base64url.
func (c *cacheSalts) of(tenant int64) string {
	slot := &c.slots[uint64(tenant)%saltSlots]
	if ts := slot.Load(); ts != nil && ts.tenant == tenant {
		return ts.salt
	}
	mac := hmac.New(sha256.New, c.secret)
	mac.Write([]byte("tailgate cache_salt\x00"))
	mac.Write(strconv.AppendInt(nil, tenant, 10))
	salt := base64.RawURLEncoding.EncodeToString(mac.Sum(nil)[:16])
	slot.Store(&tenantSalt{tenant, salt})
	return salt
}

// saltRequest sets the forwarded JSON body's cache_salt to cl's tenant's
// salt (a batch line's too), replacing the client's; a body it cannot edit
// is refused rather than forwarded with the client's salt.
func (s *Server) saltRequest(cl *call, pr *parsedRequest) error {
	if cl.principal == nil || pr.ctype != "" || len(pr.body) == 0 {
		return nil
	}
	salt := s.salts.of(cl.principal.TenantID)
	sent := pr.saltSent
	if !pr.saltRead {
		sent = gjson.GetBytes(pr.body, "cache_salt").Exists()
	}
	if sent {
		b, err := sjson.SetBytes(pr.body, "cache_salt", salt)
		if err != nil {
			return apierr.BadRequest("cache_salt", "request body cannot be edited: %v", err)
		}
		pr.body = b
		return nil
	}
	var buf [64]byte
	field := append(append(append(buf[:0], `,"cache_salt":"`...), salt...), '"')
	pr.body = appendFields(pr.body, field)
	return nil
}
