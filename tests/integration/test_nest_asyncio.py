"""nest_asyncio (issue 7, item 17): it replaces the loop class's _run_once (and
run_until_complete, run_forever) with its own Python versions, out of reach of the
hooks on BaseEventLoop. The report says plainly what cannot be measured then, and what it
does show is true: a nested run_until_complete is busy time of the step that called it.

The program runs in a subprocess: nest_asyncio patches asyncio for the whole process.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("nest_asyncio")

PROGRAM = textwrap.dedent("""
    import asyncio, io, json, sys, time
    import aioprof
    from aioprof.report import text
    import nest_asyncio

    async def inner(i):
        await asyncio.sleep(0.05)
        return i

    async def outer():
        loop = asyncio.get_event_loop()
        t = time.perf_counter()
        r = loop.run_until_complete(asyncio.gather(inner(1), inner(2)))
        nested = time.perf_counter() - t
        await asyncio.sleep(0.02)
        return r, nested

    with aioprof.Profiler() as p:
        nest_asyncio.apply()
        t0 = time.perf_counter()
        result, nested = asyncio.run(outer())
        total = time.perf_counter() - t0
    doc = p.stats()
    print(json.dumps({"result": result, "nested": nested, "total": total, "doc": doc,
                      "text": text.render(doc, width=1000)}))
""")


@pytest.fixture(scope="module")
def run():
    src = os.path.join(os.path.dirname(__file__), "..", "..", "src")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [src] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])))
    out = subprocess.run([sys.executable, "-c", PROGRAM], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stderr == ""
    return json.loads(out.stdout)


def test_report_says_what_cannot_be_measured(run):
    assert run["result"] == [1, 2]
    (note,) = run["doc"]["loop_notes"]
    assert note.startswith("_UnixSelectorEventLoop: _run_once is replaced by nest_asyncio: ")
    lines = run["text"].splitlines()
    at = lines.index("Event loops")
    assert lines[at + 1] == f"  Not measured: {note}."


def test_what_the_note_says_is_true(run):
    """The nested run (two 50 ms sleeps, measured by the program) is busy time of the
    outer task's step; the tasks it ran have no steps; no tick was seen."""
    doc, nested = run["doc"], run["nested"]
    assert nested >= 0.05
    tasks = {t["coroutine"]: t for t in doc["tasks"] if not t["internal"]}
    outer = tasks["outer"]
    assert outer["busy_s"] >= nested * 0.999 - 1e-4
    assert outer["busy_s"] <= run["total"]
    inners = [t for t in doc["tasks"] if t["coroutine"] == "inner"]
    assert len(inners) == 2 and all(t["steps"] == 0 for t in inners)
    assert all(loop["ticks"] == 0 for loop in doc["loops"])
