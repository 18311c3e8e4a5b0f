#!/usr/bin/env bash
# bench-overhead.sh — what the gateway adds over calling the engine directly.
#
# One run, everything on 127.0.0.1: a simulated engine answering at once
# (--sim-ttft 0 --sim-tpot 0), a second one streaming a token every
# STREAM_TPOT, and `tailgate gateway` in front of both with a real key (every
# limit on, far away), admission and metering into SQLite. vegeta sends an
# open-loop load at each rate in RATES, alternating between the engine
# directly and the gateway (and a bare nginx proxy_pass hop when nginx is
# installed, and a bare Go httputil.ReverseProxy hop, bench/goproxy), with the
# same body and keep-alive on. Then bench/streamgap holds
# STREAMS streams open on each path and compares time to first chunk and the
# gaps between chunks.
#
# Usage: scripts/bench-overhead.sh
# Environment (all optional):
#   RATES="500 1000 2000 3000 4000 5000"  request rates, req/s
#   DURATION=10s                           length of each vegeta run
#   WARMUP=2s                              warm-up run per path before the rates
#   STREAMS=200 STREAM_TOKENS=100 STREAM_TPOT=20ms STREAM_DURATION=10s STREAM_ROUNDS=1
#   JSON_RATE=100 JSON_TOKENS=16 JSON_DURATION=10s  JSON answers from the STREAM_TPOT engine
#   VEGETA_MAX_CONNS=512                   connections vegeta may open per path
#   NGINX=auto|off                         baseline row through nginx if installed
#   GOPROXY=on|off                         baseline row through a bare Go reverse proxy (bench/goproxy)
#   KEEP_TMP=1                             keep the temp dir (results, logs)
# Needs go and curl; vegeta is installed with `go install` when it is not on
# PATH.
set -euo pipefail

RATES=${RATES:-"500 1000 2000 3000 4000 5000"}
DURATION=${DURATION:-10s}
WARMUP=${WARMUP:-2s}
STREAMS=${STREAMS:-200}
STREAM_TOKENS=${STREAM_TOKENS:-100}
STREAM_TPOT=${STREAM_TPOT:-20ms}
STREAM_DURATION=${STREAM_DURATION:-10s}
STREAM_ROUNDS=${STREAM_ROUNDS:-1}
JSON_RATE=${JSON_RATE:-100}
JSON_TOKENS=${JSON_TOKENS:-16}
JSON_DURATION=${JSON_DURATION:-10s}
VEGETA_MAX_CONNS=${VEGETA_MAX_CONNS:-512}
NGINX=${NGINX:-auto}
GOPROXY=${GOPROXY:-on}

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TMP=$(mktemp -d "${TMPDIR:-/tmp}/tailgate-bench.XXXXXX")
PIDS=()
BENCH_NAME=bench-overhead
# shellcheck source=scripts/bench-lib.sh
source "$ROOT/scripts/bench-lib.sh"

trap stop_all EXIT
trap 'exit 130' INT TERM

# --- tools -------------------------------------------------------------------
need_tools
log "building tailgate and the bench helpers into $TMP"
(cd "$ROOT" && go build -o "$TMP/tailgate" . && go build -o "$TMP/streamgap" ./bench/streamgap &&
	go build -o "$TMP/overheadtable" ./bench/overheadtable && go build -o "$TMP/goproxy" ./bench/goproxy)

# --- engines and gateway -----------------------------------------------------
start_sim sim tailgate-sim 0
SIM=$ADDR
start_sim sim-stream tailgate-sim-stream "$STREAM_TPOT"
SIM_STREAM=$ADDR
log "engines: $SIM (instant), $SIM_STREAM (token every $STREAM_TPOT)"

DATA="$TMP/data"
"$TMP/tailgate" gateway --data "$DATA" --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 \
	--upstream "http://$SIM" --upstream "http://$SIM_STREAM" \
	--price tailgate-sim=0.2,0.6 --price tailgate-sim-stream=0.2,0.6 >"$TMP/gateway.out" 2>"$TMP/gateway.log" &
PIDS+=($!)
GW=$(wait_for_line "$TMP/gateway.out" '^tailgate gateway: API ' | sed -E 's|.*API http://([^/]+)/v1.*|\1|') ||
	die "gateway did not start: $(cat "$TMP/gateway.log")"
KEY=$(bench_key "$TMP/tailgate" "$DATA")

ready=
for ((i = 0; i < 100; i++)); do
	if [[ $(curl -s -o /dev/null -w '%{http_code}' "http://$GW/healthz") == 200 ]] &&
		models=$(curl -sf -H "Authorization: Bearer $KEY" "http://$GW/v1/models") &&
		[[ "$models" == *'"tailgate-sim"'* && "$models" == *'"tailgate-sim-stream"'* ]]; then
		ready=1
		break
	fi
	sleep 0.1
done
[[ -n "$ready" ]] || die "gateway never became ready: $(tail -n 20 "$TMP/gateway.log")"
log "gateway: $GW (healthz 200, both models ready)"

