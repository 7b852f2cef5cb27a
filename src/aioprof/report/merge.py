"""Read saved JSON reports (docs/json.md) and merge several into one document, for
``python -m aioprof report FILE.json [FILE2.json ...]`` (docs/cli.md, "Re-rendering a
saved report").

``load(path)`` reads one report and checks that it is one this aioprof reads (raises
`ReportError` with a one-line message); ``merge(docs)`` returns one document:

- one document is returned as it is, so its text report is the original's;
- ``tasks`` are concatenated, each with the ``pid`` of its report, and renumbered
  (``id``, ``parent``, and the ``task`` of slow steps) so ids stay unique;
- ``coroutines``, ``callbacks`` and ``sites`` with the same identity (name, file, line,
  internal) are added up: counts and times summed, maxima (``max_step_s``) the largest,
  and the step percentiles (``p50_step_s``, ``p99_step_s``, which cannot be merged) null
  where more than one report had the row;
- ``loops`` and ``loops_folded`` are listed, each with its report's ``pid``, loop ids
  renumbered;
- ``frames`` are merged and the stacks of ``samples``, ``idle_stacks`` and ``blocking``
  re-indexed and added up per stack; each of these parts is kept only when every report
  has it (a part that some runs did not record would make a flame graph of only some of
  them);
- ``trace`` is dropped: the runs' times are seconds since each one's own start;
- ``wall_s`` is the longest run's, ``start_unix_s`` the earliest start, ``pids`` lists
  every report's pid, ``processes`` one row of figures per report (`process_row`), ``python`` the versions seen, ``dropped_tasks`` the sum, and
  ``warnings`` and ``loop_notes`` every distinct line.
"""
from __future__ import annotations

import json
from typing import Any, Dict, List, Optional, Sequence, Tuple

__all__ = ["VERSION", "ReportError", "load", "merge", "process_row"]

VERSION = 1   # the "aioprof" field this aioprof writes and reads


class ReportError(Exception):
    """A file that is not a report this aioprof reads; the message is one line."""


def load(path: str) -> Dict[str, Any]:
    """The report document saved in `path` (``--format json``). Raises ReportError for a
    file that cannot be read, is not JSON, is not an aioprof report, or is of a newer
    version."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise ReportError(f"cannot read {path!r}: {e.strerror or e}") from None
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError) as e:
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ReportError(f"{path!r} is not JSON ({reason})") from None
    version = doc.get("aioprof") if isinstance(doc, dict) else None
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ReportError(f"{path!r} is not an aioprof report (no \"aioprof\": 1 version field; "
                          f"write one with --format json)")
    if version > VERSION:
        raise ReportError(f"{path!r} is an aioprof report of version {version}; this aioprof "
                          f"reads version {VERSION} (upgrade aioprof)")
    return doc


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


_IDENTITY = {
    "coroutines": ("coroutine", "file", "line", "internal"),
    "callbacks": ("callback", "file", "line", "internal"),
    "sites": ("file", "line", "function", "internal"),
}
_NOT_MERGEABLE = ("p50_step_s", "p99_step_s")


def _combine(rows: List[dict], identity: Tuple[str, ...]) -> dict:
    """Add up rows of one identity: numbers summed, max_* the largest, percentiles null."""
    if len(rows) == 1:
        return dict(rows[0])
    out = dict(rows[0])
    for key in {k for row in rows for k in row}:
        if key in identity:
            continue
        values = [row.get(key) for row in rows]
        if key in _NOT_MERGEABLE:
            out[key] = None
        elif all(_is_number(v) for v in values):
            out[key] = max(values) if key.startswith("max_") else sum(values)
        else:
            out[key] = next((v for v in values if v is not None), None)
    return out


def _add_up(docs: Sequence[dict], key: str) -> List[dict]:
    identity = _IDENTITY[key]
    groups: Dict[tuple, List[dict]] = {}
    for doc in docs:
        for row in doc.get(key) or []:
            if isinstance(row, dict):
                groups.setdefault(tuple(json.dumps(row.get(k)) for k in identity), []).append(row)
    return [_combine(rows, identity) for rows in groups.values()]


def _max_id(rows: Any) -> int:
    ids = [r.get("id") for r in rows or [] if isinstance(r, dict)]
    return max([i for i in ids if isinstance(i, int) and not isinstance(i, bool)], default=0)


def _shift(value: Any, offset: int) -> Any:
    return value + offset if isinstance(value, int) and not isinstance(value, bool) else value


def _with_pid(row: dict, pid: Any) -> dict:
    out = dict(row)
    out.setdefault("pid", pid)
    return out


def _loops(docs: Sequence[dict], task_offsets: List[int]) -> Tuple[List[dict], List[dict]]:
    loops, folded, offset = [], [], 0
    for doc, task_offset in zip(docs, task_offsets):
        pid = doc.get("pid")
        for loop in doc.get("loops") or []:
            if isinstance(loop, dict):
                loop = _with_pid(loop, pid)
                loop["id"] = _shift(loop.get("id"), offset)
                loop["slow_steps"] = [dict(s, task=_shift(s.get("task"), task_offset))
                                      for s in loop.get("slow_steps") or [] if isinstance(s, dict)]
                loops.append(loop)
        folded.extend(_with_pid(g, pid) for g in doc.get("loops_folded") or [] if isinstance(g, dict))
        offset += _max_id(doc.get("loops"))
    return loops, folded


def _stacks(docs: Sequence[dict], merged: dict) -> None:
    """frames, samples, idle_stacks and blocking, re-indexed into one frame list."""
    frames: List[Any] = []
    index: Dict[str, int] = {}
    maps = []
    for doc in docs:
        mapping = []
        for frame in doc.get("frames") or []:
            key = json.dumps(frame, sort_keys=True)
            if key not in index:
                index[key] = len(frames)
                frames.append(frame)
            mapping.append(index[key])
        maps.append(mapping)

    def remap(stack: Any, mapping: List[int]) -> Optional[tuple]:
        if not isinstance(stack, list):
            return None
        return tuple(mapping[i] if isinstance(i, int) and 0 <= i < len(mapping) else -1 for i in stack)

    def entries(lists: List[Any], fields: Tuple[str, ...]) -> List[dict]:
        sums: Dict[tuple, dict] = {}
        for entries_, mapping in zip(lists, maps):
            for entry in entries_ or []:
                stack = remap(entry.get("stack") if isinstance(entry, dict) else None, mapping)
                if stack is None:
                    continue
                acc = sums.setdefault(stack, {"stack": list(stack), **{f: 0 for f in fields}})
                for f in fields:
                    if _is_number(entry.get(f)):
                        acc[f] += entry[f]
        return list(sums.values())

    def have(key: str) -> bool:
        return all(key in doc for doc in docs)

    if have("samples") and all(isinstance(d["samples"], dict) for d in docs):
        samples = [d["samples"] for d in docs]
        intervals = {s.get("interval_s") for s in samples}
        merged["samples"] = {
            "interval_s": intervals.pop() if len(intervals) == 1 else None,
            "count": sum(s.get("count") or 0 for s in samples),
            "uncharged_s": sum(s.get("uncharged_s") or 0 for s in samples),
            "stacks": entries([s.get("stacks") for s in samples], ("samples", "time_s"))}
    if have("idle_stacks"):
        merged["idle_stacks"] = entries([d["idle_stacks"] for d in docs], ("count", "idle_s"))
    if have("blocking"):
        merged["blocking"] = entries([d["blocking"] for d in docs], ("count",))
    if any(k in merged for k in ("samples", "idle_stacks", "blocking")):
        merged["frames"] = frames


_PROCESS_SUMS = ("steps", "busy_s", "scheduled_s", "idle_s", "cpu_s")


def process_row(doc: Dict[str, Any]) -> Dict[str, Any]:
    """The figures of one report's process (the ``processes`` rows of a merge): its pid,
    argv, whether its figures are final (false: a child's last periodic part, written
    before it was killed or while it still ran), tasks (recorded and dropped), loops, and
    the sums over its coroutines that are not asyncio's own."""
    info = doc.get("process") if isinstance(doc.get("process"), dict) else {}
    rows = [r for r in doc.get("coroutines") or [] if isinstance(r, dict) and not r.get("internal")]
    tasks = len([t for t in doc.get("tasks") or [] if isinstance(t, dict) and not t.get("internal")])
    out: Dict[str, Any] = {
        "pid": doc.get("pid"), "argv": info.get("argv"),
        "final": info.get("final", True), "start_unix_s": doc.get("start_unix_s"),
        "wall_s": doc.get("wall_s"),
        "tasks": tasks + (doc.get("dropped_tasks") if _is_number(doc.get("dropped_tasks")) else 0),
        "loops": len(doc.get("loops") or [])}
    for key in _PROCESS_SUMS:
        values = [r.get(key) for r in rows if _is_number(r.get(key))]
        out[key] = sum(values) if values else (0 if key == "steps" else 0.0)
    return out


