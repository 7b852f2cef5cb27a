"""CPU time is never above busy time, for any task, coroutine or callback.

aioprof reads the thread's CPU clock about once per `cpu_window` and shares each window's
CPU among the handles that ran in it, in proportion to their wall time (docs/metrics.md,
"CPU time"). Select waits have no share, but they can use the CPU (selectors' own Python
code around poll(), many ready events): that CPU must not be handed to the steps.
"""
import asyncio
import select

import pytest
from hypothesis import given, settings, strategies as st

import aioprof
from aioprof import _core
from test_fake_clock import MS, ns

ROWS = ("tasks", "coroutines", "callbacks")


class FakePoll:
    """Stands in for a selector's epoll object: each poll() first moves the fake clock by
    the next (wall, cpu) of its plan, inside the select wait that aioprof measures."""

    def __init__(self, real: "select.epoll", plan):
        self._real, self._plan = real, iter(plan)

    def poll(self, *args):
        wall, cpu = next(self._plan, (0, 0))
        _core.fake_advance(wall, cpu)
        return self._real.poll(*args)

    def __getattr__(self, name):
        return getattr(self._real, name)


def steps_st():
    """(wall, cpu) of a step or a select, in µs, cpu <= wall."""
    return st.integers(0, 3000).flatmap(lambda w: st.tuples(st.just(w), st.integers(0, w)))


def run_plan(task_plans, cb_plans, select_plan, window):
    async def worker(plan):
        for wall, cpu in plan:
            _core.fake_advance(wall * 1000, cpu * 1000)
            await asyncio.sleep(0)

    def callback(wall, cpu):
        _core.fake_advance(wall * 1000, cpu * 1000)

    async def main():
        loop = asyncio.get_running_loop()
        sel = loop._selector
        if not hasattr(sel, "_selector") or not hasattr(sel._selector, "poll"):
            pytest.skip(f"the loop's selector is {type(sel).__name__}, not a poll-like one")
        sel._selector = FakePoll(sel._selector, [(w * 1000, c * 1000) for w, c in select_plan])
        for wall, cpu in cb_plans:
            loop.call_soon(callback, wall, cpu)
        await asyncio.gather(*(worker(p) for p in task_plans))

    _core.set_fake_clock(True)
    try:
        with aioprof.Profiler(cpu_window_ms=window * 1e3) as p:
            asyncio.run(main())
    finally:
        _core.set_fake_clock(False)
    return p.stats()


def assert_cpu_within_busy(doc):
    for kind in ROWS:
        for row in doc[kind]:
            assert ns(row["cpu_s"]) <= ns(row["busy_s"]), (kind, row)


@pytest.mark.sanitize
def test_select_cpu_is_no_steps_cpu():
    """One window (10 ms): a 1 ms step that used 1 ms of CPU and a select wait of 1 ms that
    used 0.5 ms. Shared in proportion to wall time the step would get 1.5 ms."""
    doc = run_plan([[(1000, 1000)]], [], [(1000, 500)] * 4, 0.010)
    (w,) = [t for t in doc["tasks"] if t["coroutine"].endswith("worker")]
    assert ns(w["busy_s"]) == 1 * MS and ns(w["cpu_s"]) == 1 * MS
    assert_cpu_within_busy(doc)


@pytest.mark.sanitize
@settings(deadline=None)   # max_examples: the profile's (fewer under the sanitizers)
@given(st.lists(st.lists(steps_st(), max_size=4), min_size=1, max_size=4),
       st.lists(steps_st(), max_size=3),
       st.lists(steps_st(), max_size=12),
       st.sampled_from([1e-9, 1e-4, 1e-3, 5e-3]))
def test_cpu_never_above_busy(task_plans, cb_plans, select_plan, window):
    """Random steps, callbacks and select waits, each using some CPU (at most its wall
    time), under every CPU window: no row gets more CPU than its busy time, and no more
    CPU is handed out than the program used."""
    doc = run_plan(task_plans, cb_plans, select_plan, window)
    assert_cpu_within_busy(doc)
    used = sum(c for p in task_plans for _, c in p) + sum(c for _, c in cb_plans) + sum(c for _, c in select_plan)
    assert sum(ns(t["cpu_s"]) for t in doc["tasks"]) <= used * 1000


def test_executor_round_trips_real():
    """Many run_in_executor round trips, real clocks: many short select waits with ready
    events between short steps. Every row's CPU is within its busy time."""
    def f():
        return sum(range(50))

    done_at_await = 0   # the program's own count of awaits that did not suspend

    async def worker(n):
        nonlocal done_at_await
        loop = asyncio.get_running_loop()
        for _ in range(n):
            fut = loop.run_in_executor(None, f)
            # 3.14's wrap_future copies a result that is there already at once (f can end
            # before submit returns): that await does not suspend, no step follows it.
            done_at_await += fut.done()
            await fut

    async def main():
        await asyncio.gather(*(worker(400) for _ in range(8)))

    with aioprof.Profiler() as p:
        asyncio.run(main())
    doc = p.stats()
    assert doc["warnings"] == []
    rows = [r for kind in ROWS for r in doc[kind]]
    assert sum(r["steps"] for r in doc["tasks"] if r["coroutine"].endswith("worker")) == 8 * 401 - done_at_await
    over = [(r.get("coroutine") or r.get("callback"), r["cpu_s"], r["busy_s"]) for r in rows
            if ns(r["cpu_s"]) > ns(r["busy_s"])]
    assert over == []
