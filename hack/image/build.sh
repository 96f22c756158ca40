#!/usr/bin/env bash
# make image: builds the image-refresh OCI image with ko (no Docker engine) and
# pushes it to $REGISTRY/image-refresh:$TAG, then prints the pushed reference
# with its digest on stdout (progress goes to stderr). docs/image.md.
#   REGISTRY             host:port of the registry (required); the local
#                        cluster's loopback one: eval "$(make -s cluster-up)"
#   TAG                  default dev
#   VERSION              the version stamp `image-refresh version` prints;
#                        default the chart's appVersion + "-dev"
#   KO_DEFAULTBASEIMAGE  the base; unset: a minimal base (one layer, the CA roots
#                        of this machine; linux/amd64, user 65532) is pushed to
#                        $REGISTRY/image-refresh-base first, since no registry
#                        with a real base is reachable
#   KO_VERSION, TOOLS_DIR  see install-ko.sh
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
GO=${GO:-go}
# The Go toolchain the Makefile pins (standard-library fixes govulncheck
# needs), also when this script runs outside make; ko's go build inherits it.
GOTOOLCHAIN=${GOTOOLCHAIN:-$(sed -n 's/^export GOTOOLCHAIN := *//p' Makefile)}
export GOTOOLCHAIN

if [[ -z "${REGISTRY:-}" ]]; then
	cat >&2 <<'MSG'
make image: REGISTRY is not set. Start the local cluster and its loopback
registry first, then build:
    eval "$(make -s cluster-up)"
    make image
(or name any registry you can push to: REGISTRY=host:port make image)
MSG
	exit 2
fi

TAG=${TAG:-dev}
if [[ -z "${VERSION:-}" ]]; then
	VERSION="$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\} *$/\1/p' charts/image-refresh/Chart.yaml)-dev"
fi
export VERSION

ko=$(hack/image/install-ko.sh)

# A registry off loopback that answers plain HTTP (the real node's forward of
# the local registry, 198.18.x.2:port) is written to as such; loopback hosts
# are plain HTTP to ko and go-containerregistry already.
insecure=()
case "$REGISTRY" in
127.*|localhost|localhost:*|"[::1]"*) ;;
*)
	if command -v curl >/dev/null && curl -s -o /dev/null --max-time 5 "http://$REGISTRY/v2/"; then
		insecure=(--insecure-registry)
		export INSECURE=1
	fi
	;;
esac

if [[ -z "${KO_DEFAULTBASEIMAGE:-}" ]]; then
	KO_DEFAULTBASEIMAGE=$("$GO" run ./hack/image/base "$REGISTRY/image-refresh-base:scratch")
	echo "base: $KO_DEFAULTBASEIMAGE" >&2
fi
export KO_DEFAULTBASEIMAGE
export KO_DOCKER_REPO="$REGISTRY/image-refresh"

# --bare: the repository is exactly $KO_DOCKER_REPO. --image-user: ko has no
# per-build user in .ko.yaml. --sbom none: no SBOM artifact beside the image.
# GIT_DIR points nowhere: ko runs git (status, describe) only to fill {{.Git}}
# in templates, which .ko.yaml does not use; the work tree is left alone.
ref=$(GIT_DIR=/nonexistent "$ko" build "${insecure[@]}" --bare --tags "$TAG" --platform linux/amd64 \
	--image-user 65532:65532 --sbom none .)
echo "image-refresh $VERSION: $ref" >&2
echo "chart values: --set image.repository=$KO_DOCKER_REPO --set image.tag=$TAG --set image.digest=${ref##*@}" >&2
echo "$ref"
