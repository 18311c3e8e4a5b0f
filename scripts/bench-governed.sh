#!/usr/bin/env bash
# bench-governed.sh — the field's gateway measurements, taken locally: what
# tailgate costs with every guarantee on ("governed": a key with rpm, tpm
# and a token budget, admission and the ledger on) beside a bare Go
# httputil.ReverseProxy (bench/goproxy) and nginx (Debian's; when installed),
# all in front of the same simulated engine, in one interleaved run.
#
# The method is GetBusbar/benchmarking's (README.md, "What it measures" and
# "Methodology"; engine/src/procsample.rs): an instant engine, so what a hop
# adds stands out; added latency = the hop's percentile − the engine's own
# at concurrency 1; the throughput frontier = the most requests a second a
# hop answered, every one of them, while its p99 stayed under a bound, read
# off one closed-loop concurrency sweep (bounds 1 ms, 5 ms, 20 ms here); CPU
# a request = the user+system time of the hop's process tree (the process
# and its children, /proc/PID/stat) over a run ÷ the run's requests; a large
# prompt point; memory per open stream from the resident set, as an
# operator sizes a box. Differences from Busbar's rig: one machine, nothing
# pinned (the load generator shares the cores: every hop pays that alike),
# vegeta as the load generator, and an open-loop point at RATE req/s for the
# latency and CPU the issue notes compare.
#
# Every phase runs the paths in turn, the order alternating, so drift on a
# shared machine hits all of them alike; every loop is bounded in count and
# time (a path whose p99 passed the largest bound at a rung runs no higher
# rung; the sweep stops when MAX_SECONDS have passed since the start).
#
# Phases, in order:
#   streams  scripts/bench-streams.sh (BURST=0) on fresh processes in front of
#            an engine streaming CHUNKS chunks PACE apart: STREAMS streams
#            open at once per hop; RSS per stream = (open − idle RSS) ÷ STREAMS
#   c1       ROUNDS rounds of C1_DURATION at concurrency 1 per path
#   rate     ROUNDS rounds of RATE_DURATION open loop at RATE req/s per path
#   big      ROUNDS rounds of BIG_DURATION at concurrency 1 with a BIG_BYTES prompt
#   sweep    closed loop at each concurrency in SWEEP for SWEEP_DURATION per path
#
# Usage: scripts/bench-governed.sh            # full: about 6–8 minutes after the builds
#        QUICK=1 scripts/bench-governed.sh    # a smoke: under 2 minutes after the builds
# Environment (all optional; QUICK=1 changes the defaults marked *):
#   ROUNDS=3* C1_DURATION=5s* RATE=1000 RATE_DURATION=5s* BIG_BYTES=262144 BIG_DURATION=4s*
#   SWEEP="1 2 4 8 16 32 64 128"* SWEEP_DURATION=4s* MAX_SECONDS=600*
#   STREAMS=500* CHUNKS=100* PACE=50ms STREAM_ROUNDS=1 WARMUP=2s VEGETA_MAX_CONNS=512
#   GATEWAY_BIN=path   a tailgate binary built already (default: build the working tree)
#   NGINX=auto|off     RESULT=path prefix of the result files (default ./bench-governed-UTCSTAMP)
#   KEEP_TMP=1
# Writes RESULT.md (the report: the table, the ratios to the bare Go proxy, the
# sweep) and RESULT.json (every figure), and prints the report.
# Needs go, curl; vegeta is installed with `go install` when it is not on PATH;
# nginx: apt-get install nginx-light.
set -euo pipefail

# The command as run: the knobs set in the environment, then the script.
CMD=
for v in QUICK ROUNDS C1_DURATION RATE RATE_DURATION BIG_BYTES BIG_DURATION SWEEP SWEEP_DURATION MAX_SECONDS STREAMS CHUNKS PACE STREAM_ROUNDS GATEWAY_BIN NGINX; do
	if [[ "${!v:-}" == *" "* ]]; then CMD+="$v=\"${!v}\" "; elif [[ -n "${!v:-}" ]]; then CMD+="$v=${!v} "; fi
done
CMD+=scripts/bench-governed.sh

QUICK=${QUICK:-}
if [[ "$QUICK" == 1 ]]; then
	ROUNDS=${ROUNDS:-1} C1_DURATION=${C1_DURATION:-3s} RATE_DURATION=${RATE_DURATION:-3s}
	BIG_DURATION=${BIG_DURATION:-2s} SWEEP=${SWEEP:-"2 8 32"} SWEEP_DURATION=${SWEEP_DURATION:-2s}
	MAX_SECONDS=${MAX_SECONDS:-150} STREAMS=${STREAMS:-100} CHUNKS=${CHUNKS:-20} WARMUP=${WARMUP:-1s}
