"""aioprof's memory stays bounded: per-task records are capped at `max_tasks`, finished
tasks are folded into their coroutine's row, and the rest is counted, not kept.

The stress test measures process RSS (/proc/self/statm): aioprof allocates with
PyMem_Raw*, which tracemalloc does not see the way it sees Python objects.
"""
from __future__ import annotations

import asyncio
import gc
import os
from typing import Dict

import pytest

import aioprof
from aioprof import _core

SANITIZER = os.environ.get("AIOPROF_SANITIZER", "")
PAGE = os.sysconf("SC_PAGE_SIZE")
MB = 1024 * 1024


@pytest.fixture(autouse=True)
def _profiler_is_left_clean():
    assert not _core.is_active(), "an earlier test left a profiler running"
    yield
    active = _core.is_active()
    if active:
        _core.stop()
    _core.set_fake_clock(False)
    assert not active, "the test left a profiler running"


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def short_name(qualname: str) -> str:
    return qualname.rsplit(".", 1)[-1]


def rows(stats: dict) -> Dict[str, dict]:
    out = {}
    for c in stats["coroutines"]:
        name = short_name(c["coroutine"])
        assert name not in out, f"two coroutine rows named {name}"
        out[name] = c
    return out


# asyncio.run's own tasks: each asyncio.run makes one shutdown_asyncgens and one
# shutdown_default_executor task (Python 3.9+), besides the main task.
ASYNCIO_RUN_INTERNAL = {"shutdown_asyncgens": 1, "shutdown_default_executor": 1}


async def short() -> None:
    await asyncio.sleep(0)   # two steps: up to the bare yield, then to the end


