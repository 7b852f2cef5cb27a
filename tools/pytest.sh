#!/usr/bin/env bash
# Usage: tools/pytest.sh LABEL COMMAND...   (COMMAND runs `... -m pytest [args]`)
#
# One pytest run of `make test`: under a time limit (PYTEST_TIMEOUT seconds, default 900,
# so a hung event loop cannot eat CI's 90 minutes), with a JUnit report in
# build/test-results/LABEL.xml that tools/test-all.sh sums up. pytest's exit code 5 (no
# test collected) stays a failure: a run that tests nothing must not pass.
set -uo pipefail
label=$1
shift
results=build/test-results
mkdir -p "$results"
rm -f "$results/$label.xml"
limit=${PYTEST_TIMEOUT:-900}

timeout --kill-after=30 "$limit" "$@" --junitxml="$results/$label.xml" \
    -o junit_family=xunit1 -o faulthandler_timeout=300
rc=$?
case $rc in
    5) echo "$label: pytest collected no test; counted as a failure" >&2 ;;
    124 | 137) echo "$label: killed after the time limit of ${limit}s" >&2 ;;
esac
exit $rc
