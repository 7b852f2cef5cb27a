"""aioprof under stress and misuse: faults, references, BaseExceptions, stop() at odd times.

The promises tested here: a fault inside aioprof disables profiling with one warning and
the program goes on; aioprof never keeps a task, coroutine, frame or loop alive;
KeyboardInterrupt and SystemExit pass through unchanged; start/stop cycles leak nothing.
The in-process tests are marked ``sanitize`` (they also run under ASan and valgrind, so
their sizes stay small there).
"""
from __future__ import annotations

import asyncio
import collections.abc
import gc
import os
import subprocess
import sys
import traceback
import warnings
import weakref
from pathlib import Path
from typing import Any, Callable, Dict, List

import pytest

import aioprof
from aioprof import _core

SANITIZER = os.environ.get("AIOPROF_SANITIZER", "")
REPO = Path(__file__).resolve().parents[2]


from test_compat import hooked_methods  # the one list of class entries aioprof replaces


ORIGINALS = hooked_methods()


@pytest.fixture(autouse=True)
def _profiler_is_left_clean():
    assert not _core.is_active(), "an earlier test left a profiler running"
    yield
    active = _core.is_active()
    if active:
        _core.stop()
    assert not active, "the test left a profiler running"
    assert hooked_methods() == ORIGINALS


def aioprof_warnings(caught: List[warnings.WarningMessage]) -> List[str]:
    return [str(w.message) for w in caught if "aioprof" in str(w.message)]


def short_name(qualname: str) -> str:
    return qualname.rsplit(".", 1)[-1]


def tasks_of(stats: dict, name: str) -> List[dict]:
    return [t for t in stats["tasks"] if short_name(t["coroutine"]) == name]


async def _work(i: int) -> int:
    await asyncio.sleep(0)
    await asyncio.sleep(0.001)
    return i * i


async def _gather_work(n: int) -> List[int]:
    return await asyncio.gather(*(_work(i) for i in range(n)))


# --------------------------------------------------------------------------- (a) faults

class _BadNameTask(asyncio.Task):
    """get_name() raises: aioprof calls it when it first sees a task."""

    def get_name(self) -> str:
        raise RuntimeError("get_name is broken")


class _BadCoroTask(asyncio.Task):
    def get_coro(self) -> Any:
        raise RuntimeError("get_coro is broken")


async def _faulty_program(task_cls: type) -> List[int]:
    loop = asyncio.get_running_loop()
    loop.set_task_factory(lambda loop, coro, **kw: task_cls(coro, loop=loop, **kw))
    results = await asyncio.gather(*(_work(i) for i in range(5)))
    results.append(await asyncio.create_task(_work(10)))
    loop.set_task_factory(None)
    results += await _gather_work(3)
    return results


@pytest.mark.sanitize
@pytest.mark.parametrize("task_cls", [_BadNameTask, _BadCoroTask], ids=["get_name", "get_coro"])
def test_internal_fault_one_warning_program_goes_on(task_cls: type) -> None:
    plain = asyncio.run(_faulty_program(task_cls))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        p = aioprof.Profiler().start()
        try:
            result = asyncio.run(_faulty_program(task_cls))
            during = p.stats()
            assert aioprof_warnings(caught) == [], "warned before stop()"
        finally:
            p.stop()
    assert result == plain
    assert len(during["warnings"]) == 1
    ours = [w for w in caught if "aioprof" in str(w.message)]
    assert len(ours) == 1, [str(w.message) for w in ours]
    assert ours[0].category is RuntimeWarning
    assert str(ours[0].message).startswith("aioprof:")
    stats = p.stats()
    assert len(stats["warnings"]) == 1
    assert hooked_methods() == ORIGINALS
    # The fault does not stick: the next session profiles normally.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with aioprof.Profiler() as p2:
            assert asyncio.run(_gather_work(3)) == [0, 1, 4]
    assert aioprof_warnings(caught) == []
    assert p2.stats()["warnings"] == []
    assert len(tasks_of(p2.stats(), "_work")) == 3


# --------------------------------------------------------------------------- (b) references

class _Marker:
    """A weakly referenceable object held only by a coroutine's frame."""


