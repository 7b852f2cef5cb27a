"""Chrome trace-event JSON of the report document's "trace" part (docs/stacks.md).

``render(doc)`` returns ``{"traceEvents": [...], "displayTimeUnit": "ms",
"otherData": {...}}``; ``json.dump`` it and open the file in Perfetto
(ui.perfetto.dev) or chrome://tracing.

Tracks (Trace Event Format: a process has threads, a thread is a track):

- one process per event loop: ``pid`` = the loop's id, named
  ``loop 1 (_UnixSelectorEventLoop), thread 1401...``;
- in it, one thread per task: ``tid`` = the task's id, named ``Task-3 coroutine``
  (name and coroutine from doc["tasks"]), with complete (``"ph": "X"``) events
  ``running`` (cat ``run``), ``scheduled`` (cat ``scheduled``) and ``await file:line``
  (cat ``await``, the await site in args);
- a ``loop`` track (``tid`` = ``LOOP_TID_BASE + 2 * loop id``) with the loop's ``tick``
  events and, nested in them, its ``select`` waits;
- a ``callbacks`` track (``tid`` = ``LOOP_TID_BASE + 2 * loop id + 1``) with the runs of
  callbacks that are not task steps, each named after its callback;
- task creation: a flow arrow (``"ph": "s"`` on the parent's ``running`` event,
  ``"ph": "f"`` with ``"bp": "e"`` on the child's first event; cat and name ``create``,
  ``id`` = the child's task id).

Times: ``ts`` and ``dur`` are microseconds since profiling started. Each interval end
is rounded to a multiple of 1/8 µs (125 ns): such numbers are exact in binary, so every
reader (Perfetto multiplies by 1000 and truncates) gets the same integer nanoseconds,
and intervals that touch or nest in the document still touch or nest in the viewer.
``dur`` is the difference of the rounded ends.
"""
from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Tuple

__all__ = ["LOOP_TID_BASE", "dropped_note", "render", "to_us"]

LOOP_TID_BASE = 2_000_000_000   # tids of the loop and callbacks tracks (task ids stay below)
_STEPS_PER_US = 8               # time grid: 1/8 µs


def dropped_note(doc: Dict[str, Any], option: str = "--trace-buffer N") -> Optional[str]:
    """One line for stderr when the trace ring overflowed (doc["trace"]["dropped"] > 0):
    how many events were lost and `option`, which keeps more; None when none was."""
    tr = doc.get("trace")
    if not isinstance(tr, dict):
        return None
    dropped, kept = _int(tr.get("dropped")), _int(tr.get("capacity"))
    if not dropped or dropped < 0:
        return None
    kept_text = f"; it kept the newest {kept:,}" if kept else ""
    return (f"the trace ring overflowed: {dropped:,} older events were dropped{kept_text}. "
            f"{option} keeps more (40 bytes each).")


def to_us(seconds: float) -> float:
    """Seconds as microseconds on the 1/8 µs grid (exact in binary floating point)."""
    return round(seconds * 1e6 * _STEPS_PER_US) / _STEPS_PER_US


def _num(value: Any) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if value == value and abs(value) != float("inf") else None


def _int(value: Any) -> Optional[int]:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _loc(site: Any) -> Optional[str]:
    if not isinstance(site, dict) or not site.get("file"):
        return None
    name = os.path.basename(str(site["file"])) or str(site["file"])
    return name if site.get("line") is None else f"{name}:{site['line']}"


def _interval(event: dict) -> Optional[Tuple[float, float]]:
    """(ts, dur) in µs of an event with start_s/end_s, or None if they are missing."""
    start, end = _num(event.get("start_s")), _num(event.get("end_s"))
    if start is None or end is None:
        return None
    ts, te = to_us(start), to_us(end)
    return ts, max(0.0, te - ts)


def render(doc: Dict[str, Any]) -> Dict[str, Any]:
    """The trace-event JSON object of `doc` (a report document with a "trace" part).

    Raises ValueError if the document has no "trace" part.
    """
    trace = doc.get("trace") if isinstance(doc, dict) else None
    if not isinstance(trace, dict) or not isinstance(trace.get("events"), list):
        raise ValueError("no trace in the report: the trace was off (it is on with "
                         "--format trace, Profiler(trace=True))")
    return _Builder(doc, trace).build()


