#!/usr/bin/env bash
# Runs every fuzz target of the module for FUZZTIME each (default 10s), on
# FUZZPARALLEL workers (default: one per CPU; `make test` uses one, so that
# its short fuzz runs leave a core to the end-to-end areas beside them).
# A run that ends with "context deadline exceeded" and wrote no failing
# input is the fuzzer's own deadline hitting a worker mid-input (a known
# `go test -fuzz` behaviour on a loaded machine), not a finding: it is
# retried once, then reported as a note. Any failing input fails the run.
set -uo pipefail
GO=${GO:-go}
FUZZTIME=${FUZZTIME:-10s}
FUZZPARALLEL=${FUZZPARALLEL:-$(nproc)}
cd "$(dirname "$0")/.."
status=0
for file in $(grep -rlE --include='*_test.go' '^func Fuzz' internal); do
  dir=./$(dirname "$file")
  for f in $(grep -oE '^func Fuzz[A-Za-z0-9_]+' "$file" | cut -d' ' -f2); do
    for try in 1 2; do
      echo "fuzz $dir $f ($FUZZTIME, $FUZZPARALLEL worker(s))"
      out=$("$GO" test -run '^$' -fuzz "^$f\$" -fuzztime "$FUZZTIME" -parallel "$FUZZPARALLEL" "$dir" 2>&1)
      rc=$?
      printf '%s\n' "$out" | grep -v 'elapsed:' 
      [ $rc -eq 0 ] && break
      if printf '%s' "$out" | grep -q 'Failing input written' || ! printf '%s' "$out" | grep -q 'context deadline exceeded'; then
        echo "fuzz $dir $f: FAILED (a failing input is in $dir/testdata/fuzz/$f)"
        status=1
        break
      fi
      if [ $try -eq 2 ]; then
        echo "fuzz $dir $f: note: stopped at its deadline mid-input twice, no failing input"
      fi
    done
  done
done
exit $status
