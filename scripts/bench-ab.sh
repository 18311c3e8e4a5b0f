#!/usr/bin/env bash
# bench-ab.sh — two or more builds (or settings) of the gateway, side by side
# in one run: what each adds over calling the engine directly, round by round.
#
# Runs of one build minutes apart differ on a shared machine by more than
# most changes are worth (bench-overhead.sh's added p50 at 1000 req/s moved
# between 0.30 and 0.45 ms on one machine in one hour). Here every round runs
# the engine directly and then each gateway for DURATION at RATE, in
# alternating order, so a round's differences are measured under the same
# conditions; the medians over the rounds are the result. Each gateway's (and
# the bare Go proxy's) CPU per request is read from /proc over its runs.
#
# Usage: scripts/bench-ab.sh NAME=REV[:VAR=VALUE,...] NAME=REV[:VAR=VALUE,...] ...
#   REV   a git revision (built from a temporary worktree), . for the working tree, or
#         the path of a tailgate binary built already
#   VAR   environment of that gateway's process (GOMAXPROCS=1, GOGC=400, ...)
# e.g.  scripts/bench-ab.sh base=HEAD~1 new=.
#       scripts/bench-ab.sh two-procs=. one-proc=.:GOMAXPROCS=1
# Environment (all optional):
#   RATE=1000 DURATION=4s ROUNDS=10 WARMUP=2s VEGETA_MAX_CONNS=512 KEEP_TMP=1
#   GOPROXY=off|on   also a bare Go httputil.ReverseProxy hop (bench/goproxy), row goproxy
#   WORKLOAD=json|streams   json: vegeta at RATE as above; streams: the workload of
#     scripts/bench-streams.sh (STREAMS=500 CHUNKS=100 PACE=50ms, then BURST=200
#     BURST_CHUNKS=20; ROUNDS rounds each), CPU and memory per stream of each build
#     from /proc, the ratios against the bare Go proxy (GOPROXY is on) at the end
# Everything listens on 127.0.0.1; one simulated engine (the working tree's
# build) answers at once, as in bench-overhead.sh. Needs go, git and curl;
# vegeta is installed with `go install` when it is not on PATH.
set -euo pipefail

RATE=${RATE:-1000}
DURATION=${DURATION:-4s}
ROUNDS=${ROUNDS:-10}
WARMUP=${WARMUP:-2s}
VEGETA_MAX_CONNS=${VEGETA_MAX_CONNS:-512}
GOPROXY=${GOPROXY:-off}
WORKLOAD=${WORKLOAD:-json}
STREAMS=${STREAMS:-500}
CHUNKS=${CHUNKS:-100}
PACE=${PACE:-50ms}
BURST=${BURST:-200}
BURST_CHUNKS=${BURST_CHUNKS:-20}

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BENCH_NAME=bench-ab
# shellcheck source=scripts/bench-lib.sh
source "$ROOT/scripts/bench-lib.sh"

