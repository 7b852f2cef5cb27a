"""Eager first steps (3.12+), exactly, under the fake clock.

A task made with ``Task(coro, loop=loop, eager_start=True)`` (aiohttp's request handlers
on 3.12+), by ``asyncio.eager_task_factory`` or by ``create_task(..., eager_start=True)``
(3.13... where the loop accepts it) runs its first step inside ``Task()``: no handle and
no ``call_soon``. That step is the task's (busy, CPU, its first suspension idle at its
await line), not the creator's: per-task busy times add up to the loop's.
"""
import asyncio
import sys

import pytest

import aioprof
from test_fake_clock import MS, fake_clock, line_of, ns  # noqa: F401  (fake_clock: a fixture)

pytestmark = [pytest.mark.sanitize,
              pytest.mark.skipif(sys.version_info < (3, 12), reason="eager tasks are new in 3.12")]


def profile(fn):
    with aioprof.Profiler(cpu_window_ms=1e-6, slow_ms=4) as p:   # CPU read at every handle
        fn()
    doc = p.stats()
    assert doc["warnings"] == []
    return doc


def task_named(doc, name):
    (t,) = [t for t in doc["tasks"] if t["name"] == name]
    return t


def main_task(doc):
    (t,) = [t for t in doc["tasks"] if t["coroutine"].endswith("main")]
    return t


def check_lifetimes(doc):
    for t in doc["tasks"]:
        life = ns(t["end_s"]) - ns(t["start_s"])
        assert ns(t["busy_s"]) + ns(t["scheduled_s"]) + ns(t["idle_s"]) == life, t
        assert ns(t["cpu_s"]) <= ns(t["busy_s"]), t


async def child(adv, ev):
    adv(2 * MS, 1 * MS)    # the eager first step: 2 ms, 1 ms of it CPU
    await ev.wait()  # [CHILD_WAIT]
    adv(1 * MS, 0)


def make_task_eager(coro, name):
    return asyncio.Task(coro, loop=asyncio.get_running_loop(), eager_start=True, name=name)  # [TASK]


@pytest.mark.parametrize("how", ["Task", "factory", "PyTask"])
def test_eager_first_step_and_first_wait(fake_clock, how):
    """Timeline (ms): main creates E at 0; E's eager step runs 0-2 and waits on the event;
    main goes on to 5, yields, runs 5-10 and sets the event (E ready at 10); E runs
    10-11. E: 2 steps, busy 3, idle 8 at its await line; main's busy excludes E's step."""
    async def main():
        ev = asyncio.Event()
        if how == "Task":
            t = make_task_eager(child(fake_clock, ev), "E")
        elif how == "PyTask":
            loop = asyncio.get_running_loop()
            t = asyncio.tasks._PyTask(child(fake_clock, ev), loop=loop, eager_start=True, name="E")  # [PYTASK]
        else:
            asyncio.get_running_loop().set_task_factory(asyncio.eager_task_factory)
            t = asyncio.create_task(child(fake_clock, ev), name="E")  # [FACTORY]
        fake_clock(3 * MS)
        await asyncio.sleep(0)
        fake_clock(5 * MS)
        ev.set()
        await t

    doc = profile(lambda: asyncio.run(main()))
    e, m = task_named(doc, "E"), main_task(doc)
    assert (e["steps"], ns(e["busy_s"]), ns(e["scheduled_s"]), ns(e["idle_s"])) == (2, 3 * MS, 0, 8 * MS)
    assert ns(e["cpu_s"]) == 1 * MS and ns(e["max_step_s"]) == 2 * MS
    assert ns(e["start_s"]) == 0 and ns(e["first_step_s"]) == 0 and ns(e["end_s"]) == 11 * MS
    (site,) = e["await_sites"]
    assert (site["line"], site["count"], ns(site["idle_s"])) == (line_of(child, "[CHILD_WAIT]"), 1, 8 * MS)
    # Created where the program made it, by main.
    marker = {"Task": (make_task_eager, "[TASK]"), "PyTask": (main, "[PYTASK]"),
              "factory": (main, "[FACTORY]")}[how]
    assert e["created_at"]["line"] == line_of(*marker)
    assert e["parent"] == m["id"]
    # main: 0-5 and 5-10 busy less E's 2 ms, which it waited for (scheduled); idle 10-11
    # awaiting E. CPU: none of E's.
    assert (m["steps"], ns(m["busy_s"]), ns(m["scheduled_s"]), ns(m["idle_s"])) == (3, 8 * MS, 2 * MS, 1 * MS)
    assert ns(m["cpu_s"]) == 0
    # The busy times add up to the loop's (no step is counted twice).
    (loop,) = doc["loops"]
    assert sum(ns(t["busy_s"]) for t in doc["tasks"]) == ns(loop["busy_s"]) == 11 * MS
    check_lifetimes(doc)
    # The slow steps (>= 4 ms) are main's 5 ms ones, not its first (3 ms without E's).
    steps = [s for s in loop["slow_steps"] if s["kind"] == "step"]
    assert sorted(ns(s["duration_s"]) for s in steps) == [5 * MS]
    row = next(c for c in doc["coroutines"] if c["coroutine"] == "child")
    assert (row["tasks"], row["steps"], ns(row["busy_s"]), ns(row["idle_s"])) == (1, 2, 3 * MS, 8 * MS)


