# bench-lib.sh — what the bench scripts share. Source it after setting
# BENCH_NAME (the log prefix), TMP (the run's temp dir) and VEGETA_MAX_CONNS;
# `trap stop_all EXIT` then stops the processes in PIDS and removes TMP
# (unless KEEP_TMP=1), after calling stop_more if the script defines it.
# shellcheck shell=bash

VEGETA_VERSION=v12.13.0

stop_all() {
	local pid
	for pid in "${PIDS[@]}"; do
		kill "$pid" 2>/dev/null || true
	done
	for pid in "${PIDS[@]}"; do
		wait "$pid" 2>/dev/null || true
	done
	if declare -F stop_more >/dev/null; then
		stop_more
	fi
	if [[ "${KEEP_TMP:-}" == 1 ]]; then
		echo "kept $TMP" >&2
	else
		rm -rf "$TMP"
	fi
}

log() { echo "$BENCH_NAME: $*" >&2; }
die() {
	log "$*"
	exit 1
}

# wait_for_line FILE PATTERN: waits (10 s at most) for a line matching
# PATTERN in FILE and prints it.
wait_for_line() {
	local i line
	for ((i = 0; i < 100; i++)); do
		if line=$(grep -m1 -E "$2" "$1" 2>/dev/null); then
			echo "$line"
			return 0
		fi
		sleep 0.1
	done
	return 1
}

# need_tools: curl, and vegeta in VEGETA (installed with go install when it
# is not on PATH).
need_tools() {
	command -v curl >/dev/null || die "curl is required"
	VEGETA=$(command -v vegeta || true)
	if [[ -z "$VEGETA" ]]; then
		VEGETA="$(go env GOPATH)/bin/vegeta"
		if [[ ! -x "$VEGETA" ]]; then
			log "installing vegeta $VEGETA_VERSION"
			go install "github.com/tsenart/vegeta/v12@$VEGETA_VERSION"
		fi
	fi
}

# attack PATH RATE DURATION OUT.csv: an open-loop vegeta run of the targets in
# $TMP/targets-PATH.txt, its results as CSV in OUT.csv.
attack() {
	"$VEGETA" attack -targets="$TMP/targets-$1.txt" -rate="$2/1s" -duration="$3" -keepalive=true \
		-max-connections="$VEGETA_MAX_CONNS" -timeout=10s -max-body=0 -name="$1-$2" >"$TMP/$1-$2.bin"
	"$VEGETA" encode --to csv "$TMP/$1-$2.bin" >"$4"
	rm -f "$TMP/$1-$2.bin"
}
