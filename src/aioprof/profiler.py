"""The `Profiler` class: start and stop the C core and turn its snapshot into a report.

The core (`aioprof._core`) counts integer nanoseconds; this module converts them to
seconds (every key ending in ``_ns`` becomes the same key ending in ``_s``) and
assembles the JSON document described in docs/json.md.
"""
from __future__ import annotations

import _thread
import atexit
import os
import platform
import sys
import time
import warnings
from typing import IO, Any, Optional

__all__ = ["Profiler", "load_core"]


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


def _check_number(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number (int or float), not {type(value).__name__} {value!r}")


def _check_int(name: str, value: Any, low: int, high: Optional[int]) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, not {type(value).__name__} {value!r}")
    if value < low or (high is not None and value > high):
        limits = f">= {low}" if high is None else f"from {low} to {high}"
        raise ValueError(f"{name} must be an int {limits}, not {value!r}")


def _milliseconds(name: str, value: Optional[float], old_name: str, old_seconds: Optional[float],
                  default: float) -> float:
    """The value of the `name` argument (milliseconds), or of its deprecated spelling
    `old_name` in seconds; `default` if neither is given."""
    if old_seconds is not None:
        if value is not None:
            raise TypeError(f"give {name} (milliseconds) or {old_name} (seconds, deprecated), not both")
        warnings.warn(f"Profiler({old_name}=seconds) is deprecated: use {name}=milliseconds",
                      DeprecationWarning, stacklevel=3)
        _check_number(old_name, old_seconds)
        return old_seconds * 1e3
    if value is None:
        return default
    _check_number(name, value)
    return value


def _listen_target(listen: Any) -> Any:
    """aioprof.live.listen_target: None, "unix" or (host, port); a bad AIOPROF_LISTEN is a
    warning."""
    from aioprof.live import ListenError, listen_target

    try:
        return listen_target(listen)
    except ListenError as e:
        if listen is None:
            warnings.warn(f"aioprof: not listening: {e}", RuntimeWarning, stacklevel=3)
            return None
        raise ValueError(str(e)) from None


_SUBINTERPRETER = ("aioprof._core cannot be loaded in a subinterpreter: aioprof profiles the "
                   "main interpreter only (docs/design.md)")


def load_core() -> Any:
    """Import and return `aioprof._core`. In a subinterpreter (which it refuses: its hooks
    and tables are per process) the ImportError says so in one line."""
    try:
        from aioprof import _core
    except ImportError as e:
        if "subinterpreter" in str(e):
            raise ImportError(_SUBINTERPRETER, name="aioprof._core") from None
        raise
    _check_core(_core)
    return _core


_core_checked = False


def _check_core(core: Any) -> None:
    """An in-place build older than the Python code (sources changed, `make build` not
    run) lacks functions the code calls, and would fail only at stop(), after the whole
    program ran unprofiled: compare the module with the functions its stub
    (`_core.pyi`, next to it) declares, once, and raise ImportError naming the first
    missing one."""
    global _core_checked
    if _core_checked:
        return
    stub = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_core.pyi")
    try:
        with open(stub, encoding="utf-8") as f:
            declared = [line[4:].split("(", 1)[0] for line in f if line.startswith("def ")]
    except OSError:   # no stub shipped: nothing to compare with
        declared = []
    missing = [name for name in declared if not hasattr(core, name)]
    if missing:
        raise ImportError(f"{core.__file__} is older than aioprof's Python code (it has no "
                          f"{missing[0]}()): rebuild it (make build, or pip install .)",
                          name="aioprof._core")
    _core_checked = True


class _ImportWatch:
    """A `sys.meta_path` entry that finds nothing itself: when the program imports `name`
    (uvloop, asyncio) while the profiler runs, it lets the other finders find it, and once
    the module has run, calls `hook` (the core hooks uvloop's Loop; the profiler starts its
    core once asyncio is there). So the profiler never imports either on the program's
    behalf. One use: it leaves `sys.meta_path` when the module is imported or the profiler
    stops; the module keeps its own loader and spec."""

    def __init__(self, name: str, hook: Any, what: str) -> None:
        self.name, self.hook, self.what = name, hook, what
        self.finding = False

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != self.name or self.finding:
            return None
        self.finding = True
        try:
            spec = None
            for finder in list(sys.meta_path):
                find = getattr(finder, "find_spec", None)
                if finder is not self and find is not None:
                    spec = find(name, path, target)
                    if spec is not None:
                        break
        finally:
            self.finding = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _HookAfterExec(spec.loader, self)
        return spec

    def insert(self) -> "_ImportWatch":
        sys.meta_path.insert(0, self)
        return self

    def remove(self) -> None:
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass


class _HookAfterExec:
    """Loader of the watched module: the real loader's, then the hook; puts the real one back on the
    module before it runs."""

    def __init__(self, loader: Any, watch: _ImportWatch) -> None:
        self.loader, self.watch = loader, watch

    def create_module(self, spec: Any) -> Any:
        create = getattr(self.loader, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module: Any) -> None:
        module.__loader__ = self.loader
        if getattr(module, "__spec__", None) is not None:
            module.__spec__.loader = self.loader
        self.loader.exec_module(module)
        self.watch.remove()
        try:
            self.watch.hook()
        except Exception as e:   # the program goes on (without uvloop's task steps)
            warnings.warn(f"aioprof: cannot {self.watch.what}: {type(e).__name__}: {e}",
                          RuntimeWarning, stacklevel=2)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loader, name)


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


