#!/usr/bin/env bash
# The conformance kit: clients nobody here wrote, at pinned versions, run as
# their docs set them up against a real `tailgate up` (the built binary, the
# simulated engine, a temporary data directory, loopback ports):
#
#   Node (e2e/conformance, `npm ci` from its package-lock.json): openai,
#   @ai-sdk/openai (chat, and its default provider on the Responses API),
#   @langchain/openai, @anthropic-ai/sdk 0.x and 1.x (npm aliases),
#   @ai-sdk/anthropic;
#   Go (e2e/conformance/goclients, from the Go module proxy through go.mod):
#   github.com/openai/openai-go/v3, github.com/anthropics/anthropic-sdk-go;
#   a coding agent (e2e/conformance/agents.mjs): Claude Code's npm release,
#   headless (`claude -p`), set up through its environment as the README's
#   Clients section shows — one plain turn, billed to its key.
#
# Each client: a plain call, a stream, tools, structured output, embeddings
# where its API has them, a stream aborted after three pieces (billed what was
# received: `tailgate usage --json` shows at least those tokens and less than
# the cap), a 429 the client retries by itself (its key's one concurrency
# slot held meanwhile), a wrong model and a wrong key (the client's own
# error type, parsed from the answer). The clients reach the gateway through
# e2e/conformance/specproxy.mjs, which records every exchange; the column
# "schema" is schema.mjs's judgement of a row's requests and answers (JSON
# bodies and each streamed event) against the published OpenAPI specs in
# e2e/conformance/testdata/openapi (OpenAI's, and a curated MIT-licensed
# Messages API spec; SOURCE.md there says where each comes from). Prints one
# matrix, client × feature; a failing or missing cell fails the script.
# About two minutes once npm's cache holds the packages (the first `npm ci`
# fetches about 600 MB, most of it Claude Code's native binary).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

if ! command -v npm >/dev/null 2>&1; then
	echo "conformance.sh: npm and node are needed (Node.js; the pinned packages declare 22 or later, and run on 20)" >&2
	exit 1
fi

if [ "$(node -p 'process.versions.node.split(".")[0]')" -lt 20 ]; then
	echo "conformance.sh: Node.js 20 or later is needed (the pinned packages declare 22; they run on 20), found $(node --version)" >&2
	exit 1
fi

work=$(mktemp -d)
up_pid=""
proxy_pid=""
cleanup() {
	# CONFORMANCE_RECORDS=FILE keeps the recorded exchanges (for schema.mjs by hand).
	if [ -n "${CONFORMANCE_RECORDS:-}" ] && [ -f "$work/records.jsonl" ]; then cp "$work/records.jsonl" "$CONFORMANCE_RECORDS"; fi
	if [ -n "$proxy_pid" ]; then kill "$proxy_pid" 2>/dev/null || true; wait "$proxy_pid" 2>/dev/null || true; fi
	if [ -n "$up_pid" ]; then kill "$up_pid" 2>/dev/null || true; wait "$up_pid" 2>/dev/null || true; fi
	rm -rf "$work"
}
trap cleanup EXIT

go build -o "$work/tailgate" .
go build -o "$work/goclients" ./e2e/conformance/goclients
(cd e2e/conformance && npm ci --no-audit --no-fund --loglevel=error >/dev/null)

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
port=$(free_port)
admin=$(free_port)
"$work/tailgate" up --data "$work/data" --listen "127.0.0.1:$port" --admin-listen "127.0.0.1:$admin" --replicas 1 >"$work/up.log" 2>&1 &
up_pid=$!
for _ in $(seq 1 120); do
	if curl -sf "http://127.0.0.1:$port/healthz" >/dev/null 2>&1; then break; fi
	if ! kill -0 "$up_pid" 2>/dev/null; then cat "$work/up.log" >&2; exit 1; fi
	sleep 0.5
done
curl -sf "http://127.0.0.1:$port/healthz" >/dev/null || { echo "conformance.sh: tailgate up never became healthy" >&2; cat "$work/up.log" >&2; exit 1; }

