"""`LoopMonitor`: the events and the load of one asyncio event loop, cheap enough to
leave on in production.

Loop events (from the asyncio loop-instrumentation proposal), delivered to observers:

================  ==============================================================
``loop_start()``  the loop starts running (``run_forever``/``run_until_complete``)
``tick_start()``  one loop iteration (``BaseEventLoop._run_once``) begins
``io_start(t)``   the loop is about to wait in ``select``; ``t`` is the timeout in
                  seconds, or None for "until an event"
``io_end(t, n)``  ``select`` returned with ``n`` events
``tick_end(h)``   the iteration ends, having run ``h`` handles
``loop_stop()``   the loop stops running
================  ==============================================================

The load is computed in C without calling Python: the share of time the loop is busy,
where time blocked in ``select`` counts as idle only up to the timeout it was given
(time past the timeout means the process was not scheduled: busy), smoothed
exponentially with a 1 s time constant.

uvloop runs its ticks and ``select`` in compiled code: it sends none of the events above,
and its busy time is the time inside its task steps (timed through its ``call_soon``),
everything else counting as idle. Its load is that share, smoothed the same way; work
uvloop does outside task steps (its own I/O callbacks, plain callbacks) and CPU
starvation are not seen there (docs/loop-monitor.md).
"""
from __future__ import annotations

import asyncio
import threading
from typing import Any, Optional

__all__ = ["LoopMonitor"]


class _Core:
    """aioprof._core, imported on first use so that `import aioprof` works without it;
    the first use puts the real module in this one's place."""

    def __getattr__(self, name: str) -> Any:
        from aioprof.profiler import load_core   # one clear line in a subinterpreter

        module = load_core()
        globals()["_core"] = module
        return getattr(module, name)


_core = _Core()


class LoopMonitor:
    """Watch one event loop (default: the running one) until `close()`.

    Works with or without a running `aioprof.Profiler`. One monitor per loop.

    Raises:
        RuntimeError: no loop given and none running, the loop already has a monitor,
            or 64 monitors are open.
    """

    def __init__(self, loop: Optional[asyncio.AbstractEventLoop] = None) -> None:
        if loop is None:
            loop = asyncio.get_running_loop()
        self.loop = loop
        # The standard library's loops run the hooked _run_once and select: every figure.
        # uvloop: the busy time of its task steps, so load and utilization; the tick and
        # select figures are None, never 0. Any other loop class: nothing (None).
        self.ticks_seen = isinstance(loop, asyncio.base_events.BaseEventLoop)
        self.available = self.ticks_seen or type(loop).__module__.split(".")[0] == "uvloop"
        # The thread that opened the monitor: the loop's own when opened inside it.
        self.thread_name = threading.current_thread().name
        self._id: Optional[int] = _core.monitor_add(loop)

    # -- observers ------------------------------------------------------------------
    def add_observer(self, observer: Any) -> None:
        """Call `observer`'s methods named after the loop events (any subset of
        loop_start, tick_start, io_start, io_end, tick_end, loop_stop) from now on.

        An exception raised by an observer goes to `sys.unraisablehook` and never
        reaches the loop. Observers run on the loop's thread, inside the loop: keep
        them short (they add to every tick)."""
        _core.monitor_observers(self._checked()).append(observer)

    def remove_observer(self, observer: Any) -> None:
        """Stop calling `observer`. Raises ValueError if it was not added."""
        _core.monitor_observers(self._checked()).remove(observer)

    # -- figures --------------------------------------------------------------------
    def load(self) -> Optional[float]:
        """The loop's smoothed load now, in [0, 1] (1 s exponential window); None only
        for a loop class aioprof cannot watch (see `available`).

        Time in ``select`` up to its timeout is idle; everything else while the loop
        runs is busy, including ``select`` sleeping past its timeout. Under uvloop: the
        share of time spent in task steps. A few hundred nanoseconds: fit for load
        shedding in a request handler."""
        load = _core.monitor_read(self._checked())["load"]
        return load if self.available else None

    def stats(self) -> dict:
        """Figures since the monitor opened: ``load`` (smoothed, as `load()`),
        ``busy_s`` (time the loop was busy), ``wall_s`` (time inside ticks),
        ``select_wait_s``, ``utilization`` (1 - select wait / wall), ``capped_load``
        (1 - select wait capped at each timeout / wall), ``ticks``, ``select_calls``,
        ``handles``, ``running``, ``age_s`` (seconds since the monitor opened).

        Under uvloop ``busy_s`` is the time inside task steps, ``handles`` counts those
        steps, ``utilization`` is busy / age and ``load`` as `load()`; the tick and select
        figures and ``capped_load`` are None. All but ``age_s`` are None for a loop class
        aioprof cannot watch."""
        raw = _core.monitor_read(self._checked())
        wall, age = raw["wall_ns"], raw["age_ns"]
        keys = ("load", "busy_s", "wall_s", "select_wait_s", "utilization", "capped_load", "ticks",
                "select_calls", "handles", "running")
        if not self.ticks_seen:
            out: dict = {key: None for key in keys}
            if self.available:
                busy = raw["step_busy_ns"]
                out.update(load=raw["load"], busy_s=busy / 1e9, handles=raw["steps"],
                           utilization=min(1.0, busy / age) if age > 0 else None)
            out["age_s"] = age / 1e9
            return out
        return {
            "load": raw["load"],
            "busy_s": (wall - raw["select_wait_ns"]) / 1e9,
            "wall_s": wall / 1e9,
            "select_wait_s": raw["select_wait_ns"] / 1e9,
            "utilization": (1 - raw["select_wait_ns"] / wall) if wall else None,
            "capped_load": (1 - raw["select_capped_ns"] / wall) if wall else None,
            "ticks": raw["ticks"],
            "select_calls": raw["select_calls"],
            "handles": raw["handles"],
            "running": raw["running"],
            "age_s": age / 1e9,
        }

    # -- Prometheus ---------------------------------------------------------------------
    def collect(self) -> Any:
        """The monitor's figures as ``prometheus_client`` metric families, so that the
        monitor is a collector: ``prometheus_client.REGISTRY.register(monitor)``.

        Gauges ``aioprof_loop_utilization`` and ``aioprof_loop_load``, counters
        ``aioprof_loop_{busy,wall,select_wait}_seconds_total`` and
        ``aioprof_loop_{ticks,handles,select_calls}_total``, labelled ``loop`` (the
        monitor's number), ``type`` (the loop's class) and ``thread``; nothing once
        closed. A figure the loop class does not have (uvloop's ticks) is left out.
        Imports prometheus_client (docs/prometheus.md)."""
        from aioprof.metrics import monitor_metrics

        return monitor_metrics(self)

    def describe(self) -> list:
        """Nothing (registering does not read the monitor)."""
        return []

    # -- life cycle -------------------------------------------------------------------
    def close(self) -> None:
        """Stop watching the loop. Idempotent."""
        if self._id is not None:
            _core.monitor_close(self._id)
            self._id = None

    def __enter__(self) -> "LoopMonitor":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _checked(self) -> int:
        if self._id is None:
            raise RuntimeError("this LoopMonitor is closed")
        return self._id