fi
ROUNDS=${ROUNDS:-3}
C1_DURATION=${C1_DURATION:-5s}
RATE=${RATE:-1000}
RATE_DURATION=${RATE_DURATION:-5s}
BIG_BYTES=${BIG_BYTES:-262144}
BIG_DURATION=${BIG_DURATION:-4s}
SWEEP=${SWEEP:-"1 2 4 8 16 32 64 128"}
SWEEP_DURATION=${SWEEP_DURATION:-4s}
MAX_SECONDS=${MAX_SECONDS:-600}
STREAMS=${STREAMS:-500}
CHUNKS=${CHUNKS:-100}
PACE=${PACE:-50ms}
STREAM_ROUNDS=${STREAM_ROUNDS:-1}
WARMUP=${WARMUP:-2s}
VEGETA_MAX_CONNS=${VEGETA_MAX_CONNS:-512}
NGINX=${NGINX:-auto}
RESULT=${RESULT:-./bench-governed-$(date -u +%Y%m%dT%H%M%SZ)}
# The largest frontier bound: a path past it at a rung runs no higher rung.
STOP_P99=20ms

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TMP=$(mktemp -d "${TMPDIR:-/tmp}/tailgate-governed.XXXXXX")
PIDS=()
BENCH_NAME=bench-governed
# shellcheck source=scripts/bench-lib.sh
source "$ROOT/scripts/bench-lib.sh"

trap stop_all EXIT
trap 'exit 130' INT TERM

for v in ROUNDS RATE BIG_BYTES MAX_SECONDS STREAMS CHUNKS STREAM_ROUNDS; do
	[[ "${!v}" =~ ^[1-9][0-9]*$ ]] || die "$v=${!v}: want a positive number"
done
for c in $SWEEP; do [[ "$c" =~ ^[1-9][0-9]*$ ]] || die "SWEEP=\"$SWEEP\": want concurrencies like \"1 2 4\""; done

# --- tools -------------------------------------------------------------------
need_tools
log "building tailgate and the bench helpers into $TMP"
(cd "$ROOT" && go build -o "$TMP/streamgap" ./bench/streamgap && go build -o "$TMP/overheadtable" ./bench/overheadtable &&
	go build -o "$TMP/goproxy" ./bench/goproxy && if [[ -z "${GATEWAY_BIN:-}" ]]; then go build -o "$TMP/tailgate" .; fi)
if [[ -n "${GATEWAY_BIN:-}" ]]; then
	[[ -x "$GATEWAY_BIN" ]] || die "GATEWAY_BIN=$GATEWAY_BIN is not an executable"
	ln -s "$(cd "$(dirname "$GATEWAY_BIN")" && pwd)/$(basename "$GATEWAY_BIN")" "$TMP/tailgate"
fi
RES="$TMP/results"
mkdir -p "$RES/c1" "$RES/rate" "$RES/big" "$RES/sweep"
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
START=$SECONDS

# --- streams: memory and CPU per open stream, on fresh processes -------------
# First, and on processes of their own: a Go process keeps the heap it grew
# to, so a hop that served the sweep first would hold the streams in memory
# it already has (Busbar starts each memory cell cold too).
log "streams: $STREAMS at once per hop, $CHUNKS chunks $PACE apart (scripts/bench-streams.sh)"
BIN_DIR=$TMP STREAMS_JSON="$RES/streams.json" STREAMS=$STREAMS CHUNKS=$CHUNKS PACE=$PACE ROUNDS=$STREAM_ROUNDS BURST=0 NGINX=$NGINX \
	GOPROXY=on bash "$ROOT/scripts/bench-streams.sh" >"$RES/streams.txt" || die "the streams phase failed"

# --- engine and hops -----------------------------------------------------------
# The large prompt is ⌈BIG_BYTES/4⌉ tokens to the simulated engine's tokenizer:
# its context length is raised to hold it, as --max-model-len would.
start_sim sim tailgate-sim 0 --sim-max-model-len $((BIG_BYTES / 4 + 4096))
SIM=$ADDR
log "engine: $SIM (answers at once)"
start_gateway governed "$TMP/tailgate" "" "http://$SIM" tailgate-sim
KEY=$GW_KEY
declare -A BASE=([direct]="http://$SIM" [tailgate]="http://$GW") PID=([tailgate]=$GW_PID)
log "tailgate: $GW (pid $GW_PID; key with rpm, tpm, concurrency and token budget; ledger in SQLite)"
start_goproxy "http://$SIM"
BASE[goproxy]="http://$GOPROXY_ADDR"
PID[goproxy]=$GOPROXY_PID
PATHS=(direct tailgate goproxy)
if [[ "$NGINX" != off ]] && start_nginx "$SIM"; then
	BASE[nginx]="http://$NGINX_ADDR"
	PID[nginx]=${NGINX_PIDS%%+*} # the master: tree_ticks adds its workers
	PATHS+=(nginx)
fi
log "hops: ${PATHS[*]}"

chat_body "$TMP/body.json"
# The large prompt: the chat body with BIG_BYTES of text as the user's message.
BIG_TEXT=$(head -c "$BIG_BYTES" < <(yes 'The quick brown fox jumps over the lazy dog while the gateway meters every token.' | tr '\n' ' '))
printf '{"model":"tailgate-sim","messages":[{"role":"user","content":"%s"}],"max_tokens":16,"ignore_eos":true}' "$BIG_TEXT" >"$TMP/big.json"
unset BIG_TEXT
for p in "${PATHS[@]}"; do
	targets "${BASE[$p]}" "$KEY" "$TMP/body.json" "$TMP/targets-$p.txt"
	targets "${BASE[$p]}" "$KEY" "$TMP/big.json" "$TMP/targets-big-$p.txt"
