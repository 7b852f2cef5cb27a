"""The HTML report: one self-contained file of the report document (docs/html.md).

``render(doc)`` returns the page as a string. It opens from disk in any browser and
loads nothing: the script, the style and the data are inside the file, and its Content
Security Policy (``default-src 'none'``) forbids every request. It shows:

- the header (wall time, tasks, Python, warnings) and the loops section (utilization,
  load, lag, ticks, slow steps with their lines, blocking stacks), as the text report
  words them;
- the coroutine and task tables with the text report's columns (times in ms), sortable
  by a click on a header; asyncio's internal rows are hidden unless asked for;
- icicle flame graphs of the sampled on-loop time (``samples``) and of the await time
  (``idle_stacks``): a click zooms into a frame and shows its file:line and figures, a
  search box marks the frames that match;
- a timeline of the trace (``trace``): a lane per loop (ticks, select waits, slow
  steps, callbacks) and per task (running, scheduled, awaiting), zoomable.

A part the run did not record says so in its place. The data is embedded as JSON in a
``<script type="application/json">`` with every ``<`` written ``\\u003c``, so no name
can end the script element. The file is bounded (MAX_BYTES): large runs keep the top
rows of each table (the top ones by every sortable column), the heaviest stacks and
the longest timeline intervals, and the page says what was left out.
"""
from __future__ import annotations

import json
import math
import os
from typing import Any, Dict, List, Optional

from aioprof.report import collapsed, text

__all__ = ["MAX_BYTES", "render", "page_data"]

MAX_BYTES = 2_000_000          # the whole file, for any run (10,000 tasks included)
_ASSETS = os.path.join(os.path.dirname(__file__), "html_assets")
_ROWS = 400                    # rows kept per sortable column (the union is kept)
_STACKS = 3000                 # stacks kept per flame
_LANES = 150                   # task lanes of the timeline
_EVENTS = 25000                # timeline intervals
CHART_BINS = 120               # spans of the loops' busy-over-time chart
_TEXT = 300                    # characters of a name or location at most (then an ellipsis)
_SORT_COLS = ("busy_s", "cpu_s", "scheduled_s", "idle_s", "steps", "max_step_s")


def _num(value: Any) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return round(value, 9) if math.isfinite(value) else None


def _t(value: Any) -> str:
    """A cell's text (as the text report has it), at most _TEXT characters."""
    s = text._str(value)
    return s if len(s) <= _TEXT else s[:_TEXT - 1] + "\u2026"


def _rows(doc: Dict[str, Any], key: str) -> List[dict]:
    value = doc.get(key)
    return [r for r in value if isinstance(r, dict)] if isinstance(value, list) else []


def _top(rows: List[dict], keep: int) -> List[dict]:
    """The rows that are among the `keep` first by any sortable column, in their order."""
    if len(rows) <= keep:
        return rows
    chosen = set()
    for field in _SORT_COLS:
        ranked = sorted(range(len(rows)), key=lambda i: -(_num(rows[i].get(field)) or 0.0))
        chosen.update(ranked[:keep])
    return [rows[i] for i in sorted(chosen)]


def _coroutines(doc: Dict[str, Any], keep: int) -> Dict[str, Any]:
    rows = _rows(doc, "coroutines")
    kept = _top(rows, keep)
    out = [[_t(r.get("coroutine")), _num(r.get("tasks")), _num(r.get("steps")),
            _num(r.get("busy_s")), _num(r.get("scheduled_s")), _num(r.get("idle_s")),
            _num(r.get("cpu_s")), _num(r.get("max_step_s")), _num(r.get("p99_step_s")),
            _t(text._loc(r.get("file"), r.get("line"))), 1 if r.get("internal") else 0]
           for r in kept]
    return {"rows": out, "total": len(rows)}


def _tasks(doc: Dict[str, Any], keep: int) -> Dict[str, Any]:
    rows = _rows(doc, "tasks")
    kept = _top(rows, keep)
    out = []
    for r in kept:
        state = text._str(r.get("state"))
        if state == "failed" and r.get("exception"):
            state = f"{state} {r['exception']}"
        sites = r.get("await_sites")
        site = text._loc_of(sites[0]) if isinstance(sites, list) and sites else "-"
        out.append([_num(r.get("id")), _t(r.get("name")), _t(r.get("coroutine")),
                    _t(text._created_at(r.get("created_at"))), _num(r.get("parent")), _t(state),
                    _num(r.get("steps")), _num(r.get("busy_s")), _num(r.get("scheduled_s")),
                    _num(r.get("idle_s")), _num(r.get("cpu_s")), _num(r.get("max_step_s")),
                    _t(site), 1 if r.get("internal") else 0])
    return {"rows": out, "total": len(rows), "dropped": _num(doc.get("dropped_tasks")) or 0}


