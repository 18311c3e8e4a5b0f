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
			# GOPROXY=on|off is bench-ab.sh's switch for the bare Go hop, not
			# a module proxy: go install must not read it as one.
			case "${GOPROXY:-}" in
			on | off) env -u GOPROXY go install "github.com/tsenart/vegeta/v12@$VEGETA_VERSION" ;;
			*) go install "github.com/tsenart/vegeta/v12@$VEGETA_VERSION" ;;
			esac
		fi
	fi
}

# attack PATH RATE DURATION OUT.csv [FLAG...]: an open-loop vegeta run of the
# targets in $TMP/targets-PATH.txt, its results as CSV in OUT.csv. FLAGs go
# to vegeta attack: RATE 0 with -workers=C -max-workers=C is a closed loop of
# C clients, each sending its next request when its answer is in.
attack() {
	local path=$1 rate=$2 duration=$3 out=$4
	shift 4
	"$VEGETA" attack -targets="$TMP/targets-$path.txt" -rate="$rate/1s" -duration="$duration" -keepalive=true \
		-max-connections="$VEGETA_MAX_CONNS" -timeout=10s -max-body=0 -name="$path-$rate" "$@" >"$TMP/$path-$rate.bin"
	"$VEGETA" encode --to csv "$TMP/$path-$rate.bin" >"$out"
	rm -f "$TMP/$path-$rate.bin"
}

# start_sim NAME MODEL TPOT [FLAG...]: a simulated engine answering at once
# (no time to first token, prefill free) and then a token every TPOT, with
# the sim FLAGs given; sets ADDR and SIM_PID.
start_sim() {
	local name=$1 model=$2 tpot=$3
	shift 3
	"$TMP/tailgate" sim --listen 127.0.0.1:0 --announce --model "$model" --sim-ttft 0 --sim-tpot "$tpot" \
		--sim-prefill-per-token 0 --sim-max-seqs 4096 --log-level warn "$@" >"$TMP/$name.out" 2>"$TMP/$name.log" &
	SIM_PID=$!
	PIDS+=("$SIM_PID")
	ADDR=$(wait_for_line "$TMP/$name.out" '^TAILGATE_LISTEN ' | awk '{print $2}') || die "$name did not start: $(cat "$TMP/$name.log")"
}

# tree_pids PID: PID and its descendants, one a line.
tree_pids() {
	local c
	echo "$1"
	for c in $(pgrep -P "$1" 2>/dev/null); do tree_pids "$c"; done
}