done

# order K: the paths, reversed on even K.
order() {
	if (($1 % 2 == 0)); then printf '%s\n' "${PATHS[@]}" | tac; else printf '%s\n' "${PATHS[@]}"; fi
}

# run PHASE PATH RUN TARGETS RATE DURATION [VEGETA FLAG...]: one vegeta run into
# $RES/PHASE/PATH-RUN.csv, with the CPU of the path's process tree over it
# and the second after it (the ledger's flush) in $RES/cpu.txt.
run() {
	local phase=$1 p=$2 k=$3 tg=$4 rate=$5 dur=$6 t0=0
	shift 6
	[[ -n "${PID[$p]:-}" ]] && t0=$(tree_ticks "${PID[$p]}")
	attack "$tg" "$rate" "$dur" "$RES/$phase/$p-$k.csv" "$@"
	sleep 1
	if [[ -n "${PID[$p]:-}" ]]; then echo "$phase $p $k $(($(tree_ticks "${PID[$p]}") - t0))" >>"$RES/cpu.txt"; fi
}

CLOSED=(-workers=1 -max-workers=1)
for p in "${PATHS[@]}"; do
	attack "$p" 200 "$WARMUP" "$TMP/warmup-$p.csv"
	attack "big-$p" 0 1s "$TMP/warmup-big-$p.csv" "${CLOSED[@]}"
done

log "cpus: $(nproc), load: $(cut -d' ' -f1-3 /proc/loadavg)"
for ((k = 1; k <= ROUNDS; k++)); do
	for p in $(order "$k"); do run c1 "$p" "r$k" "$p" 0 "$C1_DURATION" "${CLOSED[@]}"; done
	log "concurrency 1: round $k/$ROUNDS done"
done
for ((k = 1; k <= ROUNDS; k++)); do
	for p in $(order "$k"); do run rate "$p" "r$k" "$p" "$RATE" "$RATE_DURATION"; done
	log "$RATE req/s: round $k/$ROUNDS done"
done
for ((k = 1; k <= ROUNDS; k++)); do
	for p in $(order "$k"); do run big "$p" "r$k" "big-$p" 0 "$BIG_DURATION" "${CLOSED[@]}"; done
	log "$((BIG_BYTES >> 10)) KB prompt: round $k/$ROUNDS done"
done

declare -A DONE=()
n=0
for c in $SWEEP; do
	if ((SECONDS - START > MAX_SECONDS)); then
		log "sweep: MAX_SECONDS=$MAX_SECONDS passed; no rung from c=$c on"
		break
	fi
	n=$((n + 1))
	for p in $(order "$n"); do
		if [[ -n "${DONE[$p]:-}" ]]; then continue; fi
		run sweep "$p" "c$c" "$p" 0 "$SWEEP_DURATION" -workers="$c" -max-workers="$c"
		if why=$("$TMP/overheadtable" --collapse-p99 "$STOP_P99" --collapsed "$RES/sweep/$p-c$c.csv"); then
			log "sweep: $p past the largest bound at c=$c ($why); no higher rung on it"
			DONE[$p]=$c
		fi
	done
	log "sweep: c=$c done"
done
log "measured in $((SECONDS - START)) s"

usage=$(metered "$TMP/tailgate" "$TMP/governed/data")
log "the gateway metered $usage requests into its ledger"

# --- report ----------------------------------------------------------------------
sweep_json=$(printf '%s,' $SWEEP)
paths_json=$(printf '"%s",' "${PATHS[@]}")
cat >"$RES/meta.json" <<JSON
{"command": $(printf '%s' "$CMD" | sed 's/\\/\\\\/g; s/"/\\"/g; s/^/"/; s/$/"/'),
 "started": "$(date -u +%Y-%m-%dT%H:%MZ)", "commit": "$(git -C "$ROOT" rev-parse --short HEAD)$(git -C "$ROOT" diff --quiet HEAD -- . 2>/dev/null || echo +changes)",
 "cpus": $(nproc), "load_before": "$LOAD_BEFORE", "paths": [${paths_json%,}], "rounds": $ROUNDS, "rate": $RATE,
 "sweep_concurrency": [${sweep_json%,}], "big_prompt_bytes": $BIG_BYTES, "quick": $([[ "$QUICK" == 1 ]] && echo true || echo false),
 "durations": {"C1": "$C1_DURATION", "Rate": "$RATE_DURATION", "Big": "$BIG_DURATION", "Sweep": "$SWEEP_DURATION"},
 "clk_tck": $(getconf CLK_TCK)}
JSON
"$TMP/overheadtable" --governed "$RES"
cp "$RES/report.md" "$RESULT.md"
cp "$RES/report.json" "$RESULT.json"
echo
echo "streams phase (scripts/bench-streams.sh):"
cat "$RES/streams.txt"
log "wrote $RESULT.md and $RESULT.json (the gateway metered $usage requests)"
