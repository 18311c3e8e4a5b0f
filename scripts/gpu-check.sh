#!/usr/bin/env bash
# gpu-check.sh — acceptance checks of tailgate in front of a real vLLM, for a
# box with one NVIDIA GPU and vLLM installed. It starts
#
#   tailgate up --engine vllm --model $MODEL --replicas 1
#
# and checks, in about 10 minutes with a small model (a few more for the tune step): readiness and warm-up,
# a streamed chat and a completion through the gateway, a tool call (or
# reasoning), abort on client disconnect, the scraped engine metrics in
# /admin/v1/replicas, a drain on SIGTERM with requests in flight, a SIGKILL of
# the worker and its replacement, and `tailgate bench` for $BENCH_SECONDS
# with its report saved. It prints "PASS name", "FAIL name (why)" or
# "SKIP name (why)" per check, "N passed, N failed" last, and exits 1 if any
# check failed.
#
# Usage:
#   MODEL=Qwen/Qwen2.5-0.5B-Instruct scripts/gpu-check.sh
#   scripts/gpu-check.sh --model Qwen/Qwen2.5-0.5B-Instruct
#
# Environment (all optional):
#   MODEL              model to serve (default Qwen/Qwen2.5-0.5B-Instruct)
#   TAILGATE           tailgate binary (default: tailgate on PATH, else built
#                      from this repository with go build)
#   VLLM_BINARY        vllm executable (default: vllm on PATH)
#   VLLM_ARGS          extra `vllm serve` flags, space-separated, each passed
#                      as --vllm-arg (e.g. "--max-model-len 4096")
#   TOOL_CALL_PARSER   vLLM tool parser: checks a tool call (default hermes
#                      for the default model, else none)
#   REASONING_PARSER   vLLM reasoning parser (e.g. qwen3 for Qwen3 models):
#                      checks reasoning text (used when no tool parser is set)
#   READY_TIMEOUT      seconds the replica may take to become ready, per
#                      start (default 300)
#   BENCH_SECONDS      length of the benchmark (default 60)
#   BENCH_RATE         its requests per second (default 4)
#   OUT                directory for the logs and the bench report (default a
#                      new temporary directory; kept and printed at the end)
#   CURL_TIMEOUT       seconds one request may take (default 60)
#   DRAIN_TOKENS       tokens of each stream in flight at SIGTERM (default
#                      1000: long enough to still run when the signal comes)
#   TUNE               0 skips the last step: `tailgate tune` on the freed GPU
#                      (the configuration as given and max-num-seqs from
#                      TUNE_SEQS, default 16,64; at most 3 candidates), then
#                      `tailgate tune --check` on the file it wrote
#   TUNE_RATES         its rates, requests per second (default 2,4)
#   TUNE_SECONDS       how long each rate is replayed (default 30)
#   TUNE_TTFT_P99      its TTFT p99 target (default 5s: the step checks the
#                      process, not a deployment's target)
set -u -o pipefail

while [ $# -gt 0 ]; do
	case "$1" in
	--model) MODEL="${2:?--model needs a value}"; shift 2 ;;
	--model=*) MODEL="${1#--model=}"; shift ;;
	-h | --help) sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
	*) echo "gpu-check: unknown argument $1 (try --help)" >&2; exit 2 ;;
	esac
done

DEFAULT_MODEL=Qwen/Qwen2.5-0.5B-Instruct
MODEL="${MODEL:-$DEFAULT_MODEL}"
if [ -z "${TOOL_CALL_PARSER+x}" ] && [ "$MODEL" = "$DEFAULT_MODEL" ]; then
	TOOL_CALL_PARSER=hermes