# The profiler that waits for the program's `import asyncio` to start its core (at most one
# runs at a time, as the core's session).
_waiting: Optional["Profiler"] = None


class Profiler:
    """Profile the asyncio event loops of this process.

    Use as ``with aioprof.Profiler() as p: ...`` or with ``p.start()`` / ``p.stop()``.
    Only one profiler can run at a time in a process; it watches every standard-library
    event loop in every thread while it runs.

    Every time argument is in milliseconds, as the command line's options are
    (``interval_ms`` is ``--interval``, ``cpu_window_ms`` ``--cpu-window``, ``slow_ms``
    ``--slow-ms``).

    Args:
        max_tasks: per-task records kept (int >= 0); tasks past this are still folded
            into the per-coroutine aggregates and counted in ``dropped_tasks``.
        cpu_window_ms: milliseconds (number > 0, default 1.0); the thread CPU clock is
            read at most once per window and its CPU time is shared among the steps that
            ran in it in proportion to their wall time (docs/design.md).
        slow_ms: milliseconds (number >= 0, default 100); a step or callback at least
            this long is recorded as a slow step.
        interval_ms: milliseconds (number >= 0) between samples of the running frames,
            e.g. 1.0; 0 (the default) means no sampling. The main thread's loop samples
            itself (a pending call; on 3.10-3.12 also a real-time signal whose handler
            stays installed); other threads' loops are sampled under the GIL
            (docs/stacks.md).
        async_stacks: charge each suspension's idle time to the task's async call stack
            (the tasks awaiting it + its await chain), for the idle flame graph.
        trace: record a timeline (steps, scheduled and await intervals, ticks, selects,
            task creation) in a ring of `trace_buffer` events (int >= 1).
        listen: serve the figures while running, to ``python -m aioprof snapshot PID``
            of the same user, on the Unix socket ``PID.sock`` in a directory only this
            user can enter (docs/live.md). True (or "unix") listens, False does not;
            None (the default) listens if the environment has ``AIOPROF_LISTEN=1`` (or
            ``AIOPROF_LISTEN=HOST:PORT``). The socket is made by ``start()`` and removed
            by ``stop()``. A string ``"HOST:PORT"`` listens on TCP instead, on a
            loopback address only (``127.0.0.1:0`` picks a free port): ``start()``
            prints the port and a random token on stderr and writes them to
            ``PID.tcp`` (mode 0600) in that directory; every request must carry the
            token. Another address is a ValueError.
        interval, cpu_window: deprecated (DeprecationWarning): the same in seconds.

    Raises:
        TypeError: an argument has the wrong type (a number given as a string, ...), or
            both ``interval`` and ``interval_ms`` (``cpu_window`` and ``cpu_window_ms``)
            are given.
        ValueError: an argument is out of range.
        RuntimeError: from ``start()`` when another profiler is already running, or
            when ``listen=True`` and the socket cannot be made (its directory is
            refused: owned by another user or open to others; the message says which).
            With listening asked only by ``AIOPROF_LISTEN``, that is a warning and the
            profiler runs without listening.
    """

    def __init__(self, *, max_tasks: int = 10000, cpu_window_ms: Optional[float] = None,
                 slow_ms: float = 100.0, interval_ms: Optional[float] = None,
                 async_stacks: bool = False, trace: bool = False, trace_buffer: int = 200_000,
                 interval: Optional[float] = None, cpu_window: Optional[float] = None,
                 listen: Any = None) -> None:
        interval_ms = _milliseconds("interval_ms", interval_ms, "interval", interval, 0.0)
        cpu_window_ms = _milliseconds("cpu_window_ms", cpu_window_ms, "cpu_window", cpu_window, 1.0)
        _check_int("max_tasks", max_tasks, 0, None)
        _check_int("trace_buffer", trace_buffer, 1, 100_000_000)
        _check_number("slow_ms", slow_ms)
        if not 0 < cpu_window_ms < float("inf"):
            raise ValueError(f"cpu_window_ms must be > 0 milliseconds, not {cpu_window_ms!r}")
        if not 0 <= slow_ms < float("inf"):
            raise ValueError(f"slow_ms must be >= 0 milliseconds, not {slow_ms!r}")
        if not 0 <= interval_ms < float("inf"):
            raise ValueError(f"interval_ms must be >= 0 milliseconds, not {interval_ms!r}")
        self.interval_ms = float(interval_ms)
        self.async_stacks = bool(async_stacks)
        self.trace = bool(trace)
        self.trace_buffer = trace_buffer
        self.max_tasks = max_tasks
        self.cpu_window_ms = float(cpu_window_ms)
        self.slow_ms = float(slow_ms)
        self._final: Optional[dict] = None
        self._start_unix_s = 0.0
        self._final_metrics: Optional[dict] = None
        # Held while a metrics scrape or a live client's snapshot reads the core (from
        # their own threads) and while stop() ends the session, so that they never read a
        # session being freed.
        self._metrics_lock = _thread.allocate_lock()
        self._running = False
        self._watches: list = []       # _ImportWatch entries of this run, on sys.meta_path
        self._core_started = False
        # Called (no arguments) at the end of stop(), once the final figures are kept:
        # aioprof.metrics.publish_multiprocess's last publish.
        self._stop_hooks: list = []
        self.listen = listen
        self._listen = _listen_target(listen)
        self._server: Any = None

    # -- life cycle ---------------------------------------------------------------
    def start(self) -> "Profiler":
        """Install the hooks and start counting; returns self.

        Imports neither asyncio nor uvloop: if the program has not imported asyncio yet,
        the hooks go in as soon as it does (the report's ``wall_s`` counts from then), and
        uvloop's Loop is hooked when the program imports uvloop (docs/design.md).

        Raises RuntimeError if a profiler is already running in this process.
        """
        _core = load_core()   # imported late: reports render without a built core

        global _waiting
        if _core.is_active() or (_waiting is not None and _waiting._running):
            raise RuntimeError("an aioprof profiler is already running in this process")
        server = self._bind() if self._listen else None
        self._t_start = _core.clock_ns()
        try:
            if "asyncio" in sys.modules:
                self._start_core()
            else:
                self._watches.append(_ImportWatch("asyncio", self._start_core, "start profiling").insert())
                _waiting = self
        except BaseException:
            if server is not None:
                server.stop()
            raise
        if "uvloop" not in sys.modules:   # else the core hooked it in _start_core()
            # Also when uvloop itself imports asyncio: the core starts inside uvloop's
            # import, before its Loop exists, and this hooks Loop once uvloop has run.
            self._watches.append(_ImportWatch("uvloop", _core._uv_hook, "hook uvloop").insert())
        self._running = True
        self._final = self._final_metrics = None
        self._start_unix_s = time.time()
        # The sampler thread must not outlive the interpreter: stop at exit at the latest.
        atexit.register(self.stop)
        if server is not None:
            self._serve(server)
        return self

    def _serve(self, server: Any) -> None:
        from aioprof.live import ListenError

        try:
            self._server = server.start()
        except ListenError as e:   # no thread could be started
            self._listen_failed(e)
            return
        line = server.announcement()   # TCP: the token, for the owner's eyes
        if line is not None:
            print(f"aioprof: {line}", file=sys.stderr, flush=True)

    def _listen_failed(self, error: Exception) -> None:
        """Listening cannot start: one warning if only AIOPROF_LISTEN asked for it (the
        profiler runs on), else stop and raise RuntimeError."""
        if self.listen is None:
            warnings.warn(f"aioprof: not listening ({error})", RuntimeWarning, stacklevel=4)
            return
        self.stop()
        raise RuntimeError(f"cannot listen: {error}") from None

    def _bind(self) -> Any:
        """The live server's socket, bound (not serving yet), or None when only
        AIOPROF_LISTEN asked for it and it cannot be made (then one warning)."""
        from aioprof import __version__
        from aioprof.live import ListenError
        from aioprof.live.server import Server

        try:
            return Server(self._live_snapshot, __version__, self._listen)
        except ListenError as e:
            self._listen_failed(e)
            return None

    def _live_snapshot(self) -> dict:
        """The document a live client gets (called in the server's threads)."""
        with self._metrics_lock:   # (not while stop() frees the session)
            if not self._running:
                raise RuntimeError("the profiler has stopped")
            raw = self._raw(stop=False)
        return self._document(raw, self._start_unix_s)

    def _start_core(self) -> None:
        global _waiting
        _waiting = None
        _core = load_core()
        _core.start(self.max_tasks, int(self.cpu_window_ms * 1e6), int(self.slow_ms * 1e6),
                    int(self.interval_ms * 1e6), self.async_stacks, self.trace_buffer if self.trace else 0)
        self._core_started = True

    def stop(self) -> "Profiler":
        """Remove the hooks and keep the final snapshot; returns self. Idempotent."""
        if self._running:
            self._unhook()
            if self._server is not None:
                self._server.stop()
                self._server = None
            with self._metrics_lock:   # (a scrape or a live snapshot in another thread)
                self._final_metrics = load_core().metrics() if self._core_started else None
                raw = self._raw(stop=True)
                self._core_started = False
            self._final = self._document(raw, self._start_unix_s)
            # One warning per fault, once: the run goes on without profiling.
            for message in self._final.get("warnings", []):
                warnings.warn(f"aioprof: {message}", RuntimeWarning, stacklevel=2)
            hooks, self._stop_hooks = self._stop_hooks, []
            for hook in hooks:
                hook()
        return self

    def _unhook(self) -> None:
        """Not running any more: no stop at exit, no import watches."""
        global _waiting
        self._running = False
        atexit.unregister(self.stop)
        for watch in self._watches:
            watch.remove()
        self._watches = []
        _waiting = None if _waiting is self else _waiting

    def _abandon(self) -> None:
        """In a forked child (aioprof.subprocesses): the running session was copied from
        the parent and its figures are the parent's; drop it, no report, no warnings.
        The live server's threads and socket are the parent's: left alone."""
        if self._running:
            self._metrics_lock = _thread.allocate_lock()   # (may have been copied held)
            self._unhook()
            self._server = None
            if self._core_started:
                try:
                    load_core().stop()
                except RuntimeError:
                    pass
            self._core_started = False
            self._final = self._final_metrics = None

    def _raw(self, stop: bool) -> dict:
        """The core's snapshot (ns), or, when asyncio was never imported, the same
        document with nothing in it."""
        if self._core_started:
            _core = load_core()
            return _core.stop() if stop else _core.snapshot()
        raw: dict = {"wall_ns": load_core().clock_ns() - self._t_start,
                     "cpu_window_ns": int(self.cpu_window_ms * 1e6), "slow_ns": int(self.slow_ms * 1e6),
                     "dropped_tasks": 0, "warnings": []}
        raw.update((key, []) for key in ("tasks", "coroutines", "callbacks", "sites", "loops",
                                          "loops_folded", "frames", "blocking"))
        if self.interval_ms:
            raw["samples"] = {"interval_ns": int(self.interval_ms * 1e6), "count": 0,
                              "uncharged_ns": 0, "stacks": []}
        if self.async_stacks:
            raw["idle_stacks"] = []
        if self.trace:
            raw["trace"] = {"capacity": self.trace_buffer, "dropped": 0, "events": []}
        return raw

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
            return self._document(self._raw(stop=False), self._start_unix_s)
        if self._final is None:
            raise RuntimeError("this Profiler was never started")
        return self._final

    def report(self, format: str = "text", file: Optional[IO] = None, *,
               sort: str = "busy", limit: Optional[int] = None, by: str = "coroutine",
               show_internal: bool = False, width: Optional[int] = None,
               flame: str = "cpu") -> None:
        """Write the report to `file` (default sys.stderr), as `aioprof.report.write`.

        format: "text" (tables), "json" (docs/json.md), "collapsed" (folded stacks of
        the `flame` "cpu", "idle" or "wall"), "trace" (Chrome trace events), "html" (one
        self-contained page, docs/html.md: it shows the samples, async stacks and trace
        the profiler recorded) or "pprof" (a gzipped pprof profile, binary: `file` is a
        binary file, or a text file whose ``buffer`` gets the bytes; never a terminal). sort, limit, by, show_internal and
        width shape the text report (see `aioprof.report.text`). Raises ValueError for an
        unknown format, sort, by or flame, or pprof to a terminal.
        """
        from aioprof import report as _report

        doc = self.stats()
        _report.write(doc, format=format, file=file if file is not None else sys.stderr,
                      sort=sort, limit=limit, by=by, show_internal=show_internal, width=width,
                      flame=flame)
        note = _report.trace.dropped_note(doc, "Profiler(trace_buffer=N)") if format == "trace" else None
        if note:
            print(f"aioprof: {note}", file=sys.stderr)

    def _metrics(self) -> Optional[dict]:
        """The core's figures for aioprof.metrics (ns): per coroutine and loop, no task
        records; the final ones after stop(), None if never started. Safe to call from
        any thread (a metrics scrape)."""
        with self._metrics_lock:
            # Not `self._running`: stop() clears it before it takes this lock to read the
            # final figures, and a scrape in between must still get the core's (a scrape
            # that got nothing there saw every counter drop to 0, on 3.15 in CI).
            if self._final_metrics is None and self._core_started:
                try:
                    return load_core().metrics()
                except RuntimeError:   # stopped meanwhile, by the core itself
                    pass
            return self._final_metrics

    # -- internals ----------------------------------------------------------------
    @staticmethod
    def _document(raw: dict, start_unix_s: float) -> dict:
        doc = {"aioprof": 1, "python": platform.python_version(), "pid": os.getpid(),
               "start_unix_s": start_unix_s}
        doc.update(_to_seconds(raw))
        doc["loop_notes"] = _loop_notes()
        return doc