def _finished_tasks_program(refs: Dict[str, weakref.ref]) -> Callable[[], Any]:
    async def child(n: int) -> int:
        marker = _Marker()
        refs[f"frame-local {n}"] = weakref.ref(marker)
        await asyncio.sleep(0)
        return n

    async def main() -> List[str]:
        for n in range(3):
            coro = child(n)
            t = asyncio.create_task(coro)
            refs[f"task {n}"] = weakref.ref(t)
            refs[f"coro {n}"] = weakref.ref(coro)
            assert await t == n
            del t, coro
        failing = asyncio.create_task(_raise_value_error())
        refs["failed task"] = weakref.ref(failing)
        try:
            await failing
        except ValueError:
            pass
        del failing
        gc.collect()
        # (the failed task stays alive here even without aioprof: asyncio's traceback
        # bookkeeping holds it until main() returns)
        return sorted(name for name, r in refs.items() if r() is not None)

    return main


@pytest.mark.sanitize
def test_no_strong_reference_to_finished_tasks() -> None:
    plain_refs: Dict[str, weakref.ref] = {}
    plain_inside = asyncio.run(_finished_tasks_program(plain_refs)())
    gc.collect()
    assert [name for name, r in plain_refs.items() if r() is not None] == []

    refs: Dict[str, weakref.ref] = {}
    p = aioprof.Profiler().start()
    try:
        inside = asyncio.run(_finished_tasks_program(refs)())
        assert inside == plain_inside, "alive inside main() with aioprof but not without"
        gc.collect()
        alive = [name for name, r in refs.items() if r() is not None]
        assert alive == [], f"still alive while profiling: {alive}"
        assert p.running
        assert len(tasks_of(p.stats(), "child")) == 3
    finally:
        p.stop()
    assert p.stats()["warnings"] == []


async def _raise_value_error() -> None:
    await asyncio.sleep(0)
    raise ValueError("x")


@pytest.mark.sanitize
def test_no_strong_reference_to_pending_task_destroyed() -> None:
    """A task still pending when its loop is closed and dropped: the task, its coroutine,
    the coroutine's frame locals and the loop all die while the profiler runs."""
    refs: Dict[str, weakref.ref] = {}
    messages: List[str] = []

    async def forever() -> None:
        marker = _Marker()
        refs["frame-local"] = weakref.ref(marker)
        await asyncio.sleep(3600)

    p = aioprof.Profiler().start()
    try:
        loop = asyncio.new_event_loop()
        loop.set_exception_handler(lambda loop, ctx: messages.append(ctx["message"]))
        t = loop.create_task(forever())
        loop.run_until_complete(asyncio.sleep(0.002))
        assert not t.done()
        refs["task"] = weakref.ref(t)
        refs["coro"] = weakref.ref(t.get_coro())
        refs["loop"] = weakref.ref(loop)
        during = p.stats()   # a snapshot walks the pending task's await chain
        [rec] = tasks_of(during, "forever")
        assert rec["state"] == "pending" and rec["end_s"] is None
        loop.close()
        del t, loop
        gc.collect()
        alive = [name for name, r in refs.items() if r() is not None]
        assert alive == [], f"still alive while profiling: {alive}"
        assert messages == ["Task was destroyed but it is pending!"]
        after = p.stats()
        [rec] = tasks_of(after, "forever")
        assert rec["end_s"] is not None, "a destroyed task is still reported as running on"
        assert rec["busy_s"] + rec["scheduled_s"] + rec["idle_s"] == pytest.approx(
            rec["end_s"] - rec["start_s"], abs=1e-6)
    finally:
        p.stop()
    assert p.stats()["warnings"] == []


@pytest.mark.sanitize
def test_no_strong_reference_with_max_tasks_zero() -> None:
    """Records that are not kept must not hold anything either (pending and finished)."""
    refs: List[weakref.ref] = []

    async def sleeper() -> None:
        await asyncio.sleep(3600)

    async def main() -> None:
        tasks = [asyncio.create_task(sleeper()) for _ in range(5)]
        tasks += [asyncio.create_task(_work(i)) for i in range(5)]
        await asyncio.sleep(0.005)
        refs.extend(weakref.ref(t) for t in tasks)
        refs.extend(weakref.ref(t.get_coro()) for t in tasks)
        for t in tasks[:5]:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        del tasks
        gc.collect()

    with aioprof.Profiler(max_tasks=0) as p:
        asyncio.run(main())
        gc.collect()
        assert [r for r in refs if r() is not None] == []
    stats = p.stats()
    assert stats["tasks"] == [] and stats["warnings"] == []
    assert stats["dropped_tasks"] >= 11