@pytest.mark.slow
def test_200k_short_tasks_bounded_memory() -> None:
    batches, per_batch, keep = 200, 1000, 1000
    total_short = batches * per_batch
    marks: Dict[int, int] = {}

    async def main() -> None:
        for b in range(batches):
            if b in (20, batches // 2):
                gc.collect()
                marks[b] = rss()
            await asyncio.gather(*(short() for _ in range(per_batch)))
        gc.collect()
        marks[batches] = rss()

    with aioprof.Profiler(max_tasks=keep) as p:
        asyncio.run(main())
    stats = p.stats()
    assert stats["warnings"] == []

    by_name = rows(stats)
    assert by_name["short"]["tasks"] == total_short
    assert by_name["short"]["steps"] == 2 * total_short
    assert by_name["main"]["tasks"] == 1
    for name, count in ASYNCIO_RUN_INTERNAL.items():
        assert by_name[name]["tasks"] == count
    seen = total_short + 1 + sum(ASYNCIO_RUN_INTERNAL.values())
    assert sum(c["tasks"] for c in stats["coroutines"]) == seen
    assert len(stats["tasks"]) == keep
    assert stats["dropped_tasks"] == seen - keep
    # the kept records are the first tasks seen: main, then short ones
    assert short_name(stats["tasks"][0]["coroutine"]) == "main"
    assert {short_name(t["coroutine"]) for t in stats["tasks"][1:]} == {"short"}
    assert [t["id"] for t in stats["tasks"]] == list(range(1, keep + 1))

    first_half = marks[batches // 2] - marks[20]
    second_half = marks[batches] - marks[batches // 2]
    assert second_half < 20 * MB, (
        f"RSS grew {second_half / MB:.1f} MB in the second half of the run "
        f"(first half: {first_half / MB:.1f} MB)")


async def _fake_step(n_steps: int) -> None:
    for _ in range(n_steps - 1):
        _core.fake_advance(1000, 700)   # 1 us of wall, 0.7 us of CPU inside each step
        await asyncio.sleep(0)
    _core.fake_advance(1000, 700)


async def _fake_program(n: int) -> None:
    # n tasks of 3 steps; the main task has 1 + n // 50 + 1 steps
    tasks = []
    for i in range(n):
        tasks.append(asyncio.create_task(_fake_step(3)))
        if i % 50 == 49:
            await asyncio.sleep(0)
    await asyncio.gather(*tasks)


def _run_fake(max_tasks: int, n: int) -> dict:
    _core.set_fake_clock(True)
    try:
        with aioprof.Profiler(max_tasks=max_tasks) as p:
            asyncio.run(_fake_program(n))
    finally:
        _core.set_fake_clock(False)
    return p.stats()


@pytest.mark.sanitize
def test_max_tasks_zero_keeps_nothing_per_task_but_aggregates_are_right() -> None:
    n = 200 if SANITIZER else 2000
    none_kept = _run_fake(0, n)
    all_kept = _run_fake(10 * n, n)
    for stats in (none_kept, all_kept):
        assert stats["warnings"] == []
    assert none_kept["tasks"] == []
    seen = n + 1 + sum(ASYNCIO_RUN_INTERNAL.values())
    assert none_kept["dropped_tasks"] == seen
    assert all_kept["dropped_tasks"] == 0 and len(all_kept["tasks"]) == seen

    r0, r1 = rows(none_kept), rows(all_kept)
    assert r0["_fake_step"]["tasks"] == n and r0["_fake_step"]["steps"] == 3 * n
    # the fake clock only moves inside the steps: 1 us per step, exactly
    assert r0["_fake_step"]["busy_s"] == pytest.approx(3 * n * 1e-6, rel=1e-9)
    assert r0["_fake_step"]["max_step_s"] == pytest.approx(1e-6)
    assert r0["_fake_step"]["p50_step_s"] == pytest.approx(1e-6, rel=0.13)
    # the coroutine rows are the same whether or not the per-task records are kept
    assert r0 == r1
    assert none_kept["callbacks"] == all_kept["callbacks"]
    # and they agree with the sum of the kept per-task records
    kept = [t for t in all_kept["tasks"] if short_name(t["coroutine"]) == "_fake_step"]
    assert len(kept) == n
    for field in ("busy_s", "scheduled_s", "idle_s", "cpu_s"):
        assert sum(t[field] for t in kept) == pytest.approx(r1["_fake_step"][field], rel=1e-9, abs=1e-12)
    assert sum(t["steps"] for t in kept) == 3 * n


@pytest.mark.sanitize
def test_dropped_tasks_count_exactly_at_the_limit() -> None:
    n = 30

    async def main() -> None:
        await asyncio.gather(*(short() for _ in range(n)))

    for keep in (0, 1, 10, n + 3, n + 4, 1000):
        with aioprof.Profiler(max_tasks=keep) as p:
            asyncio.run(main())
        stats = p.stats()
        seen = n + 1 + sum(ASYNCIO_RUN_INTERNAL.values())
        assert len(stats["tasks"]) == min(keep, seen)
        assert stats["dropped_tasks"] == seen - min(keep, seen)
        assert rows(stats)["short"]["tasks"] == n


@pytest.mark.sanitize
def test_many_callbacks_and_slow_steps_stay_bounded() -> None:
    """A burst of plain callbacks larger than any internal ring, and every step 'slow'
    (slow_ms=0): the callback row counts them all, the slow-step list stays short."""
    n = 2000 if SANITIZER else 20000

    def cb() -> None:
        pass

    async def main() -> None:
        loop = asyncio.get_running_loop()
        for _ in range(n):
            loop.call_soon(cb)
        await asyncio.sleep(0.001)
        await asyncio.gather(*(short() for _ in range(n // 10)))

    with aioprof.Profiler(slow_ms=0) as p:
        asyncio.run(main())
    stats = p.stats()
    assert stats["warnings"] == []
    [row] = [c for c in stats["callbacks"] if short_name(c["callback"]) == "cb"]
    assert row["count"] == n
    for loop in stats["loops"]:
        assert len(loop["slow_steps"]) <= 1000
        assert loop["slow_total"] >= n


@pytest.mark.sanitize
@pytest.mark.parametrize("keep", [0, 5])
def test_slow_steps_of_tasks_whose_records_are_not_kept(keep: int) -> None:
    """Every step is slow (slow_ms=0) and most finished tasks' records are freed at once
    (max_tasks small): the slow-step list still names real task ids and coroutines."""
    n = 40

    async def main() -> None:
        await asyncio.gather(*(short() for _ in range(n)))

    with aioprof.Profiler(max_tasks=keep, slow_ms=0) as p:
        asyncio.run(main())
    stats = p.stats()
    assert stats["warnings"] == []
    seen = n + 1 + sum(ASYNCIO_RUN_INTERNAL.values())
    names = {short_name(c["coroutine"]) for c in stats["coroutines"]}
    steps = [s for loop in stats["loops"] for s in loop["slow_steps"] if s["kind"] == "step"]
    assert steps
    for s in steps:
        if s["task"] is not None:
            assert 1 <= s["task"] <= seen, f"slow step of an unknown task id: {s}"
            assert short_name(s["coroutine"]) in names, s