fi
TOOL_CALL_PARSER="${TOOL_CALL_PARSER:-}"
REASONING_PARSER="${REASONING_PARSER:-}"
READY_TIMEOUT="${READY_TIMEOUT:-300}"
BENCH_SECONDS="${BENCH_SECONDS:-60}"
BENCH_RATE="${BENCH_RATE:-4}"
CURL_TIMEOUT="${CURL_TIMEOUT:-60}"
DRAIN_TOKENS="${DRAIN_TOKENS:-1000}"
OUT="${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/gpu-check.XXXXXX")}"
mkdir -p "$OUT"
DATA="$OUT/data"
LOG="$OUT/up.log"

passed=0 failed=0
pass() { echo "PASS $1"; passed=$((passed + 1)); }
fail() { echo "FAIL $1 ($2)"; failed=$((failed + 1)); }
skip() { echo "SKIP $1 ($2)"; }
note() { echo "  ... $*"; }

# finish prints the summary and exits: 1 if a check failed.
finish() {
	echo "logs and reports: $OUT"
	echo "$passed passed, $failed failed"
	[ "$failed" -eq 0 ]
	exit
}

for tool in curl python3; do
	command -v "$tool" >/dev/null || { echo "gpu-check: $tool is required" >&2; exit 2; }
done
if [ -z "${TAILGATE:-}" ]; then
	if command -v tailgate >/dev/null; then
		TAILGATE=$(command -v tailgate)
	else
		TAILGATE="$OUT/tailgate"
		note "building tailgate into $TAILGATE"
		(cd "$(dirname "$0")/.." && go build -o "$TAILGATE" .) || { echo "gpu-check: go build failed" >&2; exit 2; }
	fi
fi