# --------------------------------------------------------------------------- (c, d) BaseExceptions

async def _raise_in_task(exc: BaseException) -> None:
    await asyncio.sleep(0)
    raise exc


async def _main_awaits_raiser(exc: BaseException) -> None:
    t = asyncio.create_task(_raise_in_task(exc))
    await asyncio.sleep(0.5)
    await t


async def _main_callback_raises(exc: BaseException) -> None:
    def cb() -> None:
        raise exc

    asyncio.get_running_loop().call_soon(cb)
    await asyncio.sleep(0.5)


def _propagated(make_exc: Callable[[], BaseException], main: Callable[[BaseException], Any],
                profile: bool) -> tuple:
    exc = make_exc()
    p = aioprof.Profiler().start() if profile else None
    try:
        asyncio.run(main(exc))
    except BaseException as caught:  # noqa: B902
        got = caught
    else:
        got = None
    finally:
        if p is not None:
            p.stop()
    assert got is exc, f"{exc!r} did not propagate unchanged: got {got!r}"
    # the frames it went through (asyncio's own, with Handle._run, and the program's)
    frames = [(f.filename, f.name) for f in traceback.extract_tb(got.__traceback__)]
    return (type(got), got.args, getattr(got, "code", None), frames), p


@pytest.mark.sanitize
@pytest.mark.parametrize("where", ["task", "callback"])
@pytest.mark.parametrize("make_exc", [lambda: KeyboardInterrupt("ctrl-c"), lambda: SystemExit(3)],
                         ids=["KeyboardInterrupt", "SystemExit"])
def test_base_exception_propagates(make_exc: Callable[[], BaseException], where: str) -> None:
    main = _main_awaits_raiser if where == "task" else _main_callback_raises
    plain, _ = _propagated(make_exc, main, profile=False)
    profiled, p = _propagated(make_exc, main, profile=True)
    assert profiled == plain
    stats = p.stats()
    assert stats["warnings"] == []
    if where == "task":
        [rec] = tasks_of(stats, "_raise_in_task")
        assert rec["state"] == "failed" and rec["exception"] == type(make_exc()).__name__
    # The profiler is still usable afterwards.
    with aioprof.Profiler() as p2:
        assert asyncio.run(_gather_work(2)) == [0, 1]
    assert len(tasks_of(p2.stats(), "_work")) == 2


PROGRAM_EXIT = """\
import asyncio, os, sys

async def child():
    print("child", flush=True)
    await asyncio.sleep(0)
    sys.exit(int(os.environ.get("EXIT_CODE", "4")))

async def main():
    print("main")
    await asyncio.create_task(child())
    print("never")

if os.environ.get("USE_AIOPROF") == "1":
    import aioprof
    profiler = aioprof.Profiler().start()
try:
    asyncio.run(main())
finally:
    if os.environ.get("USE_AIOPROF") == "1":
        profiler.stop()
        print("tasks", len(profiler.stats()["tasks"]), file=sys.stderr)
"""


@pytest.mark.parametrize("code", [0, 4])
def test_system_exit_code_and_stdout_in_subprocess(tmp_path: Path, code: int) -> None:
    script = tmp_path / "exit_prog.py"
    script.write_text(PROGRAM_EXIT)
    results = []
    for use in ("0", "1"):
        env = dict(os.environ, USE_AIOPROF=use, EXIT_CODE=str(code), PYTHONPATH=_pythonpath())
        results.append(subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                                      text=True, timeout=60))
    plain, profiled = results
    assert (profiled.returncode, profiled.stdout) == (plain.returncode, plain.stdout)
    assert (plain.returncode, plain.stdout) == (code, "main\nchild\n")
    assert "tasks " in profiled.stderr and "aioprof:" not in profiled.stderr


