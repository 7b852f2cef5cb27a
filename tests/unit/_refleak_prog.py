"""The program of test_refleaks.py: each scenario named on the command line is measured
with CPython's `-R` discipline, and one JSON line per scenario is printed:
``{"scenario": NAME, "references": [...], "blocks": [...], "objects": {...}, "error": ...}``.

Usage (a debug build: sys.gettotalrefcount): python _refleak_prog.py SCENARIO...

Each scenario runs WARMUPS times to fill the caches (interned names, aioprof's once-made
objects, asyncio's lazily imported modules, linecache), then RUNS more times; after each
run the caches regrtest's ``dash_R_cleanup`` clears are cleared and the garbage
collected, and the change since the previous run of the total reference count
(``references``), of the allocated memory blocks less the strings interned for good
(``blocks``) and of the reference counts of a few named objects (``objects``) is kept
for each measured run. A failed check of the scenario itself is its ``error``.
It runs in a process of its own, so that nothing another test imported (uvloop, a
release build, whose inlined Py_INCREF/Py_DECREF the total does not count) adds to it.
"""
from __future__ import annotations

import array
import asyncio
import gc
import io
import json
import linecache
import sys
import threading
import traceback
import warnings
from typing import Callable, Dict

import aioprof
from aioprof import _core

WARMUPS, RUNS = 3, 5
N = 1000   # tasks of each kind in a storm


# ------------------------------------------------------------------------ measurement

def _cleanup(filters: list) -> None:
    """The caches regrtest clears between runs (those these scenarios can fill), then gc."""
    import abc
    import re
    warnings.filters[:] = filters
    linecache.clearcache()
    re.purge()
    for cls in list(abc.ABC.__subclasses__()) + [abc.ABC]:
        cls._abc_caches_clear()
    if hasattr(sys, "_clear_internal_caches"):   # 3.13+
        sys._clear_internal_caches()
    else:
        sys._clear_type_cache()
    gc.collect()
    gc.collect()


def hunt(run: Callable[[], None], objects: Dict[str, object]) -> dict:
    """Run `run` WARMUPS + RUNS times; the deltas of each measured run (module doc)."""
    filters = warnings.filters[:]
    n = WARMUPS + RUNS
    names = sorted(objects)
    # Everything the loop keeps is made before it (as regrtest's pre-allocated lists and
    # pooled ints): an array item keeps no int object alive, so measuring leaves nothing
    # behind between two readings.
    refs, blocks = array.array("q", [0] * n), array.array("q", [0] * n)
    counts = {name: array.array("q", [0] * n) for name in names}
    befores = array.array("q", [0] * len(names))
    interned = getattr(sys, "getunicodeinternedsize", None) if sys.version_info >= (3, 13) else None
    gettotalrefcount, getallocatedblocks, getrefcount = (
        sys.gettotalrefcount, sys.getallocatedblocks, sys.getrefcount)
    rc_before = blocks_before = 0
    _cleanup(filters)
    for i in range(n):
        run()
        _cleanup(filters)
        # Strings interned by the run are immortal and never freed (3.13+): not a leak.
        immortal = interned(_only_immortal=True) if interned is not None else 0
        blocks_after = getallocatedblocks() - immortal
        rc_after = gettotalrefcount()
        refs[i] = rc_after - rc_before
        blocks[i] = blocks_after - blocks_before
        rc_before, blocks_before = rc_after, blocks_after
        for j, name in enumerate(names):
            c = getrefcount(objects[name])
            counts[name][i] = c - befores[j]
            befores[j] = c
    assert not _core.is_active(), "a scenario left a profiler running"
    return {"references": list(refs[WARMUPS:]), "blocks": list(blocks[WARMUPS:]),
            "objects": {name: list(counts[name][WARMUPS:]) for name in names},
            "warmups": {"references": list(refs[:WARMUPS]), "blocks": list(blocks[:WARMUPS])}}


def rows(doc: dict) -> dict:
    return {c["coroutine"].rsplit(".", 1)[-1]: c for c in doc["coroutines"]}


# ------------------------------------------------------------------------- the program

async def ok(i: int) -> int:
    await asyncio.sleep(0)
    return i


async def boom(i: int) -> None:
    await asyncio.sleep(0)
    raise ValueError(i)


async def sleeper() -> None:
    await asyncio.sleep(3600)


async def chain(depth: int) -> int:
    if depth == 0:
        await asyncio.sleep(0)
        return 0
    return 1 + await asyncio.create_task(chain(depth - 1))


async def ticker(n: int):
    for i in range(n):
        await asyncio.sleep(0)
        yield i


async def consume() -> int:
    return sum([i async for i in ticker(5)])


async def at_once(i: int) -> int:
    return i   # an eager task that ends in its first step


async def boom_at_once(i: int) -> None:
    raise ValueError(i)   # an eager task that raises in its first step