# json EXPR: evaluates the Python expression EXPR on the JSON document read
# from stdin (bound to d) and prints the result; nothing on bad input.
json() { python3 -c "import json,sys
try:
    d = json.load(sys.stdin)
    r = $1
except Exception:
    sys.exit(1)
print(r if not isinstance(r, (dict, list)) else json.dumps(r))"; }

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
API="127.0.0.1:$(free_port)"
ADMIN="127.0.0.1:$(free_port)"

up_args=(up --engine vllm --model "$MODEL" --replicas 1 --data "$DATA" --listen "$API" --admin-listen "$ADMIN")
[ -n "${VLLM_BINARY:-}" ] && up_args+=(--vllm-binary "$VLLM_BINARY")
vllm_args=()
# shellcheck disable=SC2206 # VLLM_ARGS is split on spaces on purpose
[ -n "${VLLM_ARGS:-}" ] && vllm_args+=($VLLM_ARGS)
[ -n "$TOOL_CALL_PARSER" ] && vllm_args+=(--enable-auto-tool-choice --tool-call-parser "$TOOL_CALL_PARSER")
[ -n "$REASONING_PARSER" ] && vllm_args+=(--reasoning-parser "$REASONING_PARSER")
for a in "${vllm_args[@]}"; do up_args+=("--vllm-arg=$a"); done

echo "gpu-check: $TAILGATE ${up_args[*]}"
"$TAILGATE" "${up_args[@]}" >"$OUT/up.out" 2>"$LOG" &
UP_PID=$!

# stop_up ends `tailgate up` (SIGTERM, SIGKILL after 60s) and with it the
# workers and engines.
stop_up() {
	kill -TERM "$UP_PID" 2>/dev/null || return 0
	for _ in $(seq 600); do
		kill -0 "$UP_PID" 2>/dev/null || return 0
		sleep 0.1
	done
	kill -KILL "$UP_PID" 2>/dev/null
}
trap stop_up EXIT
trap 'echo "gpu-check: interrupted"; exit 130' INT TERM

ADMIN_TOKEN="" KEY=""
admin() { curl -sS --max-time 10 -H "Authorization: Bearer $ADMIN_TOKEN" "http://$ADMIN$1"; }
# replica FIELD: the field of the (one) replica in /admin/v1/replicas.
replica() { admin /admin/v1/replicas | json "d['data'][0]['$1']"; }

# state_reason: the replica's state and why it is not ready, from one look.
state_reason() { admin /admin/v1/replicas 2>/dev/null | json "'state %s, reason %s' % (d['data'][0]['state'], d['data'][0]['reason'])"; }

# wait_ready WHAT [OLD_ADDRESS]: waits up to READY_TIMEOUT for the replica
# to be ready (at an address other than OLD_ADDRESS: a new worker), printing
# progress every 10s; fails if `up` exits.
wait_ready() {
	local start=$SECONDS last=$SECONDS old=${2:-} sr telling=""
	while :; do
		if ! kill -0 "$UP_PID" 2>/dev/null; then
			why="tailgate up exited; last lines of $LOG: $(tail -n 3 "$LOG" | tr '\n' ' ')"
			return 1
		fi
		if [ -z "$ADMIN_TOKEN" ] && [ -s "$DATA/admin.token" ] && [ -s "$DATA/demo.key" ]; then
			ADMIN_TOKEN=$(cat "$DATA/admin.token") KEY=$(cat "$DATA/demo.key")
		fi
		if [ -n "$ADMIN_TOKEN" ] && [ "$(replica state 2>/dev/null)" = ready ] &&
			{ [ -z "$old" ] || [ "$(replica address 2>/dev/null)" != "$old" ]; }; then
			note "$1: ready after $((SECONDS - start))s"
			return 0
		fi
		# The last reason that says more than "waiting for the engine" (an
		# engine that fails its warm-up is restarted and waits again).
		if [ -n "$ADMIN_TOKEN" ] && sr=$(state_reason) && [ -n "$sr" ] && [[ $sr != *"waiting for the engine"* ]]; then
			telling=$sr
		fi
		if [ $((SECONDS - start)) -ge "$READY_TIMEOUT" ]; then
			why="not ready within ${READY_TIMEOUT}s: ${telling:-$(state_reason)}"
			return 1
		fi
		if [ $((SECONDS - last)) -ge 10 ]; then
			last=$SECONDS
			note "$1: waited $((SECONDS - start))s of ${READY_TIMEOUT}s; $(state_reason)"
		fi
		sleep 1
	done
}

# post PATH BODY OUTFILE: POSTs BODY to the gateway with the demo key; prints
# the HTTP status.
post() {
	curl -sS -N --max-time "$CURL_TIMEOUT" -o "$3" -w '%{http_code}' "http://$API$1" \
		-H "Authorization: Bearer $KEY" -H 'Content-Type: application/json' -d "$2"
}

# stream_body MAX_TOKENS: a streamed chat that generates MAX_TOKENS tokens.
stream_body() {
	printf '{"model":"%s","stream":true,"max_tokens":%d,"ignore_eos":true,"messages":[{"role":"user","content":"Count from one to a thousand in words."}]}' "$MODEL" "$1"
}

# gone PID: the process has exited (a zombie nobody reaped counts as gone).
gone() { [ ! -e "/proc/$1/stat" ] || [ "$(sed 's/.*) //' "/proc/$1/stat" | cut -c1)" = Z ]; }

# worker_pid / engine_pid: the worker `up` runs, and the engine it runs.
worker_pid() { ps -o pid=,args= --ppid "$UP_PID" | awk '/ worker /{print $1; exit}'; }
engine_pid() { ps -o pid= --ppid "$1" | awk '{print $1; exit}'; }

# wait_until SECONDS WHAT CMD...: runs CMD every 0.5s until it succeeds, for
# at most SECONDS, with progress every 10s.
wait_until() {
	local limit=$1 what=$2 start=$SECONDS last=$SECONDS
	shift 2
	until "$@"; do
		if [ $((SECONDS - start)) -ge "$limit" ]; then return 1; fi
		if [ $((SECONDS - last)) -ge 10 ]; then
			last=$SECONDS
			note "waiting for $what: $((SECONDS - start))s of ${limit}s"
		fi
		sleep 0.5
	done
}

# --- readiness and warm-up ---------------------------------------------------
why=""
if wait_ready "first start"; then
	pass ready
else
	fail ready "$why"
	finish
fi
if grep -q 'msg="engine warmed up"' "$LOG"; then
	pass "warm-up ($(grep -o 'msg="engine warmed up".*endpoint=[^ ]*' "$LOG" | head -n 1 | sed 's/.*endpoint=//'))"
else
	fail warm-up "no \"engine warmed up\" line in $LOG"
fi

# --- a streamed chat and a completion through the gateway -------------------
code=$(post /v1/chat/completions "$(printf '{"model":"%s","stream":true,"max_tokens":32,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"Say hello in five words."}]}' "$MODEL")" "$OUT/chat.sse")
if [ "$code" != 200 ]; then
	fail stream-chat "status $code: $(head -c 300 "$OUT/chat.sse")"
elif ! grep -q '"content":"[^"]' "$OUT/chat.sse"; then
	fail stream-chat "no content delta in $OUT/chat.sse"
elif ! grep -q '"usage":{' "$OUT/chat.sse"; then
	fail stream-chat "no usage chunk although include_usage was asked for"
elif [ "$(tail -n 2 "$OUT/chat.sse" | head -n 1)" != "data: [DONE]" ]; then
	fail stream-chat "the stream does not end with data: [DONE]"
else
	pass stream-chat
fi

code=$(post /v1/completions "$(printf '{"model":"%s","prompt":"The capital of France is","max_tokens":16}' "$MODEL")" "$OUT/completion.json")
tokens=$(json "d['usage']['completion_tokens']" <"$OUT/completion.json")
if [ "$code" = 200 ] && [ "${tokens:-0}" -gt 0 ] && json "d['choices'][0]['text']" <"$OUT/completion.json" >/dev/null; then
	pass completion
else
	fail completion "status $code: $(head -c 300 "$OUT/completion.json")"
fi

# --- a tool call, or reasoning ------------------------------------------------
if [ -n "$TOOL_CALL_PARSER" ]; then
	code=$(post /v1/chat/completions "$(printf '{"model":"%s","max_tokens":256,"tool_choice":"required","messages":[{"role":"user","content":"What is the weather in Paris?"}],"tools":[{"type":"function","function":{"name":"get_weather","description":"Current weather of a city","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}]}' "$MODEL")" "$OUT/tool.json")
	name=$(json "d['choices'][0]['message']['tool_calls'][0]['function']['name']" <"$OUT/tool.json")
	if [ "$code" = 200 ] && [ "$name" = get_weather ]; then
		pass tool-call
	else
		fail tool-call "status $code: $(head -c 300 "$OUT/tool.json")"
	fi
