"""The `Profiler` class: start and stop the C core and turn its snapshot into a report.

The core (`aioprof._core`) counts integer nanoseconds; this module converts them to
seconds (every key ending in ``_ns`` becomes the same key ending in ``_s``) and
assembles the JSON document described in docs/json.md.
"""
from __future__ import annotations

import atexit
import platform
import sys
import warnings
from typing import IO, Any, Optional

__all__ = ["Profiler"]


def _to_seconds(obj: Any) -> Any:
    """Return a copy of `obj` whose ``*_ns`` integer fields are ``*_s`` floats."""
    if isinstance(obj, dict):
        out = {}
        for key, value in obj.items():
            if key.endswith("_ns") and (value is None or isinstance(value, int)):
                out[key[:-3] + "_s"] = None if value is None else value / 1e9
            else:
                out[key] = _to_seconds(value)
        return out
    if isinstance(obj, list):
        return [_to_seconds(v) for v in obj]
    return obj


def _watch_eager_factory(core: Any) -> Optional[tuple]:
    """On 3.12+, watch asyncio's eager task factory with sys.monitoring local events:
    an eager task's first step runs inside Task(), where no loop hook sees it (docs/
    metrics.md). Only that one code object is instrumented. Returns what to undo, or
    None (older Python, or every free tool id is taken)."""
    monitoring = getattr(sys, "monitoring", None)
    factory = getattr(__import__("asyncio").tasks, "create_eager_task_factory", None)
    if monitoring is None or factory is None:
        return None
    code = factory(__import__("asyncio").Task).__code__   # shared by every eager factory
    for tool in (4, 3, 5, 1):
        try:
            monitoring.use_tool_id(tool, "aioprof")
        except ValueError:
            continue
        events = monitoring.events
        monitoring.register_callback(tool, events.PY_START, core._eager_begin)
        monitoring.register_callback(tool, events.PY_RETURN, core._eager_end)
        monitoring.set_local_events(tool, code, events.PY_START | events.PY_RETURN)
        return tool, code
    return None


def _unwatch_eager_factory(handle: Optional[tuple]) -> None:
    if handle is None:
        return
    tool, code = handle
    monitoring = sys.monitoring
    monitoring.set_local_events(tool, code, 0)
    monitoring.register_callback(tool, monitoring.events.PY_START, None)
    monitoring.register_callback(tool, monitoring.events.PY_RETURN, None)
    monitoring.free_tool_id(tool)


def _loop_notes() -> list:
    """What aioprof cannot measure about this process's loops, one sentence each: loop
    classes that replace ``BaseEventLoop._run_once`` (nest_asyncio.apply() does) hide
    their ticks from the hooks, and a nested run inside a task step is that step's time."""
    asyncio = sys.modules.get("asyncio")
    base = getattr(getattr(asyncio, "base_events", None), "BaseEventLoop", None)
    if base is None:
        return []
    replaced, stack, seen = [], list(type.__subclasses__(base)), set()
    while stack:
        cls = stack.pop()
        if cls in seen:
            continue
        seen.add(cls)
        stack.extend(type.__subclasses__(cls))
        if "_run_once" in vars(cls):
            replaced.append(cls)
    if not replaced:
        return []
    names = ", ".join(sorted(c.__qualname__ for c in replaced))
    by = " by nest_asyncio" if any(vars(c).get("_nest_patched") for c in replaced) else ""
    return [f"{names}: _run_once is replaced{by}: no ticks, select wait, lag or slow ticks; a "
            "nested run_until_complete is busy time of the step that called it, and the tasks "
            "it runs get no steps"]


