# aioprof for MicroPython: per task and per coroutine function, the steps (start +
# resumptions), busy, scheduled and idle time of asyncio tasks. See README.md.
#
# It never replaces asyncio.Task, a Task's coroutine or the run queue. Two hooks in
# asyncio.core's scheduler loop, both put back by stop():
#   IOQueue.wait_io_event  the loop calls it after every step, before the next task is
#                          popped: its entry ends the step that ran; when it returns with
#                          dt <= 0, the head of the run queue is the task whose step starts.
#   core's `isinstance`    (a name in core's globals, shadowing the builtin there only):
#                          the loop calls isinstance(er, StopIteration) right after the main
#                          task's last step, then returns without waiting again.
# A task's scheduled time (ready, waiting for the loop) is how late its step starts after
# its run-queue key (ph_key: when it was queued, or when its sleep ended; milliseconds).
import sys
from time import ticks_us, ticks_ms, ticks_diff

__all__ = ("Profiler", "label")
__version__ = "0.1.0"

_active = None   # the running Profiler
_labels = {}     # task -> label, from label()
_TEXT_SORTS = ("busy", "count", "sched", "idle", "max")


def label(task, name):
    """Give `task` (a Task, or None for the current one) a label: `name` if it is a str,
    else "ClassName@hexid" of the object (e.g. the instance whose method the task runs),
    so that tasks of one coroutine function can be told apart."""
    import asyncio

    if task is None:
        task = asyncio.current_task()
    if not isinstance(task, asyncio.Task):
        raise TypeError("label() needs a Task, not %s" % type(task).__name__)
    if not isinstance(name, str):
        name = "%s@%x" % (type(name).__name__, id(name))
    if len(_labels) >= 64:   # forget the tasks that ended without a profiler to take theirs
        for t in [t for t in _labels if t.done()]:
            del _labels[t]
    _labels[task] = name


def _coro_name(coro):
    r = repr(coro)   # "<generator object 'name' at 7f...>"
    i = r.find("'")
    j = r.find("'", i + 1)
    return r[i + 1:j] if 0 <= i < j else type(coro).__name__


class _Task:
    """What one task did while profiling (times in microseconds)."""

    def __init__(self, n, task, start):
        self.id = n
        self.task = task
        self.coroutine = _coro_name(task.coro)
        self.label = None
        self.state = "pending"
        self.exception = None
        self.steps = 0
        self.busy = self.sched = self.idle = self.max_step = 0
        self.start = self.last = start   # `last`: when it was last suspended
        self.first_step = None
        self.end = None


def _add(group, rec, busy, sched, idle):
    group["tasks"] += 1
    group["steps"] += rec.steps
    group["busy"] += busy
    group["sched"] += sched
    group["idle"] += idle
    group["max"] = max(group["max"], rec.max_step)


def _group():
    return {"tasks": 0, "steps": 0, "busy": 0, "sched": 0, "idle": 0, "max": 0}


