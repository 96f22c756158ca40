#!/usr/bin/env bash
# make vulncheck (part of make test): govulncheck on the main module (./...),
# with a vulnerability database built locally from the golang.org/x/vulndb Go
# module instead of the online one. Fails (govulncheck's exit code, 3) on any
# vulnerability reachable from this module's code, and prints the findings.
#
# Both are built once and cached, keyed by version:
#   $TOOLS_DIR/govulncheck-$GOVULNCHECK_VERSION/govulncheck
#   $TOOLS_DIR/vulndb-$VULNDB_VERSION-<hash of hack/vulncheck/localdb.go>/
# The database: the OSV entries in data/osv of the vulndb module, written in
# govulncheck's file layout by hack/vulncheck/localdb.go, which uses vulndb's
# internal/database and so runs inside a copy of that module's code.
#   VULNDB_VERSION       the golang.org/x/vulndb snapshot (a pseudo-version)
#   GOVULNCHECK_VERSION  the golang.org/x/vuln release
#   TOOLS_DIR            default ${XDG_CACHE_HOME:-$HOME/.cache}/image-refresh/tools
#   GO                   the go command (default go); govulncheck runs the go
#                        command found first on PATH, so its folder is put first
# Progress goes to stderr, govulncheck's report to stdout.
set -euo pipefail

VULNDB_VERSION=${VULNDB_VERSION:-v0.0.0-20261105234957-e22db6528018}
GOVULNCHECK_VERSION=${GOVULNCHECK_VERSION:-v1.9.0}
TOOLS_DIR=${TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/image-refresh/tools}
GO=${GO:-go}

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
gen="$root/hack/vulncheck/localdb.go"
log() { printf '[vulncheck %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

gocmd=$(command -v "$GO") || die "the go command ($GO) is not on PATH"
export PATH="$(dirname "$gocmd"):$PATH"
export GOWORK=off
start=$SECONDS
mkdir -p "$TOOLS_DIR"
tmps=()
trap 'rm -rf "${tmps[@]}"' EXIT
newtmp() { local t; t=$(mktemp -d "$TOOLS_DIR/.vulncheck.XXXXXX"); tmps+=("$t"); echo "$t"; }

# govulncheck type-checks the standard library of the go command it runs, so
# it is built by that same Go version (one built by an older Go fails on a
# newer standard library): the cache key has both versions. `go install` runs
# outside any module into a private GOBIN, then the binary is moved into place,
# so concurrent runs never see half a binary.
goversion=$("$GO" env GOVERSION)
bin="$TOOLS_DIR/govulncheck-$GOVULNCHECK_VERSION-$goversion/govulncheck"
if [[ ! -x "$bin" ]]; then
	log "installing govulncheck $GOVULNCHECK_VERSION ($goversion) into $TOOLS_DIR (once)"
	t=$(newtmp)
	(cd "$t" && GOBIN="$t" GOFLAGS=-mod=mod "$GO" install "golang.org/x/vuln/cmd/govulncheck@$GOVULNCHECK_VERSION") \
		|| die "go install golang.org/x/vuln/cmd/govulncheck@$GOVULNCHECK_VERSION failed"
	mkdir -p "$(dirname "$bin")"
	mv -f "$t/govulncheck" "$bin"
fi

# The database: written into a temporary folder, renamed into place whole.
db="$TOOLS_DIR/vulndb-$VULNDB_VERSION-$(sha256sum "$gen" | cut -c1-12)"
if [[ ! -f "$db/index/modules.json.gz" ]]; then
	log "building the vulnerability database from golang.org/x/vulndb@$VULNDB_VERSION (once)"
	t=$(newtmp)
	dir=$(cd "$t" && GOFLAGS=-mod=mod "$GO" mod download -json "golang.org/x/vulndb@$VULNDB_VERSION" |
		sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')
	[[ -n "$dir" && -d "$dir/data/osv" ]] || die "go mod download golang.org/x/vulndb@$VULNDB_VERSION gave no data/osv folder"
	# The module's code, writable, without data/: the OSV entries are read in
	# place from the module cache.
	mkdir -p "$t/src"
	tar -C "$dir" --exclude=./data -cf - . | tar -C "$t/src" -xf -
	chmod -R u+w "$t/src"
	mkdir -p "$t/src/cmd/localdb"
	cp "$gen" "$t/src/cmd/localdb/main.go"
	log "  compiling the database writer (downloads vulndb's own dependencies once)"
	(cd "$t/src" && GOFLAGS=-mod=mod "$GO" build -o "$t/localdb" ./cmd/localdb/main.go) \
		|| die "building hack/vulncheck/localdb.go inside golang.org/x/vulndb@$VULNDB_VERSION failed"
	log "  writing $(find "$dir/data/osv" -name '*.json' | wc -l) OSV entries"
	"$t/localdb" -osv "$dir/data/osv" -out "$t/db"
	if ! mv -T "$t/db" "$db" 2>/dev/null; then
		[[ -f "$db/index/modules.json.gz" ]] || die "could not move the database into $db"
	fi
fi
log "tools ready in $((SECONDS - start)) s; govulncheck $GOVULNCHECK_VERSION, database vulndb@$VULNDB_VERSION, $goversion"

cd "$root"
rc=0
"$bin" -db "file://$db" ./... || rc=$?
case $rc in
0) log "no reachable vulnerabilities ($((SECONDS - start)) s)" ;;
3) log "FAILED: reachable vulnerabilities, listed above (govulncheck exit 3)" ;;
*) log "FAILED: govulncheck exited $rc" ;;
esac
exit "$rc"
