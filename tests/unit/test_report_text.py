"""The text report (aioprof.report.text) and aioprof.report.write on hand-made documents."""
from __future__ import annotations

import io
import json
import os
import re
from typing import List, Optional

import pytest

from aioprof import report
from aioprof.report import text

APP = "/srv/app/app.py"
ASYNCIO = "/usr/lib/python3.11/asyncio/base_events.py"


def make_task(id: int, coroutine: str, *, busy: float, sched: float = 0.0, idle: float = 0.0,
              cpu: Optional[float] = None, steps: int = 1, max_step: Optional[float] = None,
              line: int = 10, state: str = "done", internal: bool = False, parent=None,
              created=("app.py", 40), file: str = APP, await_sites=()) -> dict:
    """A TASK of docs/json.md; await_sites: (line, function, count, idle_s) tuples in APP."""
    return {
        "id": id, "name": f"Task-{id}", "coroutine": coroutine, "file": file, "line": line,
        "created_at": None if created is None else
        {"file": "/srv/app/" + created[0], "line": created[1], "function": "main"},
        "parent": parent, "state": state,
        "exception": "ValueError" if state == "failed" else None, "internal": internal,
        "steps": steps, "busy_s": busy, "cpu_s": busy if cpu is None else cpu,
        "scheduled_s": sched, "idle_s": idle,
        "max_step_s": busy / steps if max_step is None else max_step,
        "start_s": 0.0, "first_step_s": 0.0, "end_s": busy + sched + idle, "thread": 1,
        "await_sites": [{"file": APP, "line": ln, "function": fn, "count": n, "idle_s": s,
                         "chain": [{"file": APP, "line": ln, "function": fn}]}
                        for ln, fn, n, s in await_sites],
    }


def coroutine_of(task: dict) -> dict:
    """The COROUTINE row of a task that is alone in its coroutine."""
    row = {k: task[k] for k in ("coroutine", "file", "line", "internal", "steps", "busy_s",
                                "cpu_s", "scheduled_s", "idle_s", "max_step_s")}
    row.update(tasks=1, p50_step_s=task["max_step_s"] / 2, p99_step_s=task["max_step_s"])
    return row


def make_doc(tasks: List[dict], **extra) -> dict:
    doc = {"aioprof": 1, "python": "3.11.7", "wall_s": 1.23456, "cpu_window_s": 0.001,
           "tasks": tasks, "coroutines": [coroutine_of(t) for t in tasks],
           "callbacks": [], "sites": [], "loops": [], "dropped_tasks": 0, "warnings": []}
    doc.update(extra)
    return doc


@pytest.fixture
def doc() -> dict:
    """Three user coroutines with distinct orders per sort key, plus two internal ones."""
    tasks = [
        #                             busy    sched  idle   cpu     steps max
        make_task(1, "main", busy=0.0052, sched=0.0001, idle=1.0012, cpu=0.0049, steps=3,
                  max_step=0.0031, line=30, created=None,
                  await_sites=[(34, "main", 1, 1.0002), (36, "main", 1, 0.001)]),
        make_task(2, "poller", busy=0.0153, sched=0.0301, idle=0.9951, cpu=0.0140, steps=191,
                  max_step=0.0004, line=24, parent=1, created=("app.py", 33),
                  await_sites=[(27, "poller", 190, 0.9951)]),
        make_task(3, "crunch", busy=0.4051, sched=0.0020, idle=0.1000, cpu=0.0010, steps=6,
                  max_step=0.1010, line=50, parent=1, state="failed",
                  await_sites=[(55, "crunch", 5, 0.1)]),
        make_task(4, "BaseEventLoop.shutdown_asyncgens", busy=0.9, steps=1, line=500,
                  internal=True, created=None, file=ASYNCIO),
        make_task(5, "BaseEventLoop.shutdown_default_executor", busy=0.8, steps=2, line=510,
                  internal=True, created=None, file=ASYNCIO),
    ]
    callbacks = [
        {"callback": "BaseSelectorEventLoop._read_from_self", "file": ASYNCIO, "line": 120,
         "internal": True, "count": 3, "busy_s": 0.5, "cpu_s": 0.5, "max_step_s": 0.2},
        {"callback": "on_timer", "file": APP, "line": 70, "internal": False, "count": 10,
         "busy_s": 0.002, "cpu_s": 0.0019, "max_step_s": 0.0005},
        {"callback": "print", "file": None, "line": None, "internal": False, "count": 100,
         "busy_s": 0.0001, "cpu_s": 0.0001, "max_step_s": 0.0001},
    ]
    sites = [
        {"file": APP, "line": 27, "function": "poller", "count": 190, "idle_s": 0.9951,
         "innermost_count": 190, "innermost_idle_s": 0.9951},
        {"file": APP, "line": 34, "function": "main", "count": 1, "idle_s": 1.0002,
         "innermost_count": 1, "innermost_idle_s": 1.0002},
        {"file": APP, "line": 12, "function": "helper", "count": 5, "idle_s": 0.1,
         "innermost_count": 0, "innermost_idle_s": 0.0},
    ]
    return make_doc(tasks, callbacks=callbacks, sites=sites)


