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
# keep-alive) in front of UPSTREAM (host:port), when nginx is installed.
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