# tree_ticks PID: the user+system CPU used so far by PID and its living
# descendants (/proc/N/stat fields 14 and 15, in clock ticks of
# `getconf CLK_TCK`), as a gateway that forks workers (nginx) spends it.
tree_ticks() {
	local p t=0 v
	for p in $(tree_pids "$1"); do
		# Fields counted after the ")" that ends the command name.
		v=$(sed -E 's/.*\) //' "/proc/$p/stat" 2>/dev/null | awk '{print $12 + $13}') || v=0
		t=$((t + ${v:-0}))
	done
	echo "$t"
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

# metered BIN DATA: the requests the ledger in DATA holds for tenant bench
# (the REQUESTS column of `BIN usage`).
metered() {
	"$1" usage --data "$2" --tenant bench 2>/dev/null |
		awk 'NR == 1 { for (i = 1; i <= NF; i++) if ($i == "REQUESTS") c = i; next } c { n += $c } END { print n + 0 }'
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

# free_port: a TCP port on 127.0.0.1 nothing listens on right now.
free_port() {
	local p i
	for ((i = 0; i < 50; i++)); do
		p=$((20000 + RANDOM % 30000))
		if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
			echo "$p"
			return 0
		fi
	done
	return 1
}

# start_gateway NAME BIN ENV UPSTREAM MODEL [FLAG...]: `BIN gateway` with
# its data in $TMP/NAME/data in front of UPSTREAM (a price for MODEL), its
# process environment ENV (VAR=VALUE,... or empty), with a bench key; waits
# for /healthz 200. Sets GW (host:port), GW_PID and GW_KEY.
start_gateway() {
	local name=$1 bin=$2 envs=$3 upstream=$4 model=$5 i
	shift 5
	mkdir -p "$TMP/$name"
	# shellcheck disable=SC2086 # the VAR=VALUE entries, one word each
	env ${envs//,/ } "$bin" gateway --data "$TMP/$name/data" --listen 127.0.0.1:0 \
		--admin-listen 127.0.0.1:0 --upstream "$upstream" --price "$model=0.2,0.6" "$@" \
		>"$TMP/$name/gateway.out" 2>"$TMP/$name/gateway.log" &
	GW_PID=$!
	PIDS+=("$GW_PID")
	GW=$(wait_for_line "$TMP/$name/gateway.out" '^tailgate gateway: API ' | sed -E 's|.*API http://([^/]+)/v1.*|\1|') ||
		die "$name: the gateway did not start: $(tail -n 20 "$TMP/$name/gateway.log")"
	GW_KEY=$(bench_key "$bin" "$TMP/$name/data")
	for ((i = 0; i < 100; i++)); do
		[[ $(curl -s -o /dev/null -w '%{http_code}' "http://$GW/healthz") == 200 ]] && return 0
		sleep 0.1
	done
	die "$name: the gateway never became ready: $(tail -n 20 "$TMP/$name/gateway.log")"
}

# many_conns BIN: the flags that let BIN's gateway hold a stream benchmark's
# connections from one loopback address (none for a build without the cap).
many_conns() {
	if "$1" gateway --help 2>&1 | grep -q -- '--max-connections-per-address'; then
		echo --max-connections 16384 --max-connections-per-address 16384
	fi
}

# start_goproxy UPSTREAM: the bare Go hop (bench/goproxy, built into
# $TMP/goproxy) in front of UPSTREAM. Sets GOPROXY_ADDR and GOPROXY_PID.
start_goproxy() {
	"$TMP/goproxy" --upstream "$1" >"$TMP/goproxy.out" 2>"$TMP/goproxy.log" &
	GOPROXY_PID=$!
	PIDS+=("$GOPROXY_PID")
	GOPROXY_ADDR=$(wait_for_line "$TMP/goproxy.out" '^GOPROXY_LISTEN ' | awk '{print $2}') ||
		die "goproxy did not start: $(cat "$TMP/goproxy.log")"
}

# start_nginx UPSTREAM: a bare nginx proxy_pass hop (buffering off, upstream
# keep-alive, request bodies up to 1 MB in memory) in front of UPSTREAM (host:port), when nginx is installed.
# Sets NGINX_ADDR and NGINX_PIDS (master+workers, for /proc); returns 1, with
# the reason logged, when there is no nginx or it did not start.
start_nginx() {
	local port i
	command -v nginx >/dev/null 2>&1 || { log "no nginx installed: no nginx row"; return 1; }
	port=$(free_port) || { log "no free port for nginx"; return 1; }
	mkdir -p "$TMP/nginx/logs" "$TMP/nginx/tmp"
	cat >"$TMP/nginx/nginx.conf" <<NGINX
worker_processes auto;
pid $TMP/nginx/nginx.pid;
error_log $TMP/nginx/logs/error.log warn;
events { worker_connections 16384; }
http {
	access_log off;
	# Prompts are read into memory, as an operator in front of an LLM sets it
	# (the default, 16 KB, spools a larger body to a temporary file).
	client_body_buffer_size 1m;
	client_max_body_size 32m;
	client_body_temp_path $TMP/nginx/tmp/body;
	proxy_temp_path $TMP/nginx/tmp/proxy;
	fastcgi_temp_path $TMP/nginx/tmp/fastcgi;
	uwsgi_temp_path $TMP/nginx/tmp/uwsgi;
	scgi_temp_path $TMP/nginx/tmp/scgi;
	upstream engine { server $1; keepalive 256; }
	server {
		listen 127.0.0.1:$port;
		location / {
			proxy_pass http://engine;
			proxy_http_version 1.1;
			proxy_set_header Connection "";
			proxy_buffering off;
		}
	}
}
NGINX
	nginx -p "$TMP/nginx" -c "$TMP/nginx/nginx.conf" -g 'daemon off;' 2>"$TMP/nginx/stderr" &
	local master=$!
	PIDS+=("$master")
	for ((i = 0; i < 50; i++)); do
		curl -sf -o /dev/null "http://127.0.0.1:$port/health" && break
		sleep 0.1
	done
	if ! curl -sf -o /dev/null "http://127.0.0.1:$port/health"; then
		log "nginx did not start, no nginx row: $(cat "$TMP/nginx/stderr" "$TMP/nginx/logs/error.log" 2>/dev/null)"
		return 1
	fi
	NGINX_ADDR=127.0.0.1:$port
	NGINX_PIDS=$master
	for i in $(pgrep -P "$master"); do NGINX_PIDS+="+$i"; done
}
