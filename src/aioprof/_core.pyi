"""Type stubs of aioprof's C core, `aioprof._core`.

All times are integer nanoseconds on CLOCK_MONOTONIC (wall) and the thread's
CLOCK_THREAD_CPUTIME_ID (CPU). `aioprof.Profiler` is the public interface; these are
its building blocks. Definitions of every figure: docs/metrics.md and docs/json.md.
"""
from typing import Any, Sequence

HIST_BUCKETS: int
"""Buckets per histogram: log-linear, 8 per power of two (values within 12.5%)."""

def start(max_tasks: int, cpu_window_ns: int, slow_ns: int, interval_ns: int = ...,
          async_stacks: bool = ..., trace_events: int = ...) -> None:
    """Install the event-loop and task hooks and begin a session (3 or 6 arguments).

    max_tasks >= 0: per-task records kept (the rest are folded and counted as dropped).
    cpu_window_ns > 0: the CPU clock is read at most once per window per thread.
    slow_ns >= 0: steps, callbacks and ticks at least this long are slow; with
        interval_ns 0 and slow_ns > 0 a watchdog thread captures where each step is once
        it runs past slow_ns (slow_steps[*].blocked_at; off with AIOPROF_WATCHDOG=0).
    interval_ns >= 0: sampling interval of the sampler thread (0: no sampling).
    async_stacks: charge idle time to async call stacks (docs/stacks.md).
    trace_events in [0, 1e8]: size of the trace ring (0: no trace).

    Raises RuntimeError if a session is already running, ValueError for a bad argument,
    and ImportError/AttributeError if asyncio's classes are not where expected.
    """

def stop() -> dict[str, Any]:
    """Remove the hooks, end the session and return its final `snapshot()`.

    Raises RuntimeError if no session is running.
    """

def snapshot() -> dict[str, Any]:
    """The running session's figures as of now, in ns: keys wall_ns, cpu_window_ns,
    slow_ns, dropped_tasks, warnings (list[str]), tasks, coroutines, callbacks, sites,
    loops, loops_folded (lists of dicts; docs/json.md with *_ns in place of *_s).

    Raises RuntimeError if no session is running.
    """

def metrics() -> dict[str, Any]:
    """The running session's figures that aioprof.metrics exports, in ns, without the
    per-task records (cheap: it grows with coroutine functions and loops, not tasks):
    wall_ns, slow_ns; tasks_now {running, scheduled, idle} (live tasks by state);
    tasks_ended {done, cancelled, failed, destroyed}; coroutines (as snapshot()'s, pending
    tasks counted up to now); loops and loops_folded (the fields of snapshot()'s, without
    slow_steps, plus lag_buckets [(upper bound ns, count), ...] of the non-empty buckets of
    the lag histogram, each holding the lags from the previous bound up to its own, and
    lag_sum_ns). Safe from any thread: after its sweep of closed loops (is_closed()
    calls), it runs no Python code (the cyclic GC is off meanwhile). Ending the session
    from another thread meanwhile is the caller's to prevent (Profiler holds a lock).

    Raises RuntimeError if no session is running.
    """

def is_active() -> bool:
    """True while a session runs."""

def set_fake_clock(on: bool) -> None:
    """Replace both clocks by a fake one that starts at 0 and moves only with
    `fake_advance` (for exact tests). Raises RuntimeError while a session runs."""

def fake_advance(wall_ns: int, cpu_ns: int = 0) -> None:
    """Move the fake clock forward. Raises ValueError if the fake clock is off or a
    step is negative."""

def clock_ns() -> int:
    """aioprof's wall clock now, in ns (CLOCK_MONOTONIC, or the fake clock)."""

def monitor_add(loop: Any) -> int:
    """Open a loop monitor on `loop` (installs the hooks if needed); returns its id.
    Raises RuntimeError if the loop has one already or 64 are open."""

def monitor_close(id: int) -> None:
    """Close a loop monitor (idempotent)."""

def monitor_observers(id: int) -> list[Any]:
    """The monitor's observer list (mutable: add or remove observers in it).
    Raises ValueError for an unknown id."""

def monitor_read(id: int) -> dict[str, Any]:
    """The monitor's figures now: load (float in [0, 1], smoothed 1 s), wall_ns,
    select_wait_ns, select_capped_ns, age_ns, ticks, select_calls, handles, running;
    stepped (bool: a loop without hooked ticks, uvloop, whose load comes from its task
    steps), step_busy_ns and steps (those steps' time and count).
    Raises ValueError for an unknown id."""

def hist_quantiles(values: Sequence[int], quantiles: Sequence[float]) -> list[int]:
    """Put `values` (ns) in one of aioprof's histograms and read the given quantiles
    (each in [0, 1]; 1 gives the exact maximum). For tests of the histogram."""
