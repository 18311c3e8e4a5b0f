#!/usr/bin/env bash
# The test command: installs what the tests need that Go does not bring
# (Debian's chromium, for the dashboard's browser test), then vets and runs
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

go vet ./...
go test -race -count=1 "$@" ./...


# The differential fuzz tests of the request reader, for a short, bounded
# time each (their seed corpora already ran above as ordinary tests).
go test -run '^$' -fuzz '^FuzzGatewayAndEngineReadBodiesAlike$' -fuzztime 20s ./server/
go test -run '^$' -fuzz '^FuzzCheckAgreesWithEncodingJSON$' -fuzztime 10s ./server/strictjson/