def _frames(doc: Dict[str, Any]) -> List[list]:
    """[label, file:line or "", full file path or ""] of every frame (by index)."""
    frames = doc.get("frames")
    frames = frames if isinstance(frames, list) else []
    out = []
    for frame, label in zip(frames, collapsed.frame_texts(doc)):
        file = frame.get("file") if isinstance(frame, dict) else None
        line = frame.get("line") if isinstance(frame, dict) else None
        loc = f"{file}:{line}" if file and line is not None else (str(file) if file else "")
        out.append([_t(label), _t(loc)])
    return out


def _flame_stacks(doc: Dict[str, Any], flame: str) -> Dict[str, Any]:
    """The stacks of a flame ("cpu" or "idle") added up per stack, heaviest first, as
    [(frame indices), seconds, count]; or {"missing": why} when the run did not record
    them."""
    try:
        parts = collapsed._entries(doc, flame)
    except ValueError as e:
        return {"missing": str(e)}
    entries, field = parts[0]
    count_field = "samples" if flame == "cpu" else "count"
    n_frames = len(doc.get("frames") or [])
    stacks: Dict[tuple, List[float]] = {}
    for entry in entries:
        if not isinstance(entry, dict) or not isinstance(entry.get("stack"), list):
            continue
        seconds = _num(entry.get(field))
        if seconds is None or seconds < 0:
            continue
        key = tuple(i if isinstance(i, int) and not isinstance(i, bool) and 0 <= i < n_frames
                    else -1 for i in entry["stack"])
        acc = stacks.setdefault(key, [0.0, 0.0])
        acc[0] += seconds
        acc[1] += _num(entry.get(count_field)) or 0
    result: Dict[str, Any] = {"ranked": sorted(stacks.items(), key=lambda kv: -kv[1][0])}
    if flame == "cpu":
        samples = doc.get("samples") or {}
        result["about"] = [_num(samples.get("count")), _num(samples.get("interval_s")),
                           _num(samples.get("uncharged_s"))]
    return result


def _flame(parsed: Dict[str, Any], keep: int) -> Dict[str, Any]:
    """The heaviest `keep` stacks of `_flame_stacks` as [[frame indices], µs, count],
    and [how many, µs] of the rest."""
    if "missing" in parsed:
        return parsed
    ranked = parsed["ranked"]
    out = [[list(k), int(round(v[0] * 1e6)), int(v[1])] for k, v in ranked[:keep]]
    rest = ranked[keep:]
    result: Dict[str, Any] = {"stacks": [s for s in out if s[1] > 0]}
    if rest:
        result["other"] = [len(rest), int(round(sum(v[0] for _, v in rest) * 1e6))]
    if "about" in parsed:
        result["about"] = parsed["about"]
    return result


def _trace_lanes(doc: Dict[str, Any]) -> Dict[str, Any]:
    """Every lane of the trace: loops (kinds tick, select, slow, callback) and tasks (run,
    scheduled, await); each event [kind, start µs, duration µs, text index]."""
    tr = doc.get("trace")
    if not isinstance(tr, dict) or not isinstance(tr.get("events"), list):
        return {"missing": "the trace was not recorded (it is with --trace or --format trace, "
                           "Profiler(trace=True))"}
    strings: Dict[str, int] = {}

    def s(value: str) -> int:
        return strings.setdefault(_t(value), len(strings))

    loops: Dict[int, List[list]] = {}
    tasks: Dict[int, List[list]] = {}
    busy: Dict[int, float] = {}
    kinds = {"run": 0, "scheduled": 1, "await": 2, "tick": 3, "select": 4}
    running, scheduled = s("running"), s("scheduled")
    for e in tr["events"]:
        if not isinstance(e, dict):
            continue
        kind, start, end = e.get("kind"), e.get("start_s"), e.get("end_s")
        if kind not in kinds or _num(start) is None or _num(end) is None:
            continue
        t0, dur = int(round(start * 1e6)), max(0, int(round((end - start) * 1e6)))
        task, loop = e.get("task"), e.get("loop")
        if kind in ("tick", "select") and isinstance(loop, int):
            label = (f"tick, {e.get('handles')} handles" if kind == "tick"
                     else f"select, {e.get('events')} events")
            loops.setdefault(loop, []).append([kinds[kind], t0, dur, s(label)])
        elif kind == "run" and not isinstance(task, int) and isinstance(loop, int):
            loops.setdefault(loop, []).append([6, t0, dur, s(f"callback {e.get('callback')}")])
        elif isinstance(task, int):
            index = running if kind == "run" else scheduled if kind == "scheduled" else \
                s(f"awaiting at {text._loc_of(e.get('site'))}")
            tasks.setdefault(task, []).append([kinds[kind], t0, dur, index])
            if kind == "run":
                busy[task] = busy.get(task, 0.0) + dur
    for loop in _rows(doc, "loops"):
        for r in loop.get("slow_steps") or []:
            at, d = _num(r.get("at_s")) if isinstance(r, dict) else None, \
                _num(r.get("duration_s")) if isinstance(r, dict) else None
            if at is None or d is None or not isinstance(loop.get("id"), int):
                continue
            what = r.get("coroutine") or r.get("callback") or f"tick of {r.get('handles')} handles"
            blocked = r.get("blocked_at")
            where = f", blocked at {text._loc_of(blocked)}" if isinstance(blocked, dict) else ""
            loops.setdefault(loop["id"], []).append(
                [5, int(round(at * 1e6)), int(round(d * 1e6)),
                 s(f"slow {r.get('kind')} {what} {d * 1e3:.1f} ms{where}")])
    inv = [""] * len(strings)
    for value, index in strings.items():
        inv[index] = value
    return {"loops": loops, "tasks": tasks, "strings": inv, "dropped": tr.get("dropped") or 0,
            "order": sorted(tasks, key=lambda t: (-busy.get(t, 0.0), t))}


