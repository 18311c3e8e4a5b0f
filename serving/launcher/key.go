package launcher

import (
	"crypto/rand"
	"strings"
)

// EngineKeyEnv is the environment variable that gives the engine its API
// key. vLLM reads it as it reads --api-key (the flag wins when both are
// set) and then answers 401 {"error":"Unauthorized"} to /v1 requests
// without "Authorization: Bearer KEY"; the simulated engine does the same.
// The environment, unlike argv, is not shown by ps to other users.
const EngineKeyEnv = "VLLM_API_KEY"

// newEngineKey returns a fresh random API key (128 bits) for one engine
// start.
func newEngineKey() string { return "tgk-" + rand.Text() }

// isEngineKey reports whether an environment entry sets [EngineKeyEnv].
func isEngineKey(kv string) bool { return strings.HasPrefix(kv, EngineKeyEnv+"=") }
