"""With aioprof running, an asyncio program behaves exactly as without it.

Each scenario runs twice through `both()`: once plain and once under `aioprof.Profiler()`,
from the same call site, so that even tracebacks and stacks can be compared whole. The
outcome (return value, or exception type, args and traceback) must be equal, the profiler
must not have faulted, and where it makes sense the profiler must have seen the tasks.

The scenarios are module-level coroutines so that the uvloop test can run them again on
another event loop (where aioprof's hooks never fire: behaviour only, no figures).
"""
from __future__ import annotations

import asyncio
import contextvars
import functools
import gc
import logging
import os
import re
import selectors
import sys
import threading
import time
import traceback
import types
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Dict, List, Tuple

import pytest

import aioprof
from aioprof import _core

PY311 = sys.version_info >= (3, 11)
PY312 = sys.version_info >= (3, 12)


# --------------------------------------------------------------------------- helpers

def hooked_methods() -> Dict[str, Any]:
    """The class-dict entries aioprof replaces while it runs (the raw objects, not getattr)."""
    import asyncio.base_events
    import asyncio.events

    out = {
        "Handle._run": asyncio.events.Handle.__dict__["_run"],
        "BaseEventLoop._call_soon": asyncio.base_events.BaseEventLoop.__dict__["_call_soon"],
        "BaseEventLoop._run_once": asyncio.base_events.BaseEventLoop.__dict__["_run_once"],
        "BaseEventLoop.run_forever": asyncio.base_events.BaseEventLoop.__dict__["run_forever"],
    }
    try:
        import uvloop
    except ImportError:
        uvloop = None
    if uvloop is not None:   # uvloop.Loop (a Python subclass) gets its own call_soon
        out["uvloop.Loop.call_soon"] = uvloop.Loop.__dict__.get("call_soon")
    for name in dir(selectors):
        cls = getattr(selectors, name)
        if isinstance(cls, type) and "select" in cls.__dict__:
            out[name + ".select"] = cls.__dict__["select"]
    return out


def class_dicts() -> Dict[str, Dict[str, Any]]:
    """Every attribute of the classes aioprof may patch (asyncio's handles and base loop, the
    selectors, uvloop's Loop when installed), to check that stop() leaves them as it found them."""
    import asyncio.base_events
    import asyncio.events

    classes = [asyncio.events.Handle, asyncio.events.TimerHandle, asyncio.base_events.BaseEventLoop,
               asyncio.Task, asyncio.Future]
    classes += [c for c in vars(selectors).values() if isinstance(c, type)]
    try:
        import uvloop
    except ImportError:
        pass
    else:
        classes.append(uvloop.Loop)
    return {f"{c.__module__}.{c.__qualname__}": dict(vars(c)) for c in classes}


def assert_classes_unchanged(before: Dict[str, Dict[str, Any]]) -> None:
    after = class_dicts()
    for cls, attrs in before.items():
        now = after[cls]
        assert now.keys() == attrs.keys(), f"{cls}: attributes added or removed: {now.keys() ^ attrs.keys()}"
        changed = [name for name in attrs if now[name] is not attrs[name]]
        assert not changed, f"{cls}: attributes not restored: {changed}"


ORIGINALS = hooked_methods()   # captured at import, before any profiler ran
ORIGINAL_CLASSES = class_dicts()
ORIGINAL_TASK = asyncio.Task


@pytest.fixture(autouse=True)
def _profiler_is_left_clean():
    assert not _core.is_active(), "an earlier test left a profiler running"
    yield
    active = _core.is_active()
    if active:
        _core.stop()
    assert not active, "the test left a profiler running"
    assert hooked_methods() == ORIGINALS
    assert_classes_unchanged(ORIGINAL_CLASSES)
    assert asyncio.Task is ORIGINAL_TASK


def describe(exc: BaseException) -> Tuple[str, tuple]:
    return type(exc).__name__, exc.args


def tb_summary(tb: Any) -> List[Tuple[str, str, int]]:
    return [(f.filename, f.name, f.lineno) for f in traceback.extract_tb(tb)]


def outcome(fn: Callable[[], Any]) -> tuple:
    """("returned", value) or ("raised", type, args, traceback summary) of fn()."""
    try:
        return ("returned", fn())
    except BaseException as exc:  # noqa: B902 - the whole point is to compare any outcome
        return ("raised", type(exc), exc.args, tb_summary(exc.__traceback__))


def run_twice(fn: Callable[[], Any], **profiler_kw: Any) -> Tuple[tuple, tuple, dict]:
    """fn() without, then with a profiler; returns (plain outcome, profiled outcome, stats).

    Both calls go through the same line, so the outer frames of a traceback are equal."""
    outcomes = []
    profiler = None
    for profile in (False, True):
        profiler = aioprof.Profiler(**profiler_kw) if profile else None
        if profiler is not None:
            profiler.start()
        try:
            outcomes.append(outcome(fn))
        finally:
            if profiler is not None:
                profiler.stop()
    assert profiler is not None
    return outcomes[0], outcomes[1], profiler.stats()


def both(fn: Callable[[], Any], **profiler_kw: Any) -> Tuple[Any, dict]:
    """Assert fn() has the same outcome with and without aioprof and that aioprof did not
    fault; return (fn's return value, or its outcome tuple if it raised; stats)."""
    plain, profiled, stats = run_twice(fn, **profiler_kw)
    assert profiled == plain
    assert stats["warnings"] == []
    return (plain[1] if plain[0] == "returned" else plain), stats


def short_name(qualname: str) -> str:
    return qualname.rsplit(".", 1)[-1]


def tasks_of(stats: dict, name: str) -> List[dict]:
    return [t for t in stats["tasks"] if short_name(t["coroutine"]) == name]


def assert_seen(stats: dict, *names: str) -> None:
    """The profiler reported at least one task of each named coroutine."""
    seen = {short_name(t["coroutine"]) for t in stats["tasks"]}
    missing = set(names) - seen
    assert not missing, f"tasks of {sorted(missing)} were not reported; saw {sorted(seen)}"


def assert_coroutine_tasks(stats: dict, name: str, count: int) -> None:
    rows = [c for c in stats["coroutines"] if short_name(c["coroutine"]) == name]
    assert sum(c["tasks"] for c in rows) == count, rows


# --------------------------------------------------------------------------- building blocks

async def _child(x: int) -> int:
    await asyncio.sleep(0)
    return x * 2


async def _ok(i: Any, delay: float = 0.0) -> Any:
    await asyncio.sleep(delay)
    return i


async def _bad(i: Any, delay: float = 0.0) -> None:
    await asyncio.sleep(delay)
    raise ValueError(i)


class _Boom(Exception):
    pass