def table(out: str, title: str) -> List[str]:
    """The lines of the table whose title line starts with `title`: header first, up to the
    next blank line (notes in parentheses left out)."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(title))
    body = []
    for line in lines[start + 1:]:
        if not line.strip():
            break
        if not line.startswith("("):
            body.append(line)
    return body


def first_column(rows: List[str]) -> List[str]:
    return [row.split()[0] for row in rows[1:]]


def column(rows: List[str], header: str) -> List[str]:
    """Cells of a right-aligned column, found by the end of its header."""
    end = rows[0].index(header) + len(header)
    return [row[:end].split()[-1] for row in rows[1:]]


# -- header ----------------------------------------------------------------------------
def test_header_has_wall_seconds_and_task_count(doc):
    first = text.render(doc, width=120).splitlines()[0]
    assert first == "aioprof: wall 1.235 s, 5 tasks, Python 3.11.7"


def test_header_shows_dropped_tasks_only_when_any(doc):
    assert "dropped" not in text.render(doc, width=120)
    doc["dropped_tasks"] = 7
    first = text.render(doc, width=120).splitlines()[0]
    assert first == "aioprof: wall 1.235 s, 5 tasks (+7 dropped past max_tasks), Python 3.11.7"


def test_warnings_are_listed_under_the_header(doc):
    doc["warnings"] = ["hook fault: accounting stopped"]
    lines = text.render(doc, width=120).splitlines()
    assert lines[1] == "aioprof: warning: hook fault: accounting stopped"


# -- coroutine view: sort, limit, internal ---------------------------------------------
@pytest.mark.parametrize("sort, order", [
    ("busy", ["crunch", "poller", "main"]),
    ("cpu", ["poller", "main", "crunch"]),
    ("scheduled", ["poller", "crunch", "main"]),
    ("idle", ["main", "poller", "crunch"]),
    ("steps", ["poller", "crunch", "main"]),
    ("max", ["crunch", "main", "poller"]),
])
def test_coroutines_sorted_descending_by_key(doc, sort, order):
    out = text.render(doc, sort=sort, width=160)
    label = {"scheduled": "sched ms", "steps": "steps", "max": "max ms"}.get(sort, f"{sort} ms")
    assert f"Coroutines by {label}" in out
    assert first_column(table(out, "Coroutines by")) == order


def test_coroutine_table_units_and_values_in_ms(doc):
    rows = table(text.render(doc, width=160), "Coroutines by")
    assert rows[0].split("  ")[0].strip() == "coroutine"
    for header in ("busy ms", "sched ms", "idle ms", "cpu ms", "max ms", "p99 ms"):
        assert header in rows[0]
    assert column(rows, "busy ms") == ["405.1", "15.3", "5.2"]
    assert column(rows, "idle ms") == ["100.0", "995.1", "1001.2"]
    assert column(rows, "steps") == ["6", "191", "3"]
    assert rows[1].rstrip().endswith("app.py:50")      # definition site, basename:line


def test_limit_cuts_rows_and_says_so(doc):
    out = text.render(doc, limit=2, width=160)
    assert first_column(table(out, "Coroutines by")) == ["crunch", "poller"]
    title = next(line for line in out.splitlines() if line.startswith("Coroutines by"))
    assert "(top 2 of 3, --limit)" in title


def test_limit_default_and_zero():
    tasks = [make_task(i, f"co{i}", busy=i / 1000, line=i) for i in range(1, 31)]
    doc = make_doc(tasks)
    rows = table(text.render(doc, width=120), "Coroutines by")
    assert len(rows) - 1 == text.DEFAULT_LIMIT == 20
    assert first_column(rows)[:3] == ["co30", "co29", "co28"]
    assert len(table(text.render(doc, limit=0, width=120), "Coroutines by")) - 1 == 30


def test_internal_rows_hidden_with_a_note(doc):
    out = text.render(doc, width=160)
    assert "shutdown_asyncgens" not in out
    assert "_read_from_self" not in out
    title = next(line for line in out.splitlines() if line.startswith("Coroutines by"))
    assert title.endswith("(2 internal hidden, --show-internal)")
    callbacks = next(line for line in out.splitlines() if line.startswith("Callbacks"))
    assert "(1 internal hidden, --show-internal)" in callbacks


def test_show_internal_shows_them_without_note(doc):
    out = text.render(doc, show_internal=True, width=160)
    assert first_column(table(out, "Coroutines by")) == [
        "BaseEventLoop.shutdown_asyncgens", "BaseEventLoop.shutdown_default_executor",
        "crunch", "poller", "main"]
    assert "internal hidden" not in out
    assert "BaseSelectorEventLoop._read_from_self" in out


def test_await_sites_of_top_coroutines(doc):
    out = text.render(doc, width=120)
    lines = out.splitlines()
    start = lines.index("Where the top coroutines wait (await sites of their recorded tasks)")
    assert lines[start + 1:start + 8] == [
        "(idle: task time, summed over the tasks; it can exceed the wall time)",
        "  crunch  (app.py:50)",
        "        100.0 ms idle        5x  app.py:55",
        "  poller  (app.py:24)",
        "        995.1 ms idle      190x  app.py:27",
        "  main  (app.py:30)",
        "       1000.2 ms idle        1x  app.py:34",
    ]


# -- task view -------------------------------------------------------------------------
def test_task_view_columns(doc):
    rows = table(text.render(doc, by="task", width=200), "Tasks by busy ms")
    assert re.split(r"\s{2,}", rows[0].strip()) == [
        "id", "name", "coroutine", "created at", "parent", "state", "steps", "busy ms",
        "sched ms", "idle ms", "cpu ms", "max ms", "await site"]
    assert re.split(r"\s{2,}", rows[1].strip()) == [
        "3", "Task-3", "crunch", "app.py:40", "1", "failed ValueError", "6", "405.1", "2.0",
        "100.0", "1.0", "101.0", "app.py:55"]
    # Task-1 existed before profiling: no creation site, no parent.
    assert re.split(r"\s{2,}", rows[3].strip())[:6] == ["1", "Task-1", "main", "-", "-", "done"]
    assert len(rows) == 4                              # two internal tasks hidden


def test_task_view_sorted_by_idle(doc):
    rows = table(text.render(doc, by="task", sort="idle", width=200), "Tasks by idle ms")
    assert first_column(rows) == ["1", "2", "3"]


# -- site and callback views -----------------------------------------------------------
def test_site_view(doc):
    out = text.render(doc, by="site", width=120)
    rows = table(out, "Await sites by idle ms")
    assert re.split(r"\s{2,}", rows[0].strip()) == [
        "await site", "function", "count", "idle ms", "inner idle ms"]
    assert first_column(rows) == ["app.py:34", "app.py:27", "app.py:12"]
    assert re.split(r"\s{2,}", rows[2].strip()) == ["app.py:27", "poller", "190", "995.1",
                                                     "995.1"]
    # sort "steps" means the suspension count for sites
    rows = table(text.render(doc, by="site", sort="steps", width=120), "Await sites by count")
    assert first_column(rows) == ["app.py:27", "app.py:12", "app.py:34"]


def test_callbacks_table_in_every_view(doc):
    for by in ("coroutine", "task", "site"):
        rows = table(text.render(doc, by=by, width=120), "Callbacks (not task steps) by busy ms")
        assert first_column(rows) == ["on_timer", "print"]
        assert rows[2].rstrip().endswith("<built-in>")
    rows = table(text.render(doc, by="callback", sort="steps", width=120), "Callbacks")
    assert first_column(rows) == ["print", "on_timer"]


def test_short_callbacks_table_has_five_rows():
    cbs = [{"callback": f"cb{i}", "file": APP, "line": i, "internal": False, "count": 1,
            "busy_s": i / 1000, "cpu_s": 0.0, "max_step_s": 0.0} for i in range(1, 9)]
    doc = make_doc([], callbacks=cbs)
    out = text.render(doc, width=120)
    assert first_column(table(out, "Callbacks")) == ["cb8", "cb7", "cb6", "cb5", "cb4"]
    assert "(top 5 of 8, --by callback)" in out
    assert len(table(text.render(doc, by="callback", width=120), "Callbacks")) == 9


# -- loops -----------------------------------------------------------------------------
def make_loop(**extra) -> dict:
    """A LOOP as Profiler.stats() gives it (see the core's snapshot)."""
    loop = {"id": 1, "type": "_UnixSelectorEventLoop", "thread": 4242, "ticks": 380,
            "handles": 400, "select_calls": 380, "io_events": 2, "wall_s": 1.01,
            "select_wait_s": 0.955, "busy_s": 0.055, "utilization": 0.054, "load": 0.041,
            "load_smoothed": 0.04, "lag_p50_s": 0.0001, "lag_p90_s": 0.0005,
            "lag_p99_s": 0.0012, "lag_max_s": 0.0051, "lag_count": 400,
            "timer_lag_p99_s": 0.0011, "timer_lag_max_s": 0.002, "tick_busy_p50_s": 0.0001,
            "tick_busy_p99_s": 0.1, "tick_busy_max_s": 0.101, "handles_per_tick_max": 10,
            "slow_steps": [], "slow_total": 0, "destroyed": False}
    loop.update(extra)
    return loop


def test_loop_section(doc):
    """Slow steps come before slow ticks; a step's line says where it was resumed, where
    it blocked (the watchdog's capture) and, labelled apart, the await it ended at."""
    step = {"kind": "step", "duration_s": 0.101, "at_s": 0.25, "task": 3, "coroutine": "crunch",
            "callback": None, "step_start": {"file": APP, "line": 50, "function": "crunch"},
            "step_end": {"file": APP, "line": 55, "function": "crunch"},
            "blocked_at": {"file": APP, "line": 52, "function": "parse"}, "handles": 0}
    tick = {"kind": "tick", "duration_s": 0.102, "at_s": 0.25, "task": None, "coroutine": None,
            "callback": None, "step_start": None, "step_end": None, "blocked_at": None, "handles": 2}
    cb = {"kind": "callback", "duration_s": 0.1005, "at_s": 0.5, "task": None, "coroutine": None,
          "callback": "on_timer", "step_start": None, "step_end": None,
          "blocked_at": {"file": APP, "line": 70, "function": "on_timer"}, "handles": 0}
    doc["loops"] = [make_loop(slow_steps=[tick, step, cb], slow_total=3)]
    out = text.render(doc, width=140)
    assert out[out.index("Event loops"):] == (
        "Event loops\n"
        "  loop 1 (_UnixSelectorEventLoop), thread 4242\n"
        "      utilization 5.4%, load 4.1%, wall 1.010 s, ticks 380, handles 400, max handles/tick 10\n"
        "      select wait 955.0 ms in 380 calls, io events 2\n"
        "      lag p50 0.1 ms p99 1.2 ms max 5.1 ms, timer lag p99 1.1 ms max 2.0 ms, tick busy p50 0.1 ms p99 100.0 ms"
        " max 101.0 ms\n"
        "      slow steps 3; the longest:\n"
        "            101.0 ms  crunch (task 3)  resumed at app.py:50 \u00b7 blocked at app.py:52 (parse)"
        " \u00b7 then awaited at app.py:55  at 0.250 s\n"
        "            100.5 ms  on_timer  blocked at app.py:70 (on_timer)  at 0.500 s\n"
        "            102.0 ms  tick of 2 handles  at 0.250 s\n")
    # A stream that cannot take U+2026 gets "; " between the parts.
    plain = text.render(doc, width=140, ellipsis="...")
    assert "blocked at app.py:52 (parse); then awaited at app.py:55  at" in plain


def test_wide_characters_keep_the_columns_aligned():
    """Task and file names in East Asian wide characters take two columns each: the
    columns after them stay aligned, and a name cut to fit is cut by display width."""
    tasks = [make_task(1, "処理する", busy=0.5), make_task(2, "abc", busy=0.25)]
    out = text.render(make_doc(tasks), width=80)
    rows = table(out, "Coroutines")
    header, *body = rows[:3]
    col = text._width(header[: header.index("busy ms") + len("busy ms")])
    assert len(body) == 2
    for row in body:
        busy = row.split()[3]   # the busy ms cell, right-aligned under its header
        assert text._width(row[: row.index(busy) + len(busy)]) == col, rows
    assert text._width("処理する") == 8 and text._pad("処", 4) == "処  "
    assert text._cut_left("ab処理する", 7, "\u2026") == "\u2026理する"
    assert text._cut("処理する", 6, "...") == "処..."


def test_a_report_to_a_file_or_pipe_has_whole_rows(doc, monkeypatch, tmp_path):
    """Only a terminal gets a width-fitted report: to a file or a pipe, no column is
    left out and no name shortened (COLUMNS, when set, still gives the width)."""
    from aioprof import report
    long = "a_very_long_coroutine_name_" * 6
    doc["tasks"].append(make_task(99, long, busy=0.9))
    doc["coroutines"] = [coroutine_of(t) for t in doc["tasks"]]
    monkeypatch.delenv("COLUMNS", raising=False)
    path = tmp_path / "out.txt"
    with open(path, "w", encoding="utf-8") as f:
        report.write(doc, file=f)
    written = path.read_text(encoding="utf-8")
    assert long in written and "left out to fit" not in written and "\u2026" not in written
    r, w = os.pipe()
    with os.fdopen(w, "w", encoding="utf-8") as pipe:
        report.write(doc, file=pipe)
    with os.fdopen(r, encoding="utf-8") as f:
        assert f.read() == written
    monkeypatch.setenv("COLUMNS", "80")
    with open(path, "w", encoding="utf-8") as f:
        report.write(doc, file=f)
    assert long not in path.read_text(encoding="utf-8")


def test_loop_section_tolerates_missing_keys(doc):
    doc["loops"] = [{}, {"id": 7, "ticks": 3}]
    out = text.render(doc, width=120)
    assert "  loop 1\n" in out
    assert "  loop 7\n      ticks 3\n" in out


def test_no_loop_section_without_loops(doc):
    assert "Event loops" not in text.render(doc, width=120)
    del doc["loops"]
    assert "Event loops" not in text.render(doc, width=120)


def test_empty_and_sparse_documents():
    out = text.render({}, width=80)
    assert out.startswith("aioprof: wall - s, 0 tasks\n")
    assert "(none)" in out
    sparse = {"wall_s": 0.5, "tasks": [{"id": 1}], "coroutines": [{"coroutine": "f"}]}
    for by in text.VIEWS:
        text.render(sparse, by=by, width=80)        # missing keys render as "-"
    rows = table(text.render(sparse, width=80), "Coroutines by")
    assert rows[1].split() == ["f"] + ["-"] * 8


# -- width -----------------------------------------------------------------------------
def long_doc() -> dict:
    long = "Server.handle_connection.<locals>.a_very_long_inner_coroutine_name"
    tasks = [make_task(i, f"{long}_{i}", busy=123.456 + i, sched=55.5, idle=3600.25,
                       steps=1234567, line=1000 + i, file="/srv/a_long_module_name_for_tests.py",
                       created=("another_long_module_name.py", 9999), parent=i,
                       await_sites=[(77, long, 5, 1.0)]) for i in range(1, 6)]
    sites = [{"file": "/x/a_long_module_name_for_tests.py", "line": 100 + i, "function": long,
              "count": 10 ** 6, "idle_s": 1e4, "innermost_count": 1, "innermost_idle_s": 1e4}
             for i in range(3)]
    slow = {"kind": "step", "duration_s": 5.0, "at_s": 1e4, "task": 10 ** 9,
            "coroutine": long * 3, "callback": None, "handles": 0,
            "step_start": {"file": "/x/a_long_module_name_for_tests.py", "line": 1, "function": ""},
            "step_end": {"file": "/x/a_long_module_name_for_tests.py", "line": 2, "function": ""}}
    loops = [make_loop(thread=140000000000000, type="Some" * 30, ticks=10 ** 9,
                       select_calls=10 ** 9, select_wait_s=1e5, slow_total=200,
                       slow_steps=[slow] * 3)]
    cbs = [{"callback": long, "file": "/x/a_long_module_name_for_tests.py", "line": 1,
            "internal": False, "count": 10 ** 8, "busy_s": 1e4, "cpu_s": 1e4, "max_step_s": 1.0}]
    return make_doc(tasks, sites=sites, loops=loops, callbacks=cbs, dropped_tasks=123456,
                    warnings=["w" * 300])


@pytest.mark.parametrize("by", text.VIEWS)
@pytest.mark.parametrize("width", [80, 100, 132, 200])
def test_every_line_fits_the_width(by, width):
    out = text.render(long_doc(), by=by, width=width, show_internal=True)
    for line in out.splitlines():
        assert len(line) <= width, line


def test_narrow_width_shortens_names_with_ellipsis_instead_of_wrapping():
    doc = long_doc()
    out = text.render(doc, width=100)
    rows = table(out, "Coroutines by")
    assert len(rows) == 1 + 5                          # no wrapped rows
    assert rows[1].startswith("\u2026")
    assert rows[1].split()[0].endswith("_name_5")     # the end of the name is kept
    assert "busy ms" in rows[0]
    assert re.search(r"\u2026\S*:1005$", rows[1])          # the line number is kept


def test_narrow_width_leaves_out_least_important_columns_with_a_note(doc):
    out = text.render(doc, by="task", width=80)
    rows = table(out, "Tasks by busy ms")
    for kept in ("id", "coroutine", "steps", "busy ms", "sched ms", "idle ms"):
        assert kept in rows[0]
    assert "parent" not in rows[0]
    assert "(left out to fit 80 columns: " in out
    assert "parent" in out[out.index("(left out to fit 80 columns: "):]


def test_width_is_at_least_80(doc):
    narrow = text.render(long_doc(), width=20)
    assert narrow == text.render(long_doc(), width=80)
    assert max(len(line) for line in narrow.splitlines()) == 80


def test_default_width_is_the_terminal_width(doc, monkeypatch):
    monkeypatch.setenv("COLUMNS", "90")
    assert text.render(long_doc()) == text.render(long_doc(), width=90)


# -- report.write ----------------------------------------------------------------------
def test_write_json(doc):
    f = io.StringIO()
    report.write(doc, format="json", file=f, sort="busy", limit=None, by="coroutine",
                 show_internal=False, width=None)
    out = f.getvalue()
    assert out.endswith("}\n")
    assert json.loads(out) == doc
    assert out.startswith('{\n "aioprof": 1,')       # indent=1


def test_write_text(doc):
    f = io.StringIO()
    report.write(doc, format="text", file=f, sort="idle", limit=2, by="task",
                 show_internal=False, width=120)
    assert f.getvalue() == text.render(doc, sort="idle", limit=2, by="task", width=120)


def test_write_uses_ascii_ellipsis_for_ascii_streams():
    raw = io.BytesIO()
    f = io.TextIOWrapper(raw, encoding="ascii")
    report.write(long_doc(), format="text", file=f, width=80)
    f.flush()
    out = raw.getvalue().decode("ascii")
    assert "..." in out


@pytest.mark.parametrize("bad, message", [
    ({"format": "xml"}, "unknown report format 'xml' (choose from text, json, collapsed, trace, pprof, html)"),
    ({"sort": "wall"}, "unknown sort key 'wall' (choose from busy, cpu, scheduled, idle, steps, max)"),
    ({"by": "thread"}, "unknown view 'thread' (choose from coroutine, task, site, callback, stack, process)"),
    ({"limit": -1}, "limit must be an int >= 0"),
    ({"format": "json", "sort": "nope"}, "unknown sort key 'nope'"),
])
def test_write_rejects_bad_options(doc, bad, message):
    kwargs = dict(format="text", sort="busy", limit=None, by="coroutine")
    kwargs.update(bad)
    with pytest.raises(ValueError) as err:
        report.write(doc, file=io.StringIO(), **kwargs)
    assert str(err.value).startswith(message)