elif [ -n "$REASONING_PARSER" ]; then
	code=$(post /v1/chat/completions "$(stream_body 256)" "$OUT/reasoning.sse")
	if [ "$code" = 200 ] && grep -Eq '"reasoning(_content)?":"[^"]' "$OUT/reasoning.sse"; then
		pass reasoning
	else
		fail reasoning "status $code, no reasoning delta: $(head -c 300 "$OUT/reasoning.sse")"
	fi
else
	skip tool-call "set TOOL_CALL_PARSER (or REASONING_PARSER) for a model that supports it"
fi

# --- scraped engine metrics ---------------------------------------------------
row=$(admin /admin/v1/replicas | json "d['data'][0]")
if [ -n "$row" ] && echo "$row" | json "all(isinstance(d[k], (int, float)) for k in ('engine_running', 'engine_waiting', 'kv_cache_usage', 'recent_ttft_ms'))" | grep -q True; then
	pass "metrics (running $(echo "$row" | json "d['engine_running']"), kv cache $(echo "$row" | json "d['kv_cache_usage']"), recent ttft $(echo "$row" | json "d['recent_ttft_ms']")ms)"
else
	fail metrics "replica row lacks the scraped engine load: $row"
fi

# --- abort on client disconnect -------------------------------------------------
running_at_least() { [ "$(replica engine_running 2>/dev/null | cut -d. -f1)" -ge "$1" ] 2>/dev/null; }
running_zero() { [ "$(replica engine_running 2>/dev/null | cut -d. -f1)" = 0 ]; }
curl -sS -N --max-time "$CURL_TIMEOUT" -o "$OUT/abort.sse" "http://$API/v1/chat/completions" \
	-H "Authorization: Bearer $KEY" -H 'Content-Type: application/json' -d "$(stream_body 4000)" 2>/dev/null &