async def _boom(n: int) -> None:
    await asyncio.sleep(0)
    raise _Boom("boom", n)


class _MyTask(asyncio.Task):
    """A user Task subclass: extra state and overridden public methods."""

    def __init__(self, coro: Any, *, loop: Any = None, **kw: Any) -> None:
        super().__init__(coro, loop=loop, **kw)
        self.tag = "mine"
        self.cancel_calls = 0

    def cancel(self, *args: Any, **kw: Any) -> bool:
        self.cancel_calls += 1
        return super().cancel(*args, **kw)


_VAR: contextvars.ContextVar = contextvars.ContextVar("aioprof_compat_var", default="unset")

SCENARIOS: Dict[str, Callable[[], Any]] = {}


def scenario(fn: Callable[[], Any]) -> Callable[[], Any]:
    """Register a loop-agnostic scenario for the uvloop test."""
    SCENARIOS[fn.__name__] = fn
    return fn


# --------------------------------------------------------------------------- scenarios

@scenario
async def sc_task_identity() -> dict:
    coro = _child(21)
    t = asyncio.create_task(coro)
    me = asyncio.current_task()
    out: Dict[str, Any] = {
        "type": type(t), "me_type": type(me), "is_task": isinstance(t, asyncio.Task),
        "is_future": isinstance(t, asyncio.Future), "isfuture": asyncio.isfuture(t),
        "get_coro": t.get_coro() is coro, "in_all_tasks": t in asyncio.all_tasks(),
        "me_in_all_tasks": me in asyncio.all_tasks(),
        "refcounts_before": (sys.getrefcount(t), sys.getrefcount(coro)),
        "ensure_future": asyncio.ensure_future(t) is t,
    }
    out["result"] = await t
    out.update({
        "get_coro_after": t.get_coro() is coro, "current_after": asyncio.current_task() is me,
        "done": t.done(), "cancelled": t.cancelled(), "coro_finished": coro.cr_frame is None,
        "refcounts_after": (sys.getrefcount(t), sys.getrefcount(coro)),
    })
    return out


@scenario
async def sc_task_factory() -> dict:
    loop = asyncio.get_running_loop()
    calls = []

    class FactoryTask(asyncio.Task):
        pass

    def factory(loop: Any, coro: Any, **kw: Any) -> asyncio.Task:
        calls.append((coro.__qualname__, sorted(kw)))
        return FactoryTask(coro, loop=loop, **kw)

    loop.set_task_factory(factory)
    same = loop.get_task_factory() is factory
    t = asyncio.create_task(_child(1))
    gathered = await asyncio.gather(_child(2), _child(3))
    result = await t
    kinds = [type(t).__name__, isinstance(t, FactoryTask), isinstance(t, asyncio.Task)]
    loop.set_task_factory(None)
    return {"same": same, "calls": calls, "kinds": kinds, "result": result, "gathered": gathered,
            "reset": loop.get_task_factory()}


async def sc_eager_factory() -> dict:
    """3.12+: eager tasks run their first step inside create_task."""
    log = []

    async def eager_child(i: int) -> int:
        log.append(f"start {i}")
        if i % 2:
            await asyncio.sleep(0)
            log.append(f"resumed {i}")
        log.append(f"end {i}")
        return i

    async def eager_parent() -> List[int]:
        log.append("parent start")
        inner = [asyncio.create_task(eager_child(10 + i)) for i in range(2)]
        log.append("parent created")
        return await asyncio.gather(*inner)

    loop = asyncio.get_running_loop()
    loop.set_task_factory(asyncio.eager_task_factory)
    same = loop.get_task_factory() is asyncio.eager_task_factory
    tasks = []
    for i in range(4):
        t = asyncio.create_task(eager_child(i))
        log.append(f"created {i} done={t.done()}")
        tasks.append(t)
    p = asyncio.create_task(eager_parent())
    log.append(f"created parent done={p.done()}")
    log.append("gather")
    results = await asyncio.gather(*tasks, p)
    log.append("gathered")
    loop.set_task_factory(None)
    return {"same": same, "log": log, "results": results,
            "types": [type(t) is asyncio.Task for t in tasks]}


async def _read_and_set(value: str) -> Tuple[str, str]:
    before = _VAR.get()
    _VAR.set(value)
    await asyncio.sleep(0)
    return before, _VAR.get()


@scenario
async def sc_contextvars() -> dict:
    loop = asyncio.get_running_loop()
    out: Dict[str, Any] = {"start": _VAR.get()}
    _VAR.set("main")
    child = asyncio.create_task(_read_and_set("child"))
    out["child"] = await child
    if hasattr(child, "get_context"):
        out["child_context"] = child.get_context()[_VAR]
    out["main_after_child"] = _VAR.get()
    out["gather"] = await asyncio.gather(_read_and_set("g1"), _read_and_set("g2"))

    fut = loop.create_future()
    loop.call_soon(lambda: fut.set_result(_VAR.get()))
    _VAR.set("main2")   # call_soon copied the context when it was called
    out["call_soon"] = await fut

    fut = loop.create_future()
    loop.call_later(0.001, lambda: fut.set_result(_VAR.get()))
    out["call_later"] = await fut

    def set_in_callback() -> None:
        _VAR.set("callback")
        fut.set_result(_VAR.get())

    fut = loop.create_future()
    loop.call_soon(set_in_callback)
    out["callback_set"] = (await fut, _VAR.get())

    ctx = contextvars.copy_context()
    out["ctx_run"] = ctx.run(_VAR.get)
    ctx.run(_VAR.set, "in-ctx")
    out["ctx_after"] = (ctx[_VAR], _VAR.get())
    fut = loop.create_future()
    loop.call_soon(lambda: fut.set_result(_VAR.get()), context=ctx)
    out["call_soon_ctx"] = await fut
    if PY311:
        out["task_in_ctx"] = await asyncio.create_task(_read_and_set("x"), context=ctx)
        out["ctx_after_task"] = ctx[_VAR]
    out["to_thread"] = await asyncio.to_thread(_VAR.get)
    out["final"] = _VAR.get()
    return out


@scenario
async def sc_gather() -> dict:
    out: Dict[str, Any] = {"plain": await asyncio.gather(_ok(1, 0.002), _ok(2), _ok(3, 0.001))}
    res = await asyncio.gather(_ok(1), _bad(2), _ok(3), return_exceptions=True)
    out["return_exceptions"] = [describe(r) if isinstance(r, BaseException) else r for r in res]
    try:
        await asyncio.gather(_ok(1, 0.005), _bad(2))
    except ValueError as exc:
        out["raised"] = describe(exc)
    out["empty"] = await asyncio.gather()
    out["nested"] = await asyncio.gather(asyncio.gather(_ok(1), _ok(2)), _ok(3))
    g = asyncio.gather(_ok(1, 10), _ok(2, 10))
    await asyncio.sleep(0)
    g.cancel()
    try:
        await g
    except asyncio.CancelledError:
        out["gather_cancelled"] = g.cancelled()
    return out