def _distinct(docs: Sequence[dict], key: str) -> List[Any]:
    seen: Dict[str, Any] = {}
    for doc in docs:
        for item in doc.get(key) or []:
            seen.setdefault(json.dumps(item, sort_keys=True), item)
    return list(seen.values())


def merge(docs: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    """One report document of the reports `docs` (see the module's docstring)."""
    if len(docs) == 1:
        return docs[0]
    tasks, offsets, offset = [], [], 0
    for doc in docs:
        offsets.append(offset)
        for task in doc.get("tasks") or []:
            if isinstance(task, dict):
                task = _with_pid(task, doc.get("pid"))
                task["id"] = _shift(task.get("id"), offset)
                task["parent"] = _shift(task.get("parent"), offset)
                tasks.append(task)
        offset += _max_id(doc.get("tasks"))
    pythons = list(dict.fromkeys(str(d.get("python")) for d in docs if d.get("python")))
    starts = [d["start_unix_s"] for d in docs if _is_number(d.get("start_unix_s"))]
    walls = [d["wall_s"] for d in docs if _is_number(d.get("wall_s"))]
    merged: Dict[str, Any] = {
        "aioprof": VERSION, "python": ", ".join(pythons) or None,
        "pids": [d.get("pid") for d in docs],
        "processes": [process_row(d) for d in docs],
        "start_unix_s": min(starts) if starts else None,
        "wall_s": max(walls) if walls else None,
    }
    for key in ("cpu_window_s", "slow_s"):
        values = [d.get(key) for d in docs if _is_number(d.get(key))]
        merged[key] = max(values) if values else None
    merged["dropped_tasks"] = sum(d.get("dropped_tasks") or 0 for d in docs
                                  if _is_number(d.get("dropped_tasks")))
    merged["warnings"] = _distinct(docs, "warnings")
    merged["tasks"] = tasks
    for key in ("coroutines", "callbacks", "sites"):
        merged[key] = _add_up(docs, key)
    merged["loops"], merged["loops_folded"] = _loops(docs, offsets)
    _stacks(docs, merged)
    merged["loop_notes"] = _distinct(docs, "loop_notes")
    return merged
