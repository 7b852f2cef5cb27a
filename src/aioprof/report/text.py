"""The text report: the document of docs/json.md as tables for a terminal.

``render(doc, ...)`` returns the whole report as one string:

1. a header line: wall time in seconds, number of tasks (and dropped tasks), Python;
   then one line per warning of the document;
2. the table of the chosen view (``by``): ``coroutine`` (default), ``task``, ``site`` or
   ``callback``, sorted descending by ``sort`` and cut to ``limit`` rows; under the
   coroutine table, where the top coroutines wait (their top await sites); or, for
   ``stack``, the sampled on-loop time as a call tree (``limit`` children per node);
3. a short callbacks table (unless the view is ``callback``);
4. the event loops, if the document has any, and the blocking stacks captured during
   slow steps, if it has them (docs/stacks.md).

Times in tables are milliseconds with one decimal; every time column says ``ms`` in its
header. No line is longer than ``width``: the name and location columns are shortened
with an ellipsis first (keeping their end, where ``Task-12``, ``inner`` or ``:27`` is),
and if that is not enough the least important columns are left out, with a note.
Rows marked ``"internal": true`` (asyncio's own coroutines and callbacks) are left out
unless ``show_internal``, with a note saying how many.
"""
from __future__ import annotations

import math
import os
import shutil
import textwrap
import unicodedata
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from aioprof.report import collapsed

__all__ = ["DEFAULT_LIMIT", "MIN_WIDTH", "SORTS", "VIEWS", "check_options", "render"]

SORTS = ("busy", "cpu", "scheduled", "idle", "steps", "max")
VIEWS = ("coroutine", "task", "site", "callback", "stack", "process")
DEFAULT_LIMIT = 20      # rows of the main table when limit is None; limit=0 shows all
MIN_WIDTH = 80          # the report is never laid out narrower than this
FULL_WIDTH = 100_000    # the width of a report written to a file or a pipe: whole rows
SHORT_CALLBACKS = 5     # rows of the callbacks table under the other views
AWAIT_COROUTINES = 3    # coroutines whose await sites are listed under the coroutine table
AWAIT_SITES = 3         # await sites listed per coroutine
SEP = "  "              # between columns
TREE_MIN_FRACTION = 0.01  # call tree nodes below this share of the sampled time are left out
TREE_INDENT = 2         # characters of indentation per call tree level
BLOCKING_STACKS = 5     # blocking stacks (by innermost line) listed in the loops section
LOOPS_SHOWN = 5         # event loops shown in full (running first, then the busiest)
NO_LOOP_NOTE = "No asyncio event loop ran: no loop figures (aioprof sees asyncio and uvloop)."
SLOW_LISTED = 3         # slow steps (then ticks) listed per loop

# Sort key -> (field of tasks and coroutines, column header it sorts).
_SORT_FIELD = {"busy": "busy_s", "cpu": "cpu_s", "scheduled": "scheduled_s",
               "idle": "idle_s", "steps": "steps", "max": "max_step_s"}
_SORT_LABEL = {"busy": "busy ms", "cpu": "cpu ms", "scheduled": "sched ms",
               "idle": "idle ms", "steps": "steps", "max": "max ms"}
# Callbacks have no scheduled or idle time and count calls instead of steps.
_CALLBACK_SORT = {"busy": "busy_s", "cpu": "cpu_s", "max": "max_step_s", "steps": "count"}
# Await sites have only counts and idle time.
_SITE_SORT = {"steps": "count"}


def check_options(*, sort: str = "busy", limit: Optional[int] = None, by: str = "coroutine",
                  width: Optional[int] = None) -> None:
    """Raise ValueError, naming the choices, if an option of `render()` is out of range."""
    if sort not in SORTS:
        raise ValueError(f"unknown sort key {sort!r} (choose from {', '.join(SORTS)})")
    if by not in VIEWS:
        raise ValueError(f"unknown view {by!r} (choose from {', '.join(VIEWS)})")
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 0):
        raise ValueError(f"limit must be an int >= 0 (0 = all rows) or None, not {limit!r}")
    if width is not None and (not isinstance(width, int) or isinstance(width, bool) or width <= 0):
        raise ValueError(f"width must be a positive int or None, not {width!r}")


