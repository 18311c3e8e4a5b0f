# bench-lib.sh — what the bench scripts share. Source it after setting
# BENCH_NAME (the log prefix), TMP (the run's temp dir, with the tailgate
# binary built into it) and VEGETA_MAX_CONNS;
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

# start_sim NAME MODEL TPOT: a simulated engine answering at once (a token
# every TPOT); sets ADDR.
start_sim() {
	"$TMP/tailgate" sim --listen 127.0.0.1:0 --announce --model "$2" --sim-ttft 0 --sim-tpot "$3" \
		--sim-max-seqs 4096 --log-level warn >"$TMP/$1.out" 2>"$TMP/$1.log" &
	PIDS+=($!)
	ADDR=$(wait_for_line "$TMP/$1.out" '^TAILGATE_LISTEN ' | awk '{print $2}') || die "$1 did not start: $(cat "$TMP/$1.log")"
}

# bench_key BIN DATA: prints a new key of tenant bench in DATA, made by BIN,
# with every limit on and far away, so admission does all of its work.
bench_key() {
	local key
	key=$("$1" keys create --data "$2" --tenant bench --rpm 1000000000 --tpm 1000000000000 \
		--max-concurrency 100000 --budget-tokens 1000000000000000 2>/dev/null | tail -n1)
	[[ -n "$key" ]] || die "keys create ($2) printed no key"
	echo "$key"
}

# chat_body FILE: the chat request both benches send to the instant engine.
chat_body() {
	printf '%s' '{"model":"tailgate-sim","messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"Say hello to the benchmark."}],"max_tokens":16,"ignore_eos":true}' >"$1"
}

# targets BASE KEY BODY OUT: a vegeta target file posting BODY to BASE's
# chat completions with KEY.
targets() {
	printf 'POST %s/v1/chat/completions\nContent-Type: application/json\nAuthorization: Bearer %s\n@%s\n' "$1" "$2" "$3" >"$4"
}
