"""Exact figures under aioprof's fake clock.

The fake clock only moves when a test calls ``_core.fake_advance(wall_ns, cpu_ns)``,
so every busy, scheduled and idle figure of these programs is known to the
nanosecond: the tests assert equality, not ranges.
"""
import asyncio
import inspect

import pytest

import aioprof
from aioprof import _core

pytestmark = pytest.mark.sanitize

MS = 1_000_000  # ns


@pytest.fixture
def fake_clock():
    _core.set_fake_clock(True)
    yield _core.fake_advance
    _core.set_fake_clock(False)


def ns(seconds):
    return round(seconds * 1e9)


def line_of(fn, marker):
    src, first = inspect.getsourcelines(fn)
    for i, text in enumerate(src):
        if marker in text:
            return first + i
    raise AssertionError(marker)


def by_name(doc):
    return {t["name"]: t for t in doc["tasks"] if not t["internal"]}


def by_coro(doc, suffix):
    (task,) = [t for t in doc["tasks"] if t["coroutine"].endswith(suffix)]
    return task


async def job(ev_wait, ev_set, adv, first, second):
    adv(first * MS, first * MS // 2)
    if ev_wait is not None:
        await ev_wait.wait()  # [WAIT]
    if ev_set is not None:
        ev_set.set()
    adv(second * MS, 0)


async def two_jobs(adv):
    e = asyncio.Event()
    a = asyncio.create_task(job(e, None, adv, 5, 2), name="A")  # [CREATE_A]
    b = asyncio.create_task(job(None, e, adv, 3, 1), name="B")
    await asyncio.gather(a, b)  # [GATHER]


def profile(fn, **kw):
    kw.setdefault("cpu_window_ms", 1e-6)   # read the (fake) CPU clock at every handle
    with aioprof.Profiler(**kw) as p:
        fn()
    return p.stats()


def test_busy_scheduled_idle_exact(fake_clock):
    # Timeline (ms): A runs 0-5 then waits on the event; B becomes ready at 0 and
    # runs 5-9, setting the event at 8 (A ready at 8); A runs again 9-11.
    doc = profile(lambda: asyncio.run(two_jobs(fake_clock)))
    t = by_name(doc)
    a, b, main = t["A"], t["B"], by_coro(doc, "two_jobs")

    assert (a["steps"], ns(a["busy_s"]), ns(a["scheduled_s"]), ns(a["idle_s"])) == (2, 7 * MS, 1 * MS, 3 * MS)
    assert (b["steps"], ns(b["busy_s"]), ns(b["scheduled_s"]), ns(b["idle_s"])) == (1, 4 * MS, 5 * MS, 0)
    assert (main["steps"], ns(main["busy_s"]), ns(main["idle_s"])) == (2, 0, 11 * MS)
    assert ns(a["max_step_s"]) == 5 * MS and ns(b["max_step_s"]) == 4 * MS
    assert ns(a["start_s"]) == 0 and ns(a["first_step_s"]) == 0 and ns(a["end_s"]) == 11 * MS
    assert ns(b["first_step_s"]) == 5 * MS and ns(b["end_s"]) == 9 * MS
    for task in (a, b, main):
        life = ns(task["end_s"]) - ns(task["start_s"])
        assert ns(task["busy_s"]) + ns(task["scheduled_s"]) + ns(task["idle_s"]) == life
        assert task["state"] == "done" and task["exception"] is None

    # CPU: half of each first step, none of the second.
    assert ns(a["cpu_s"]) == 2_500_000 and ns(b["cpu_s"]) == 1_500_000

    # Await sites: A waited 3 ms at the event, main 11 ms at the gather.
    wait_line = line_of(job, "# [WAIT]")
    (site,) = a["await_sites"]
    assert (site["line"], site["count"], ns(site["idle_s"])) == (wait_line, 1, 3 * MS)
    assert [c["line"] for c in site["chain"]] == [wait_line]
    (msite,) = main["await_sites"]
    assert (msite["line"], ns(msite["idle_s"])) == (line_of(two_jobs, "# [GATHER]"), 11 * MS)

    # Creation sites and parents.
    assert a["created_at"]["line"] == line_of(two_jobs, "# [CREATE_A]")
    assert a["created_at"]["function"] == "two_jobs"
    assert a["parent"] == main["id"] and b["parent"] == main["id"]

    # The coroutine row folds both tasks.
    row = next(c for c in doc["coroutines"] if c["coroutine"] == "job")
    assert (row["tasks"], row["steps"]) == (2, 3)
    assert (ns(row["busy_s"]), ns(row["scheduled_s"]), ns(row["idle_s"])) == (11 * MS, 6 * MS, 3 * MS)
    assert ns(row["cpu_s"]) == 4 * MS and ns(row["max_step_s"]) == 5 * MS

    # The loop: every fake millisecond passed inside a tick, none in select.
    (loop,) = doc["loops"]
    assert ns(loop["busy_s"]) == 11 * MS and ns(loop["select_wait_s"]) == 0
    assert loop["utilization"] == 1.0


def test_sites_charge_outer_frames(fake_clock):
    async def inner(ev):
        await ev.wait()  # [INNER]

    async def outer(ev):
        await inner(ev)  # [OUTER]

    async def setter(ev):
        fake_clock(4 * MS)
        ev.set()

    async def main():
        ev = asyncio.Event()
        await asyncio.gather(outer(ev), setter(ev))

    doc = profile(lambda: asyncio.run(main()))
    # 3.10 code objects know only their plain name (no co_qualname): compare that part.
    sites = {(s["function"].rsplit(".", 1)[-1], s["line"]): s for s in doc["sites"]}
    i_line, o_line = line_of(inner, "# [INNER]"), line_of(outer, "# [OUTER]")
    i_site = sites[("inner", i_line)]
    o_site = sites[("outer", o_line)]
    assert (i_site["count"], ns(i_site["idle_s"]), i_site["innermost_count"]) == (1, 4 * MS, 1)
    assert (o_site["count"], ns(o_site["idle_s"]), o_site["innermost_count"]) == (1, 4 * MS, 0)
    task = next(t for t in doc["tasks"] if t["coroutine"].endswith("outer"))
    assert [c["line"] for c in task["await_sites"][0]["chain"]] == [o_line, i_line]


def test_pending_task_counted_to_snapshot(fake_clock):
    async def sleeper(ev):
        await ev.wait()

    async def main():
        ev = asyncio.Event()
        t = asyncio.create_task(sleeper(ev), name="S")
        await asyncio.sleep(0)
        fake_clock(7 * MS)
        doc = p.stats()   # inside the run: S is suspended, main is running
        ev.set()
        await t
        return doc

    with aioprof.Profiler(cpu_window_ms=1e-6) as p:
        doc = asyncio.run(main())
    s = by_name(doc)["S"]
    assert s["state"] == "pending" and s["end_s"] is None
    assert ns(s["idle_s"]) == 7 * MS and s["await_sites"][0]["count"] == 1
    main_task = by_coro(doc, "main")
    assert ns(main_task["busy_s"]) == 7 * MS   # its running step, up to the snapshot
    assert ns(doc["wall_s"]) == 7 * MS


def test_slow_steps_and_ticks(fake_clock):
    doc = profile(lambda: asyncio.run(two_jobs(fake_clock)), slow_ms=4)
    (loop,) = doc["loops"]
    steps = [s for s in loop["slow_steps"] if s["kind"] == "step"]
    assert [ns(s["duration_s"]) for s in steps] == [5 * MS, 4 * MS]
    assert steps[0]["coroutine"] == "job"
    assert steps[0]["step_end"]["line"] == line_of(job, "# [WAIT]")
    assert next(c for c in doc["coroutines"] if c["coroutine"] == "job")["slow_steps"] == 2
    wait_site = next(s for s in doc["sites"] if s["line"] == line_of(job, "# [WAIT]"))
    assert wait_site["slow_steps"] == 1   # A's first step ended suspended there; B's ended done
    ticks = [s for s in loop["slow_steps"] if s["kind"] == "tick"]
    assert ticks and ns(ticks[0]["duration_s"]) == 9 * MS and ticks[0]["handles"] >= 2


def test_yields_cost_no_idle(fake_clock):
    async def spinner():
        for _ in range(10):
            fake_clock(1 * MS)
            await asyncio.sleep(0)

    async def main():
        await asyncio.create_task(spinner())

    doc = profile(lambda: asyncio.run(main()))
    t = by_coro(doc, "spinner")
    assert t["steps"] == 11 and t["yields"] == 10
    assert ns(t["busy_s"]) == 10 * MS and ns(t["idle_s"]) == 0


def test_max_tasks_folds_into_aggregates(fake_clock):
    async def tiny():
        fake_clock(1 * MS)

    async def main():
        await asyncio.gather(*(tiny() for _ in range(50)))

    doc = profile(lambda: asyncio.run(main()), max_tasks=10)
    row = next(c for c in doc["coroutines"] if c["coroutine"].endswith("tiny"))
    assert row["tasks"] == 50 and row["steps"] == 50 and ns(row["busy_s"]) == 50 * MS
    assert len(doc["tasks"]) == 10
    assert doc["dropped_tasks"] == 50 + 3 - 10   # + main and asyncio.run's two shutdown tasks


def test_histogram_quantiles():
    assert _core.hist_quantiles([5] * 10, [0.5, 1.0]) == [5, 5]
    values = list(range(1, 1001))
    p50, p99, top = _core.hist_quantiles([v * 1000 for v in values], [0.5, 0.99, 1.0])
    assert abs(p50 - 500_000) <= 500_000 * 0.125
    assert abs(p99 - 990_000) <= 990_000 * 0.125
    assert top == 1_000_000
    assert _core.hist_quantiles([], [0.5]) == [0]


try:
    from hypothesis import given, settings, strategies as st
except ImportError:  # pragma: no cover - hypothesis is a test dependency
    given = None

if given is not None:

    @settings(max_examples=60, deadline=None)
    @given(st.lists(st.lists(st.integers(0, 4), min_size=1, max_size=5), min_size=1, max_size=5),
           st.integers(0, 3))
    def test_invariants_random_programs(plans, waiter_ms):
        """Random tasks that burn fake time and yield; one waits on the last to finish."""
        _core.set_fake_clock(True)
        try:
            async def worker(plan):
                for ms in plan:
                    _core.fake_advance(ms * MS, ms * MS)
                    await asyncio.sleep(0)

            async def waiter(t):
                _core.fake_advance(waiter_ms * MS)
                await t

            async def main():
                tasks = [asyncio.create_task(worker(p)) for p in plans]
                w = asyncio.create_task(waiter(tasks[-1]))
                await asyncio.gather(*tasks, w)

            doc = profile(lambda: asyncio.run(main()))
        finally:
            _core.set_fake_clock(False)
        workers = [t for t in doc["tasks"] if t["coroutine"].endswith("worker")]
        assert len(workers) == len(plans)
        for plan, t in zip(plans, workers):   # tasks are listed in first-seen order
            assert ns(t["busy_s"]) == sum(plan) * MS
            assert ns(t["cpu_s"]) == sum(plan) * MS
            assert t["steps"] == len(plan) + 1 and t["yields"] == len(plan)
            assert ns(t["idle_s"]) == 0
        for t in doc["tasks"]:
            life = ns(t["end_s"]) - ns(t["start_s"])
            assert ns(t["busy_s"]) + ns(t["scheduled_s"]) + ns(t["idle_s"]) == life
        total = sum(map(sum, plans)) * MS + waiter_ms * MS
        assert sum(ns(t["busy_s"]) for t in doc["tasks"]) == total
        (loop,) = doc["loops"]
        assert ns(loop["busy_s"]) == total == ns(doc["wall_s"])
        w = next(t for t in doc["tasks"] if t["coroutine"].endswith("waiter"))
        assert ns(w["idle_s"]) == ns(workers[-1]["end_s"]) - ns(w["first_step_s"]) - waiter_ms * MS