class Profiler:
    """Profile asyncio tasks: ``with aioprof.Profiler() as p: asyncio.run(main())``, or
    ``p.start()`` / ``p.stop()``; then ``p.report()`` or ``p.stats()``. One at a time.

    max_tasks: task records kept (int >= 0); tasks past it are still counted in their
    coroutine's and label's figures, and in ``dropped_tasks``.
    """

    def __init__(self, max_tasks=1000):
        if not isinstance(max_tasks, int) or isinstance(max_tasks, bool):
            raise TypeError("max_tasks must be an int, not %s %r" % (type(max_tasks).__name__, max_tasks))
        if max_tasks < 0:
            raise ValueError("max_tasks must be an int >= 0, not %r" % (max_tasks,))
        self.max_tasks = max_tasks
        self._running = False
        self._final = None

    # -- life cycle ---------------------------------------------------------------
    def start(self):
        """Install the hooks and start counting; returns self. RuntimeError if a profiler
        is already running."""
        global _active
        if _active is not None:
            raise RuntimeError("an aioprof Profiler is already running")
        from asyncio import core

        if not hasattr(core.IOQueue, "wait_io_event"):
            raise RuntimeError("aioprof: this asyncio has no IOQueue.wait_io_event to hook")
        self._core = core
        self._orig_wait = core.IOQueue.wait_io_event
        self._t0 = ticks_us()
        self._live = {}      # task -> _Task, while pending
        self._done = []      # finished _Task records (at most max_tasks kept with the live ones)
        self._folded = {}    # coroutine -> group, of the records not kept
        self._folded_labels = {}
        self._dropped = 0
        self._n = 0
        self._cur = None     # the _Task whose step runs
        self._step_t0 = 0
        self._warnings = []
        self._final = None
        orig = self._orig_wait
        prof = self

        def wait_io_event(ioq, dt):   # core.IOQueue.wait_io_event while profiling
            if prof._cur is not None:
                prof._end_step(None)
            orig(ioq, dt)
            if dt <= 0 and _active is prof:
                prof._begin_step()

        def isinstance_(obj, cls):    # core's isinstance while profiling
            if cls is StopIteration and prof._cur is not None:
                prof._end_step(obj)   # the main task's last step has ended, with obj
            return isinstance(obj, cls)

        self._hook_wait = wait_io_event
        core.IOQueue.wait_io_event = wait_io_event
        core.isinstance = isinstance_
        self._hook_isinstance = isinstance_
        _active = self
        task = core.cur_task
        if task is not None and not task.done():   # started by a task: its step runs now
            self._n = 1
            rec = self._cur = self._live[task] = _Task(1, task, self._t0)
            rec.steps = 1
            rec.first_step = self._step_t0 = self._t0
        self._running = True
        return self

    def stop(self):
        """Remove the hooks and keep the final figures; returns self. Idempotent."""
        if self._running:
            self._final = self._document()
            self._unhook()
        return self

    def _unhook(self):
        global _active
        core = self._core
        if core.IOQueue.wait_io_event is self._hook_wait:
            core.IOQueue.wait_io_event = self._orig_wait
        if getattr(core, "isinstance", None) is self._hook_isinstance:
            del core.isinstance
        self._running = False
        if _active is self:
            _active = None

    @property
    def running(self):
        return self._running

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    # -- the hooks' work (a fault stops profiling, with one warning) ------------------
    def _fault(self, e):
        message = "profiling stopped by an internal error: %s: %s" % (type(e).__name__, e)
        print("aioprof:", message, file=sys.stderr)
        self._warnings.append(message)
        self._cur = None
        self._unhook()
        try:
            self._final = self._document()
        except Exception:   # the figures are lost with the tables: an empty document
            self._live, self._done, self._folded, self._folded_labels = {}, [], {}, {}
            self._final = self._document()

    def _begin_step(self):
        try:
            task = self._core._task_queue.peek()
            if task is None or task.done():   # (a done task here: the loop reports its exception)
                return
            rec = self._live.get(task)
            now = ticks_us()
            late = ticks_diff(ticks_ms(), task.ph_key) * 1000
            if rec is None:
                self._n += 1
                start = now - max(0, min(late, ticks_diff(now, self._t0)))
                rec = self._live[task] = _Task(self._n, task, start)
            gap = ticks_diff(now, rec.last)
            late = max(0, min(late, gap))
            rec.sched += late
            rec.idle += gap - late
            rec.steps += 1
            if rec.first_step is None:
                rec.first_step = now
            self._cur = rec
            self._step_t0 = now   # (so busy + scheduled + idle is the task's lifetime exactly)
        except Exception as e:
            self._fault(e)

    def _end_step(self, er):
        try:
            now = ticks_us()
            rec = self._cur
            self._cur = None
            d = ticks_diff(now, self._step_t0)
            rec.busy += d
            if d > rec.max_step:
                rec.max_step = d
            rec.last = now
            task = rec.task
            if er is not None or task.done():
                self._finish(rec, er if er is not None else task.data, now)
        except Exception as e:
            self._fault(e)

    def _finish(self, rec, er, now):
        core = self._core
        rec.end = now
        if isinstance(er, StopIteration):
            rec.state = "done"
        elif isinstance(er, core.CancelledError) or er is core.CancelledError:
            rec.state = "cancelled"
        else:
            rec.state = "failed"
            rec.exception = type(er).__name__
        del self._live[rec.task]
        rec.label = _labels.pop(rec.task, None)
        rec.task = None
        if len(self._done) + len(self._live) < self.max_tasks:
            self._done.append(rec)
        else:
            self._dropped += 1
            for groups, key in ((self._folded, rec.coroutine), (self._folded_labels, (rec.coroutine, rec.label))):
                if key not in groups:
                    groups[key] = _group()
                _add(groups[key], rec, rec.busy, rec.sched, rec.idle)

    # -- results ------------------------------------------------------------------
    def _figures(self, rec, now, now_ms):
        """busy, sched, idle (us) of a record as of now: a pending task's current wait is
        scheduled time past its run-queue key if it is on the run queue, else idle."""
        busy, sched, idle = rec.busy, rec.sched, rec.idle
        if rec.end is None:
            if rec is self._cur:
                busy += ticks_diff(now, self._step_t0)
            else:
                gap = ticks_diff(now, rec.last)
                late = 0
                if rec.task.data is None:   # on the run queue (ready, or sleeping until ph_key)
                    late = max(0, min(gap, ticks_diff(now_ms, rec.task.ph_key) * 1000))
                sched += late
                idle += gap - late
        return busy, sched, idle

    def _document(self):
        now, now_ms = ticks_us(), ticks_ms()
        t0 = self._t0
        s = lambda us: us / 1e6
        at = lambda us: None if us is None else ticks_diff(us, t0) / 1e6
        tasks = []
        coros = {}
        labels = {}
        for key, g in self._folded.items():
            coros[key] = dict(g)
        for key, g in self._folded_labels.items():
            labels[key] = dict(g)
        for rec in self._done + sorted(self._live.values(), key=lambda r: r.id):
            busy, sched, idle = self._figures(rec, now, now_ms)
            lab = rec.label if rec.task is None else _labels.get(rec.task)
            tasks.append({
                "id": rec.id, "coroutine": rec.coroutine, "label": lab, "state": rec.state,
                "exception": rec.exception, "steps": rec.steps, "busy_s": s(busy),
                "scheduled_s": s(sched), "idle_s": s(idle), "max_step_s": s(rec.max_step),
                "start_s": at(rec.start), "first_step_s": at(rec.first_step), "end_s": at(rec.end)})
            for groups, key in ((coros, rec.coroutine), (labels, (rec.coroutine, lab))):
                if key not in groups:
                    groups[key] = _group()
                _add(groups[key], rec, busy, sched, idle)
        tasks.sort(key=lambda t: t["id"])

        def rows(groups, fields):
            out = []
            for key, g in groups.items():
                row = dict(zip(fields, key if isinstance(key, tuple) else (key,)))
                row.update({"tasks": g["tasks"], "steps": g["steps"], "busy_s": s(g["busy"]),
                            "scheduled_s": s(g["sched"]), "idle_s": s(g["idle"]),
                            "max_step_s": s(g["max"])})
                out.append(row)
            out.sort(key=lambda r: -r["busy_s"])
            return out

        impl = sys.implementation
        return {
            "aioprof": 1, "python": sys.version.split(";")[0],
            "implementation": "%s %s" % (impl.name, ".".join(str(v) for v in impl.version[:3])),
            "wall_s": s(ticks_diff(now, t0)), "tasks": tasks,
            "coroutines": rows(coros, ("coroutine",)),
            "labels": rows(labels, ("coroutine", "label")),
            "dropped_tasks": self._dropped, "warnings": list(self._warnings),
            "not_measured": NOT_MEASURED,
        }

    def stats(self):
        """The figures as a dict of the JSON document (README.md): while running, as of
        now; after stop(), the final ones. RuntimeError if never started."""
        if self._running:
            return self._document()
        if self._final is None:
            raise RuntimeError("this Profiler was never started")
        return self._final

    def report(self, format="text", file=None, sort="busy", limit=None):
        """Write the report to `file` (default sys.stderr): format "text" (tables: per
        coroutine function, per label when tasks have labels, per task) or "json".
        sort: "busy", "count", "sched", "idle" or "max"; limit: rows per table."""
        if format not in ("text", "json"):
            raise ValueError("format must be 'text' or 'json', not %r" % (format,))
        if sort not in _TEXT_SORTS:
            raise ValueError("sort must be one of %s, not %r" % (", ".join(_TEXT_SORTS), sort))
        doc = self.stats()
        out = file if file is not None else sys.stderr
        if format == "json":
            import json

            out.write(json.dumps(doc))
            out.write("\n")
        else:
            out.write(text(doc, sort, limit))


