#!/usr/bin/env bash
# scripts/release.sh — the release build: static tailgate binaries for linux and darwin on
# amd64 and arm64, each in a tar.gz with the README and the docs, the version stamped, and a
# SHA-256 checksums file. The same commit and toolchain give the same bytes (reproducible):
# -trimpath, no cgo, the build ID from the content, archive entries sorted, owned by 0:0 and
# dated at the commit, gzip without a name or time stamp.
#
#   scripts/release.sh                          # every platform into dist/
#   scripts/release.sh --only linux/amd64       # one platform (repeatable, or a comma list)
#   VERSION=v0.3.0 scripts/release.sh           # the version to stamp (default: git describe)
#   scripts/release.sh --out /tmp/rel --images  # also build the container images (needs docker)
#
# Why a script and not GoReleaser: the go command already cross-compiles a static binary for
# every target here (the SQLite driver is pure Go), so the release is `go build` and `tar`;
# a script needs no tool to install or pin and is read in a minute.
set -euo pipefail

cd "$(dirname "$0")/.."
OUT=dist
PLATFORMS=(linux/amd64 linux/arm64 darwin/amd64 darwin/arm64)
ONLY=()
IMAGES=0
while [ $# -gt 0 ]; do
	case "$1" in
	--only) ONLY+=(${2//,/ }); shift 2 ;;
	--only=*) v=${1#--only=}; ONLY+=(${v//,/ }); shift ;;
	--out) OUT=$2; shift 2 ;;
	--out=*) OUT=${1#--out=}; shift ;;
	--images) IMAGES=1; shift ;;
	-h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) echo "release.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
	esac
done
if [ ${#ONLY[@]} -gt 0 ]; then
	for p in "${ONLY[@]}"; do
		case " ${PLATFORMS[*]} " in *" $p "*) ;; *) echo "release.sh: --only $p: want one of ${PLATFORMS[*]}" >&2; exit 2 ;; esac
	done
	PLATFORMS=("${ONLY[@]}")
fi

# The version: $VERSION, else the nearest tag (with the commits since and the commit), else
# the commit; -dirty when the tree has changes. The binary's `tailgate version` prints it.
# (-X names the main package's variable as main.version whatever the module path is, so the
# rename to github.com/tailgate-dev/tailgate changes nothing here.)
VERSION=${VERSION:-$(git describe --tags --always --dirty 2>/dev/null || echo devel)}
case "$VERSION" in *[!A-Za-z0-9._+-]*) echo "release.sh: VERSION $VERSION: letters, digits and ._+- only" >&2; exit 2 ;; esac
LDFLAGS="-s -w -buildid= -X main.version=$VERSION"
# Archive entries are dated at the commit, so two builds of it are the same bytes.
EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}

sha256() { if command -v sha256sum >/dev/null; then sha256sum "$@"; else shasum -a 256 "$@"; fi; }

# Progress on stderr: a line as each target starts, one every 30 s while it builds (a
# target's first build compiles every dependency for that platform: minutes on a small box),
# and its time when done; stdout stays the version alone.
t0=$(date +%s)
since() { local s=$(($(date +%s) - $1)); printf '%dm%02ds' $((s / 60)) $((s % 60)); }
say() { echo "release.sh [$(since "$t0")] $*" >&2; }
build() { # build GOOS GOARCH OUT: go build, with a line every 30 s while it runs
	CGO_ENABLED=0 GOOS=$1 GOARCH=$2 go build -trimpath -ldflags "$LDFLAGS" -o "$3" . &
	local pid=$! n=0
	while kill -0 "$pid" 2>/dev/null; do
		sleep 1
		n=$((n + 1))
		if [ $((n % 30)) -eq 0 ] && kill -0 "$pid" 2>/dev/null; then say "  still compiling $1/$2 ($(since "$start") so far)"; fi
	done
	wait "$pid"
}

mkdir -p "$OUT"
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
archives=()
say "building tailgate $VERSION for ${#PLATFORMS[@]} platform(s): ${PLATFORMS[*]} into $OUT/"
i=0
for p in "${PLATFORMS[@]}"; do
	i=$((i + 1))
	goos=${p%/*} goarch=${p#*/}
	name="tailgate_${VERSION}_${goos}_${goarch}"
	dir="$stage/$name"
	mkdir -p "$dir/docs"
	start=$(date +%s)
	say "[$i/${#PLATFORMS[@]}] $p: go build (static, -trimpath)"
	build "$goos" "$goarch" "$dir/tailgate"
	cp README.md "$dir/"
	cp docs/*.md "$dir/docs/"
	for f in LICENSE LICENSE.md COPYING; do [ -f "$f" ] && cp "$f" "$dir/"; done
	# The files sit at the archive's root: `tar xzf …; ./tailgate up`.
	(cd "$dir" && find . -mindepth 1 -print0 | LC_ALL=C sort -z |
		tar --null --no-recursion --owner=0 --group=0 --numeric-owner \
			--mtime="@$EPOCH" --mode='u+rwX,go+rX,go-w' -cf - -T -) | gzip -9n >"$OUT/$name.tar.gz"
	archives+=("$name.tar.gz")
	say "[$i/${#PLATFORMS[@]}] $p: built $OUT/$name.tar.gz in $(since "$start")"
done
(cd "$OUT" && sha256 "${archives[@]}" >"tailgate_${VERSION}_checksums.txt")
say "done: checksums in $OUT/tailgate_${VERSION}_checksums.txt"

# The container images, from the same commit and version (deploy/Dockerfile builds the static
# binary inside; deploy/worker.Dockerfile adds it to the official vLLM image).
images=(
	"docker build -f deploy/Dockerfile --build-arg VERSION=$VERSION -t tailgate:$VERSION ."
	"docker build -f deploy/worker.Dockerfile --build-arg VERSION=$VERSION -t tailgate-vllm:$VERSION ."
)
if [ "$IMAGES" = 1 ]; then
	command -v docker >/dev/null || { echo "release.sh: --images needs docker; the commands are:" >&2; printf '  %s\n' "${images[@]}" >&2; exit 1; }
	for c in "${images[@]}"; do echo "+ $c" >&2; $c; done
else
	echo "container images (not built; --images builds them):" >&2
	printf '  %s\n' "${images[@]}" >&2
fi
echo "$VERSION"
