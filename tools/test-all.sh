#!/usr/bin/env bash
# `make test`: setup (tools/install-deps.sh: missing Debian packages, then the pip test
# dependencies of every interpreter), then build and pytest on each interpreter in $PYTHONS,
# and CPython's own test_asyncio under aioprof on each, without and with sampling
# (tests/suites/, docs/testing.md), then uvloop's, anyio's, pytest-asyncio's and aiohttp's
# own suites under aioprof, the MicroPython port's tests, `make lint` (cppcheck), `make asan`,
# `make valgrind` and `make debug` (3.14's debug build). Every step runs
# even when an earlier one failed
# (pytest is skipped only for an interpreter whose build failed), and the summary at the
# end names the failures. Exit status 0 only if every step passed.
set -uo pipefail
cd "$(dirname "$0")/.."
: "${PYTHONS:?set PYTHONS to the interpreters to test (the Makefile does)}"
MAKE=${MAKE:-make}
rm -rf build/test-results

names=() results=() secs=()
failed=0
start=$SECONDS

step() { # NAME COMMAND...: run one step and record how it went
    local name=$1 t0=$SECONDS rc=0
    shift
    printf '\n===== %s\n' "$name"
    "$@" || rc=$?
    names+=("$name")
    secs+=($((SECONDS - t0)))
    if [ "$rc" -eq 0 ]; then results+=(ok); else results+=("FAILED (exit $rc)"); failed=$((failed + 1)); fi
    return "$rc"
}

step "setup (apt, pip)" tools/install-deps.sh
for py in $PYTHONS; do
    ver=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null) || ver=$py
    if step "build $ver" "$MAKE" --no-print-directory build PY="$py"; then
        step "pytest $ver" "$MAKE" --no-print-directory test-py PY="$py"
        step "test_asyncio $ver" "$MAKE" --no-print-directory test-asyncio PY="$py" SAMPLE_MS=0
        step "test_asyncio $ver, sampling" "$MAKE" --no-print-directory test-asyncio PY="$py" SAMPLE_MS=1
    else
        names+=("pytest $ver" "test_asyncio $ver" "test_asyncio $ver, sampling") secs+=(0 0 0)
        results+=("SKIPPED (build failed)" "SKIPPED (build failed)" "SKIPPED (build failed)")
    fi
done
# Libraries' own suites under aioprof, one interpreter each (tests/suites/run_suites.py,
# docs/testing.md: which runs where, and why).
for spec in "uvloop 3.13 0" "anyio 3.11 1" "pytest-asyncio 3.12 0" "aiohttp 3.10 1"; do
    read -r suite ver ms <<<"$spec"
    step "suite $suite $ver" "$MAKE" --no-print-directory test-suites PY="python$ver" SUITES="$suite" SAMPLE_MS="$ms"
done
step "micropython" "$MAKE" --no-print-directory test-micropython PY="${PYTHONS%% *}"
step "lint (cppcheck)" "$MAKE" --no-print-directory lint
step "asan" "$MAKE" --no-print-directory asan
step "valgrind" "$MAKE" --no-print-directory valgrind
step "debug (3.14-dbg)" "$MAKE" --no-print-directory debug

printf '\n===== summary (%ds in all)\n' $((SECONDS - start))
for i in "${!names[@]}"; do
    printf '  %-26s %-26s %5ss\n' "${names[$i]}" "${results[$i]}" "${secs[$i]}"
done
# Test counts from the JUnit reports; the last line is 'tests: N passed, N failed'.
python3 - "$failed" <<'PY'
import glob, os, sys
import xml.etree.ElementTree as ET

failed_steps = int(sys.argv[1])
total = {"passed": 0, "failed": 0, "skipped": 0}
for path in sorted(glob.glob("build/test-results/*.xml")):
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError:
        print(f"  {os.path.basename(path)[:-4]:26} unreadable report")
        continue
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    n = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
    bad = n["failures"] + n["errors"]
    passed = n["tests"] - bad - n["skipped"]
    total["passed"] += passed
    total["failed"] += bad
    total["skipped"] += n["skipped"]
    print(f"  {os.path.basename(path)[:-4]:26} {passed} passed, {bad} failed, {n['skipped']} skipped")
if failed_steps and not total["failed"]:
    # A step failed without a failing test (build error, crash, sanitizer report, no tests).
    total["failed"] = failed_steps
reruns = [(os.path.basename(p)[:-7], line.strip()) for p in sorted(glob.glob("build/test-results/*.reruns"))
          for line in open(p, encoding="utf-8") if line.strip()]
if reruns:
    print(f"passed only on a rerun ({len(reruns)}; timing tests, docs/testing.md):")
    for label, nodeid in reruns:
        print(f"  {label:26} {nodeid}")
print(f"tests: {total['passed']} passed, {total['failed']} failed, {total['skipped']} skipped"
      + (f", {len(reruns)} passed only on a rerun" if reruns else ""))
PY
if [ "$failed" -ne 0 ]; then
    echo "make test: FAILED ($failed step(s))" >&2
    exit 1
fi