class _Builder:
    def __init__(self, doc: Dict[str, Any], trace: Dict[str, Any]) -> None:
        self.doc = doc
        self.trace = trace
        self.events = [e for e in trace["events"] if isinstance(e, dict)]
        self.tasks: Dict[int, dict] = {}
        for task in doc.get("tasks") or []:
            if isinstance(task, dict) and _int(task.get("id")) is not None:
                self.tasks[task["id"]] = task
        self.loops: Dict[int, dict] = {}
        for loop in doc.get("loops") or []:
            if isinstance(loop, dict) and _int(loop.get("id")) is not None:
                self.loops[loop["id"]] = loop
        self.loop_threads: Dict[int, int] = {}    # loop id -> thread ident
        self.task_loop: Dict[int, int] = {}       # task id -> loop id (pid)
        self._find_loops()
        self.out: List[dict] = []
        self.tracks: Dict[Tuple[int, int], str] = {}   # (pid, tid) -> thread name
        self.slices: Dict[Tuple[int, int], List[Tuple[float, float]]] = {}   # for flows

    # -- which loop (process) each task belongs to ------------------------------------
    def _find_loops(self) -> None:
        for e in self.events:
            loop = _int(e.get("loop"))
            if loop is None:
                continue
            if _int(e.get("thread")) is not None:
                self.loop_threads.setdefault(loop, e["thread"])
            task = _int(e.get("task"))
            if e.get("kind") == "run" and task is not None:
                self.task_loop.setdefault(task, loop)
        for loop_id, loop in self.loops.items():
            if _int(loop.get("thread")) is not None:
                self.loop_threads.setdefault(loop_id, loop["thread"])
        by_thread: Dict[int, List[int]] = {}
        for loop_id, thread in self.loop_threads.items():
            by_thread.setdefault(thread, []).append(loop_id)
        self.default_pid = min(self.loop_threads) if self.loop_threads else (
            min(self.loops) if self.loops else 1)
        # Tasks that never ran in the window: the loop of their thread, if only one.
        for task_id, task in self.tasks.items():
            if task_id in self.task_loop:
                continue
            loops = by_thread.get(_int(task.get("thread")) or -1, [])
            if len(loops) == 1:
                self.task_loop[task_id] = loops[0]

    def pid_of_task(self, task: int) -> int:
        return self.task_loop.get(task, self.default_pid)

    # -- tracks -----------------------------------------------------------------------
    def task_track(self, task: int, register: bool = True) -> Tuple[int, int]:
        """The (pid, tid) of a task's track; registered (named) unless register is False."""
        key = (self.pid_of_task(task), task)
        if register and key not in self.tracks:
            info = self.tasks.get(task, {})
            name = info.get("name") or f"task {task}"
            coroutine = info.get("coroutine")
            self.tracks[key] = f"{name} {coroutine}" if coroutine else str(name)
        return key

    def loop_track(self, loop: int, callbacks: bool = False) -> Tuple[int, int]:
        key = (loop, LOOP_TID_BASE + 2 * loop + (1 if callbacks else 0))
        if key not in self.tracks:
            self.tracks[key] = f"loop {loop} callbacks" if callbacks else f"loop {loop}"
        return key

    def add_slice(self, track: Tuple[int, int], name: str, cat: str, ts: float, dur: float,
                  args: Dict[str, Any]) -> None:
        pid, tid = track
        self.out.append({"name": name, "cat": cat, "ph": "X", "ts": ts, "dur": dur,
                         "pid": pid, "tid": tid, "args": args})
        self.slices.setdefault(track, []).append((ts, ts + dur))

    # -- events -----------------------------------------------------------------------
    def build(self) -> Dict[str, Any]:
        creates = []
        for e in self.events:
            kind = e.get("kind")
            if kind == "create":
                creates.append(e)
                continue
            span = _interval(e)
            if span is None:
                continue
            ts, dur = span
            task = _int(e.get("task"))
            loop = _int(e.get("loop"))
            if kind == "run":
                if task is not None:
                    self.add_slice(self.task_track(task), "running", "run", ts, dur,
                                   {"task": task})
                elif loop is not None:
                    callback = str(e.get("callback") or "callback")
                    self.add_slice(self.loop_track(loop, callbacks=True), callback,
                                   "callback", ts, dur, {"callback": callback})
            elif kind == "scheduled" and task is not None:
                self.add_slice(self.task_track(task), "scheduled", "scheduled", ts, dur,
                               {"task": task})
            elif kind == "await" and task is not None:
                site = e.get("site")
                loc = _loc(site)
                args: Dict[str, Any] = {"task": task}
                if isinstance(site, dict):
                    args.update({k: site.get(k) for k in ("file", "line", "function")})
                self.add_slice(self.task_track(task), f"await {loc}" if loc else "await",
                               "await", ts, dur, args)
            elif kind == "tick" and loop is not None:
                self.add_slice(self.loop_track(loop), "tick", "loop", ts, dur,
                               {"handles": e.get("handles")})
            elif kind == "select" and loop is not None:
                self.add_slice(self.loop_track(loop), "select", "loop", ts, dur,
                               {"events": e.get("events")})
        flows = [f for e in creates for f in self.flow(e)]
        # Longer first on equal ts: a slice comes before the slices nested in it.
        self.out.sort(key=lambda ev: (ev["ts"], -ev["dur"]))
        flows.sort(key=lambda ev: ev["ts"])
        return {"traceEvents": self.metadata() + _merge(self.out, flows),
                "displayTimeUnit": "ms",
                "otherData": self.other_data()}

    def flow(self, create: dict) -> List[dict]:
        """The "s"/"f" pair of a task creation; none if either end has no slice to bind."""
        child, parent, at = _int(create.get("task")), _int(create.get("parent")), \
            _num(create.get("at_s"))
        if child is None or parent is None or at is None:
            return []
        ts = to_us(at)
        src = self.task_track(parent, register=False)
        if not any(start <= ts <= end for start, end in self.slices.get(src, ())):
            return []
        dst = self.task_track(child, register=False)
        # The child's first slice that ends at or after the creation; "f" with "bp": "e"
        # binds to the slice enclosing it, so it goes strictly inside that slice when it
        # can (a viewer may read an event at a slice's very start before the slice).
        after = [(start, end) for start, end in self.slices.get(dst, ()) if end >= ts]
        if not after:
            return []
        start, end = min(after)
        head = max(ts, start)
        if head <= start and end - start > 2 / _STEPS_PER_US:
            head = start + 1 / _STEPS_PER_US
        common = {"name": "create", "cat": "create", "id": child}
        return [dict(common, ph="s", ts=ts, pid=src[0], tid=src[1]),
                dict(common, ph="f", bp="e", ts=head, pid=dst[0], tid=dst[1])]

    def metadata(self) -> List[dict]:
        out: List[dict] = []
        for pid in sorted({pid for pid, _ in self.tracks}):
            # Process metadata goes on the loop's track: a tid that names no task (tid 0
            # is the idle thread to some readers, and no tid means tid = pid = a task id).
            _, loop_tid = self.loop_track(pid)
            loop = self.loops.get(pid, {})
            name = f"loop {pid}"
            if loop.get("type"):
                module = loop.get("module")
                qualify = isinstance(module, str) and module.split(".")[0] not in ("", "asyncio")
                name += f" ({module}.{loop['type']})" if qualify else f" ({loop['type']})"
            thread = loop.get("thread_name") or self.loop_threads.get(pid)
            if thread is not None:
                name += f", thread {thread}"
            out.append({"name": "process_name", "ph": "M", "pid": pid, "tid": loop_tid,
                        "args": {"name": name}})
            out.append({"name": "process_sort_index", "ph": "M", "pid": pid, "tid": loop_tid,
                        "args": {"sort_index": pid}})
        for (pid, tid), name in sorted(self.tracks.items()):
            out.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid,
                        "args": {"name": name}})
            # The loop's tracks first, then the tasks in id order.
            index = tid - LOOP_TID_BASE - 2 * pid - 2 if tid >= LOOP_TID_BASE else tid
            out.append({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid,
                        "args": {"sort_index": index}})
        return out

    def other_data(self) -> Dict[str, Any]:
        data: Dict[str, Any] = {"generator": "aioprof"}
        for key in ("aioprof", "python", "wall_s"):
            if key in self.doc:
                data[key] = self.doc[key]
        for key in ("capacity", "dropped"):
            if key in self.trace:
                data[f"trace_{key}"] = self.trace[key]
        data["time_unit"] = "microseconds since profiling started, on a 1/8 us grid"
        return data


def _merge(slices: List[dict], flows: List[dict]) -> List[dict]:
    """Both lists (each sorted by ts) merged by ts; on equal ts slices come first."""
    out: List[dict] = []
    i = j = 0
    while i < len(slices) or j < len(flows):
        if j == len(flows) or (i < len(slices) and slices[i]["ts"] <= flows[j]["ts"]):
            out.append(slices[i])
            i += 1
        else:
            out.append(flows[j])
            j += 1
    return out
