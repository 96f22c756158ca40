# shellcheck shell=bash
# Sourced by hack/build-cluster.sh, hack/build-cosign.sh and
# hack/build-argo-rollouts.sh, which build once into the cache directory
# $cache and define log and exit_if_built (prints what is built and exits 0
# when it is built already, else returns).

# build_once LOCK exits when the build is done already; otherwise it takes
# the lock file $cache/LOCK, one build at a time (tests and `make demo` may
# start a script concurrently): whoever waited finds the stamp written and
# exits.
build_once() {
  exit_if_built
  mkdir -p "$cache"
  exec 9>"$cache/$1"
  if command -v flock >/dev/null && ! flock -n 9; then
    log "another $(basename "$0") is building into $cache; waiting for it"
    flock 9
    exit_if_built
  fi
}