usage() {
	sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//' >&2
	exit 2
}
(($# >= 2)) || usage
declare -A REVS=() ENVS=()
NAMES=()
for arg in "$@"; do
	[[ "$arg" =~ ^([A-Za-z][A-Za-z0-9_-]*)=([^:]+)(:(.*))?$ ]] || die "bad variant '$arg': want NAME=REV[:VAR=VALUE,...]"
	name=${BASH_REMATCH[1]}
	[[ "$name" != direct && -z "${REVS[$name]:-}" ]] || die "variant name '$name' is taken"
	REVS[$name]=${BASH_REMATCH[2]}
	ENVS[$name]=${BASH_REMATCH[4]:-}
	for kv in ${ENVS[$name]//,/ }; do
		[[ "$kv" =~ ^[A-Za-z_][A-Za-z0-9_]*=.*$ ]] || die "variant '$name': bad environment entry '$kv' (want VAR=VALUE)"
	done
	if [[ "${REVS[$name]}" != . && ! ( -f "${REVS[$name]}" && -x "${REVS[$name]}" ) ]]; then
		git -C "$ROOT" rev-parse --verify --quiet "${REVS[$name]}^{commit}" >/dev/null ||
			die "variant '$name': '${REVS[$name]}' is neither a git revision here nor a tailgate binary"
	fi
	NAMES+=("$name")
done
[[ "$ROUNDS" =~ ^[1-9][0-9]*$ ]] || die "ROUNDS=$ROUNDS: want a positive number"
[[ "$RATE" =~ ^[1-9][0-9]*$ ]] || die "RATE=$RATE: want requests per second"
[[ "$WORKLOAD" == json || "$WORKLOAD" == streams ]] || die "WORKLOAD=$WORKLOAD: want json or streams"
if [[ "$WORKLOAD" == streams ]]; then GOPROXY=on; fi

TMP=$(mktemp -d "${TMPDIR:-/tmp}/tailgate-ab.XXXXXX")
PIDS=()
WORKTREES=()
# The worktrees of the revisions built, removed when the run ends.
stop_more() {
	local wt
	for wt in "${WORKTREES[@]}"; do
		git -C "$ROOT" worktree remove --force "$wt" 2>/dev/null || true
	done
}
trap stop_all EXIT
trap 'exit 130' INT TERM

need_tools

# --- builds ------------------------------------------------------------------
log "building the working tree (engine, table) into $TMP"
(cd "$ROOT" && go build -o "$TMP/tailgate" . && go build -o "$TMP/overheadtable" ./bench/overheadtable &&
	go build -o "$TMP/goproxy" ./bench/goproxy && go build -o "$TMP/streamgap" ./bench/streamgap)
declare -A BIN=()
for name in "${NAMES[@]}"; do
	rev=${REVS[$name]}
	if [[ "$rev" == . ]]; then
		BIN[$name]=$TMP/tailgate
		continue
	fi
	if [[ -f "$rev" && -x "$rev" ]]; then
		BIN[$name]=$(cd "$(dirname "$rev")" && pwd)/$(basename "$rev")
		continue
	fi
	commit=$(git -C "$ROOT" rev-parse --short "$rev^{commit}")
	if [[ -x "$TMP/tailgate-$commit" ]]; then
		BIN[$name]=$TMP/tailgate-$commit
		continue
	fi
	log "building $name: $rev ($commit) from a temporary worktree"
	git -C "$ROOT" worktree add --detach --quiet "$TMP/src-$commit" "$commit"
	WORKTREES+=("$TMP/src-$commit")
	(cd "$TMP/src-$commit" && go build -o "$TMP/tailgate-$commit" .) || die "$name: $rev does not build"
	BIN[$name]=$TMP/tailgate-$commit
done

# --- engine and gateways -----------------------------------------------------
if [[ "$WORKLOAD" == streams ]]; then
	start_sim sim tailgate-sim "$PACE"
else
	start_sim sim tailgate-sim 0
fi
SIM=$ADDR
declare -A BASE=([direct]="http://$SIM") KEYS=([direct]=none) PID=()
for name in "${NAMES[@]}"; do
	flags=()
	# shellcheck disable=SC2207 # flags, one word each
	if [[ "$WORKLOAD" == streams ]]; then flags=($(many_conns "${BIN[$name]}")); fi
	start_gateway "$name" "${BIN[$name]}" "${ENVS[$name]}" "http://$SIM" tailgate-sim "${flags[@]}"
	BASE[$name]="http://$GW"
	KEYS[$name]=$GW_KEY
	PID[$name]=$GW_PID
	log "$name: ${REVS[$name]}${ENVS[$name]:+ with ${ENVS[$name]}} at $GW"
done
EXTRA=()
if [[ "$GOPROXY" == on ]]; then
	start_goproxy "http://$SIM"
	BASE[goproxy]="http://$GOPROXY_ADDR"
	KEYS[goproxy]=none
	PID[goproxy]=$GOPROXY_PID
	EXTRA=(goproxy)
	log "goproxy: a bare Go hop at $GOPROXY_ADDR"
fi

describe() {
	local name rev desc
	for name in "${NAMES[@]}"; do
		rev=${REVS[$name]}
		if [[ "$rev" == . ]]; then
			desc="the working tree (on $(git -C "$ROOT" rev-parse --short HEAD))"
		elif [[ -f "$rev" && -x "$rev" ]]; then
			desc="$rev (a binary: $("${BIN[$name]}" version 2>/dev/null | head -n1 || echo "no version command"))"
		else
			desc="$rev ($(git -C "$ROOT" rev-parse --short "$rev^{commit}"))"
		fi
		echo "$name: $desc${ENVS[$name]:+ with ${ENVS[$name]}}"
	done
}

if [[ "$WORKLOAD" == streams ]]; then
	ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)" || true
	targets=(--target "direct=http://$SIM")
	for name in "${NAMES[@]}" goproxy; do
		targets+=(--target "$name=${BASE[$name]}@${PID[$name]}" --target-key "$name=${KEYS[$name]}")
	done
	echo "== gateway builds side by side on streams: $STREAMS at once, $CHUNKS chunks $PACE apart, $ROUNDS round(s), $(nproc) cpus shared =="
	describe
	"$TMP/streamgap" "${targets[@]}" --model tailgate-sim --streams "$STREAMS" \
		--tokens "$CHUNKS" --rounds "$ROUNDS"
	if ((BURST > 0)); then
		echo
		echo "== burst: $BURST streams opening at once, $BURST_CHUNKS chunks $PACE apart, $ROUNDS round(s) =="
		"$TMP/streamgap" "${targets[@]}" --model tailgate-sim --streams "$BURST" \
			--tokens "$BURST_CHUNKS" --rounds "$ROUNDS"
	fi
	exit 0
fi

# --- rounds ------------------------------------------------------------------
PATHS=(direct "${NAMES[@]}" "${EXTRA[@]}")
chat_body "$TMP/body.json"
for p in "${PATHS[@]}"; do
	targets "${BASE[$p]}" "${KEYS[$p]}" "$TMP/body.json" "$TMP/targets-$p.txt"
done
for p in "${PATHS[@]}"; do
	attack "$p" 200 "$WARMUP" "$TMP/warmup-$p.csv"
done
mkdir -p "$TMP/results"
log "cpus: $(nproc), load: $(cut -d' ' -f1-3 /proc/loadavg); $ROUNDS rounds of ${PATHS[*]} at $RATE req/s, $DURATION each"
for ((k = 1; k <= ROUNDS; k++)); do
	order=("${PATHS[@]}")
	if ((k % 2 == 0)); then
		mapfile -t order < <(printf '%s\n' "${PATHS[@]}" | tac)
	fi
	for p in "${order[@]}"; do
		t0=$([[ -n "${PID[$p]:-}" ]] && tree_ticks "${PID[$p]}" || echo 0)
		attack "$p" "$RATE" "$DURATION" "$TMP/results/$p-r$k.csv"
		sleep 1 # let the ledger flush and the connections go idle
		if [[ -n "${PID[$p]:-}" ]]; then
			echo "$p $k $(($(tree_ticks "${PID[$p]}") - t0)) $(wc -l <"$TMP/results/$p-r$k.csv")" >>"$TMP/cpu.txt"
		fi
	done
	log "round $k/$ROUNDS done"
done

echo "== gateway builds side by side: $RATE req/s, $ROUNDS rounds of $DURATION per path, $(nproc) cpus shared =="
describe
"$TMP/overheadtable" --dir "$TMP/results" --paths "${PATHS[*]}" --rounds "$ROUNDS"
echo
echo "CPU per request, µs (user+system of the hop's process tree over its run and the second after it, /proc/PID/stat):"
awk -v hz="$(getconf CLK_TCK)" -v paths="${NAMES[*]} ${EXTRA[*]}" '
	{ us[$1, $2] = $3 * 1e6 / hz / $4; n[$1]++ }
	function median(p,   i, j, t, v, m) {
		m = n[p]
		for (i = 1; i <= m; i++) v[i] = us[p, i]
		for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++) if (v[j] < v[i]) { t = v[i]; v[i] = v[j]; v[j] = t }
		return m % 2 ? v[(m + 1) / 2] : (v[m / 2] + v[m / 2 + 1]) / 2
	}
	END {
		np = split(paths, ps, " ")
		for (i = 1; i <= np; i++) {
			p = ps[i]; line = sprintf("  %-12s", p)
			for (k = 1; k <= n[p]; k++) line = line sprintf(" %7.0f", us[p, k])
			med[p] = median(p)
			line = line sprintf("   median %5.0f", med[p])
			if ("goproxy" in n && n["goproxy"] > 0 && p != "goproxy") line = line sprintf("   %.2fx goproxy", med[p] / median("goproxy"))
			print line
		}
	}' "$TMP/cpu.txt"