def _busy_over_time(doc: Dict[str, Any], bins: int = CHART_BINS) -> List[Dict[str, Any]]:
    """Per loop of the trace, its busy time (ticks less their select waits) in `bins`
    equal spans of the run: {"loop": id, "bin_us": span, "busy_us": [µs per span]}."""
    tr = doc.get("trace")
    wall = _num(doc.get("wall_s"))
    if not isinstance(tr, dict) or not isinstance(tr.get("events"), list) or not wall:
        return []
    width = wall * 1e6 / bins
    per_loop: Dict[int, List[float]] = {}
    for e in tr["events"]:
        if not isinstance(e, dict) or e.get("kind") not in ("tick", "select") \
                or not isinstance(e.get("loop"), int):
            continue
        start, end = _num(e.get("start_s")), _num(e.get("end_s"))
        if start is None or end is None or end < start:
            continue
        sign = 1.0 if e["kind"] == "tick" else -1.0
        acc = per_loop.setdefault(e["loop"], [0.0] * bins)
        t0, t1 = start * 1e6, end * 1e6
        first, last = int(t0 // width), int(t1 // width)
        for b in range(max(0, first), min(bins - 1, last) + 1):
            overlap = min(t1, (b + 1) * width) - max(t0, b * width)
            if overlap > 0:
                acc[b] += sign * overlap
    return [{"loop": loop, "bin_us": round(width, 3),
             "busy_us": [round(max(0.0, v), 1) for v in acc]}
            for loop, acc in sorted(per_loop.items())]


def _timeline(doc: Dict[str, Any], parsed: Dict[str, Any], lanes_keep: int,
              events_keep: int) -> Dict[str, Any]:
    """The lanes of `_trace_lanes`: every loop's, the `lanes_keep` tasks that ran longest,
    and of their intervals the `events_keep` longest."""
    if "missing" in parsed:
        return parsed
    names = {t["id"]: t for t in _rows(doc, "tasks") if isinstance(t.get("id"), int)}
    tasks, order = parsed["tasks"], parsed["order"]
    kept_tasks = sorted(order[:lanes_keep])
    lanes = [[f"loop {lid}", 1, ev] for lid, ev in sorted(parsed["loops"].items())]
    for tid in kept_tasks:
        info = names.get(tid, {})
        lanes.append([_t(f"{info.get('name') or f'task {tid}'} {info.get('coroutine') or ''}".strip()),
                      0, tasks[tid]])
    total = sum(len(lane[2]) for lane in lanes)
    left = {"lanes": len(tasks) - len(kept_tasks),
            "events": sum(len(tasks[t]) for t in order[lanes_keep:])}
    if total > events_keep:   # keep the longest intervals
        durations = sorted((ev[2] for lane in lanes for ev in lane[2]), reverse=True)
        cut = durations[events_keep - 1]
        at_cut = events_keep - sum(1 for d in durations[:events_keep] if d > cut)
        short = 0
        for lane in lanes:
            keep = []
            for ev in lane[2]:
                if ev[2] > cut or (ev[2] == cut and at_cut > 0):
                    keep.append(ev)
                    at_cut -= ev[2] == cut
            short += len(lane[2]) - len(keep)
            lane[2] = keep
        left["short"] = short
    wall = _num(doc.get("wall_s")) or 0.0
    return {"lanes": lanes, "strings": parsed["strings"], "left": left,
            "wall_us": int(round(wall * 1e6)), "dropped": parsed["dropped"]}


def _loops_text(doc: Dict[str, Any]) -> Dict[str, Any]:
    """The loops section as the text report words it, and each loop's key figures."""
    r = text._Renderer(doc, sort="busy", limit=0, show_internal=False, width=text.FULL_WIDTH,
                       ellipsis="\u2026")
    cards = []
    for i, loop in enumerate(_rows(doc, "loops")):
        cards.append({"name": f"loop {loop.get('id') or i + 1} ({text._class_of(loop)}), "
                              f"thread {text._thread_of(loop)}",
                      "figures": [["utilization", text._pct(loop.get("utilization"))],
                                  ["load", text._pct(loop.get("load"))],
                                  ["lag p50", f"{text._ms(loop.get('lag_p50_s'))} ms"],
                                  ["lag p99", f"{text._ms(loop.get('lag_p99_s'))} ms"],
                                  ["ticks", text._int(loop.get("ticks"))],
                                  ["slow steps", text._int(loop.get("slow_total"))]]})
    lines = r.loops()
    if lines and lines[0] == "Event loops":   # the section's own title says it
        lines = lines[1:]
    return {"lines": lines, "cards": cards[:text.LOOPS_SHOWN]}


def page_data(doc: Dict[str, Any], scale: float = 1.0,
              _parsed: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """The data the page shows (embedded as JSON), its bounds multiplied by `scale`."""
    if not isinstance(doc, dict):
        raise ValueError("the report document must be a dict")
    parsed = _parsed if _parsed is not None else _parse(doc)
    rows = max(10, int(_ROWS * scale))
    stacks = max(50, int(_STACKS * scale))
    return {"header": parsed["header"],
            "wall_s": _num(doc.get("wall_s")),
            "coroutines": _coroutines(doc, rows),
            "tasks": _tasks(doc, rows),
            "keep_rows": rows,
            "frames": parsed["frames"],
            "flames": {"cpu": _flame(parsed["cpu"], stacks), "idle": _flame(parsed["idle"], stacks)},
            "timeline": _timeline(doc, parsed["trace"], max(10, int(_LANES * scale)),
                                  max(500, int(_EVENTS * scale))),
            "loops": parsed["loops"]}


def _parse(doc: Dict[str, Any]) -> Dict[str, Any]:
    """What page_data needs that does not depend on its bounds."""
    r = text._Renderer(doc, sort="busy", limit=0, show_internal=False, width=text.FULL_WIDTH,
                       ellipsis="\u2026")
    return {"header": [_t(line) for line in r.header()], "frames": _frames(doc),
            "cpu": _flame_stacks(doc, "cpu"), "idle": _flame_stacks(doc, "idle"),
            "trace": _trace_lanes(doc), "loops": dict(_loops_text(doc), charts=_busy_over_time(doc))}


def _asset(name: str) -> str:
    with open(os.path.join(_ASSETS, name), encoding="utf-8") as f:
        return f.read()


def _embed(data: Dict[str, Any]) -> str:
    """JSON for a <script type="application/json">: every "<" (and ">", "&") escaped, so
    no string in it can close the element or open a comment."""
    s = json.dumps(data, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return s.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026") \
        .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


def _fill(template: str, parts: Dict[str, str]) -> str:
    """`template` with each marker replaced once by its part (the parts themselves are
    not searched: a name in the data cannot act as a marker)."""
    out, rest = [], template
    for marker, part in parts.items():
        head, found, rest = rest.partition(marker)
        if not found:
            raise ValueError(f"the HTML template lacks {marker}")
        out += [head, part]
    return "".join(out) + rest


def render(doc: Dict[str, Any]) -> str:
    """The HTML page of `doc` (a report document, docs/json.md), at most MAX_BYTES of
    UTF-8: when the data would make it larger, fewer rows, stacks and timeline intervals
    are kept (the page says how many were left out)."""
    template = _asset("template.html")
    if not isinstance(doc, dict):
        raise ValueError("the report document must be a dict")
    parsed = _parse(doc)
    scale = 1.0
    while True:
        data = page_data(doc, scale, parsed)
        page = _fill(template, {"/*AIOPROF_CSS*/": _asset("report.css"),   # in this order
                                "AIOPROF_DATA": _embed(data),
                                "/*AIOPROF_JS*/": _asset("report.js")})
        if len(page.encode("utf-8")) <= MAX_BYTES or scale < 0.001:
            return page
        scale /= 2