@scenario
async def sc_wait_for() -> dict:
    out: Dict[str, Any] = {"ok": await asyncio.wait_for(_ok(7, 0.001), timeout=5)}
    inner = []

    async def slow() -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            inner.append("cancelled")
            raise

    try:
        await asyncio.wait_for(slow(), timeout=0.01)
    except asyncio.TimeoutError as exc:
        out["timeout"] = (type(exc).__name__, isinstance(exc, TimeoutError))
    out["inner"] = inner
    out["no_timeout"] = await asyncio.wait_for(_ok(8), None)
    t1, t2 = asyncio.create_task(_ok(1)), asyncio.create_task(_ok(2, 10))
    done, pending = await asyncio.wait([t1, t2], timeout=0.01)
    out["wait"] = (sorted(t.result() for t in done), len(pending))
    t2.cancel()
    done, _ = await asyncio.wait([t2])
    out["wait_cancelled"] = t2.cancelled()
    return out


@scenario
async def sc_shield() -> list:
    log: List[Any] = []

    async def inner() -> str:
        await asyncio.sleep(0.1)
        log.append("inner done")
        return "inner-result"

    it = asyncio.create_task(inner())
    outer = asyncio.ensure_future(asyncio.shield(it))
    await asyncio.sleep(0.001)
    outer.cancel()
    try:
        await outer
    except asyncio.CancelledError:
        log.append("outer cancelled")
    log.append(("inner cancelled", it.cancelled()))
    log.append(("inner result", await it))
    log.append(("outer cancelled", outer.cancelled()))
    return log


@scenario
async def sc_taskgroup() -> dict:
    out: Dict[str, Any] = {}
    async with asyncio.TaskGroup() as tg:
        t1 = tg.create_task(_ok(1, 0.001))
        t2 = tg.create_task(_ok(2))
    out["ok"] = [t1.result(), t2.result()]
    cancelled = []

    async def long() -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            cancelled.append("long")
            raise

    try:
        async with asyncio.TaskGroup() as tg:
            tl = tg.create_task(long())
            tg.create_task(_bad(5, 0.001))
            tg.create_task(_bad(6, 0.5))   # cancelled by the first failure
    except BaseExceptionGroup as eg:  # noqa: F821 - 3.11+ only
        out["group"] = (type(eg).__name__, eg.message, sorted(describe(e) for e in eg.exceptions))
    out["cancelled"] = (cancelled, tl.cancelled())
    return out


@scenario
async def sc_as_completed() -> list:
    order = []
    for f in asyncio.as_completed([_ok(3, 0.03), _ok(1, 0.01), _ok(2, 0.02)]):
        order.append(await f)
    return order


@scenario
async def sc_timeout() -> dict:
    loop = asyncio.get_running_loop()
    out: Dict[str, Any] = {}
    try:
        async with asyncio.timeout(0.01) as cm:
            await asyncio.sleep(10)
    except TimeoutError as exc:
        out["expired"] = (type(exc).__name__, cm.expired())
    async with asyncio.timeout(5) as cm2:
        r = await _ok(3, 0.001)
    out["not_expired"] = (r, cm2.expired())
    try:
        async with asyncio.timeout(None) as cm3:
            cm3.reschedule(loop.time() + 0.01)
            await asyncio.sleep(10)
    except TimeoutError:
        out["rescheduled"] = cm3.expired()
    try:
        async with asyncio.timeout_at(loop.time() + 0.005):
            await asyncio.sleep(1)
    except TimeoutError:
        out["timeout_at"] = True
    return out


@scenario
async def sc_to_thread() -> list:
    main = threading.get_ident()

    def work(x: int) -> Tuple[int, bool]:
        return x * 3, threading.get_ident() != main

    def fail() -> None:
        raise LookupError("in thread")

    out: List[Any] = [await asyncio.to_thread(work, 2)]
    out.append(await asyncio.gather(*(asyncio.to_thread(work, i) for i in range(4))))
    try:
        await asyncio.to_thread(fail)
    except LookupError as exc:
        out.append(describe(exc))
    return out


@scenario
async def sc_run_in_executor() -> list:
    loop = asyncio.get_running_loop()
    out: List[Any] = [await loop.run_in_executor(None, pow, 2, 10)]
    with ThreadPoolExecutor(2) as ex:
        out.append(await asyncio.gather(*(loop.run_in_executor(ex, time.sleep, 0.001) for _ in range(3))))
        out.append(await loop.run_in_executor(ex, functools.partial(sorted, [3, 1, 2], reverse=True)))
        try:
            await loop.run_in_executor(ex, int, "not a number")
        except ValueError as exc:
            out.append(type(exc).__name__)
    return out


@scenario
async def sc_threadsafe() -> dict:
    loop = asyncio.get_running_loop()
    fut = loop.create_future()
    order: List[int] = []

    def from_thread() -> None:
        for i in range(5):
            loop.call_soon_threadsafe(order.append, i)
        loop.call_soon_threadsafe(fut.set_result, "from-thread")

    th = threading.Thread(target=from_thread)
    th.start()
    result = await fut
    th.join()

    def submit() -> Any:
        return asyncio.run_coroutine_threadsafe(_ok(9, 0.001), loop).result(5)

    return {"result": result, "order": order, "submitted": await asyncio.to_thread(submit)}


@scenario
async def sc_timers() -> tuple:
    loop = asyncio.get_running_loop()
    order: List[str] = []
    done = loop.create_future()
    loop.call_later(0.03, order.append, "c")
    loop.call_later(0.01, order.append, "a")
    loop.call_at(loop.time() + 0.02, order.append, "b")
    h = loop.call_later(0.015, order.append, "cancelled")
    loop.call_soon(order.append, "soon")
    loop.call_later(0, order.append, "later0")
    h.cancel()
    loop.call_later(0.04, done.set_result, None)
    await done
    return order, h.cancelled()