NOT_MEASURED = [
    "CPU time (MicroPython has no per-thread CPU clock): busy_s is wall time",
    "creation sites, await sites and definition files (MicroPython has no frames)",
    "the bound object of a method's coroutine: use aioprof.label(task, obj)",
    "loop ticks, select wait and callbacks (MicroPython's asyncio has no callbacks)",
]

_SORT_KEY = {"busy": "busy_s", "count": "steps", "sched": "scheduled_s", "idle": "idle_s",
             "max": "max_step_s"}


def _table(head, rows, text_columns):
    """Rows of cells joined by " | ", the columns in `text_columns` flush left, the others
    (figures) flush right."""
    widths = [max([len(r[i]) for r in [head] + rows]) for i in range(len(head))]
    lines = []
    for r in [head] + rows:
        pads = [" " * (widths[i] - len(r[i])) for i in range(len(r))]   # (no str.ljust)
        cells = [r[i] + pads[i] if i in text_columns else pads[i] + r[i] for i in range(len(r))]
        lines.append(" | ".join(cells).rstrip())
    return "\n".join(lines) + "\n"


def _ms(v):
    return "%.1f" % (v * 1e3)


def text(doc, sort="busy", limit=None):
    """The text report of a stats() document: the seed tool's `function name | count | ms`
    table (ms: busy) with scheduled, idle and the longest step, then per label, per task."""
    key = _SORT_KEY[sort]
    cut = lambda rows: sorted(rows, key=lambda r: -r[key])[:limit]
    ms_heads = ["busy ms", "sched ms", "idle ms", "max ms"]
    figures = lambda r: [str(r["steps"]), _ms(r["busy_s"]), _ms(r["scheduled_s"]), _ms(r["idle_s"]),
                         _ms(r["max_step_s"])]
    out = ["aioprof: wall %.3f s, %d tasks, %s\n\n" % (doc["wall_s"], len(doc["tasks"]) + doc["dropped_tasks"],
                                                      doc["implementation"])]
    out.append(_table(["function name", "tasks", "count"] + ms_heads,
                      [[r["coroutine"], str(r["tasks"])] + figures(r) for r in cut(doc["coroutines"])], (0,)))
    if any(r["label"] is not None for r in doc["labels"]):
        out.append("\n")
        out.append(_table(["function name", "label", "tasks", "count"] + ms_heads,
                          [[r["coroutine"], r["label"] or "-", str(r["tasks"])] + figures(r)
                           for r in cut(doc["labels"])], (0, 1)))
    out.append("\n")
    out.append(_table(["task", "function name", "label", "state", "count"] + ms_heads,
                      [[str(r["id"]), r["coroutine"], r["label"] or "-",
                        r["state"] if not r["exception"] else "failed (%s)" % r["exception"]] + figures(r)
                       for r in cut(doc["tasks"])], (1, 2, 3)))
    if doc["dropped_tasks"]:
        out.append("(%d more tasks not listed: max_tasks)\n" % doc["dropped_tasks"])
    for w in doc["warnings"]:
        out.append("warning: %s\n" % w)
    return "".join(out)
