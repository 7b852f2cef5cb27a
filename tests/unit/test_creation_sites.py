"""Where a task was created: the line of the program that asked for it.

asyncio's frames are skipped, and so are a task factory's (the loop's `_task_factory`,
called from `BaseEventLoop.create_task`): the site is the `create_task` line. A task
that no line of the program created (a callback that is `loop.create_task` or
`asyncio.ensure_future` itself, compiled code) names what made it, with no line; never
a line further out such as the `asyncio.run(...)` that runs the loop.
"""
import asyncio
import functools
import io
import sys

import pytest

import aioprof
from aioprof import report
from test_fake_clock import line_of

pytestmark = pytest.mark.sanitize

HERE = __file__


def profile(fn):
    with aioprof.Profiler() as p:
        fn()
    doc = p.stats()
    assert doc["warnings"] == []
    return doc


def created(doc, name):
    (t,) = [t for t in doc["tasks"] if t["name"] == name]
    return t["created_at"]


async def work():
    await asyncio.sleep(0)


def make_task(loop, coro, **kw):
    return asyncio.Task(coro, loop=loop, **kw)  # [HELPER]


def factory(loop, coro, **kw):
    return asyncio.Task(coro, loop=loop, **kw)  # [FACTORY]


def factory_with_helper(loop, coro, **kw):
    return make_task(loop, coro, **kw)


class FactoryObject:
    def __call__(self, loop, coro, **kw):
        return factory(loop, coro, **kw)


async def with_factories():
    loop = asyncio.get_running_loop()
    loop.set_task_factory(factory)
    a = asyncio.create_task(work(), name="a")  # [A]
    b = loop.create_task(work(), name="b")  # [B]
    loop.set_task_factory(factory_with_helper)
    c = asyncio.ensure_future(work())  # [C]
    c.set_name("c")
    loop.set_task_factory(FactoryObject())
    d = asyncio.create_task(work(), name="d")  # [D]
    tasks = [a, b, c, d]
    if sys.version_info >= (3, 11):
        async with asyncio.TaskGroup() as tg:
            tasks.append(tg.create_task(work(), name="e"))  # [E]
    loop.set_task_factory(None)
    direct = asyncio.Task(work(), name="direct")  # [DIRECT]
    await asyncio.gather(*tasks, direct)


def test_task_factory_frames_are_skipped():
    doc = profile(lambda: asyncio.run(with_factories()))
    names = "abcde" if sys.version_info >= (3, 11) else "abcd"
    for name in names:
        site = created(doc, name)
        assert (site["file"], site["line"]) == (HERE, line_of(with_factories, f"[{name.upper()}]")), name
        assert site["function"].endswith("with_factories")
    # A Task() made by hand is created there, factories or not.
    assert created(doc, "direct")["line"] == line_of(with_factories, "[DIRECT]")


async def by_callbacks():
    loop = asyncio.get_running_loop()
    made = []

    def callback():
        made.append(loop.create_task(work(), name="in_callback"))  # [CALLBACK]

    loop.call_soon(loop.create_task, work())
    loop.call_soon(functools.partial(loop.create_task, work(), name="partial"))
    loop.call_later(0.001, asyncio.ensure_future, work())
    loop.call_soon(callback)
    await asyncio.sleep(0.01)
    await asyncio.gather(*made)


def test_tasks_made_by_callbacks_name_the_callback():
    def program():
        asyncio.run(by_callbacks())  # [RUN]

    doc = profile(program)
    works = [t for t in doc["tasks"] if t["coroutine"].endswith("work")]
    assert len(works) == 4
    by_name = {t["name"]: t["created_at"] for t in works}
    # A Python callback of the program created it: its line.
    assert by_name.pop("in_callback")["line"] == line_of(by_callbacks, "[CALLBACK]")
    run_line = line_of(program, "[RUN]")
    # No line of the program did: the callback that did, no line (3.10: no class in names).
    functions = sorted(site["function"].rsplit(".", 1)[-1] for site in by_name.values())
    assert functions == ["create_task", "create_task", "ensure_future"], by_name
    for site in by_name.values():
        assert site["line"] is None and site["line"] != run_line
        assert site["file"].endswith(("base_events.py", "tasks.py")), site
    # The main task is still created at the asyncio.run() line.
    (main,) = [t for t in doc["tasks"] if t["coroutine"].endswith("by_callbacks")]
    assert main["created_at"]["line"] == run_line
    # The text report names the callback, in parentheses.
    buf = io.StringIO()
    report.write(doc, format="text", file=buf, by="task", width=200)
    assert buf.getvalue().count("create_task)") == 2 and "(ensure_future)" in buf.getvalue()
