#!/usr/bin/env bash
# Usage: tools/pytest.sh LABEL COMMAND...   (COMMAND runs `... -m pytest [args]`)
#
# One pytest run of `make test`: under a time limit (PYTEST_TIMEOUT seconds, default 900,
# so a hung event loop cannot eat CI's 90 minutes), with a JUnit report in
# build/test-results/LABEL.xml that tools/test-all.sh sums up. pytest's exit code 5 (no
# test collected) stays a failure: a run that tests nothing must not pass.
#
# Reruns (docs/testing.md): a failed test marked `timing` runs once more
# (AIOPROF_TIMING_RERUNS, default 1; pytest-rerunfailures), no other test; the tests that
# passed only on that rerun are listed in build/test-results/LABEL.reruns, and the summary of
# tools/test-all.sh names them. A missing shared-cases folder fails the case tests here
# (AIOPROF_REQUIRE_CASES), and a program of tests/real/ that cannot run (a package or
# PostgreSQL missing) fails (AIOPROF_REQUIRE_REAL), where a bare `pytest` only skips them.
set -uo pipefail
label=$1
shift
results=build/test-results
mkdir -p "$results"
rm -f "$results/$label.xml" "$results/$label.reruns"
limit=${PYTEST_TIMEOUT:-900}
export AIOPROF_TIMING_RERUNS=${AIOPROF_TIMING_RERUNS:-1}
export AIOPROF_RERUN_LOG=$PWD/$results/$label.reruns
# AIOPROF_REQUIRE_REAL= (empty, as the Makefile sets it for 3.14/3.15, whose Debian root file
# system has no wheels of the real programs' packages) lets those programs skip.
export AIOPROF_REQUIRE_CASES=1 AIOPROF_REQUIRE_REAL=${AIOPROF_REQUIRE_REAL-1}

timeout --kill-after=30 "$limit" "$@" --junitxml="$results/$label.xml" \
    -o junit_family=xunit1 -o faulthandler_timeout=300
rc=$?
case $rc in
    5) echo "$label: pytest collected no test; counted as a failure" >&2 ;;
    124 | 137) echo "$label: killed after the time limit of ${limit}s" >&2 ;;
esac
if [ -s "$results/$label.reruns" ]; then
    echo "$label: passed only on a rerun (timing):" >&2
    sed 's/^/    /' "$results/$label.reruns" >&2
fi
exit $rc