def render(doc: Dict[str, Any], *, sort: str = "busy", limit: Optional[int] = None,
           by: str = "coroutine", show_internal: bool = False, width: Optional[int] = None,
           ellipsis: str = "\u2026") -> str:
    """Return the text report of `doc` (a report document, docs/json.md).

    sort: busy, cpu, scheduled, idle, steps or max (the longest step); tables are sorted
        descending by it (callbacks: by busy for scheduled/idle, by count for steps;
        await sites: by count for steps, else by idle time).
    limit: rows of the main table; None means DEFAULT_LIMIT, 0 means all.
    by: the main table: coroutine, task, site or callback; or stack: the sampled time
        (doc["samples"]) as a call tree, nodes below 1% of it left out, at most `limit`
        children per node; or process: one row per process of a merged report.
    show_internal: include asyncio's own tasks, coroutines and callbacks.
    width: the line length to fit (at least MIN_WIDTH); default the terminal's width.
    ellipsis: marks shortened cells ("..." for streams that cannot encode U+2026).

    Missing keys and null values are shown as "-"; raises ValueError for bad options.
    """
    check_options(sort=sort, limit=limit, by=by, width=width)
    if width is None:
        width = shutil.get_terminal_size().columns
    r = _Renderer(doc, sort=sort, limit=DEFAULT_LIMIT if limit is None else limit,
                  show_internal=show_internal, width=max(MIN_WIDTH, width), ellipsis=ellipsis)
    sections = [r.header()]
    if by == "coroutine":
        sections.append(r.coroutines())
        sections.append(r.await_sites_of_top_coroutines())
    elif by == "task":
        sections.append(r.tasks())
    elif by == "site":
        sections.append(r.sites())
    elif by == "stack":
        sections.append(r.call_tree())
    elif by == "process":
        sections.append(r.processes())
    if by == "callback":
        sections.append(r.callbacks(r.limit))
    else:
        sections.append(r.callbacks(min(SHORT_CALLBACKS, r.limit or SHORT_CALLBACKS), short=True))
    sections.append(r.loops())
    lines: List[str] = []
    for section in sections:
        if section:
            if lines:
                lines.append("")
            lines.extend(section)
    return "".join(_cut(line.rstrip(), r.width, ellipsis) + "\n" for line in lines)


# -- cells -------------------------------------------------------------------------------
def _num(value: Any) -> Optional[float]:
    """`value` as a float, or None if it is missing or not a finite number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _ms(value: Any) -> str:
    """Seconds as milliseconds with one decimal; "-" if missing."""
    v = _num(value)
    return "-" if v is None else f"{v * 1e3:.1f}"


def _int(value: Any) -> str:
    v = _num(value)
    return "-" if v is None else str(int(v))


def _pct(value: Any) -> str:
    """A fraction (0.25) as a percentage ("25.0%")."""
    v = _num(value)
    return "-" if v is None else f"{v * 100:.1f}%"


def _str(value: Any) -> str:
    return "-" if value is None else str(value)


def _loc(file: Any, line: Any) -> str:
    """``basename:line`` of a file path; "-" without a file."""
    if not file:
        return "-"
    name = os.path.basename(str(file)) or str(file)
    return name if line is None else f"{name}:{line}"


def _loc_of(obj: Any) -> str:
    """``basename:line`` of a dict with "file" and "line" keys (or "-")."""
    if not isinstance(obj, dict):
        return "-"
    return _loc(obj.get("file"), obj.get("line"))


def _library_path(file: Any) -> str:
    """A library file's path from its package on (``anyio/_backends/_asyncio.py``): the part
    after site-packages or dist-packages, or after the standard library's directory."""
    parts = str(file).replace("\\", "/").split("/")
    for i in range(len(parts) - 1, -1, -1):
        if parts[i] in ("site-packages", "dist-packages") or (
                parts[i].startswith("python3") and i > 0 and parts[i - 1] == "lib"):
            return "/".join(parts[i + 1:])
    return os.path.basename(str(file))


def _created_at(obj: Any) -> str:
    """A task's creation site, with the library line it was made through beside it
    (``app.py:12 (via anyio/_backends/_asyncio.py:2665)``); for one made by no line of the
    program (by a callback or compiled code, docs/json.md), the name of what made it in
    parentheses, or "-"."""
    if isinstance(obj, dict) and obj.get("line") is None:
        return f"({obj['function']})" if obj.get("function") else "-"
    via = obj.get("via") if isinstance(obj, dict) else None
    if isinstance(via, dict) and via.get("file"):
        return f"{_loc_of(obj)} (via {_library_path(via['file'])}:{via.get('line')})"
    return _loc_of(obj)


def _width(s: str) -> int:
    """The display width of `s` in a terminal: East Asian wide and fullwidth characters
    take two columns, combining marks none."""
    if s.isascii():
        return len(s)
    return sum(0 if unicodedata.combining(c) else
               2 if unicodedata.east_asian_width(c) in ("W", "F") else 1 for c in s)


def _head(s: str, width: int) -> str:
    """The longest start of `s` that is at most `width` columns wide."""
    n = 0
    for i, c in enumerate(s):
        n += _width(c)
        if n > width:
            return s[:i]
    return s


def _pad(s: str, width: int, right: bool = False) -> str:
    """`s` padded with spaces to `width` columns (on the left if `right`)."""
    fill = " " * max(0, width - _width(s))
    return fill + s if right else s + fill


def _cut(s: str, width: int, ellipsis: str) -> str:
    """`s` cut to `width` columns, ending with the ellipsis when cut."""
    if _width(s) <= width:
        return s
    return _head(s, max(0, width - len(ellipsis))) + ellipsis