@scenario
async def sc_cancel() -> list:
    log: List[Any] = []

    async def sleeper() -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError as exc:
            log.append(("caught", exc.args))
            raise

    t = asyncio.create_task(sleeper())
    await asyncio.sleep(0)
    log.append(("cancel()", t.cancel("stop it")))
    try:
        await t
    except asyncio.CancelledError as exc:
        log.append(("awaiter got", describe(exc)))
    log.append(("state", t.cancelled(), t.done(), t.cancel()))

    t2 = asyncio.create_task(_ok(1))
    t2.cancel()   # before its first step
    try:
        await t2
    except asyncio.CancelledError:
        log.append(("cancelled before start", t2.cancelled()))

    async def stubborn() -> str:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            if PY311:
                asyncio.current_task().uncancel()
            return "swallowed"
        return "not cancelled"

    t3 = asyncio.create_task(stubborn())
    await asyncio.sleep(0)
    t3.cancel()
    log.append(("stubborn", await t3, t3.cancelled()))

    async def cancels_itself() -> None:
        await asyncio.sleep(0)
        asyncio.current_task().cancel()
        await asyncio.sleep(0)

    t4 = asyncio.create_task(cancels_itself())
    try:
        await t4
    except asyncio.CancelledError:
        log.append(("self-cancelled", t4.cancelled()))
    return log


@scenario
async def sc_task_raises() -> dict:
    t = asyncio.create_task(_boom(1))
    try:
        await t
    except _Boom as exc:
        tb = traceback.extract_tb(exc.__traceback__)
        return {"type": type(exc), "args": exc.args, "same": exc is t.exception(),
                "last": (tb[-1].filename, tb[-1].name, tb[-1].lineno, tb[-1].line),
                "tb": tb_summary(exc.__traceback__)}
    return {}


@scenario
async def sc_callback_raises() -> list:
    loop = asyncio.get_running_loop()
    contexts: List[dict] = []
    loop.set_exception_handler(lambda loop, ctx: contexts.append(ctx))

    def bad_cb(x: int) -> None:
        raise ZeroDivisionError("cb", x)

    handles = [loop.call_soon(bad_cb, 1), loop.call_later(0.001, bad_cb, 2)]
    await asyncio.sleep(0.01)
    # (uvloop may run the timer first on a busy machine: compare in argument order)
    contexts.sort(key=lambda c: c["exception"].args[1])
    # The loop's exception handler got the very handles, and tracebacks with the same
    # frames (asyncio's Handle._run included, though aioprof runs callbacks from C).
    same_handles = [c.get("handle") is h for c, h in zip(contexts, handles)]
    tracebacks = [tb_summary(c["exception"].__traceback__) for c in contexts]
    t = asyncio.create_task(_boom(3))   # its exception is never retrieved
    for _ in range(10):
        await asyncio.sleep(0)
    assert t.done()
    del t
    gc.collect()
    loop.set_exception_handler(None)
    return [(re.sub(" at 0x[0-9a-f]+", "", c.get("message", "")),
             describe(c["exception"]) if "exception" in c else None, sorted(c)) for c in contexts] + \
        [same_handles, tracebacks]


