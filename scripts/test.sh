#!/usr/bin/env bash
# The test command: installs what the tests need that Go does not bring
# (Debian's chromium, for the dashboard's browser test; systemd, whose
# systemd-analyze checks the units in deploy/systemd; prometheus, whose
# promtool checks and unit-tests the alert rules in deploy/prometheus; and
# postgresql, whose binaries the PostgreSQL tests run: data/pgtest starts a throwaway server
# with initdb in a temporary directory, on 127.0.0.1 only, and stops it at
# the end), then vets and runs every test with the race detector. Without
# PostgreSQL those tests fail; TAILGATE_TEST_POSTGRES=skip skips them (for
# local runs only).
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
updated=""
install() { # PACKAGE WHY
	echo "test.sh: installing $1 (Debian package) for $2" >&2
	if [ -z "$updated" ]; then $SUDO apt-get update -qq; updated=1; fi
	DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "$1" >/dev/null
}
if ! command -v chromium >/dev/null 2>&1; then
	install chromium "the dashboard test"
fi
if [ -z "${TAILGATE_PG_BINDIR:-}" ] && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
	install postgresql "the PostgreSQL tests"
fi

if ! command -v systemd-analyze >/dev/null 2>&1; then
	install systemd "systemd-analyze verify of deploy/systemd"
fi
if ! command -v promtool >/dev/null 2>&1; then
	install prometheus "promtool check/test rules of deploy/prometheus"
fi

# workerd (npm), the Cloudflare Workers runtime: serving/edge runs
# deploy/cloudflare/worker.js in it on loopback.
if ! command -v workerd >/dev/null 2>&1; then
	echo "test.sh: installing workerd (npm package) for the Cloudflare Worker's tests" >&2
	$SUDO npm install -g workerd >/dev/null
fi

go vet ./...
# e2e/ starts the real binary in ~80 tests (several minutes under -race on
# 2 cores): more than go test's default 10 min per package.
go test -race -count=1 -timeout 30m "$@" ./...
# Memory per open stream is measured without the race detector (it changes
# what is allocated and pools less), so that test skips itself above and runs
# here: 200 streams held open through the gateway, heap per stream bounded.
go test -count=1 -run '^TestOpenStreamMemoryIsBounded$' ./server/

# The conformance kit: the clients users bring (openai, the Vercel AI SDK,
# LangChain, Anthropic's SDKs, the official Go SDKs, Claude Code headless), at
# pinned versions from npm and the Go module proxy, against a real `tailgate up`;
# every request and answer is also checked against the published OpenAPI specs
# (e2e/conformance/testdata/openapi). One matrix, client × feature plus a schema
# column; any failing cell fails here (two to five minutes).
scripts/conformance.sh

# The differential fuzz tests of the request readers (JSON bodies, multipart
# forms), each for a bounded number of inputs (their seed corpora already ran
# above as ordinary tests).
# Counts, not durations: Go 1.26's fuzz coordinator can fail a duration run
# at its deadline with "context deadline exceeded" and no crasher
# (golang/go#75804, fixed in Go 1.27).
go test -run '^$' -fuzz '^FuzzGatewayAndEngineReadBodiesAlike$' -fuzztime 100000x -timeout 5m ./server/
go test -run '^$' -fuzz '^FuzzGatewayAndEngineReadFormsAlike$' -fuzztime 50000x -timeout 5m ./server/
# Bodies mixing the members of each endpoint's request union: the gateway
# refuses them or reserves at least what the engine bills (about 15 s).
go test -run '^$' -fuzz '^FuzzShapesReserveWhatTheEngineBills$' -fuzztime 3000x -timeout 5m ./server/
# The audio length readers over arbitrary uploads (about 25 s).
go test -run '^$' -fuzz '^FuzzAudioDurationNeverPanics$' -fuzztime 100000x -timeout 5m ./server/
go test -run '^$' -fuzz '^FuzzCheckAgreesWithEncodingJSON$' -fuzztime 300000x -timeout 5m ./server/strictjson/
# The walker the request readers step over checked JSON with, against gjson.
go test -run '^$' -fuzz '^FuzzWalkAgreesWithGJSON$' -fuzztime 100000x -timeout 5m ./server/strictjson/
# The commit log's decoder over arbitrary file contents (about 10 s).
go test -run '^$' -fuzz '^FuzzCommitLogDecode$' -fuzztime 200000x -timeout 5m ./data/commitlog/