def _from_thread(loop: asyncio.AbstractEventLoop, fut: "asyncio.Future[int]") -> None:
    loop.call_soon_threadsafe(fut.set_result, 7)


async def storm() -> dict:
    """Thousands of tasks that return, raise, are cancelled, await chains and async
    generators, wait_for/timeouts, executor jobs and call_soon_threadsafe, eager tasks
    (3.12+ factory; create_task(eager_start=True) on 3.14+). Returns what it counted."""
    loop = asyncio.get_running_loop()
    got = {}
    oks = [asyncio.create_task(ok(i)) for i in range(N)]
    booms = [asyncio.create_task(boom(i)) for i in range(N // 4)]
    sleepers = [asyncio.create_task(sleeper()) for _ in range(N // 4)]
    await asyncio.sleep(0)
    for t in sleepers:
        t.cancel()
    results = await asyncio.gather(*oks, *booms, *sleepers, return_exceptions=True)
    got["ok"] = sum(1 for r in results if isinstance(r, int))
    got["boom"] = sum(1 for r in results if isinstance(r, ValueError))
    got["cancelled"] = sum(1 for r in results if isinstance(r, asyncio.CancelledError))
    del results, oks, booms, sleepers
    got["chain"] = await asyncio.gather(*(chain(5) for _ in range(20)))
    got["agen"] = await asyncio.gather(*(consume() for _ in range(20)))
    try:
        await asyncio.wait_for(sleeper(), 0.001)
    except asyncio.TimeoutError:
        got["wait_for"] = "timeout"
    got["to_thread"] = await asyncio.to_thread(sum, range(10))
    got["executor"] = await loop.run_in_executor(None, sum, range(5))
    fut = loop.create_future()
    th = threading.Thread(target=_from_thread, args=(loop, fut))
    th.start()
    got["threadsafe"] = await fut
    th.join()
    if sys.version_info >= (3, 11):
        try:
            async with asyncio.TaskGroup() as tg:
                for i in range(50):
                    tg.create_task(ok(i))
                tg.create_task(boom(-1))
        except Exception as e:   # ExceptionGroup (3.11+)
            got["taskgroup"] = type(e).__name__
    if sys.version_info >= (3, 12):
        loop.set_task_factory(asyncio.eager_task_factory)
        eager = [asyncio.create_task(at_once(i)) for i in range(N // 4)]
        eager += [asyncio.create_task(ok(i)) for i in range(N // 4)]
        eager += [asyncio.create_task(boom_at_once(i)) for i in range(50)]
        eager_sleepers = [asyncio.create_task(sleeper()) for _ in range(50)]
        for t in eager_sleepers:
            t.cancel()
        results = await asyncio.gather(*eager, *eager_sleepers, return_exceptions=True)
        got["eager_factory"] = [sum(1 for r in results if isinstance(r, kind))
                                for kind in (int, ValueError, asyncio.CancelledError)]
        loop.set_task_factory(None)
        del eager, eager_sleepers, results
    if sys.version_info >= (3, 14):
        eager = [asyncio.create_task(at_once(i), eager_start=True) for i in range(N // 4)]
        got["eager_start"] = len(await asyncio.gather(*eager))
        del eager
    return got


EXPECTED = {"ok": N, "boom": N // 4, "cancelled": N // 4, "chain": [5] * 20, "agen": [10] * 20,
            "wait_for": "timeout", "to_thread": 45, "executor": 10, "threadsafe": 7}
if sys.version_info >= (3, 11):
    EXPECTED["taskgroup"] = "ExceptionGroup"
if sys.version_info >= (3, 12):
    EXPECTED["eager_factory"] = [N // 2, 50, 50]
if sys.version_info >= (3, 14):
    EXPECTED["eager_start"] = N // 4


def at_once_tasks() -> int:
    """Tasks of at_once per storm."""
    return (N // 4 if sys.version_info >= (3, 12) else 0) + (N // 4 if sys.version_info >= (3, 14) else 0)


def check_storm(doc: dict) -> None:
    assert doc["warnings"] == []
    by = rows(doc)
    assert by["ok"]["tasks"] == N + 50 * (sys.version_info >= (3, 11)) + (N // 4) * (sys.version_info >= (3, 12))
    assert by["boom"]["tasks"] == N // 4 + (sys.version_info >= (3, 11))
    # wait_for runs its awaitable in a task of its own before 3.12
    assert by["sleeper"]["tasks"] == N // 4 + (sys.version_info < (3, 12)) + 50 * (sys.version_info >= (3, 12))
    assert by["chain"]["tasks"] == 20 * 6
    if at_once_tasks():
        assert by["at_once"]["tasks"] == at_once_tasks()
        assert by["boom_at_once"]["tasks"] == 50


# -------------------------------------------------------------------------- scenarios

CONFIGS = [
    dict(),
    dict(max_tasks=0),
    dict(max_tasks=50, cpu_window_ms=1e-6, slow_ms=0),
    dict(interval_ms=1, async_stacks=True, trace=True, trace_buffer=1000),
]
CONFIG_NAMES = ["default", "max_tasks=0", "slow_ms=0", "sampling+stacks+trace"]
SCENARIOS: Dict[str, Callable[[], dict]] = {}


def scenario(fn: Callable[[], dict]) -> Callable[[], dict]:
    SCENARIOS[fn.__name__] = fn
    return fn


@scenario
def start_stop_cycles() -> dict:
    """Many sessions with every kind of option, each with a short loop run, a snapshot
    while running, and stats() of the finished session."""
    def run() -> None:
        for _ in range(10):
            for cfg in CONFIGS:
                p = aioprof.Profiler(**cfg)
                p.start()
                assert asyncio.run(ok(3)) == 3
                assert rows(p.stats())["ok"]["tasks"] == 1
                p.stop()
                p.stop()   # idempotent
                assert rows(p.stats())["ok"]["tasks"] == 1
                del p
    return hunt(run, {"ok": ok})


def _storm_scenario(cfg: dict) -> Callable[[], dict]:
    def storm_scenario() -> dict:
        def run() -> None:
            with aioprof.Profiler(**cfg) as p:
                assert asyncio.run(storm()) == EXPECTED
            check_storm(p.stats())
        return hunt(run, {"ok": ok, "storm": storm})
    return storm_scenario


for _cfg, _name in zip(CONFIGS, CONFIG_NAMES):
    SCENARIOS[f"task_storm[{_name}]"] = _storm_scenario(_cfg)

FORMATS = [("text", {}), ("text", {"by": "task"}), ("text", {"by": "site"}), ("json", {}),
           ("collapsed", {"flame": "cpu"}), ("collapsed", {"flame": "idle"}),
           ("collapsed", {"flame": "wall"}), ("trace", {})]


@scenario
def report_renders() -> dict:
    """Every format and view of one storm's report, rendered again in each run."""
    with aioprof.Profiler(interval_ms=1, async_stacks=True, trace=True, trace_buffer=5000) as p:
        assert asyncio.run(storm()) == EXPECTED
    doc = p.stats()
    check_storm(doc)
    sizes: Dict[str, int] = {}

    def run() -> None:
        for fmt, opts in FORMATS:
            out = io.StringIO()
            p.report(format=fmt, file=out, **opts)
            text = out.getvalue()
            if fmt in ("json", "trace"):
                json.loads(text)
            key = fmt + repr(opts)
            assert text and sizes.setdefault(key, len(text)) == len(text), key   # the same each time
    return hunt(run, {"document": doc})


class Counter:
    def __init__(self) -> None:
        self.ticks = 0
        self.starts = 0

    def loop_start(self) -> None:
        self.starts += 1

    def tick_end(self, handles: int) -> None:
        self.ticks += 1


@scenario
def loop_monitor() -> dict:
    """LoopMonitor with and without a running profiler: observers, load(), stats()."""
    def run() -> None:
        for profiled in (False, True):
            p = aioprof.Profiler().start() if profiled else None
            loop = asyncio.new_event_loop()
            try:
                with aioprof.LoopMonitor(loop) as mon:
                    counter = Counter()
                    mon.add_observer(counter)
                    assert loop.run_until_complete(storm()) == EXPECTED
                    load = mon.load()
                    stats = mon.stats()
                    mon.remove_observer(counter)
            finally:
                loop.close()
            assert load is not None and 0 <= load <= 1
            assert counter.starts == 1 and counter.ticks == stats["ticks"] > 0
            if p is not None:
                p.stop()
                check_storm(p.stats())
    return hunt(run, {"Counter": Counter})


@scenario
def uvloop_storm() -> dict:
    """The storm on uvloop's loop, profiled, and sessions with uvloop imported (aioprof
    hooks uvloop.Loop.call_soon at each start); `objects` holds uvloop's loop class and
    the call_soon that aioprof wraps."""
    import uvloop

    def run() -> None:
        for _ in range(10):
            aioprof.Profiler().start().stop()
        with aioprof.Profiler() as p:
            got = uvloop.run(storm())
        assert got == EXPECTED
        check_storm(p.stats())
    base_call_soon = next(vars(c)["call_soon"] for c in uvloop.Loop.__mro__ if "call_soon" in vars(c))
    return hunt(run, {"uvloop.Loop": uvloop.Loop, "call_soon": base_call_soon, "aioprof._core": _core})


def main(names: list) -> int:
    if not hasattr(sys, "gettotalrefcount"):
        print(f"{sys.executable} is not a debug build (no sys.gettotalrefcount)", file=sys.stderr)
        return 2
    for name in names:
        try:
            out = SCENARIOS[name]()
            out["error"] = None
        except Exception:
            out = {"error": traceback.format_exc()}
        out["scenario"] = name
        print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or list(SCENARIOS)))