async def finisher(adv, ms):
    adv(ms * MS, ms * MS)


async def yielder(adv):
    adv(1 * MS, 0)
    await asyncio.sleep(0)
    adv(1 * MS, 0)


async def nester(adv, ev):
    adv(1 * MS, 0)
    inner = make_task_eager(child(adv, ev), "inner")   # [NESTED] inner runs 1-3
    adv(1 * MS, 0)
    await inner  # [NESTER_WAIT]


def test_eager_finished_yielded_nested_and_slow(fake_clock):
    """Eager steps that finish, that yield (sleep(0)), that create an eager task of their
    own, and one long enough to be a slow step of its task (not of main)."""
    async def main():
        ev = asyncio.Event()
        done = make_task_eager(finisher(fake_clock, 1), "done")      # 0-1, finished
        slow = make_task_eager(finisher(fake_clock, 6), "slow")      # 1-7, finished, slow
        yld = make_task_eager(yielder(fake_clock), "yield")          # 7-8, ready again
        nest = make_task_eager(nester(fake_clock, ev), "nest")       # 8-9, inner 9-11, 11-12
        assert done.done() and slow.done() and not yld.done()
        fake_clock(2 * MS)                                           # main: 12-14
        await asyncio.sleep(0)
        ev.set()
        await asyncio.gather(yld, nest)

    doc = profile(lambda: asyncio.run(main()))
    done, slow, yld = task_named(doc, "done"), task_named(doc, "slow"), task_named(doc, "yield")
    nest, inner, m = task_named(doc, "nest"), task_named(doc, "inner"), main_task(doc)
    assert (done["steps"], ns(done["busy_s"]), ns(done["cpu_s"]), done["state"]) == (1, 1 * MS, 1 * MS, "done")
    assert (slow["steps"], ns(slow["busy_s"]), ns(slow["cpu_s"])) == (1, 6 * MS, 6 * MS)
    assert ns(done["end_s"]) == 1 * MS and ns(slow["end_s"]) == 7 * MS
    # The yielder is ready again at 8, when its eager step ends; main runs until 14.
    assert (yld["steps"], yld["yields"], ns(yld["busy_s"])) == (2, 1, 2 * MS)
    assert ns(yld["scheduled_s"]) == 6 * MS and ns(yld["idle_s"]) == 0
    # inner is nest's child, created at nest's line, and nest's busy excludes inner's step.
    assert inner["parent"] == nest["id"] and nest["parent"] == m["id"]
    assert inner["created_at"]["line"] == line_of(make_task_eager, "[TASK]")
    assert ns(inner["first_step_s"]) == 9 * MS and inner["steps"] == 2
    assert (nest["steps"], ns(nest["first_step_s"])) == (2, 8 * MS)
    assert ns(nest["busy_s"]) == 2 * MS
    assert nest["await_sites"][0]["line"] == line_of(nester, "[NESTER_WAIT]")
    # main: 0-14 less the eager steps (1 + 6 + 1 + 4) = 2 ms, which it waited for
    # (scheduled), as it did for yield's second step (14-15); nest waited for inner.
    assert ns(m["busy_s"]) == 2 * MS and ns(m["cpu_s"]) == 0
    assert ns(m["scheduled_s"]) == 13 * MS and ns(nest["scheduled_s"]) == 2 * MS
    (loop,) = doc["loops"]
    assert sum(ns(t["busy_s"]) for t in doc["tasks"]) == ns(loop["busy_s"])
    check_lifetimes(doc)
    slow_steps = [s for s in loop["slow_steps"] if s["kind"] == "step"]
    assert [(ns(s["duration_s"]), s["task"]) for s in slow_steps] == [(6 * MS, slow["id"])]


def test_eager_from_a_callback(fake_clock):
    """An eager task started by a plain callback: the callback's busy time excludes it."""
    async def main():
        ev = asyncio.Event()
        holder = []

        def cb():
            fake_clock(1 * MS, 1 * MS)
            holder.append(make_task_eager(child(fake_clock, ev), "E"))
            fake_clock(1 * MS, 1 * MS)

        asyncio.get_running_loop().call_soon(cb)
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        ev.set()
        await holder[0]

    doc = profile(lambda: asyncio.run(main()))
    e = task_named(doc, "E")
    assert (e["steps"], ns(e["busy_s"]), ns(e["cpu_s"])) == (2, 3 * MS, 1 * MS)
    (row,) = [c for c in doc["callbacks"] if c["callback"].split(".")[-1] == "cb"]
    assert (row["count"], ns(row["busy_s"]), ns(row["cpu_s"])) == (1, 2 * MS, 2 * MS)
    check_lifetimes(doc)
