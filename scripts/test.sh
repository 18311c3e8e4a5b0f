#!/usr/bin/env bash
# The test command: installs what the tests need that Go does not bring
# (Debian's chromium, for the dashboard's browser test; systemd, whose
# systemd-analyze checks the units in deploy/systemd), then vets and runs
# every test with the race detector.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v chromium >/dev/null 2>&1; then
	echo "test.sh: installing chromium (Debian package) for the dashboard test" >&2
	SUDO=""
	if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
	$SUDO apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null
fi

if ! command -v systemd-analyze >/dev/null 2>&1; then
	echo "test.sh: installing systemd (Debian package) for systemd-analyze verify of deploy/systemd" >&2
	SUDO=""
	if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
	$SUDO apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq systemd >/dev/null
fi

go vet ./...
go test -race -count=1 "$@" ./...

# The differential fuzz tests of the request reader, each for a bounded
# number of inputs (their seed corpora already ran above as ordinary tests).
# Counts, not durations: Go 1.26's fuzz coordinator can fail a duration run
# at its deadline with "context deadline exceeded" and no crasher
# (golang/go#75804, fixed in Go 1.27).
go test -run '^$' -fuzz '^FuzzGatewayAndEngineReadBodiesAlike$' -fuzztime 100000x -timeout 5m ./server/
go test -run '^$' -fuzz '^FuzzCheckAgreesWithEncodingJSON$' -fuzztime 300000x -timeout 5m ./server/strictjson/
