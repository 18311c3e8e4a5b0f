#!/usr/bin/env bash
# bench-streams.sh — what a stream costs on each hop: the engine directly,
# the gateway, a bare Go httputil.ReverseProxy (bench/goproxy) and nginx
# (when installed), in one interleaved run on 127.0.0.1.
#
# A simulated engine answers at once and streams CHUNKS chunks PACE apart.
# bench/streamgap opens STREAMS streams in the same instant on each target
# in turn (ROUNDS rounds, the order alternating), one stream each, held to
# its end, and reads each hop's process tree in /proc: CPU per stream and
# per chunk, and resident memory per open stream the way an operator sizes
# a box — (RSS of the hop's process tree at its highest while STREAMS
# streams are open − its RSS before the first stream) ÷ STREAMS, the idle
# and open sizes printed beside it; the client side gives time to first
# chunk (p50/p99, and added over the engine), the largest gap between
# chunks and stalls (a gap over STALL, or a failed stream). Then the burst: BURST streams of BURST_CHUNKS chunks
# opening at once, whose added time to first chunk is the cost of opening.
# Each table ends with the ratios to the bare Go proxy, ready to paste.
#
# Usage: scripts/bench-streams.sh
# Environment (all optional):
#   STREAMS=500 CHUNKS=100 PACE=50ms ROUNDS=1   the concurrent-streams phase
#   BURST=200 BURST_CHUNKS=20 BURST_ROUNDS=3     the burst phase (BURST=0: none)
#   STALL=1s                                     a gap over this is a stall
#   GATEWAY_BIN=path                             a tailgate binary built already (default: build the working tree)
#   BIN_DIR=dir                                  tailgate, streamgap and goproxy built already in dir (nothing is built)
#   STREAMS_JSON=file                            also write the streams table's figures to file as JSON
#   GATEWAY_ENV=VAR=VALUE,...                    the gateway's process environment (e.g. GODEBUG=gctrace=1,
#                                                whose lines go to $TMP/gateway/gateway.log; with KEEP_TMP=1)
#   NGINX=auto|off GOPROXY=on|off KEEP_TMP=1
#   PROFILE=10s                                  also sample the gateway with perf for this long from the
#                                                start of the streams phase and print its hottest functions
# scripts/bench-ab.sh WORKLOAD=streams compares two builds on the same workload.
set -euo pipefail

STREAMS=${STREAMS:-500}
CHUNKS=${CHUNKS:-100}
PACE=${PACE:-50ms}
ROUNDS=${ROUNDS:-1}
BURST=${BURST:-200}
BURST_CHUNKS=${BURST_CHUNKS:-20}
BURST_ROUNDS=${BURST_ROUNDS:-3}
STALL=${STALL:-1s}
NGINX=${NGINX:-auto}
GOPROXY=${GOPROXY:-on}
PROFILE=${PROFILE:-}

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TMP=$(mktemp -d "${TMPDIR:-/tmp}/tailgate-streams.XXXXXX")
PIDS=()
BENCH_NAME=bench-streams
VEGETA_MAX_CONNS=0 # no vegeta here
# shellcheck source=scripts/bench-lib.sh
source "$ROOT/scripts/bench-lib.sh"

trap stop_all EXIT
trap 'exit 130' INT TERM

command -v curl >/dev/null || die "curl is required"
if [[ -n "${BIN_DIR:-}" ]]; then
	for b in tailgate streamgap goproxy; do
		[[ -x "$BIN_DIR/$b" ]] || die "BIN_DIR=$BIN_DIR has no $b"
		ln -s "$(cd "$BIN_DIR" && pwd)/$b" "$TMP/$b"
	done
	GATEWAY_BIN=${GATEWAY_BIN:-$TMP/tailgate}
else
	log "building tailgate and the bench helpers into $TMP"
	(cd "$ROOT" && go build -o "$TMP/streamgap" ./bench/streamgap && go build -o "$TMP/goproxy" ./bench/goproxy &&
		if [[ -z "${GATEWAY_BIN:-}" ]]; then go build -o "$TMP/tailgate" .; fi)
fi
GW_BIN=${GATEWAY_BIN:-$TMP/tailgate}
[[ -x "$GW_BIN" ]] || die "GATEWAY_BIN=$GW_BIN is not an executable"
[[ -n "${GATEWAY_BIN:-}" && ! -e "$TMP/tailgate" ]] && ln -s "$(cd "$(dirname "$GW_BIN")" && pwd)/$(basename "$GW_BIN")" "$TMP/tailgate"

start_sim sim tailgate-sim "$PACE"
SIM=$ADDR
log "engine: $SIM (first chunk at once, then one every $PACE)"
# Room for every stream from the one loopback address.
# shellcheck disable=SC2046 # flags, one word each
start_gateway gateway "$GW_BIN" "${GATEWAY_ENV:-}" "http://$SIM" tailgate-sim $(many_conns "$GW_BIN")
log "gateway: $GW (pid $GW_PID)"
TARGETS=(--target "direct=http://$SIM" --target "gateway=http://$GW@$GW_PID")
if [[ "$GOPROXY" != off ]]; then
	start_goproxy "http://$SIM"
	TARGETS+=(--target "goproxy=http://$GOPROXY_ADDR@$GOPROXY_PID")
	log "bare Go proxy: $GOPROXY_ADDR (pid $GOPROXY_PID)"
fi
if [[ "$NGINX" != off ]] && start_nginx "$SIM"; then
	TARGETS+=(--target "nginx=http://$NGINX_ADDR@$NGINX_PIDS")
	log "nginx: $NGINX_ADDR (pids ${NGINX_PIDS//+/ })"
fi
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)" || true

if [[ -n "$PROFILE" ]]; then
	# The gateway has no pprof endpoint; perf samples its Go frames (frame
	# pointers are on in Go binaries) as well.
	command -v perf >/dev/null || die "PROFILE needs perf"
	perf record -F 499 -g -p "$GW_PID" -o "$TMP/gateway.perf.data" -- sleep "${PROFILE%s}" 2>"$TMP/perf.log" &
	PERF_PID=$!
fi

log "cpus: $(nproc), load: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== streams: $STREAMS at once, $CHUNKS chunks $PACE apart, $ROUNDS round(s), $(nproc) cpus shared =="
"$TMP/streamgap" "${TARGETS[@]}" --key "$GW_KEY" --model tailgate-sim --streams "$STREAMS" --tokens "$CHUNKS" \
	--rounds "$ROUNDS" --stall "$STALL" ${STREAMS_JSON:+--json "$STREAMS_JSON"}
if ((BURST > 0)); then
	echo
	echo "== burst: $BURST streams opening at once, $BURST_CHUNKS chunks $PACE apart, $BURST_ROUNDS round(s) =="
	"$TMP/streamgap" "${TARGETS[@]}" --key "$GW_KEY" --model tailgate-sim --streams "$BURST" --tokens "$BURST_CHUNKS" \
		--rounds "$BURST_ROUNDS" --stall "$STALL"
fi
if [[ -n "$PROFILE" ]]; then
	wait "$PERF_PID" || true
	perf report -i "$TMP/gateway.perf.data" --no-children -g none --sort symbol --stdio 2>/dev/null | grep -v '^#' | grep '%' | head -n 50 >"$TMP/gateway.perf.txt" || true
	echo
	echo "== where the gateway's CPU went (perf, ${PROFILE} from the first streams round; self time) =="
	cat "$TMP/gateway.perf.txt"
fi
