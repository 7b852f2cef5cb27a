"""Every way a task or callback gets onto the ready queue is measured, on every version.

3.14 changed two of them: `call_soon_threadsafe` builds an `events._ThreadSafeHandle` and
appends it to `_ready` itself, without `_call_soon`; and the C `_asyncio` module (the
`Task` and `Future` of 3.12+) schedules a task's steps and a future's callbacks through
`loop.call_soon`, looked up by name (`PyObject_VectorcallMethod(call_soon)` in
Modules/_asynciomodule.c), so through `BaseEventLoop._call_soon`. Under the fake clock the
figures are exact.
"""
import asyncio
import threading

import pytest
from test_fake_clock import MS, fake_clock, ns  # noqa: F401  (fake_clock: the fixture)

import aioprof

pytestmark = pytest.mark.sanitize


def profile(fn):
    with aioprof.Profiler(cpu_window_ms=1e-6) as p:
        result = fn()
    return result, p.stats()


def from_thread_cb(adv, n):
    adv(n * MS, 0)


async def threadsafe_main(adv):
    loop = asyncio.get_running_loop()
    done = loop.create_future()

    def worker():
        for n in (1, 2, 4):
            loop.call_soon_threadsafe(from_thread_cb, adv, n)
        loop.call_soon_threadsafe(done.set_result, "ok")

    th = threading.Thread(target=worker)
    th.start()
    result = await done
    th.join()
    return result


def test_call_soon_threadsafe_callbacks_counted_once_with_their_name(fake_clock):
    result, doc = profile(lambda: asyncio.run(threadsafe_main(fake_clock)))
    assert result == "ok"
    cbs = {c["callback"]: c for c in doc["callbacks"]}
    cb = cbs["from_thread_cb"]
    # Three handles, 1 + 2 + 4 ms of (fake) time: each counted once, under its own name.
    assert (cb["count"], ns(cb["busy_s"])) == (3, 7 * MS), cbs
    assert not any("ThreadSafe" in name or name.endswith("Handle._run") for name in cbs), cbs
    (loop,) = doc["loops"]
    assert ns(loop["busy_s"]) == 7 * MS


async def sleeper(adv):
    await asyncio.sleep(0)      # the task's next step, queued by Task itself
    adv(1 * MS, 0)


async def waiter(fut, adv):
    await fut                   # woken by the future's done callback
    adv(2 * MS, 0)


async def wakeups_main(adv):
    loop = asyncio.get_running_loop()
    fut = loop.create_future()
    s = asyncio.create_task(sleeper(adv), name="S")
    w = asyncio.create_task(waiter(fut, adv), name="W")
    await asyncio.sleep(0)      # S and W have run their first steps: both wait
    fut.set_result(None)        # W ready now; S is ready since its first step
    adv(3 * MS, 0)              # before either runs: 3 ms of scheduled time for each
    await asyncio.gather(s, w)
    return type(s).__module__


def test_c_task_steps_and_future_wakeups_measured(fake_clock):
    module, doc = profile(lambda: asyncio.run(wakeups_main(fake_clock)))
    if hasattr(asyncio.tasks, "_CTask"):
        assert module == "_asyncio"   # the C Task: the path this test is about
    tasks = {t["name"]: t for t in doc["tasks"] if not t["internal"]}
    s, w = tasks["S"], tasks["W"]
    # S: ready from its first step's end (0) until it runs at 3 ms; then W after S's 1 ms.
    assert (s["steps"], ns(s["busy_s"]), ns(s["scheduled_s"])) == (2, 1 * MS, 3 * MS)
    assert (w["steps"], ns(w["busy_s"]), ns(w["scheduled_s"])) == (2, 2 * MS, 4 * MS)