def _cut_left(s: str, width: int, ellipsis: str) -> str:
    """`s` cut to `width` columns keeping its end, starting with the ellipsis."""
    if _width(s) <= width:
        return s
    if width <= len(ellipsis):
        return _head(s[::-1], width)[::-1]
    return ellipsis + _head(s[::-1], width - len(ellipsis))[::-1]


def _sorted(rows: Iterable[dict], field: str) -> List[dict]:
    """Rows sorted descending by `field` (missing values last); ties keep their order."""
    def key(row: dict) -> float:
        value = _num(row.get(field))
        return -math.inf if value is None else value

    return sorted(rows, key=key, reverse=True)


def _list(doc: Dict[str, Any], key: str) -> List[dict]:
    value = doc.get(key)
    return [row for row in value if isinstance(row, dict)] if isinstance(value, list) else []


def _class_of(loop: dict) -> str:
    """The loop's class: module-qualified outside asyncio (``uvloop.Loop``)."""
    cls, module = _str(loop.get("type")), loop.get("module")
    if isinstance(module, str) and module and module != "asyncio" and not module.startswith("asyncio."):
        return f"{module}.{cls}"
    return cls


def _thread_of(loop: dict) -> str:
    """The loop's thread by name (threading's), else by ident; "-" if neither."""
    name = loop.get("thread_name")
    if isinstance(name, str) and name:
        return name
    thread = loop.get("thread")
    return "(other threads)" if thread is None and loop.get("loops") is not None else _str(thread)


def _loop_totals(members: List[dict]) -> List[str]:
    """The summed figures of loops and folded groups: busy, ticks, handles, select wait,
    the worst lag and the slow steps."""
    def total(key: str) -> Optional[float]:
        values = [_num(m.get(key)) for m in members]
        known = [v for v in values if v is not None]
        return sum(known) if known else None

    def worst(key: str) -> Optional[float]:
        known = [v for v in (_num(m.get(key)) for m in members) if v is not None]
        return max(known) if known else None

    items = []
    for label, value, fmt in (("busy", total("busy_s"), lambda v: f"{_ms(v)} ms"),
                              ("ticks", total("ticks"), _int), ("handles", total("handles"), _int),
                              ("select wait", total("select_wait_s"), lambda v: f"{_ms(v)} ms"),
                              ("lag max", worst("lag_max_s"), lambda v: f"{_ms(v)} ms"),
                              ("slow steps", total("slow_total"), _int)):
        if value is not None:
            items.append(f"{label} {fmt(value)}")
    return items


class _Node:
    """A call tree node: a frame, the time of the stacks through it and its children."""
    __slots__ = ("text", "total", "self_time", "children")

    def __init__(self, text: str) -> None:
        self.text = text
        self.total = 0.0
        self.self_time = 0.0
        self.children: Dict[str, "_Node"] = {}

    def add(self, stack: Sequence[str], seconds: float) -> None:
        node = self
        node.total += seconds
        for text in stack:
            child = node.children.get(text)
            if child is None:
                child = node.children[text] = _Node(text)
            child.total += seconds
            node = child
        node.self_time += seconds


@dataclass
class _Col:
    """A table column: its header, how a row becomes a cell, and how it gives way."""
    header: str
    cell: Callable[[dict], str]
    right: bool = False   # right-aligned (numbers)
    flex: int = 0         # > 0: may be shortened with an ellipsis down to this many chars
    drop: int = 0         # > 0: may be left out when too wide; the highest goes first


def _ms_col(header: str, field: str, drop: int = 0) -> _Col:
    return _Col(header, lambda row: _ms(row.get(field)), right=True, drop=drop)


def _int_col(header: str, field: str, drop: int = 0) -> _Col:
    return _Col(header, lambda row: _int(row.get(field)), right=True, drop=drop)


def _time_cols(cpu_drop: int) -> List[_Col]:
    """busy, sched, idle and cpu ms: the time columns of the coroutine, task and process
    tables."""
    return [_ms_col("busy ms", "busy_s"), _ms_col("sched ms", "scheduled_s"),
            _ms_col("idle ms", "idle_s"), _ms_col("cpu ms", "cpu_s", drop=cpu_drop)]


def _layout(cols: Sequence[_Col], cells: List[List[str]], width: int
            ) -> Tuple[List[int], List[Optional[int]]]:
    """Choose the columns shown and their widths so a line fits in `width`.

    Returns (indices of the columns shown, width of each column or None if hidden).
    Shortens flexible columns (widest first) to their minimum, and while that is not
    enough, leaves out the droppable column with the highest `drop`.
    """
    natural = [max([_width(c.header)] + [_width(row[i]) for row in cells]) for i, c in enumerate(cols)]
    minimum = [min(natural[i], max(len(c.header), c.flex)) if c.flex else natural[i]
               for i, c in enumerate(cols)]
    shown = list(range(len(cols)))
    while True:
        widths = {i: natural[i] for i in shown}
        excess = sum(widths.values()) + len(SEP) * (len(shown) - 1) - width
        slack = sum(widths[i] - minimum[i] for i in shown)
        if excess <= slack:
            while excess > 0:   # take one character at a time from the widest flexible column
                i = max((i for i in shown if widths[i] > minimum[i]), key=lambda i: widths[i])
                widths[i] -= 1
                excess -= 1
            break
        droppable = [i for i in shown if cols[i].drop > 0]
        if not droppable:       # cannot fit: use the minimum; render() cuts the lines
            widths = {i: minimum[i] for i in shown}
            break
        shown.remove(max(droppable, key=lambda i: (cols[i].drop, i)))
    return shown, [widths.get(i) for i in range(len(cols))]


