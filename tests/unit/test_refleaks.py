"""No reference and no memory block leaked per cycle: CPython's `-R` discipline on a debug
build (``Py_DEBUG``: ``sys.gettotalrefcount()``), as `make debug` runs it on 3.14-dbg.

_refleak_prog.py runs each scenario (start/stop cycles with every option, task storms,
report renders, LoopMonitor, uvloop) a few times to fill the caches and then RUNS more
times, clearing the interpreter's caches and collecting the garbage after each; here
the change per measured run of the total reference count and of the allocated memory
blocks must be exactly 0 in every run (stricter than regrtest, which forgives deltas that
are not all >= 1). Every scenario also checks that aioprof saw what the program did, so
it cannot pass by measuring nothing. The scenarios run in two processes of their own
(the standard-library loop's; uvloop's), so that what other tests imported counts not.

Elsewhere (a release build, ASan, valgrind) the module skips, saying why; under
`make debug` (AIOPROF_REQUIRE_DEBUG=1) a build without ``sys.gettotalrefcount`` fails.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import importable

if not hasattr(sys, "gettotalrefcount"):
    if os.environ.get("AIOPROF_REQUIRE_DEBUG"):
        raise RuntimeError(f"AIOPROF_REQUIRE_DEBUG is set but {sys.executable} is not a debug "
                           "build (no sys.gettotalrefcount)")
    pytest.skip("reference counts need a debug build of CPython (sys.gettotalrefcount; "
                "make debug runs this on 3.14-dbg)", allow_module_level=True)

pytestmark = pytest.mark.sanitize

PROG = Path(__file__).with_name("_refleak_prog.py")
STDLIB = ["start_stop_cycles", "task_storm[default]", "task_storm[max_tasks=0]",
          "task_storm[slow_ms=0]", "task_storm[sampling+stacks+trace]", "report_renders",
          "loop_monitor"]


def hunt(names: list) -> dict:
    proc = subprocess.run([sys.executable, str(PROG), *names], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr
    results = {}
    for line in proc.stdout.splitlines():
        out = json.loads(line)
        results[out.pop("scenario")] = out
    assert sorted(results) == sorted(names), proc.stdout + proc.stderr
    return results


@pytest.fixture(scope="module")
def stdlib_results() -> dict:
    return hunt(STDLIB)


def check(out: dict, *, references: bool = True) -> None:
    assert out["error"] is None, out["error"]
    zeros = [0] * len(out["blocks"])
    got = f"per measured run: {out} "
    if references:
        assert out["references"] == zeros, got
    assert out["blocks"] == zeros, got
    for name, deltas in out["objects"].items():
        assert deltas == zeros, f"references to {name}: {got}"


@pytest.mark.parametrize("name", STDLIB)
def test_no_leak(stdlib_results, name):
    check(stdlib_results[name])


def test_no_leak_uvloop():
    """On uvloop: the blocks and the references to uvloop.Loop and its call_soon (which
    aioprof wraps at each start) exactly 0 per run, but not the total: 3.14-dbg loads
    Debian's uvloop, a release build, whose inlined Py_INCREF/Py_DECREF the total does not
    count, so it drifts with uvloop's work alone (about 11,200 per storm without aioprof,
    the same with it; one attribute read of uvloop.Loop.call_soon, a Cython function,
    moves it by 1-2)."""
    if not importable("uvloop"):
        pytest.skip("uvloop is not installed for this interpreter")
    check(hunt(["uvloop_storm"])["uvloop_storm"], references=False)
