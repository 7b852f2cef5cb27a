"""The report document as a pprof profile (gzipped ``profile.proto``), for go tool pprof,
Pyroscope, Parca and Grafana.

``render(doc)`` returns the gzipped bytes of one ``perftools.profiles.Profile`` message
(google/pprof's proto/profile.proto), encoded here with no dependency: varints and
length-delimited fields for the few messages a profile needs.

Sample types, each in nanoseconds (docs/stacks.md, "pprof"):

``cpu``
    with sampling on, the sampled on-loop time of ``samples.stacks`` (the cpu flame of
    ``--format collapsed``), at the line that ran; with sampling off, each task's and
    callback's thread CPU time (``cpu_s``, exact), at its coroutine (callback) frame.
``busy``, ``scheduled``, ``idle``
    exact, from the accounting: per task, ``busy_s`` and ``scheduled_s`` at its coroutine
    frame and ``idle_s`` split over its await sites (the await chain, outermost first,
    down to the line that awaits; what no site holds stays at the coroutine frame).
    Callbacks have busy time only. The time of tasks past ``max_tasks`` (not kept one by
    one) is charged to their coroutine with the task label ``(not kept)``, so per
    coroutine every figure is that of ``coroutines``.

Stacks are async call stacks, root first in the document and leaf first in the profile: a
``[task coroutine]`` (``[callback name]``) marker frame, then the code frames
(function name, file, line). Labels (strings): ``task`` (the task's name), ``coroutine``,
``loop`` (``#id class (thread name)``, when the task's thread ran one loop), ``pid``, and
``callback`` for callbacks. Samples of ``samples.stacks`` carry ``coroutine`` (of their
innermost task marker), ``pid``, and ``loop`` when the report has one loop only: the
sampler records neither the task nor the loop.

Every time is rounded to integer nanoseconds on its own, so a sum over samples can differ
from the rounded sum of the document's floats by a nanosecond per entry.
"""
from __future__ import annotations

import gzip
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from aioprof.report.collapsed import frame_text
from aioprof.report.text import _class_of   # the loop class as the text report spells it

__all__ = ["SAMPLE_TYPES", "render"]

SAMPLE_TYPES = ("cpu", "busy", "scheduled", "idle")
_CPU, _BUSY, _SCHEDULED, _IDLE = range(4)


# ------------------------------------------------------------------ protobuf encoding

def _varint(value: int) -> bytes:
    """A base-128 varint; negative int64 values take ten bytes (two's complement)."""
    if value < 0:
        value += 1 << 64
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _int_field(number: int, value: int) -> bytes:
    """Field `number` as a varint (wire type 0); 0 is the default and left out."""
    return _varint(number << 3) + _varint(value) if value else b""


def _bytes_field(number: int, data: bytes) -> bytes:
    """Field `number` length-delimited (wire type 2): a string, a message, packed ints."""
    return _varint(number << 3 | 2) + _varint(len(data)) + data


def _packed(number: int, values: Iterable[int]) -> bytes:
    data = b"".join(_varint(v) for v in values)
    return _bytes_field(number, data) if data else b""


class _Strings:
    """The string table: index 0 is "", each string once."""

    def __init__(self) -> None:
        self.table: List[str] = [""]
        self.index: Dict[str, int] = {"": 0}

    def __call__(self, s: str) -> int:
        i = self.index.get(s)
        if i is None:
            i = self.index[s] = len(self.table)
            self.table.append(s)
        return i


# A frame: (function name, file name, line); file "" and line 0 for marker frames.
Frame = Tuple[str, str, int]