class _Renderer:
    def __init__(self, doc: Dict[str, Any], *, sort: str, limit: int, show_internal: bool,
                 width: int, ellipsis: str) -> None:
        self.doc = doc if isinstance(doc, dict) else {}
        self.sort = sort
        self.limit = limit
        self.show_internal = show_internal
        self.width = width
        self.ellipsis = ellipsis
        self.top_coroutines: List[dict] = []   # set by coroutines()

    # -- building blocks ------------------------------------------------------------------
    def _visible(self, rows: List[dict]) -> Tuple[List[dict], int]:
        """(rows shown, number of internal rows hidden)."""
        if self.show_internal:
            return rows, 0
        shown = [row for row in rows if not row.get("internal")]
        return shown, len(rows) - len(shown)

    def _title(self, title: str, total: int, shown: int, hidden: int,
               limit_hint: str = "--limit") -> List[str]:
        notes = []
        if shown < total:
            notes.append(f"(top {shown} of {total}, {limit_hint})")
        if hidden:
            notes.append(f"({hidden} internal hidden, --show-internal)")
        line = SEP.join([title] + notes)
        if len(line) <= self.width or not notes:
            return [line]
        return [title, SEP.join(notes)]

    def _table(self, cols: Sequence[_Col], rows: List[dict]) -> List[str]:
        """Header and rows of a table fitted to the width; "(none)" if no rows."""
        if not rows:
            return ["  (none)"]
        cells = [[c.cell(row) for c in cols] for row in rows]
        shown, widths = _layout(cols, cells, self.width)

        def line(values: Sequence[str]) -> str:
            parts = []
            for i in shown:
                c, w, v = cols[i], widths[i], values[i]
                assert w is not None
                parts.append(_pad(_cut_left(v, w, self.ellipsis), w, c.right))
            return SEP.join(parts)

        out = [line([c.header for c in cols])]
        out.extend(line(row) for row in cells)
        left_out = [cols[i].header for i in range(len(cols)) if widths[i] is None]
        if left_out:
            note = f"(left out to fit {self.width} columns: {', '.join(left_out)}"
            hint = "; widen the terminal or set COLUMNS)"
            out.append(note + hint if len(note + hint) <= self.width else note + ")")
        return out

    # -- sections -------------------------------------------------------------------------
    def header(self) -> List[str]:
        doc = self.doc
        wall = _num(doc.get("wall_s"))
        tasks = len(_list(doc, "tasks"))
        parts = [f"aioprof: wall {'-' if wall is None else f'{wall:.3f}'} s",
                 f"{tasks} task{'' if tasks == 1 else 's'}"]
        dropped = _num(doc.get("dropped_tasks"))
        if dropped:
            parts[-1] += f" (+{int(dropped)} dropped past max_tasks)"
        if doc.get("python"):
            parts.append(f"Python {doc['python']}")
        pids = doc.get("pids")
        if isinstance(pids, list) and len(pids) > 1:   # a merge of reports (aioprof report)
            parts.append(f"{len(pids)} reports merged (pids {', '.join(map(str, pids))})")
        lines = [", ".join(parts)]
        warnings = doc.get("warnings")
        if isinstance(warnings, list):
            lines.extend(f"aioprof: warning: {w}" for w in warnings)
        return lines

    def _rows(self, key: str, field: str) -> Tuple[List[dict], int, int]:
        """(sorted visible rows cut to the limit, visible count, internal hidden count)."""
        rows, hidden = self._visible(_list(self.doc, key))
        rows = _sorted(rows, field)
        total = len(rows)
        if self.limit:
            rows = rows[: self.limit]
        return rows, total, hidden

    def coroutines(self) -> List[str]:
        rows, total, hidden = self._rows("coroutines", _SORT_FIELD[self.sort])
        self.top_coroutines = rows[:AWAIT_COROUTINES]
        cols = [
            _Col("coroutine", lambda r: _str(r.get("coroutine")), flex=12),
            _int_col("tasks", "tasks", drop=5),
            _int_col("steps", "steps"),
            _ms_col("busy ms", "busy_s"),
            _ms_col("sched ms", "scheduled_s"),
            _ms_col("idle ms", "idle_s"),
            _ms_col("cpu ms", "cpu_s", drop=3),
            _ms_col("max ms", "max_step_s", drop=4),
            _ms_col("p99 ms", "p99_step_s", drop=6),
            _Col("defined at", lambda r: _loc(r.get("file"), r.get("line")), flex=10, drop=2),
        ]
        title = f"Coroutines by {_SORT_LABEL[self.sort]}"
        return self._title(title, total, len(rows), hidden) + self._table(cols, rows)

    def await_sites_of_top_coroutines(self) -> List[str]:
        """For the first coroutines of the table (call coroutines() first): where their
        recorded tasks waited longest, summed over the tasks of each coroutine."""
        by_coro: Dict[tuple, Dict[tuple, List[float]]] = {}
        for task in _list(self.doc, "tasks"):
            sites = task.get("await_sites")
            if not isinstance(sites, list):
                continue
            agg = by_coro.setdefault((task.get("coroutine"), task.get("file"), task.get("line")), {})
            for site in sites:
                if not isinstance(site, dict):
                    continue
                user = site.get("user_site")
                user = (user.get("file"), user.get("line"), user.get("function")) if isinstance(user, dict) else None
                acc = agg.setdefault((site.get("file"), site.get("line"), site.get("function"), user),
                                     [0.0, 0.0])
                acc[0] += _num(site.get("idle_s")) or 0.0
                acc[1] += _num(site.get("count")) or 0.0
        out: List[str] = []
        for coro in self.top_coroutines:
            agg = by_coro.get((coro.get("coroutine"), coro.get("file"), coro.get("line")))
            if not agg:
                continue
            out.append(f"  {_str(coro.get('coroutine'))}  ({_loc(coro.get('file'), coro.get('line'))})")
            top = sorted(agg.items(), key=lambda kv: kv[1][0], reverse=True)[:AWAIT_SITES]
            for (file, line, function, user), (idle, count) in top:
                # A wait inside a library: the innermost line of the program's own code,
                # with the library's line beside it.
                via = ""
                if user is not None and user != (file, line, function):
                    via = f" (via {_library_path(file)}:{line})"
                    file, line, function = user
                same = function and str(coro.get("coroutine", "")).split(".")[-1] == function
                where = _loc(file, line) + (f" in {function}" if function and not same else "") + via
                out.append(f"    {_ms(idle):>9} ms idle  {int(count):>7}x  {where}")
        if not out:
            return []
        return ["Where the top coroutines wait (await sites of their recorded tasks)",
                "(idle: task time, summed over the tasks; it can exceed the wall time)"] + out

    def tasks(self) -> List[str]:
        rows, total, hidden = self._rows("tasks", _SORT_FIELD[self.sort])

        def state(r: dict) -> str:
            s = _str(r.get("state"))
            return f"{s} {r['exception']}" if s == "failed" and r.get("exception") else s

        def await_site(r: dict) -> str:
            sites = r.get("await_sites")
            return _loc_of(sites[0]) if isinstance(sites, list) and sites else "-"

        cols = [
            _int_col("id", "id"),
            _Col("name", lambda r: _str(r.get("name")), flex=8, drop=5),
            _Col("coroutine", lambda r: _str(r.get("coroutine")), flex=10),
            _Col("created at", lambda r: _created_at(r.get("created_at")), flex=10, drop=3),
            _Col("parent", lambda r: _int(r.get("parent")), right=True, drop=9),
            _Col("state", state, flex=9, drop=8),
            _int_col("steps", "steps"),
            *_time_cols(cpu_drop=6),
            _ms_col("max ms", "max_step_s", drop=7),
            _Col("await site", await_site, flex=10, drop=2),
        ]
        title = f"Tasks by {_SORT_LABEL[self.sort]}"
        lines = self._title(title, total, len(rows), hidden) + self._table(cols, rows)
        dropped = _num(self.doc.get("dropped_tasks"))
        if dropped:
            lines.append(f"({int(dropped)} more tasks not recorded past max_tasks; "
                         f"the coroutine view counts them)")
        return lines

    def processes(self) -> List[str]:
        """One row per process of a merged report (--subprocesses, aioprof report A B):
        its tasks and the sums over its coroutines (asyncio's own left out)."""
        from aioprof.report.merge import process_row

        rows = [r for r in _list(self.doc, "processes")] or [process_row(self.doc)]
        rows = _sorted(rows, _SORT_FIELD[self.sort] if self.sort != "max" else "busy_s")
        total = len(rows)
        if self.limit:
            rows = rows[: self.limit]

        def command(r: dict) -> str:
            argv = r.get("argv")
            text = " ".join(map(str, argv)) if isinstance(argv, list) and argv else "-"
            return text if r.get("final", True) else f"{text} (not final)"

        cols = [
            _int_col("pid", "pid"),
            _int_col("tasks", "tasks", drop=5),
            _int_col("loops", "loops", drop=6),
            _int_col("steps", "steps", drop=4),
            *_time_cols(cpu_drop=3),
            _ms_col("wall ms", "wall_s", drop=7),
            _Col("command", command, flex=12, drop=2),
        ]
        title = f"Processes by {_SORT_LABEL[self.sort if self.sort != 'max' else 'busy']}"
        return self._title(title, total, len(rows), 0) + self._table(cols, rows)

    def sites(self) -> List[str]:
        field = _SITE_SORT.get(self.sort, "idle_s")
        rows = _sorted(_list(self.doc, "sites"), field)
        total = len(rows)
        if self.limit:
            rows = rows[: self.limit]
        cols = [
            _Col("await site", _loc_of, flex=10),
            _Col("function", lambda r: _str(r.get("function")), flex=10, drop=1),
            _int_col("count", "count"),
            _ms_col("idle ms", "idle_s"),
            _ms_col("inner idle ms", "innermost_idle_s"),
        ]
        title = f"Await sites by {'count' if field == 'count' else 'idle ms'}"
        lines = self._title(title, total, len(rows), 0) + self._table(cols, rows)
        if rows:
            lines.append("(inner: only the suspensions where the line is the await site itself)")
        return lines

    def callbacks(self, limit: int, short: bool = False) -> List[str]:
        field = _CALLBACK_SORT.get(self.sort, "busy_s")
        rows, hidden = self._visible(_list(self.doc, "callbacks"))
        rows = _sorted(rows, field)
        total = len(rows)
        if short and not rows:
            if not hidden:
                return []
            return [f"Callbacks (not task steps): none  ({hidden} internal hidden, --show-internal)"]
        if limit:
            rows = rows[:limit]
        cols = [
            _Col("callback", lambda r: _str(r.get("callback")), flex=12),
            _int_col("count", "count"),
            _ms_col("busy ms", "busy_s"),
            _ms_col("cpu ms", "cpu_s", drop=2),
            _ms_col("max ms", "max_step_s", drop=3),
            _Col("defined at", lambda r: _loc(r.get("file"), r.get("line"))
                 if r.get("file") else "<built-in>", flex=10, drop=1),
        ]
        label = {"count": "count"}.get(field) or _SORT_LABEL[{"busy_s": "busy", "cpu_s": "cpu",
                                                              "max_step_s": "max"}[field]]
        title = f"Callbacks (not task steps) by {label}"
        hint = "--by callback" if short else "--limit"
        return self._title(title, total, len(rows), hidden, hint) + self._table(cols, rows)

    def call_tree(self) -> List[str]:
        """The sampled on-loop time (doc["samples"]) as a call tree of async call stacks."""
        title = "Sampled on-loop time by call stack"
        samples = self.doc.get("samples")
        if not isinstance(samples, dict) or not isinstance(samples.get("stacks"), list):
            return [f"{title}: no samples (sampling was off: --interval 0)"]
        texts = collapsed.frame_texts(self.doc)
        root = _Node("")
        for entry in samples["stacks"]:
            if not isinstance(entry, dict):
                continue
            seconds = _num(entry.get("time_s"))
            stack = collapsed.stack_texts(entry.get("stack"), texts)
            if seconds is None or seconds < 0 or stack is None:
                continue
            root.add(stack, seconds)
        total = root.total
        # What the samples are, not what was asked: the sampler can be late (a busy
        # machine, the GIL, a long step's signals thinned out), so say how many there
        # are and their mean spacing over the sampled time; the interval asked beside.
        count, interval = _num(samples.get("count")), _num(samples.get("interval_s"))
        uncharged = _num(samples.get("uncharged_s"))
        about = [f"{_ms(total)} ms in {int(count)} samples" if count is not None else f"{_ms(total)} ms",
                 f"one per {_ms(total / count)} ms on average" if count and total > 0 else None,
                 f"asked every {_ms(interval)} ms" if interval else None,
                 f"{_ms(uncharged)} ms no sample saw" if uncharged and uncharged >= 0.0005 else None]
        out = [f"{title}: " + ", ".join(a for a in about if a)]
        if not total > 0:
            out.append("  (no samples)")
            return out
        header = f"{'total ms':>9}{SEP}{'%':>6}{SEP}{'self ms':>9}{SEP}"
        out.append(header + "call stack")
        avail = self.width - len(header)
        pruned = [0, 0]    # nodes below the threshold, nodes past the limit
        threshold = total * TREE_MIN_FRACTION

        def walk(node: "_Node", depth: int) -> None:
            children = sorted(node.children.values(), key=lambda n: (-n.total, n.text))
            kept = [c for c in children if c.total >= threshold]
            pruned[0] += len(children) - len(kept)
            if self.limit and len(kept) > self.limit:
                pruned[1] += len(kept) - self.limit
                kept = kept[: self.limit]
            for child in kept:
                indent = min(depth * TREE_INDENT, max(0, avail - 24))
                label = _cut_left(child.text, max(1, avail - indent), self.ellipsis)
                out.append(f"{_ms(child.total):>9}{SEP}{_pct(child.total / total):>6}{SEP}"
                           f"{_ms(child.self_time):>9}{SEP}{' ' * indent}{label}")
                walk(child, depth + 1)

        walk(root, 0)
        notes = []
        if pruned[0]:
            notes.append(f"{pruned[0]} node{'s' if pruned[0] != 1 else ''} below "
                         f"{TREE_MIN_FRACTION:.0%} of the sampled time left out")
        if pruned[1]:
            notes.append(f"{pruned[1]} more past {self.limit} children per node, --limit")
        if notes:
            out.append("(" + "; ".join(notes) + ")")
        return out

    def loops(self) -> List[str]:
        """The loops: LOOPS_SHOWN in full (running ones first, then the busiest), the
        rest rolled up per thread and loop class with the ended loops the core folded
        (doc["loops_folded"]), then the totals of all."""
        loops = _list(self.doc, "loops")
        folded = _list(self.doc, "loops_folded")
        notes = self.doc.get("loop_notes")
        notes = [line for n in (notes if isinstance(notes, list) else []) if isinstance(n, str)
                 for line in textwrap.wrap(f"Not measured: {n}.", self.width - 1,
                                           initial_indent="  ", subsequent_indent="    ")]
        if not loops and not folded:
            if notes:
                return ["Event loops"] + notes
            if isinstance(self.doc.get("loops"), list):
                return [NO_LOOP_NOTE]
            return []
        n_folded = sum(int(_num(g.get("loops")) or 0) for g in folded)
        total = len(loops) + n_folded
        out = ["Event loops" + (f"  ({total}; {n_folded} ended ones folded per thread and class)"
                                if n_folded else "")] + notes
        order = sorted(range(len(loops)), key=lambda i: (bool(loops[i].get("destroyed")),
                                                       -(_num(loops[i].get("busy_s")) or 0.0), i))
        shown = sorted(order[:LOOPS_SHOWN])
        for i in shown:
            out.extend(self._loop(loops[i], i + 1))
        groups: Dict[Tuple[str, str], List[dict]] = {}
        for i in order[LOOPS_SHOWN:]:
            groups.setdefault((_thread_of(loops[i]), _class_of(loops[i])), []).append(loops[i])
        for g in folded:
            groups.setdefault((_thread_of(g), _class_of(g)), []).append(g)
        for (thread, cls), members in groups.items():
            count = sum(int(_num(m.get("loops")) or 1) for m in members)
            out.append(f"  {count} more loop{'s' if count != 1 else ''} ({cls}), thread {thread}")
            out.extend(self._wrap(_loop_totals(members)))
        if groups:
            out.append(f"  all {total} loops")
            out.extend(self._wrap(_loop_totals(loops + folded)))
        out.extend(self.blocking(loops + folded))
        return out

    def blocking(self, loops: List[dict]) -> List[str]:
        """The blocking stacks (doc["blocking"]) folded by their innermost code line."""
        entries = self.doc.get("blocking")
        if not isinstance(entries, list):
            return []
        frames = self.doc.get("frames")
        frames = frames if isinstance(frames, list) else []
        texts = collapsed.frame_texts(self.doc)
        agg: Dict[Tuple[str, str], List[Any]] = {}    # (where, task) -> [count, order]
        for entry in entries:
            if not isinstance(entry, dict):
                continue
            count = _num(entry.get("count"))
            stack = entry.get("stack")
            if count is None or not isinstance(stack, list):
                continue
            where, task = "", ""
            for index in reversed(stack):
                if not (isinstance(index, int) and 0 <= index < len(frames)):
                    continue
                frame = frames[index]
                if not isinstance(frame, dict):
                    continue
                if not where and frame.get("kind") == "code":
                    where = _loc(frame.get("file"), frame.get("line"))
                    if frame.get("function"):
                        where += f" {frame['function']}"
                if not task and frame.get("kind") in ("task", "callback"):
                    task = texts[index]
            if not where:   # no code frame: the innermost frame, whatever it is
                where = collapsed.stack_texts(stack, texts)[-1] if stack else "[no frames]"
            acc = agg.setdefault((where, task), [0.0, len(agg)])
            acc[0] += count
        threshold = _num(self.doc.get("slow_s"))
        when = f" (>= {_ms(threshold)} ms)" if threshold is not None else ""
        title = f"  blocking stacks captured during slow steps{when}, by innermost line"
        if not agg:
            slow = sum(_num(loop.get("slow_total")) or 0 for loop in loops)
            return [title + ": none captured"] if slow else []
        rows = sorted(agg.items(), key=lambda kv: (-kv[1][0], kv[1][1]))
        shown = rows[:BLOCKING_STACKS]
        out = [title + (f"  (top {len(shown)} of {len(rows)})" if len(shown) < len(rows) else "")]
        for (where, task), (count, _) in shown:
            out.append(f"        {int(count):>7}x  {where}" + (f"  in {task}" if task else ""))
        return out

    def _loop(self, loop: dict, index: int) -> List[str]:
        """Lines of one loop (fields of docs/json.md "loops"; missing ones are left out)."""
        def get(key: str) -> Any:
            return loop.get(key)

        name = f"loop {_str(get('id') or index)}"
        if get("type"):
            name += f" ({_class_of(loop)})"
        if get("thread") is not None or get("thread_name"):
            name += f", thread {_thread_of(loop)}"
        if get("pid") is not None:   # only in a merge of reports (aioprof report)
            name += f", pid {_str(get('pid'))}"
        if get("destroyed"):
            name += ", ended"   # the loop object is gone (closed and collected)
        groups: List[List[str]] = [[], [], [], []]

        def add(group: int, label: str, value: Any, fmt: Callable[[Any], str],
                suffix: str = "") -> None:
            if _num(value) is not None:
                groups[group].append(f"{label} {fmt(value)}{suffix}")

        def quantiles(group: int, label: str, prefix: str, names: Sequence[str]) -> None:
            values = [(q, get(f"{prefix}_{q}_s")) for q in names]
            if any(_num(v) is not None for _, v in values):
                groups[group].append(label + " " + " ".join(
                    f"{q} {_ms(v)} ms" for q, v in values if _num(v) is not None))

        add(0, "utilization", get("utilization"), _pct)
        add(0, "load", get("load"), _pct)
        add(0, "wall", get("wall_s"), lambda v: f"{v:.3f}", " s")
        add(0, "ticks", get("ticks"), _int)
        add(0, "handles", get("handles"), _int)
        add(0, "max handles/tick", get("handles_per_tick_max"), _int)
        if _num(get("select_wait_s")) is not None:
            calls = get("select_calls")
            groups[1].append(f"select wait {_ms(get('select_wait_s'))} ms"
                             + (f" in {_int(calls)} calls" if _num(calls) is not None else ""))
        add(1, "io events", get("io_events"), _int)
        quantiles(2, "lag", "lag", ("p50", "p99", "max"))
        quantiles(2, "timer lag", "timer_lag", ("p99", "max"))
        quantiles(2, "tick busy", "tick_busy", ("p50", "p99", "max"))
        slow = get("slow_steps")
        slow_list = [r for r in slow if isinstance(r, dict)] if isinstance(slow, list) else []
        n_slow = _num(get("slow_total"))
        if n_slow is None and isinstance(slow, list):
            n_slow = float(len(slow_list))
        if n_slow is not None:
            threshold = _num(self.doc.get("slow_s"))
            groups[3].append(f"slow steps {int(n_slow)}"
                             + (f" (>= {_ms(threshold)} ms)" if threshold is not None else "")
                             + ("; the longest:" if slow_list else ""))

        out = [f"  {name}"]
        for items in groups:
            if items:
                out.extend(self._wrap(items))

        out.extend(self._slow_lines(slow_list))
        return out

    def _slow_lines(self, slow_list: List[dict]) -> List[str]:
        """The longest slow steps and callbacks (up to SLOW_LISTED), then slow ticks in
        what room is left: a step's line says where it blocked (the watchdog's capture,
        docs/stacks.md) and, labelled apart, the await it ended at."""
        def key(r: dict) -> Tuple[bool, float]:
            return r.get("kind") == "tick", -(_num(r.get("duration_s")) or 0.0)

        sep = " \u00b7 " if self.ellipsis == "\u2026" else "; "
        out = []
        for r in sorted(slow_list, key=key)[:SLOW_LISTED]:
            if r.get("kind") == "tick":
                what = f"tick of {_int(r.get('handles'))} handles"
            else:
                what = _str(r.get("coroutine") or r.get("callback"))
                if r.get("task") is not None:
                    what += f" (task {r['task']})"
            parts = []
            if _loc_of(r.get("step_start")) != "-":
                parts.append(f"resumed at {_loc_of(r.get('step_start'))}")
            if isinstance(r.get("blocked_at"), dict):
                blocked = r["blocked_at"]
                parts.append(f"blocked at {_loc_of(blocked)}"
                             + (f" ({blocked['function']})" if blocked.get("function") else ""))
            if _loc_of(r.get("step_end")) != "-":
                parts.append(("then " if parts else "") + f"awaited at {_loc_of(r.get('step_end'))}")
            at = _num(r.get("at_s"))
            when = f"  at {at:.3f} s" if at is not None else ""
            span = ("  " + sep.join(parts)) if parts else ""
            out.append(f"        {_ms(_num(r.get('duration_s')) or 0.0):>9} ms  {what}{span}{when}")
        return out

    def _wrap(self, items: List[str]) -> List[str]:
        """The items joined with ", " on indented lines, wrapped between items."""
        indent = " " * 6
        lines: List[str] = []
        line, fresh = indent, True
        for item in items:
            if not fresh and len(line) + len(", ") + len(item) + len(",") > self.width:
                lines.append(line + ",")
                line, fresh = indent, True
            line += item if fresh else ", " + item
            fresh = False
        lines.append(line)
        return lines