# The recording proxy in front of the gateway: every client goes through it.
records="$work/records.jsonl"
(cd e2e/conformance && exec node specproxy.mjs "http://127.0.0.1:$port" "$records" "$work/proxy.port") &
proxy_pid=$!
for _ in $(seq 1 100); do
	[ -s "$work/proxy.port" ] && break
	kill -0 "$proxy_pid" 2>/dev/null || { echo "conformance.sh: specproxy.mjs exited" >&2; exit 1; }
	sleep 0.1
done
[ -s "$work/proxy.port" ] || { echo "conformance.sh: specproxy.mjs never listened" >&2; exit 1; }

export TG_BASE="http://127.0.0.1:$(cat "$work/proxy.port")" TG_KEY="$(cat "$work/data/demo.key")" TG_BIN="$work/tailgate" TG_DATA="$work/data"
cells="$work/cells.jsonl"
status=0
(cd e2e/conformance && timeout 300 node openai.mjs) >>"$cells" || status=1
(cd e2e/conformance && timeout 300 node anthropic.mjs) >>"$cells" || status=1
timeout 300 "$work/goclients" >>"$cells" || status=1
(cd e2e/conformance && timeout 300 node agents.mjs) >>"$cells" || status=1
# The schema column: every row's recorded exchanges against the specs.
(cd e2e/conformance && timeout 120 node schema.mjs "$records" "openai (npm)" "@ai-sdk/openai chat" "@ai-sdk/openai responses" \
	"@langchain/openai" "@anthropic-ai/sdk 0.x" "@anthropic-ai/sdk 1.x" "@ai-sdk/anthropic" "openai-go/v3" "anthropic-sdk-go" "claude-code") >>"$cells" || status=1

# The matrix, and every cell the kit expects.
node --input-type=module - "$cells" <<'JS' || status=1
import { readFileSync } from "node:fs";
const features = ["plain", "stream", "tools", "structured", "embeddings", "abort", "retry_429", "wrong_model", "wrong_key", "schema"];
const noEmbeddings = new Set(["@ai-sdk/openai responses", "@anthropic-ai/sdk 0.x", "@anthropic-ai/sdk 1.x", "@ai-sdk/anthropic", "anthropic-sdk-go"]);
const clients = ["openai (npm)", "@ai-sdk/openai chat", "@ai-sdk/openai responses", "@langchain/openai",
  "@anthropic-ai/sdk 0.x", "@anthropic-ai/sdk 1.x", "@ai-sdk/anthropic", "openai-go/v3", "anthropic-sdk-go", "claude-code"];
// The coding agent's row: one headless turn (it streams), and the schema of what it was answered.
const only = { "claude-code": new Set(["plain", "schema"]) };
const got = new Map();
for (const line of readFileSync(process.argv[2], "utf8").split("\n")) {
  if (!line.startsWith("{")) continue;
  const c = JSON.parse(line);
  got.set(`${c.client}\t${c.feature}`, c);
}
const w = Math.max(...clients.map((c) => c.length));
console.log("client".padEnd(w) + "  " + features.map((f) => f.padEnd(11)).join(" "));
let failed = [];
for (const client of clients) {
  const cells = features.map((f) => {
    if (f === "embeddings" && noEmbeddings.has(client)) return "-".padEnd(11);
    if (only[client] && !only[client].has(f)) return "-".padEnd(11);
    const c = got.get(`${client}\t${f}`);
    if (!c) { failed.push(`${client} ${f}: no result`); return "MISSING".padEnd(11); }
    if (!c.pass) { failed.push(`${client} ${f}: ${c.error}`); return "FAIL".padEnd(11); }
    return "pass".padEnd(11);
  });
  console.log(client.padEnd(w) + "  " + cells.join(" "));
}
for (const f of failed) console.error("FAIL " + f);
process.exit(failed.length ? 1 : 0);
JS
if [ "$status" -ne 0 ]; then
	echo "conformance.sh: failed; the gateway's log:" >&2
	tail -50 "$work/up.log" >&2
fi
exit "$status"