client=$!
if ! wait_until 30 "the long stream's first token" grep -qs '"content":"[^"]' "$OUT/abort.sse"; then
	kill "$client" 2>/dev/null
	fail abort "no token of the long stream within 30s"
elif ! wait_until 15 "the engine to report the running request" running_at_least 1; then
	kill "$client" 2>/dev/null
	fail abort "vllm:num_requests_running never showed the stream in /admin/v1/replicas"
else
	kill "$client" 2>/dev/null
	if wait_until 20 "the engine to abort the stream" running_zero; then
		pass abort
	else
		fail abort "vllm:num_requests_running still $(replica engine_running) 20s after the client went away"
	fi
fi
wait "$client" 2>/dev/null

# --- drain on SIGTERM with requests in flight -----------------------------------
worker=$(worker_pid)
address=$(replica address)
streams=()
for i in 1 2 3; do
	curl -sS -N --max-time "$CURL_TIMEOUT" -o "$OUT/drain$i.sse" "http://$API/v1/chat/completions" \
		-H "Authorization: Bearer $KEY" -H 'Content-Type: application/json' -d "$(stream_body "$DRAIN_TOKENS")" 2>"$OUT/drain$i.err" &
	streams+=($!)
done
all_started() { for i in 1 2 3; do grep -q '"content":"[^"]' "$OUT/drain$i.sse" 2>/dev/null || return 1; done; }
if [ -z "$worker" ]; then
	fail drain "no worker process under tailgate up ($UP_PID)"
elif ! wait_until 30 "three streams to start" all_started; then
	fail drain "the three streams did not all start within 30s"
else
	kill -TERM "$worker"
	ok=1
	for i in 0 1 2; do wait "${streams[$i]}" || ok=0; done
	bad=""
	for i in 1 2 3; do
		if grep -q '"error"' "$OUT/drain$i.sse" || [ "$(tail -n 2 "$OUT/drain$i.sse" | head -n 1)" != "data: [DONE]" ]; then
			bad="$bad drain$i.sse"
		fi
	done
	if [ "$ok" = 1 ] && [ -z "$bad" ]; then
		pass drain
	else
		fail drain "streams in flight at SIGTERM did not complete:${bad:- curl failed}"
	fi
fi
for s in "${streams[@]}"; do wait "$s" 2>/dev/null; done
if wait_until 60 "the drained worker to exit" gone "${worker:-0}" && wait_ready "restart after the drain" "$address"; then
	:
else
	fail restart "the replica did not come back after the drain: ${why:-the worker did not exit}"
	finish
fi

# --- SIGKILL of the worker, and its replacement ----------------------------------
worker=$(worker_pid)
engine=$(engine_pid "${worker:-0}")
address=$(replica address)
new_worker() { [ -n "$(worker_pid)" ] && [ "$(worker_pid)" != "$worker" ]; }
if [ -z "$worker" ] || [ -z "$engine" ]; then
	fail sigkill "no worker or engine process found (worker '$worker', engine '$engine')"
else
	kill -KILL "$worker"
	if ! wait_until 30 "the engine of the killed worker to go" gone "$engine"; then
		fail sigkill "engine $engine still runs 30s after its worker $worker was killed"
	elif ! wait_until 30 "up to start a new worker" new_worker; then
		fail sigkill "tailgate up started no new worker within 30s"
	elif ! wait_ready "replacement of the killed worker" "$address"; then
		fail sigkill "$why"
	else
		pass sigkill
	fi