class _Builder:
    """Functions, locations and samples of one profile; samples of equal stack and
    labels are added up."""

    def __init__(self) -> None:
        self.strings = _Strings()
        self.functions: Dict[Tuple[str, str], int] = {}
        self.locations: Dict[Tuple[int, int], int] = {}
        self.samples: Dict[Tuple[Tuple[int, ...], Tuple[Tuple[str, str], ...]], List[int]] = {}

    def location(self, frame: Frame) -> int:
        name, file, line = frame
        fid = self.functions.get((name, file))
        if fid is None:
            fid = self.functions[(name, file)] = len(self.functions) + 1
        key = (fid, line)
        lid = self.locations.get(key)
        if lid is None:
            lid = self.locations[key] = len(self.locations) + 1
        return lid

    def add(self, stack: Sequence[Frame], labels: Dict[str, str], kind: int, ns: int) -> None:
        """Add `ns` nanoseconds of sample type `kind` to the stack (root first)."""
        if ns <= 0:
            return
        ids = tuple(self.location(f) for f in reversed(stack))   # leaf first
        key = (ids, tuple(sorted((k, v) for k, v in labels.items() if v)))
        values = self.samples.get(key)
        if values is None:
            values = self.samples[key] = [0] * len(SAMPLE_TYPES)
        values[kind] += ns

    def encode(self, *, period: int, duration: int, time: int, comments: Sequence[str]) -> bytes:
        s = self.strings
        ns = s("nanoseconds")
        out = [_bytes_field(1, _int_field(1, s(t)) + _int_field(2, ns)) for t in SAMPLE_TYPES]
        for (ids, labels), values in self.samples.items():
            body = _packed(1, ids) + _packed(2, values)
            for key, value in labels:
                body += _bytes_field(3, _int_field(1, s(key)) + _int_field(2, s(value)))
            out.append(_bytes_field(2, body))
        for (fid, line), lid in self.locations.items():
            line_msg = _int_field(1, fid) + _int_field(2, line)
            out.append(_bytes_field(4, _int_field(1, lid) + _int_field(2, 1) + _bytes_field(4, line_msg)))
        for (name, file), fid in self.functions.items():
            body = (_int_field(1, fid) + _int_field(2, s(name)) + _int_field(3, s(name))
                    + _int_field(4, s(file)))
            out.append(_bytes_field(5, body))
        # One mapping, "python", that every location is in (has_functions, has_filenames,
        # has_line_numbers): readers then take the symbols as they are.
        out.append(_bytes_field(3, _int_field(1, 1) + _int_field(5, s("python")) + _int_field(7, 1)
                                + _int_field(8, 1) + _int_field(9, 1)))
        # Strings used by later fields must be in the table before it is written.
        comment_ids = [s(c) for c in comments]
        period_type = _int_field(1, s("cpu")) + _int_field(2, ns)
        default_type = s("cpu")
        out.extend(_bytes_field(6, t.encode("utf-8", "replace")) for t in s.table)
        out.append(_int_field(9, time))
        out.append(_int_field(10, duration))
        out.append(_bytes_field(11, period_type))
        out.append(_int_field(12, period))
        out.extend(_int_field(13, c) for c in comment_ids)
        out.append(_int_field(14, default_type))
        return b"".join(out)


# ------------------------------------------------------------------ the document's data

def _ns(seconds: Any) -> int:
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        return 0
    if not 0 <= seconds < float("inf"):
        return 0
    return int(round(seconds * 1e9))


def _text(value: Any, default: str = "?") -> str:
    return str(value) if value not in (None, "") else default


def _code(site: Any) -> Optional[Frame]:
    """A code frame of a {file, line, function} object."""
    if not isinstance(site, dict):
        return None
    line = site.get("line")
    line = line if isinstance(line, int) and not isinstance(line, bool) and line > 0 else 0
    return (_text(site.get("function")), _text(site.get("file"), ""), line)


def _frame(frame: Any) -> Frame:
    """A pprof frame of an entry of doc["frames"] (the marker texts of collapsed.py)."""
    if isinstance(frame, dict) and frame.get("kind") == "code":
        code = _code(frame)
        if code is not None:
            return code
    return (frame_text(frame), "", 0)


def _loop_labels(doc: dict) -> Dict[Any, str]:
    """{thread ident: loop label} for the threads that ran exactly one listed loop."""
    by_thread: Dict[Any, List[dict]] = {}
    for loop in doc.get("loops") or []:
        if isinstance(loop, dict):
            by_thread.setdefault((loop.get("pid"), loop.get("thread")), []).append(loop)
    labels = {}
    for key, loops in by_thread.items():
        if len(loops) == 1:
            loop = loops[0]
            name = loop.get("thread_name")
            labels[key] = f"#{loop.get('id')} {_class_of(loop)}" + (f" ({name})" if name else "")
    return labels


def _pid(obj: dict, doc: dict) -> str:
    pid = obj.get("pid", doc.get("pid"))
    return str(pid) if isinstance(pid, int) and not isinstance(pid, bool) else ""


def _coroutine_key(obj: dict) -> tuple:
    return (obj.get("coroutine"), obj.get("file"), obj.get("line"))


