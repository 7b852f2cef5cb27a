"""Under uvloop: task figures are measured, the loop figures uvloop cannot give are null
(never 0), the program's results are unchanged, and uvloop.Loop is restored at stop."""
import asyncio
import inspect
import os
import time

import pytest

import aioprof

uvloop = pytest.importorskip("uvloop")

# Under ASan or valgrind the program runs many times slower: timing bounds scale up.
SLACK = 10 if os.environ.get("AIOPROF_SANITIZER") else 1


async def blocker(i):
    time.sleep(0.02 * i)
    await asyncio.sleep(0.05)  # [AWAIT]
    return i


async def main():
    return await asyncio.gather(*(blocker(i) for i in (1, 2, 3)))  # [GATHER]


def line(marker, fn):
    src, first = inspect.getsourcelines(fn)
    return first + next(i for i, text in enumerate(src) if marker in text)


def run_uvloop(coro_fn):
    loop = uvloop.new_event_loop()
    try:
        return loop.run_until_complete(coro_fn())
    finally:
        loop.close()


@pytest.mark.sanitize
def test_task_figures_under_uvloop():
    assert "call_soon" not in uvloop.Loop.__dict__
    with aioprof.Profiler() as p:
        result = run_uvloop(main)
    assert result == [1, 2, 3]
    assert "call_soon" not in uvloop.Loop.__dict__    # the hook is gone again
    doc = p.stats()
    tasks = [t for t in doc["tasks"] if t["coroutine"] == "blocker"]
    assert len(tasks) == 3
    for i, t in enumerate(tasks, 1):
        assert t["steps"] == 2 and t["state"] == "done"
        assert t["busy_s"] == pytest.approx(0.02 * i, abs=0.015 * SLACK)
        # Each waits behind the blocking first steps of the ones before it.
        assert t["scheduled_s"] == pytest.approx(0.02 * (i - 1) * i / 2, abs=0.02 * SLACK)
        assert t["created_at"]["line"] == line("# [GATHER]", main)
        (site,) = t["await_sites"]
        assert site["line"] == line("# [AWAIT]", blocker) and site["count"] == 1
        life = t["end_s"] - t["start_s"]
        assert t["busy_s"] + t["scheduled_s"] + t["idle_s"] == pytest.approx(life, abs=1e-6)
    (loop,) = doc["loops"]
    for key in ("ticks", "select_calls", "select_wait_s", "wall_s", "busy_s", "utilization", "load"):
        assert loop[key] is None, key
    assert loop["lag_max_s"] is not None and loop["lag_count"] >= 6


@pytest.mark.sanitize
def test_uvloop_shutdown_tasks_are_internal():
    async def nothing():
        return 5

    with aioprof.Profiler() as p:
        assert uvloop.run(nothing()) == 5 if hasattr(uvloop, "run") else True
    internal = [t["coroutine"] for t in p.stats()["tasks"] if t["internal"]]
    if hasattr(uvloop, "run"):   # Cython's code objects carry the plain name
        assert any(name.endswith("shutdown_asyncgens") for name in internal), internal


def test_loop_monitor_on_uvloop_reports_unavailable():
    loop = uvloop.new_event_loop()
    try:
        with aioprof.LoopMonitor(loop) as mon:
            loop.run_until_complete(asyncio.sleep(0.01))
            assert mon.available is False
            assert mon.load() is None
            stats = mon.stats()
            assert stats["load"] is None and stats["ticks"] is None and stats["age_s"] > 0
    finally:
        loop.close()