@scenario
async def sc_streams() -> dict:
    async def handle_echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            line = await reader.readline()
            if not line:
                break
            writer.write(line.upper())
            await writer.drain()
        writer.close()
        await writer.wait_closed()

    server = await asyncio.start_server(handle_echo, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    replies = []
    async with server:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for msg in (b"hello\n", b"aioprof\n", b"x" * 50000 + b"\n"):
            writer.write(msg)
            await writer.drain()
            replies.append(await reader.readline())
        writer.close()
        await writer.wait_closed()
    return {"replies": [r[:20] for r in replies], "sizes": [len(r) for r in replies]}


@scenario
async def sc_queue() -> tuple:
    q: asyncio.Queue = asyncio.Queue(maxsize=2)
    log: List[str] = []

    async def producer(n: int) -> None:
        for i in range(n):
            await q.put(i)
            log.append(f"put {i}")
        await q.put(None)

    async def consumer() -> List[int]:
        got = []
        while True:
            item = await q.get()
            q.task_done()
            if item is None:
                return got
            got.append(item)
            log.append(f"got {item}")

    p = asyncio.create_task(producer(10))
    c = asyncio.create_task(consumer())
    await q.join()
    got = await c
    await p
    return got, log


@scenario
async def sc_task_subclass() -> dict:
    loop = asyncio.get_running_loop()
    t = _MyTask(_child(4), loop=loop)
    r = await t
    loop.set_task_factory(lambda loop, coro, **kw: _MyTask(coro, loop=loop, **kw))
    t2 = asyncio.create_task(_child(5))
    r2 = await t2
    t3 = asyncio.create_task(_ok(1, 10))
    await asyncio.sleep(0)
    t3.cancel()
    try:
        await t3
    except asyncio.CancelledError:
        pass
    loop.set_task_factory(None)
    return {"types": [type(x) is _MyTask for x in (t, t2, t3)], "tag": t.tag, "results": (r, r2),
            "is_task": isinstance(t, asyncio.Task), "cancel_calls": t3.cancel_calls,
            "cancelled": t3.cancelled()}


@scenario
async def sc_pure_python_task() -> dict:
    """The pure-Python Task (asyncio.tasks._PyTask) schedules bound methods, not wrappers."""
    py_task = asyncio.tasks._PyTask
    loop = asyncio.get_running_loop()
    loop.set_task_factory(lambda loop, coro, **kw: py_task(coro, loop=loop, **kw))
    t = asyncio.create_task(_child(6))
    gathered = await asyncio.gather(_child(1), _bad(2), return_exceptions=True)
    r = await t
    loop.set_task_factory(None)
    return {"type": type(t) is py_task, "result": r,
            "gathered": [describe(x) if isinstance(x, BaseException) else x for x in gathered]}


@scenario
async def sc_stacks() -> dict:
    """The Python stack seen from a task step and from a callback: the C hooks add no frame
    and the original methods still run as Python functions."""
    loop = asyncio.get_running_loop()

    def stack() -> List[Tuple[str, str, int]]:
        return [(f.filename, f.name, f.lineno) for f in traceback.extract_stack()[:-1]]

    out = {"task": stack()}
    fut = loop.create_future()
    loop.call_soon(lambda: fut.set_result(stack()))
    out["callback"] = await fut
    fut = loop.create_future()
    loop.call_later(0.001, lambda: fut.set_result(stack()))
    out["timer"] = await fut
    out["child"] = await asyncio.create_task(_stack_in_child())
    return out


async def _stack_in_child() -> List[Tuple[str, str, int]]:
    await asyncio.sleep(0)
    return [(f.filename, f.name, f.lineno) for f in traceback.extract_stack()]


def _normalize_log(message: str) -> str:
    message = re.sub(r"0x[0-9a-f]+", "ADDR", message)
    message = re.sub(r"took [0-9.]+ seconds", "took N seconds", message)
    return re.sub(r"Task-[0-9]+", "Task-N", message)


# A slow handle blocks SLOW s; the loop logs handles longer than SLOW / 3, and the test
# keeps the log lines of handles that took at least 0.9 * SLOW (not some other step that
# a loaded machine happened to slow down). Under valgrind every step is some 50 times
# slower, so the scale grows there.
SLOW = 0.5 if os.environ.get("AIOPROF_SANITIZER") else 0.05


async def _slow_step() -> None:
    await asyncio.sleep(0)
    time.sleep(SLOW)


async def sc_debug_mode() -> dict:
    """asyncio debug mode: source tracebacks of tasks and handles, and the loop's
    "Executing <handle> took N seconds" log line for a slow callback and a slow task step."""
    loop = asyncio.get_running_loop()
    records: List[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            message = record.getMessage()
            took = re.search(r"took ([0-9.]+) seconds", message)
            if took and float(took.group(1)) >= 0.9 * SLOW:
                records.append(_normalize_log(message))

    handler = Collect()
    logger = logging.getLogger("asyncio")
    logger.addHandler(handler)
    try:
        t = asyncio.create_task(_child(1))
        task_tb = [(f[0], f[2], f[1]) for f in t._source_traceback]
        h = loop.call_soon(lambda: None)
        handle_tb = [(f[0], f[2], f[1]) for f in getattr(h, "_source_traceback", None) or []]
        await t
        loop.slow_callback_duration = SLOW / 3
        loop.call_soon(time.sleep, SLOW)
        await asyncio.sleep(SLOW * 1.3)
        await asyncio.create_task(_slow_step())
    finally:
        logger.removeHandler(handler)
    return {"debug": loop.get_debug(), "task_tb": task_tb, "handle_tb": handle_tb,
            "log": [r for r in records if r.startswith("Executing")]}


# --------------------------------------------------------------------------- tests

@pytest.mark.sanitize
def test_task_type_identity_and_refcounts() -> None:
    result, stats = both(lambda: asyncio.run(sc_task_identity()))
    assert result["type"] is asyncio.Task and result["me_type"] is asyncio.Task
    assert result["is_task"] and result["get_coro"] and result["get_coro_after"]
    assert result["result"] == 42
    assert_seen(stats, "sc_task_identity", "_child")


@pytest.mark.sanitize
def test_user_task_factory() -> None:
    result, stats = both(lambda: asyncio.run(sc_task_factory()))
    assert result["same"] and result["reset"] is None
    assert [c[0] for c in result["calls"]] == ["_child"] * 3
    assert result["kinds"] == ["FactoryTask", True, True]
    assert (result["result"], result["gathered"]) == (2, [4, 6])
    assert len(tasks_of(stats, "_child")) == 3


@pytest.mark.sanitize
def test_eager_task_factory() -> None:
    if not PY312:
        pytest.skip("asyncio.eager_task_factory is new in Python 3.12")
    result, stats = both(lambda: asyncio.run(sc_eager_factory()))
    assert result["same"]
    log = result["log"]
    # eager: the first step ran inside create_task, before "created i"
    assert log.index("start 0") < log.index("created 0 done=True")
    assert log.index("start 1") < log.index("created 1 done=False") < log.index("resumed 1")
    assert result["results"] == [0, 1, 2, 3, [10, 11]]
    # Eager children that suspended are woken through call_soon: aioprof sees them then.
    assert_seen(stats, "eager_child")


async def _eager_counted(i: int) -> int:
    if i % 2:
        await asyncio.sleep(0)
    return i


async def sc_eager_counted() -> list:
    asyncio.get_running_loop().set_task_factory(asyncio.eager_task_factory)
    tasks = [asyncio.create_task(_eager_counted(i)) for i in range(4)]
    return await asyncio.gather(*tasks)


@pytest.mark.sanitize
def test_eager_tasks_are_counted_with_their_creation_site() -> None:
    """Eager tasks created while profiling: the ones that finish inside create_task and the
    ones that suspend are all counted, with all their steps, and have a creation site
    (json.md: created_at is null only for tasks that existed before profiling started)."""
    if not PY312:
        pytest.skip("asyncio.eager_task_factory is new in Python 3.12")
    result, stats = both(lambda: asyncio.run(sc_eager_counted()))
    assert result == [0, 1, 2, 3]
    assert_coroutine_tasks(stats, "_eager_counted", 4)
    [row] = [c for c in stats["coroutines"] if short_name(c["coroutine"]) == "_eager_counted"]
    assert row["steps"] == 6   # 1 step each for 0 and 2, 2 steps each for 1 and 3
    main = tasks_of(stats, "sc_eager_counted")[0]
    for t in tasks_of(stats, "_eager_counted"):
        assert t["created_at"] is not None and t["created_at"]["function"] == "sc_eager_counted", t
        assert t["parent"] == main["id"], t


@pytest.mark.sanitize
def test_contextvars() -> None:
    result, stats = both(lambda: asyncio.run(sc_contextvars()))
    assert result["start"] == "unset"
    assert result["child"] == ("main", "child") and result["main_after_child"] == "main"
    assert result["gather"] == [("main", "g1"), ("main", "g2")]
    assert result["call_soon"] == "main" and result["call_later"] == "main2"
    assert result["callback_set"] == ("callback", "main2")
    assert result["ctx_after"] == ("in-ctx", "main2") and result["call_soon_ctx"] == "in-ctx"
    assert result["to_thread"] == "main2" and result["final"] == "main2"
    if PY311:
        assert result["task_in_ctx"] == ("in-ctx", "x") and result["ctx_after_task"] == "x"
    assert_seen(stats, "_read_and_set")
    assert _VAR.get() == "unset"


@pytest.mark.sanitize
def test_gather() -> None:
    result, stats = both(lambda: asyncio.run(sc_gather()))
    assert result["plain"] == [1, 2, 3]
    assert result["return_exceptions"] == [1, ("ValueError", (2,)), 3]
    assert result["raised"] == ("ValueError", (2,))
    assert result["empty"] == [] and result["nested"] == [[1, 2], 3]
    assert "gather_cancelled" in result   # its value differs between Python versions
    assert_seen(stats, "_ok", "_bad")
    failed = [t for t in tasks_of(stats, "_bad")]
    assert failed and all(t["state"] == "failed" and t["exception"] == "ValueError" for t in failed)


@pytest.mark.sanitize
def test_wait_for() -> None:
    result, stats = both(lambda: asyncio.run(sc_wait_for()))
    assert result["ok"] == 7 and result["no_timeout"] == 8
    assert result["timeout"][0] == "TimeoutError" and result["inner"] == ["cancelled"]
    assert result["wait"] == ([1], 1) and result["wait_cancelled"] is True
    assert_seen(stats, "_ok")


@pytest.mark.sanitize
def test_shield() -> None:
    result, stats = both(lambda: asyncio.run(sc_shield()))
    assert result == ["outer cancelled", ("inner cancelled", False), "inner done",
                      ("inner result", "inner-result"), ("outer cancelled", True)]
    assert_seen(stats, "inner")
    assert tasks_of(stats, "inner")[0]["state"] == "done"


@pytest.mark.sanitize
def test_taskgroup() -> None:
    if not PY311:
        pytest.skip("asyncio.TaskGroup is new in Python 3.11")
    result, stats = both(lambda: asyncio.run(sc_taskgroup()))
    assert result["ok"] == [1, 2]
    kind, _, errors = result["group"]
    assert kind == "ExceptionGroup" and errors[0] == ("ValueError", (5,))
    assert result["cancelled"] == (["long"], True)
    assert_seen(stats, "long", "_bad", "_ok")
    assert all(t["state"] == "cancelled" for t in tasks_of(stats, "long"))


@pytest.mark.sanitize
def test_as_completed() -> None:
    result, stats = both(lambda: asyncio.run(sc_as_completed()))
    assert result == [1, 2, 3]
    assert_coroutine_tasks(stats, "_ok", 3)


@pytest.mark.sanitize
def test_asyncio_timeout() -> None:
    if not PY311:
        pytest.skip("asyncio.timeout is new in Python 3.11")
    result, _ = both(lambda: asyncio.run(sc_timeout()))
    assert result == {"expired": ("TimeoutError", True), "not_expired": (3, False),
                      "rescheduled": True, "timeout_at": True}


@pytest.mark.sanitize
def test_run_until_complete_on_new_event_loop() -> None:
    def program() -> tuple:
        loop = asyncio.new_event_loop()
        try:
            r1 = loop.run_until_complete(_ok(1, 0.001))
            r2 = loop.run_until_complete(_gather_two())
            r3 = loop.run_until_complete(loop.create_task(_ok(4)))
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            loop.close()
        return r1, r2, r3, loop.is_closed()

    result, stats = both(program)
    assert result == (1, [2, 3], 4, True)
    assert len(stats["loops"]) == 1
    assert_coroutine_tasks(stats, "_ok", 4)


async def _gather_two() -> list:
    return await asyncio.gather(_ok(2), _ok(3))


@pytest.mark.sanitize
def test_asyncio_run_twice() -> None:
    result, stats = both(lambda: [asyncio.run(_ok(1, 0.001)), asyncio.run(_ok(2, 0.001))])
    assert result == [1, 2]
    assert len(stats["loops"]) == 2
    assert_coroutine_tasks(stats, "_ok", 2)


@pytest.mark.sanitize
def test_to_thread() -> None:
    result, stats = both(lambda: asyncio.run(sc_to_thread()))
    assert result == [(6, True), [(0, True), (3, True), (6, True), (9, True)],
                      ("LookupError", ("in thread",))]
    assert_seen(stats, "sc_to_thread")


@pytest.mark.sanitize
def test_run_in_executor() -> None:
    result, _ = both(lambda: asyncio.run(sc_run_in_executor()))
    assert result == [1024, [None, None, None], [3, 2, 1], "ValueError"]


@pytest.mark.sanitize
def test_call_soon_threadsafe() -> None:
    result, stats = both(lambda: asyncio.run(sc_threadsafe()))
    assert result == {"result": "from-thread", "order": [0, 1, 2, 3, 4], "submitted": 9}
    assert_seen(stats, "_ok")


@pytest.mark.sanitize
def test_call_later_call_at_order() -> None:
    result, stats = both(lambda: asyncio.run(sc_timers()))
    assert result == (["soon", "later0", "a", "b", "c"], True)
    # list.append and Future.set_result ran as plain callbacks
    assert sum(c["count"] for c in stats["callbacks"]) >= 5


@pytest.mark.sanitize
def test_cancellation() -> None:
    result, stats = both(lambda: asyncio.run(sc_cancel()))
    assert result[0] == ("cancel()", True) and result[1][0] == "caught"
    assert result[2][0] == "awaiter got" and result[2][1][0] == "CancelledError"
    assert result[3] == ("state", True, True, False)
    assert result[4] == ("cancelled before start", True)
    assert result[5] == ("stubborn", "swallowed", False)
    assert result[6] == ("self-cancelled", True)
    assert [t["state"] for t in tasks_of(stats, "sleeper")] == ["cancelled"]
    assert [t["state"] for t in tasks_of(stats, "stubborn")] == ["done"]


@pytest.mark.sanitize
def test_task_raises() -> None:
    result, stats = both(lambda: asyncio.run(sc_task_raises()))
    assert result["type"] is _Boom and result["args"] == ("boom", 1) and result["same"]
    assert result["last"][1] == "_boom" and result["last"][3] == 'raise _Boom("boom", n)'
    assert [t["exception"] for t in tasks_of(stats, "_boom")] == ["_Boom"]


@pytest.mark.sanitize
def test_exception_out_of_asyncio_run() -> None:
    """The exception and its whole traceback are the same (run_twice compares the summary)."""
    result, _ = both(lambda: asyncio.run(_boom(2)))
    kind, exc_type, args, tb = result
    assert (kind, exc_type, args) == ("raised", _Boom, ("boom", 2))
    assert tb[-1][1] == "_boom"


@pytest.mark.sanitize
def test_exception_in_plain_callback() -> None:
    result, stats = both(lambda: asyncio.run(sc_callback_raises()))
    assert all(r[0].startswith("Exception in callback ") for r in result[:2])
    assert [r[1] for r in result[:2]] == [("ZeroDivisionError", ("cb", 1)), ("ZeroDivisionError", ("cb", 2))]
    # both() compared the lists: with aioprof the loop's exception handler gets the same
    # contexts, including the one of a task whose exception was never retrieved.
    assert result[2][0] == "Task exception was never retrieved"
    assert result[2][1] == ("_Boom", ("boom", 3))
    same_handles, tracebacks = result[3:]
    assert same_handles == [True, True]
    assert [[name for _, name, _ in tb] for tb in tracebacks] == [["_run", "bad_cb"]] * 2
    assert any(short_name(c["callback"]) == "bad_cb" and c["count"] == 2 for c in stats["callbacks"])


async def sc_unretrieved_exception() -> list:
    """A failed task nobody awaits: asyncio reports "Task exception was never retrieved"
    when the task is destroyed (and only if nothing called its exception() or result())."""
    loop = asyncio.get_running_loop()
    messages: List[str] = []
    loop.set_exception_handler(lambda loop, ctx: messages.append(ctx["message"]))
    t = asyncio.create_task(_boom(4))
    for _ in range(10):
        await asyncio.sleep(0)
    done = t.done()
    del t
    gc.collect()
    loop.set_exception_handler(None)
    return [done] + messages


@pytest.mark.sanitize
def test_unretrieved_task_exception_still_reported() -> None:
    result, stats = both(lambda: asyncio.run(sc_unretrieved_exception()))
    assert result == [True, "Task exception was never retrieved"]
    assert [t["state"] for t in tasks_of(stats, "_boom")] == ["failed"]


@pytest.mark.sanitize
def test_streams_echo() -> None:
    result, stats = both(lambda: asyncio.run(sc_streams()))
    assert result["replies"][:2] == [b"HELLO\n", b"AIOPROF\n"]
    assert result["sizes"] == [6, 8, 50001]
    assert_seen(stats, "handle_echo", "sc_streams")
    assert sum(loop["select_calls"] for loop in stats["loops"]) > 0


@pytest.mark.sanitize
def test_queue_producer_consumer() -> None:
    result, stats = both(lambda: asyncio.run(sc_queue()))
    assert result[0] == list(range(10))
    assert_seen(stats, "producer", "consumer")


@pytest.mark.sanitize
def test_custom_task_subclass() -> None:
    result, stats = both(lambda: asyncio.run(sc_task_subclass()))
    assert result == {"types": [True, True, True], "tag": "mine", "results": (8, 10), "is_task": True,
                      "cancel_calls": 1, "cancelled": True}
    assert len(tasks_of(stats, "_child")) == 2
    assert [t["state"] for t in tasks_of(stats, "_ok")] == ["cancelled"]


@pytest.mark.sanitize
def test_pure_python_task() -> None:
    if asyncio.tasks._PyTask is asyncio.Task:
        pytest.skip("no C Task in this build: the pure-Python one is tested everywhere")
    result, stats = both(lambda: asyncio.run(sc_pure_python_task()))
    assert result == {"type": True, "result": 12, "gathered": [2, ("ValueError", (2,))]}
    assert_coroutine_tasks(stats, "_child", 2)
    assert [t["state"] for t in tasks_of(stats, "_bad")] == ["failed"]


@pytest.mark.sanitize
def test_stacks_unchanged_but_for_handle_run() -> None:
    """The Python stack seen inside a step or callback is the same, except that asyncio's
    `Handle._run` frame is missing: aioprof does its work in C (docs/design.md)."""
    plain, profiled, stats = run_twice(lambda: asyncio.run(sc_stacks()))
    assert plain[0] == profiled[0] == "returned" and stats["warnings"] == []
    plain, profiled = plain[1], profiled[1]
    assert plain.keys() == profiled.keys()
    events = asyncio.events.__file__
    for key in plain:
        assert plain[key][-1][1] in ("<lambda>", "sc_stacks", "_stack_in_child")
        run_frames = [f for f in plain[key] if f[0] == events and f[1] == "_run"]
        assert len(run_frames) == 1, plain[key]
        assert profiled[key] == [f for f in plain[key] if f not in run_frames], key


@pytest.mark.sanitize
def test_debug_mode() -> None:
    result, _ = both(lambda: asyncio.run(sc_debug_mode(), debug=True))
    assert result["debug"] is True and result["task_tb"] and result["handle_tb"]
    assert len(result["log"]) == 2, result["log"]


@pytest.mark.sanitize
def test_hooks_restored_after_stop() -> None:
    import asyncio.events

    before = hooked_methods()
    classes_before = class_dicts()
    # (uvloop.Loop inherits call_soon from its Cython base: no entry of its own, None)
    assert all(isinstance(fn, types.FunctionType) or (fn is None and key.startswith("uvloop."))
               for key, fn in before.items())
    timer_has_run = "_run" in asyncio.events.TimerHandle.__dict__
    p = aioprof.Profiler().start()
    try:
        during = hooked_methods()
        for key in ("Handle._run", "BaseEventLoop._call_soon", "BaseEventLoop._run_once",
                    "BaseEventLoop.run_forever", "uvloop.Loop.call_soon", "EpollSelector.select"):
            if key in before:
                assert during[key] is not before[key], f"{key} was not hooked"
        assert asyncio.run(_ok(5, 0.001)) == 5
        assert asyncio.Task is ORIGINAL_TASK
    finally:
        p.stop()
    after = hooked_methods()
    assert after.keys() == before.keys()
    for key in before:
        assert after[key] is before[key], f"{key} was not restored"
    assert asyncio.events.Handle._run is before["Handle._run"]
    assert asyncio.base_events.BaseEventLoop._call_soon is before["BaseEventLoop._call_soon"]
    assert asyncio.base_events.BaseEventLoop._run_once is before["BaseEventLoop._run_once"]
    if hasattr(selectors, "EpollSelector"):
        assert selectors.EpollSelector.select is before["EpollSelector.select"]
    assert ("_run" in asyncio.events.TimerHandle.__dict__) == timer_has_run
    assert_classes_unchanged(classes_before)
    # and the program runs as before with no profiler at all
    assert asyncio.run(_ok(6)) == 6


@pytest.mark.sanitize
def test_no_trace_or_profile_function() -> None:
    """aioprof never installs a per-call hook (sys.setprofile / settrace)."""
    before = sys.getprofile(), sys.gettrace()
    with aioprof.Profiler():
        during = asyncio.run(_report_hooks())
    assert during == before


async def _report_hooks() -> tuple:
    await asyncio.sleep(0)
    return sys.getprofile(), sys.gettrace()


async def _pre_existing(ev: asyncio.Event) -> str:
    await ev.wait()
    await asyncio.sleep(0)
    return "pre"


async def _start_inside(profile: bool) -> tuple:
    ev = asyncio.Event()
    t = asyncio.create_task(_pre_existing(ev))
    await asyncio.sleep(0)   # t has started and waits on ev
    p = aioprof.Profiler() if profile else None
    if p is not None:
        p.start()
    try:
        ev.set()
        r = await t
        new = await asyncio.create_task(_ok("new", 0.001))
    finally:
        if p is not None:
            p.stop()
    return (r, new), (p.stats() if p is not None else None)


@pytest.mark.sanitize
def test_start_inside_running_coroutine() -> None:
    plain, _ = asyncio.run(_start_inside(False))
    result, stats = asyncio.run(_start_inside(True))
    assert result == plain == ("pre", "new")
    assert stats["warnings"] == []
    pre = tasks_of(stats, "_pre_existing")
    assert len(pre) == 1, "a task that existed before start() was not reported once it stepped"
    assert pre[0]["created_at"] is None and pre[0]["state"] == "done" and pre[0]["steps"] >= 1
    main = tasks_of(stats, "_start_inside")
    assert len(main) == 1 and main[0]["created_at"] is None
    new = tasks_of(stats, "_ok")
    assert len(new) == 1 and new[0]["created_at"] is not None
    assert new[0]["parent"] == main[0]["id"]


@pytest.mark.sanitize
def test_second_start_raises_and_first_keeps_running() -> None:
    first = aioprof.Profiler().start()
    try:
        second = aioprof.Profiler()
        with pytest.raises(RuntimeError):
            second.start()
        assert not second.running
        with pytest.raises(RuntimeError):
            second.stats()
        second.stop()   # a no-op: it never started; must not stop the first one
        assert first.running and _core.is_active()
        assert hooked_methods()["Handle._run"] is not ORIGINALS["Handle._run"]
        assert asyncio.run(_ok(3, 0.001)) == 3
        stats = first.stats()
        assert_coroutine_tasks(stats, "_ok", 1)
        with pytest.raises(RuntimeError):
            with aioprof.Profiler():
                pass
        assert first.running and _core.is_active()
    finally:
        first.stop()
    assert first.stats()["warnings"] == []
    assert_coroutine_tasks(first.stats(), "_ok", 1)


@pytest.mark.sanitize
def test_exception_through_profiler_context_manager() -> None:
    with pytest.raises(KeyError):
        with aioprof.Profiler() as p:
            asyncio.run(_ok(1))
            raise KeyError("out")
    assert not p.running and not _core.is_active()


# --------------------------------------------------------------------------- uvloop

def _uvloop():
    try:
        import uvloop
    except ImportError:   # (Debian's uvloop is built for 3.14 only: on 3.15 it is there
        uvloop = None     # but does not load)
    if uvloop is None:
        # Outside the handler: a skip chained to the ImportError makes 3.15's traceback
        # re-import uvloop to explain it, and that failure ends the whole pytest run.
        pytest.skip("uvloop is not installed for this interpreter")
    return uvloop


def _uvloop_scenarios() -> List[str]:
    names = sorted(SCENARIOS)
    if not PY311:
        names = [n for n in names if n not in ("sc_taskgroup", "sc_timeout")]
    return names


@pytest.mark.parametrize("name", _uvloop_scenarios())
def test_uvloop(name: str) -> None:
    uvloop = _uvloop()
    main = SCENARIOS[name]
    plain, profiled, stats = run_twice(lambda: uvloop.run(main()))
    assert plain[0] == "returned", plain
    assert profiled == plain
    assert stats["warnings"] == []


def test_uvloop_eager_factory() -> None:
    uvloop = _uvloop()
    if not PY312:
        pytest.skip("asyncio.eager_task_factory is new in Python 3.12")
    plain, profiled, stats = run_twice(lambda: uvloop.run(sc_eager_factory()))
    assert profiled == plain
    assert stats["warnings"] == []
    if plain[0] == "raised":
        pytest.skip(f"uvloop {uvloop.__version__} cannot run the eager task factory here: {plain[1:3]}")


def test_uvloop_debug_mode() -> None:
    """The loop's slow-callback log names the same handle with and without aioprof."""
    uvloop = _uvloop()
    result, _ = both(lambda: uvloop.run(sc_debug_mode(), debug=True))
    assert result["debug"] is True and len(result["log"]) == 2, result["log"]


def test_uvloop_after_asyncio_in_one_session() -> None:
    """One profiling session over a standard loop, then uvloop, then a standard loop again."""
    uvloop = _uvloop()

    def program() -> list:
        return [asyncio.run(sc_gather()), uvloop.run(sc_gather()), asyncio.run(sc_queue())]

    result, stats = both(program)
    assert result[0] == result[1]
    assert_seen(stats, "_ok", "producer")


@pytest.mark.sanitize
def test_program_own_call_soon_and_handle_class_are_used() -> None:
    """aioprof does asyncio's own `_call_soon` in C (docs/performance.md), but a
    `_call_soon` the program put in place before profiling, and an `asyncio.events.Handle`
    class it swapped in, are still what runs."""
    import asyncio.base_events
    import asyncio.events

    calls: List[int] = []
    original = asyncio.base_events.BaseEventLoop._call_soon

    def own_call_soon(self, callback, args, context):   # type: ignore[no-untyped-def]
        calls.append(1)
        return original(self, callback, args, context)

    async def handle_types() -> List[str]:
        loop = asyncio.get_running_loop()
        made = [type(loop.call_soon(lambda: None)).__name__]
        await asyncio.sleep(0)
        return made

    class OwnHandle(asyncio.events.Handle):
        __slots__ = ()

    asyncio.base_events.BaseEventLoop._call_soon = own_call_soon   # type: ignore[method-assign]
    try:
        result, stats = both(lambda: asyncio.run(_ok(7, 0.001)))
        assert result == 7
        plain = len(calls) // 2
        assert plain > 0 and len(calls) == 2 * plain, calls   # as many calls under aioprof
    finally:
        asyncio.base_events.BaseEventLoop._call_soon = original   # type: ignore[method-assign]
    assert_seen(stats, "_ok")

    asyncio.events.Handle = OwnHandle   # type: ignore[misc]
    try:
        result, stats = both(lambda: asyncio.run(handle_types()))
    finally:
        asyncio.events.Handle = OwnHandle.__mro__[1]   # type: ignore[misc]
    assert result == ["OwnHandle"]
    assert_seen(stats, "handle_types")


_VAR: "contextvars.ContextVar[str]" = contextvars.ContextVar("_VAR", default="unset")


async def sc_callback_cancels_itself_and_raises() -> list:
    """A callback that cancels its own handle (which clears its callback and arguments)
    and then raises, in a context of its own: the exception handler sees the handle as
    asyncio leaves it, its context, and the message made from the cleared callback."""
    loop = asyncio.get_running_loop()
    seen: List[tuple] = []

    def handler(loop: asyncio.AbstractEventLoop, ctx: dict) -> None:
        h = ctx["handle"]
        seen.append((re.sub(" at 0x[0-9a-f]+", "", ctx["message"]), describe(ctx["exception"]),
                     h.cancelled(), h._callback, h._args, h._context.get(_VAR),
                     _VAR.get(), tb_summary(ctx["exception"].__traceback__)[-1][1]))

    loop.set_exception_handler(handler)
    handles: List[asyncio.Handle] = []

    def cb(x: int) -> None:
        _VAR.set("in callback")
        handles[0].cancel()
        raise ValueError("cancelled", x)

    ctx = contextvars.copy_context()
    handles.append(loop.call_soon(cb, 5, context=ctx))
    await asyncio.sleep(0.01)
    loop.set_exception_handler(None)
    return seen + [ctx.get(_VAR)]


@pytest.mark.sanitize
def test_callback_that_cancels_itself_and_raises() -> None:
    result, _ = both(lambda: asyncio.run(sc_callback_cancels_itself_and_raises()))
    [(message, exc, cancelled, cb, args, in_ctx, _, last_frame), after] = result
    assert exc == ("ValueError", ("cancelled", 5)) and cancelled and last_frame == "cb"
    assert (cb, args, in_ctx, after) == (None, None, "in callback", "in callback")
    assert message.startswith("Exception in callback")