def _add_tasks(b: _Builder, doc: dict, with_cpu: bool) -> None:
    loops = _loop_labels(doc)
    kept: Dict[tuple, List[int]] = {}
    for task in doc.get("tasks") or []:
        if not isinstance(task, dict):
            continue
        coroutine = _text(task.get("coroutine"))
        pid = _pid(task, doc)
        root = [(f"[task {coroutine}]", "", 0)]
        own = _code({"function": coroutine, "file": task.get("file"), "line": task.get("line")})
        top = root + [own] if own is not None else root
        labels = {"task": _text(task.get("name")), "coroutine": coroutine, "pid": pid,
                  "loop": loops.get((task.get("pid"), task.get("thread")), "")}
        busy, scheduled, idle, cpu = (_ns(task.get(k)) for k in ("busy_s", "scheduled_s", "idle_s", "cpu_s"))
        b.add(top, labels, _BUSY, busy)
        b.add(top, labels, _SCHEDULED, scheduled)
        if with_cpu:
            b.add(top, labels, _CPU, cpu)
        left = idle
        for site in task.get("await_sites") or []:
            if not isinstance(site, dict):
                continue
            chain = [c for c in map(_code, site.get("chain") or [site]) if c is not None]
            ns = min(_ns(site.get("idle_s")), left)
            b.add(root + chain, labels, _IDLE, ns)
            left -= ns
        b.add(top, labels, _IDLE, left)
        sums = kept.setdefault(_coroutine_key(task), [0, 0, 0, 0])
        for kind, ns in ((_CPU, cpu), (_BUSY, busy), (_SCHEDULED, scheduled), (_IDLE, idle)):
            sums[kind] += ns
    # Tasks past max_tasks: their coroutine's figures less those of the tasks kept.
    for coro in doc.get("coroutines") or []:
        if not isinstance(coro, dict):
            continue
        pid = _pid(coro, doc)
        sums = kept.get(_coroutine_key(coro), [0, 0, 0, 0])
        coroutine = _text(coro.get("coroutine"))
        own = _code({"function": coroutine, "file": coro.get("file"), "line": coro.get("line")})
        stack = [(f"[task {coroutine}]", "", 0)] + ([own] if own is not None else [])
        labels = {"task": "(not kept)", "coroutine": coroutine, "pid": pid}
        for kind, key in ((_CPU, "cpu_s"), (_BUSY, "busy_s"), (_SCHEDULED, "scheduled_s"), (_IDLE, "idle_s")):
            if kind == _CPU and not with_cpu:
                continue
            # a nanosecond per task of rounding is not a task that was not kept
            rest = _ns(coro.get(key)) - sums[kind]
            if rest > max(1, int(coro.get("tasks") or 0)):
                b.add(stack, labels, kind, rest)


def _add_callbacks(b: _Builder, doc: dict, with_cpu: bool) -> None:
    for cb in doc.get("callbacks") or []:
        if not isinstance(cb, dict):
            continue
        name = _text(cb.get("callback"))
        own = _code({"function": name, "file": cb.get("file"), "line": cb.get("line")})
        stack = [(f"[callback {name}]", "", 0)] + ([own] if own is not None and own[1] else [])
        labels = {"callback": name, "pid": _pid(cb, doc)}
        b.add(stack, labels, _BUSY, _ns(cb.get("busy_s")))
        if with_cpu:
            b.add(stack, labels, _CPU, _ns(cb.get("cpu_s")))


def _add_samples(b: _Builder, doc: dict, samples: dict) -> None:
    frames = [_frame(f) for f in doc.get("frames") or []]
    raw = doc.get("frames") or []
    # The sampler does not record the loop; a process that ran one loop has it anyway.
    loops = [lp for lp in doc.get("loops") or [] if isinstance(lp, dict)]
    loop = ""
    if len(loops) == 1 and not doc.get("loops_folded") and "pids" not in doc:
        loop = next(iter(_loop_labels(doc).values()), "")
    for entry in samples.get("stacks") or []:
        if not isinstance(entry, dict) or not isinstance(entry.get("stack"), list):
            continue
        stack, coroutine = [], ""
        for index in entry["stack"]:
            if isinstance(index, int) and not isinstance(index, bool) and 0 <= index < len(frames):
                stack.append(frames[index])
                if isinstance(raw[index], dict) and raw[index].get("kind") == "task":
                    coroutine = _text(raw[index].get("coroutine"))
            else:
                stack.append(("[unknown]", "", 0))
        b.add(stack or [("[no frames]", "", 0)], {"coroutine": coroutine, "pid": _pid(entry, doc), "loop": loop},
              _CPU, _ns(entry.get("time_s")))


def render(doc: Dict[str, Any]) -> bytes:
    """The gzipped pprof profile of the report document `doc` (docs/json.md).

    Raises ValueError if `doc` is not a report document (a dict).
    """
    if not isinstance(doc, dict):
        raise ValueError("the report document must be a dict")
    b = _Builder()
    samples = doc.get("samples")
    sampled = isinstance(samples, dict) and isinstance(samples.get("stacks"), list)
    if sampled:
        _add_samples(b, doc, samples)
    _add_tasks(b, doc, with_cpu=not sampled)
    _add_callbacks(b, doc, with_cpu=not sampled)
    period = _ns(samples.get("interval_s")) if sampled else 0
    start = doc.get("start_unix_s")
    comments = [f"aioprof report of Python {doc.get('python', '?')}",
                "cpu: sampled on-loop time" if sampled else "cpu: thread CPU time per task (no sampling)"]
    data = b.encode(period=period, duration=_ns(doc.get("wall_s")), time=_ns(start), comments=comments)
    return gzip.compress(data, mtime=0)