fi

# --- benchmark ---------------------------------------------------------------------
bench_args=(bench --target "http://$API/v1" --key-file "$DATA/demo.key" --admin "http://$ADMIN"
	--admin-token-file "$DATA/admin.token" --model "$MODEL" --rate "$BENCH_RATE"
	--phases "steady:${BENCH_SECONDS}s" --json "$OUT/bench.json" --quiet)
note "bench: ${BENCH_SECONDS}s at $BENCH_RATE requests/s; report in $OUT/bench.txt"
if ! timeout $((BENCH_SECONDS + 120)) "$TAILGATE" "${bench_args[@]}" >"$OUT/bench.txt" 2>"$OUT/bench.err"; then
	fail bench "tailgate bench failed: $(tail -n 3 "$OUT/bench.err" | tr '\n' ' ')"
else
	counts=$(json "'%d %d' % (d['all']['requests'], d['all']['errors'])" <"$OUT/bench.json")
	read -r requests errors <<<"${counts:-0 -1}"
	if [ "$requests" -gt 0 ] && [ "$errors" = 0 ] && [ -s "$OUT/bench.txt" ]; then
		pass "bench ($requests requests, report $OUT/bench.txt)"
	else
		fail bench "$requests requests, $errors errors (see $OUT/bench.txt)"
	fi
fi

# --- tune ----------------------------------------------------------------------------
if [ "${TUNE:-1}" = 0 ]; then
	skip tune "TUNE=0"
else
	stop_up # tune starts its own engines on the GPU
	TUNE_SECONDS="${TUNE_SECONDS:-30}" TUNE_RATES="${TUNE_RATES:-2,4}"
	tune_args=(tune --engine vllm --model "$MODEL" --startup-timeout "${READY_TIMEOUT}s"
		--ttft-p99 "${TUNE_TTFT_P99:-5s}" --rate "$TUNE_RATES" --duration "${TUNE_SECONDS}s"
		--space "max-num-seqs=${TUNE_SEQS:-16,64}" --max-candidates 3
		--prompt-tokens lognormal:256:0.5 --output-tokens lognormal:64:0.5)
	[ -n "${VLLM_BINARY:-}" ] && tune_args+=(--vllm-binary "$VLLM_BINARY")
	for a in "${vllm_args[@]}"; do tune_args+=("--vllm-arg=$a"); done
	note "tune: up to 3 candidates, ${TUNE_SECONDS}s a rate; report in $OUT/tune.txt"
	bound=$((3 * (READY_TIMEOUT + 2 * TUNE_SECONDS + 60)))
	if ! timeout "$bound" "$TAILGATE" "${tune_args[@]}" --out "$OUT/tuned-worker.conf" >"$OUT/tune.txt" 2>"$OUT/tune.err"; then
		fail tune "tailgate tune failed: $(tail -n 3 "$OUT/tune.err" | tr '\n' ' ')"
	elif ! timeout $((READY_TIMEOUT + 2 * TUNE_SECONDS + 60)) "$TAILGATE" tune --check "$OUT/tuned-worker.conf" \
		--ttft-p99 "${TUNE_TTFT_P99:-5s}" --rate "${TUNE_RATES%%,*}" --duration "${TUNE_SECONDS}s" \
		--prompt-tokens lognormal:256:0.5 --output-tokens lognormal:64:0.5 >"$OUT/tune-check.txt" 2>&1; then
		fail tune "tune --check failed on the configuration tune wrote: $(tail -n 2 "$OUT/tune-check.txt" | tr '\n' ' ')"
	else
		pass "tune (chose $(grep -m1 '^# candidate:' "$OUT/tuned-worker.conf" | cut -d: -f2-), report $OUT/tune.txt)"
	fi
fi

finish