def _pythonpath() -> str:
    import importlib.util

    spec = importlib.util.find_spec("aioprof")
    root = Path(list(spec.submodule_search_locations)[0]).parent if spec else REPO / "src"
    return os.pathsep.join([str(root)] + [p for p in [os.environ.get("PYTHONPATH")] if p])


# --------------------------------------------------------------------------- (e) stop() mid-step

@pytest.mark.sanitize
def test_stop_inside_a_task_step() -> None:
    p = aioprof.Profiler().start()

    async def main() -> list:
        await asyncio.sleep(0)
        await asyncio.create_task(_work(1))
        p.stop()                                  # inside this task's step
        assert hooked_methods() == ORIGINALS
        out = await _gather_work(3)
        out.append(await asyncio.create_task(_work(5)))
        return out

    assert asyncio.run(main()) == [0, 1, 4, 25]
    stats = p.stats()
    assert stats["warnings"] == []
    assert [t["coroutine"].rsplit(".", 1)[-1] for t in stats["tasks"]][:2] == ["main", "_work"]


@pytest.mark.sanitize
def test_stop_and_restart_inside_a_task_step() -> None:
    p = aioprof.Profiler().start()
    holder: Dict[str, aioprof.Profiler] = {}

    async def main() -> list:
        await asyncio.create_task(_work(1))
        p.stop()
        holder["p2"] = aioprof.Profiler().start()   # same step: a new session under the old hooks' frames
        out = await _gather_work(3)
        await asyncio.sleep(0.001)
        holder["p2"].stop()
        holder["p3"] = aioprof.Profiler().start()
        out += await _gather_work(2)
        return out

    try:
        assert asyncio.run(main()) == [0, 1, 4, 0, 1]
    finally:
        for q in holder.values():
            q.stop()
    for q in (p, holder["p2"], holder["p3"]):
        assert q.stats()["warnings"] == []
    assert len(tasks_of(holder["p2"].stats(), "_work")) == 3
    assert len(tasks_of(holder["p3"].stats(), "_work")) == 2


@pytest.mark.sanitize
def test_stop_inside_a_plain_callback() -> None:
    p = aioprof.Profiler().start()

    async def main() -> list:
        loop = asyncio.get_running_loop()
        loop.call_soon(p.stop)
        loop.call_later(0.001, p.stats)
        out = await _gather_work(4)
        await asyncio.sleep(0.002)
        return out

    assert asyncio.run(main()) == [0, 1, 4, 9]
    assert not p.running and p.stats()["warnings"] == []


# --------------------------------------------------------------------------- odd programs

class _HandMadeCoroutine(collections.abc.Coroutine):
    """A coroutine that is not a Python coroutine object: no frame, no cr_await."""

    def __init__(self, steps: int) -> None:
        self.left = steps

    def send(self, value: Any) -> Any:
        if self.left == 0:
            raise StopIteration("hand-made")
        self.left -= 1
        return None   # a bare yield: the task steps again

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any:
        raise typ if val is None else val

    def close(self) -> None:
        self.left = 0

    def __await__(self) -> Any:
        return self


class _Awaitable:
    def __await__(self):
        return iter([None, None])   # an iterator, not a generator: the chain walk ends here


async def _awaits_custom() -> str:
    await _Awaitable()
    return "custom"


async def _deep(n: int) -> int:
    if n == 0:
        await asyncio.sleep(0.001)
        return 0
    return 1 + await _deep(n - 1)


async def _odd_program() -> list:
    loop = asyncio.get_running_loop()
    out: List[Any] = [await loop.create_task(_HandMadeCoroutine(3))]
    out.append(await asyncio.create_task(_awaits_custom()))
    out.append(await asyncio.create_task(_deep(300)))
    out.append(await asyncio.gather(*(_deep(60) for _ in range(3))))
    gen = _async_gen()
    out.append([x async for x in gen])
    return out


async def _async_gen():
    for i in range(3):
        await asyncio.sleep(0)
        yield i


@pytest.mark.sanitize
def test_odd_awaitables_and_deep_chains() -> None:
    plain = asyncio.run(_odd_program())
    with aioprof.Profiler() as p:
        result = asyncio.run(_odd_program())
    assert result == plain == ["hand-made", "custom", 300, [60, 60, 60], [0, 1, 2]]
    stats = p.stats()
    assert stats["warnings"] == []
    deep = tasks_of(stats, "_deep")
    assert len(deep) == 4
    for t in deep:
        for site in t["await_sites"]:
            assert 1 <= len(site["chain"]) <= 300


