#!/usr/bin/env bash
# Routing and hedging benchmarks, each a `tailgate bench --compare` of two
# gateways with their own fleets of simulated workers on 127.0.0.1:
#
#   policy    one replica 3x slower (--sim-ttft): p2c vs round-robin
#   hedge     stall-prone fleet (--sim-stall-prob 0.03 --sim-stall-factor 10)
#             at moderate load: hedging off vs on
#   saturate  the same fleet pushed past its slots: hedging off vs on
#
# Usage: scripts/bench-routing.sh [policy|hedge|saturate ...]   (default: all)
# Env: DURATION (default 40s), RATE (20), SAT_RATE (55), SAT_SEQS (2), TTFT (50ms), KEEP_TMP=1.
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-40s}
RATE=${RATE:-20}
SAT_RATE=${SAT_RATE:-55}
SAT_SEQS=${SAT_SEQS:-2}
TTFT=${TTFT:-50ms}
TTFT_MS=${TTFT%ms}
SCENARIOS=("$@")
[ ${#SCENARIOS[@]} -eq 0 ] && SCENARIOS=(policy hedge saturate)

TMP=$(mktemp -d)
BIN="$TMP/tailgate"
PIDS=()
cleanup() {
	for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
	sleep 1
	for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
	if [ "${KEEP_TMP:-}" = 1 ]; then echo "kept $TMP" >&2; else rm -rf "$TMP"; fi
}
trap cleanup EXIT INT TERM

echo "bench-routing: building" >&2
go build -o "$BIN" .

# fleet NAME "GATEWAY FLAGS" "WORKER FLAGS 1" "WORKER FLAGS 2" ... — starts a
# gateway and one worker per flag set (worker i seeded i, so replicas stall
# independently); sets ${NAME}_API, ${NAME}_ADMIN, ${NAME}_DIR.
fleet() {
	local name=$1 gwflags=$2
	shift 2
	local dir="$TMP/$name"
	mkdir -p "$dir"
	# shellcheck disable=SC2086
	"$BIN" gateway --data "$dir" --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 $gwflags \
		>"$dir/gateway.out" 2>"$dir/gateway.log" &
	PIDS+=($!)
	local line=""
	for _ in $(seq 100); do
		line=$(grep -m1 'API http' "$dir/gateway.out" 2>/dev/null || true)
		[ -n "$line" ] && break
		sleep 0.1
	done
	[ -n "$line" ] || { echo "gateway $name did not start:"; cat "$dir/gateway.log"; exit 1; }
	local api admin
	api=$(sed -E 's/.*API (http[^ ]+).*/\1/' <<<"$line")
	admin=$(sed -E 's/.*admin (http[^ ]+)\/ui\/.*/\1/' <<<"$line")
	local i=0
	for wflags in "$@"; do
		i=$((i + 1))
		# shellcheck disable=SC2086
		"$BIN" worker --gateway "$admin" --cluster-token-file "$dir/cluster.token" --engine sim \
			--listen 127.0.0.1:0 --replica-id "$name-$i" --data "$dir/w$i" --warmup 1 --sim-seed "$i" $wflags \
			2>"$dir/worker-$i.log" &
		PIDS+=($!)
	done
	"$BIN" keys create --data "$dir" --tenant bench 2>/dev/null | tail -1 >"$dir/key"
	local ready=0
	for _ in $(seq 300); do
		ready=$(curl -s -H "Authorization: Bearer $(cat "$dir/admin.token")" "$admin/admin/v1/replicas" |
			grep -o '"state":"ready"' | wc -l || true)
		[ "$ready" -ge "$i" ] && break
		sleep 0.1
	done
	[ "$ready" -ge "$i" ] || { echo "fleet $name: only $ready of $i replicas ready"; exit 1; }
	printf -v "${name}_API" '%s' "$api"
	printf -v "${name}_ADMIN" '%s' "$admin"
	printf -v "${name}_DIR" '%s' "$dir"
}

# metric ADMIN DIR NAME FILTER — sum of a counter's series matching FILTER.
metric() {
	curl -s -H "Authorization: Bearer $(cat "$2/admin.token")" "$1/metrics" |
		{ grep "^$3" || true; } | { grep -- "$4" || true; } | awk '{s += $2} END {printf "%d", s}'
}

# attempts NAME — "requests, attempts, hedges, extra%" of a fleet's gateway.
attempts() {
	local api_admin_var="${1}_ADMIN" dir_var="${1}_DIR"
	local admin=${!api_admin_var} dir=${!dir_var}
	local req att hedge
	req=$(metric "$admin" "$dir" tailgate_requests_total 'code="200"')
	att=$(metric "$admin" "$dir" tailgate_upstream_attempts_total 'reason=')
	hedge=$(metric "$admin" "$dir" tailgate_upstream_attempts_total 'reason="hedge"')
	awk -v n="$1" -v r="$req" -v a="$att" -v h="$hedge" 'BEGIN {
		printf "  %-10s %6d requests answered, %6d upstream attempts, %5d hedges: %.2f%% extra upstream requests\n",
			n, r, a, h, (r > 0 ? 100 * (a - r) / r : 0) }'
}

compare() { # compare A B RATE PHASES title
	local a=$1 b=$2 rate=$3 title=$4
	local aapi="${a}_API" bapi="${b}_API" aadm="${a}_ADMIN" badm="${b}_ADMIN" adir="${a}_DIR" bdir="${b}_DIR"
	echo
	echo "=== $title ==="
	"$BIN" bench --quiet --target "${!aapi}" --key-file "${!adir}/key" --admin "${!aadm}" \
		--admin-token-file "${!adir}/admin.token" --label "$a" \
		--compare --target-b "${!bapi}" --key-file-b "${!bdir}/key" --admin-b "${!badm}" \
		--admin-token-file-b "${!bdir}/admin.token" --label-b "$b" \
		--rate "$rate" --phases "steady:$DURATION" --seed 7 --stream-fraction 1 \
		--prompt-tokens lognormal:128:0.5 --output-tokens 16
	echo "upstream attempts (from each gateway's /metrics):"
	attempts "$a"
	attempts "$b"
}

slow=$((TTFT_MS * 3))ms
for s in "${SCENARIOS[@]}"; do
	case $s in
	policy)
		w="--sim-ttft $TTFT --sim-tpot 2ms"
		ws="--sim-ttft $slow --sim-tpot 2ms"
		fleet rr "--policy round-robin --hedge=false" "$w" "$w" "$ws"
		fleet p2c "--policy p2c --hedge=false" "$w" "$w" "$ws"
		compare rr p2c "$RATE" "one replica 3x slower (sim-ttft $slow vs $TTFT), $RATE req/s: round-robin (A) vs power of two choices (B)"
		;;
	hedge | saturate)
		w="--sim-ttft $TTFT --sim-tpot 2ms --sim-stall-prob 0.03 --sim-stall-factor 10"
		rate=$RATE
		if [ "$s" = saturate ]; then
			w="$w --sim-max-seqs $SAT_SEQS"
			rate=$SAT_RATE
		fi
		fleet "${s}_off" "--hedge=false" "$w" "$w" "$w"
		fleet "${s}_on" "--hedge" "$w" "$w" "$w"
		compare "${s}_off" "${s}_on" "$rate" "stall-prone fleet (stall prob 0.03 x10)$([ "$s" = saturate ] && echo ", $SAT_SEQS slots per replica (saturated)"), $rate req/s: hedging off (A) vs on (B)"
		;;
	*)
		echo "unknown scenario $s (want policy, hedge or saturate)" >&2
		exit 2
		;;
	esac
done