class Profiler:
    """Profile the asyncio event loops of this process.

    Use as ``with aioprof.Profiler() as p: ...`` or with ``p.start()`` / ``p.stop()``.
    Only one profiler can run at a time in a process; it watches every standard-library
    event loop in every thread while it runs.

    Args:
        max_tasks: per-task records kept (int >= 0); tasks past this are still folded
            into the per-coroutine aggregates and counted in ``dropped_tasks``.
        cpu_window: seconds (float > 0); the thread CPU clock is read at most once per
            window and its CPU time is shared among the steps that ran in it in
            proportion to their wall time (docs/design.md).
        slow_ms: milliseconds (float >= 0); a step or callback at least this long is
            recorded as a slow step.
        interval: seconds (float >= 0) between samples of the running frames, e.g.
            0.001; 0 (the default) means no sampling. The main thread's loop samples
            itself (a pending call; on 3.10-3.12 also a real-time signal whose handler
            stays installed); other threads' loops are sampled under the GIL
            (docs/stacks.md).
        async_stacks: charge each suspension's idle time to the task's async call stack
            (the tasks awaiting it + its await chain), for the idle flame graph.
        trace: record a timeline (steps, scheduled and await intervals, ticks, selects,
            task creation) in a ring of `trace_buffer` events (int >= 1).

    Raises:
        ValueError: an argument is out of range.
        RuntimeError: from ``start()`` when another profiler is already running.
    """

    def __init__(self, *, max_tasks: int = 10000, cpu_window: float = 0.001,
                 slow_ms: float = 100.0, interval: float = 0.0, async_stacks: bool = False,
                 trace: bool = False, trace_buffer: int = 200_000) -> None:
        if not isinstance(max_tasks, int) or max_tasks < 0:
            raise ValueError(f"max_tasks must be an int >= 0, not {max_tasks!r}")
        if not cpu_window > 0:
            raise ValueError(f"cpu_window must be > 0 seconds, not {cpu_window!r}")
        if not slow_ms >= 0:
            raise ValueError(f"slow_ms must be >= 0, not {slow_ms!r}")
        if not interval >= 0:
            raise ValueError(f"interval must be >= 0 seconds, not {interval!r}")
        if not isinstance(trace_buffer, int) or not 1 <= trace_buffer <= 100_000_000:
            raise ValueError(f"trace_buffer must be an int from 1 to 100000000, not {trace_buffer!r}")
        self.interval = float(interval)
        self.async_stacks = bool(async_stacks)
        self.trace = bool(trace)
        self.trace_buffer = trace_buffer
        self.max_tasks = max_tasks
        self.cpu_window = float(cpu_window)
        self.slow_ms = float(slow_ms)
        self._final: Optional[dict] = None
        self._running = False
        self._eager: Optional[tuple] = None

    # -- life cycle ---------------------------------------------------------------
    def start(self) -> "Profiler":
        """Install the hooks and start counting; returns self.

        Raises RuntimeError if a profiler is already running in this process.
        """
        from aioprof import _core   # imported late: reports render without a built core

        _core.start(self.max_tasks, int(self.cpu_window * 1e9), int(self.slow_ms * 1e6),
                    int(self.interval * 1e9), self.async_stacks, self.trace_buffer if self.trace else 0)
        self._eager = _watch_eager_factory(_core)
        self._running = True
        self._final = None
        # The sampler thread must not outlive the interpreter: stop at exit at the latest.
        atexit.register(self.stop)
        return self

    def stop(self) -> "Profiler":
        """Remove the hooks and keep the final snapshot; returns self. Idempotent."""
        if self._running:
            self._running = False
            atexit.unregister(self.stop)
            _unwatch_eager_factory(self._eager)
            from aioprof import _core

            self._final = self._document(_core.stop())
            # One warning per fault, once: the run goes on without profiling.
            for message in self._final.get("warnings", []):
                warnings.warn(f"aioprof: {message}", RuntimeWarning, stacklevel=2)
        return self

    @property
    def running(self) -> bool:
        """True between start() and stop()."""
        return self._running

    def __enter__(self) -> "Profiler":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- results ------------------------------------------------------------------
    def stats(self) -> dict:
        """Return the report as the JSON document of docs/json.md (dicts and lists).

        While running, a snapshot as of now (pending tasks are counted up to now);
        after stop(), the final snapshot. Raises RuntimeError if never started.
        """
        if self._running:
            from aioprof import _core

            return self._document(_core.snapshot())
        if self._final is None:
            raise RuntimeError("this Profiler was never started")
        return self._final

    def report(self, format: str = "text", file: Optional[IO[str]] = None, *,
               sort: str = "busy", limit: Optional[int] = None, by: str = "coroutine",
               show_internal: bool = False, width: Optional[int] = None) -> None:
        """Write the report to `file` (default sys.stderr).

        format: "text" (tables) or "json" (docs/json.md). sort, limit, by,
        show_internal and width shape the text report (see `aioprof.report.text`).
        Raises ValueError for an unknown format, sort or by.
        """
        from aioprof import report as _report

        doc = self.stats()
        _report.write(doc, format=format, file=file if file is not None else sys.stderr,
                      sort=sort, limit=limit, by=by, show_internal=show_internal, width=width)
        note = _report.trace.dropped_note(doc, "Profiler(trace_buffer=N)") if format == "trace" else None
        if note:
            print(f"aioprof: {note}", file=sys.stderr)

    # -- internals ----------------------------------------------------------------
    @staticmethod
    def _document(raw: dict) -> dict:
        doc = {"aioprof": 1, "python": platform.python_version()}
        doc.update(_to_seconds(raw))
        doc["loop_notes"] = _loop_notes()
        return doc