# --------------------------------------------------------------------------- (f) start/stop cycles

async def _small(i: int) -> int:
    t = asyncio.create_task(_work(i))
    await asyncio.sleep(0)
    return await t


@pytest.mark.sanitize
def test_start_stop_cycles_do_not_leak() -> None:
    cycles = 20 if SANITIZER else 100

    def once(i: int) -> None:
        p = aioprof.Profiler(max_tasks=10)
        p.start()
        try:
            assert asyncio.run(_small(i)) == i * i
        finally:
            p.stop()
        stats = p.stats()
        assert stats["warnings"] == []
        assert len(tasks_of(stats, "_work")) == 1

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(5):
            once(i)
        gc.collect()
        objects_before = len(gc.get_objects())
        code_refs = sys.getrefcount(_work.__code__), sys.getrefcount(_small.__code__)
        for i in range(cycles):
            once(i)
        gc.collect()
        objects_after = len(gc.get_objects())
    assert aioprof_warnings(caught) == []
    assert objects_after - objects_before < 100, (objects_before, objects_after)
    # the sessions' strong references to code objects were all released
    assert (sys.getrefcount(_work.__code__), sys.getrefcount(_small.__code__)) == code_refs
    assert hooked_methods() == ORIGINALS


# --------------------------------------------------------------------------- hooks kept past stop()

KEPT_BOUND_HOOK = """\
import asyncio, aioprof

p = aioprof.Profiler().start()
loop = asyncio.new_event_loop()
handle = loop.call_soon(print, "callback ran")
run = handle._run           # a bound method of whatever Handle._run is now, kept past stop()
p.stop()
run()
loop.close()
print("ok")
"""

PATCH_DURING_PROFILING = """\
import asyncio, asyncio.events, os
import aioprof

calls = []
p = aioprof.Profiler().start() if os.environ.get("USE_AIOPROF") == "1" else None
inner = asyncio.events.Handle._run     # another tool wraps Handle._run while aioprof runs


def traced_run(self):
    calls.append(1)
    return inner(self)


asyncio.events.Handle._run = traced_run
if p is not None:
    p.stop()
print("patch kept:", asyncio.events.Handle._run is traced_run)
print(asyncio.run(asyncio.sleep(0, "result")), "wrapper called:", len(calls) > 0)
"""


def _run_script(tmp_path: Path, source: str, use_aioprof: str = "1") -> "subprocess.CompletedProcess[str]":
    script = tmp_path / "prog.py"
    script.write_text(source)
    env = dict(os.environ, PYTHONPATH=_pythonpath(), USE_AIOPROF=use_aioprof)
    return subprocess.run([sys.executable, "-X", "faulthandler", str(script)], env=env,
                          capture_output=True, text=True, timeout=60)


def test_hook_method_kept_past_stop_still_calls_the_original(tmp_path: Path) -> None:
    """A bound `handle._run` taken while profiling (a cached method, another tool's wrapper,
    or a thread preempted between looking the method up and calling it) is called after
    stop(): it must run the callback, not crash. In a subprocess: it may crash."""
    proc = _run_script(tmp_path, KEPT_BOUND_HOOK)
    assert (proc.returncode, proc.stdout) == (0, "callback ran\nok\n"), proc.stderr[-2000:]


def test_monkeypatch_made_while_profiling_survives_stop(tmp_path: Path) -> None:
    """A program (or another tool) that wraps Handle._run while aioprof runs keeps its wrapper
    after stop(), as it would without aioprof, and the wrapper still works."""
    plain = _run_script(tmp_path, PATCH_DURING_PROFILING, use_aioprof="0")
    profiled = _run_script(tmp_path, PATCH_DURING_PROFILING, use_aioprof="1")
    assert (plain.returncode, plain.stdout) == (0, "patch kept: True\nresult wrapper called: True\n")
    assert (profiled.returncode, profiled.stdout) == (plain.returncode, plain.stdout), profiled.stderr[-2000:]