PATHS="direct gateway"
declare -A BASE=([direct]="http://$SIM" [gateway]="http://$GW")
if [[ "$NGINX" != off ]] && start_nginx "$SIM"; then
	PATHS="$PATHS nginx"
	BASE[nginx]="http://$NGINX_ADDR"
	log "nginx baseline: $NGINX_ADDR"
fi

# A bare Go hop (net/http + httputil.ReverseProxy, no work at all): what Go's
# HTTP stack alone adds, so the gateway's own share can be told apart.
if [[ "$GOPROXY" != off ]]; then
	start_goproxy "http://$SIM"
	PATHS="$PATHS goproxy"
	BASE[goproxy]="http://$GOPROXY_ADDR"
	log "bare Go proxy baseline: $GOPROXY_ADDR"
fi

# --- non-streaming: vegeta at fixed rates ------------------------------------
BODY="$TMP/body.json"
chat_body "$BODY"
for p in $PATHS; do
	targets "${BASE[$p]}" "$KEY" "$BODY" "$TMP/targets-$p.txt"
done

log "cpus: $(nproc), load: $(cut -d' ' -f1-3 /proc/loadavg); paths: $PATHS; rates: $RATES; $DURATION each"
for p in $PATHS; do
	attack "$p" 200 "$WARMUP" "$TMP/warmup-$p.csv"
done
mkdir -p "$TMP/results"
# A path that broke down at a rate is not driven harder: an overloaded run
# leaves thousands of connections in TIME_WAIT, which would spoil the runs
# after it on the other paths.
declare -A BROKE=()
n=0
for rate in $RATES; do
	# Alternate the order, so neither path always runs right after the other.
	order=$PATHS
	if ((n % 2 == 1)); then order=$(echo "$PATHS" | tr ' ' '\n' | tac | tr '\n' ' '); fi
	for p in $order; do
		if [[ -n "${BROKE[$p]:-}" ]]; then
			log "$p at $rate req/s: skipped, it broke down at ${BROKE[$p]} req/s"
			continue
		fi
		log "$p at $rate req/s for $DURATION"
		attack "$p" "$rate" "$DURATION" "$TMP/results/$p-$rate.csv"
		if why=$("$TMP/overheadtable" --collapsed "$TMP/results/$p-$rate.csv"); then
			log "$p broke down at $rate req/s ($why); no higher rate on it"
			BROKE[$p]=$rate
			sleep 5
		fi
		sleep 1 # let the ledger flush and the previous connections go idle
	done
	n=$((n + 1))
done

echo "== gateway overhead, non-streaming chat (vegeta open loop, $DURATION per rate and path, $(nproc) cpus shared) =="
"$TMP/overheadtable" --dir "$TMP/results" --rates "$RATES" --paths "$PATHS"

# --- streams -----------------------------------------------------------------
echo
echo "== streams: engine token every $STREAM_TPOT =="
log "streams: $STREAMS at once, $STREAM_TOKENS tokens, $STREAM_DURATION per path"
"$TMP/streamgap" --direct "http://$SIM_STREAM" --gateway "http://$GW" --key "$KEY" --model tailgate-sim-stream \
	--streams "$STREAMS" --tokens "$STREAM_TOKENS" --duration "$STREAM_DURATION" --rounds "$STREAM_ROUNDS"

# --- JSON answers from an engine that takes time per token ------------------
# With the instant engine above, every chunk the gateway reads from the
# engine (it streams from the engine to hedge JSON answers on their first
# token, and assembles them) arrives at once, so all their handling adds to
# the answer's time. Here tokens come STREAM_TPOT apart, as from a GPU: what
# the gateway adds is what a client of a real engine sees.
echo
echo "== JSON answers, engine token every $STREAM_TPOT (${JSON_TOKENS} tokens, $JSON_RATE req/s, $JSON_DURATION) =="
JBODY="$TMP/body-slow.json"
printf '{"model":"tailgate-sim-stream","messages":[{"role":"user","content":"Say hello to the benchmark."}],"max_tokens":%d,"ignore_eos":true}' "$JSON_TOKENS" >"$JBODY"
targets "http://$SIM_STREAM" "$KEY" "$JBODY" "$TMP/targets-direct.txt"
targets "http://$GW" "$KEY" "$JBODY" "$TMP/targets-gateway.txt"
mkdir -p "$TMP/results-json"
for p in direct gateway; do
	log "JSON answers: $p at $JSON_RATE req/s for $JSON_DURATION"
	attack "$p" "$JSON_RATE" "$JSON_DURATION" "$TMP/results-json/$p-$JSON_RATE.csv"
	sleep 1
done
"$TMP/overheadtable" --dir "$TMP/results-json" --rates "$JSON_RATE" --paths "direct gateway" | grep -v -e '^goal' -e '^highest rate' -e '^  direct ' -e '^  gateway '

# The gateway metered what it served.
usage=$(metered "$TMP/tailgate" "$DATA")
echo
echo "metered by the gateway: $usage requests in the ledger for tenant bench"
