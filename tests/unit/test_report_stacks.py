"""The stack views on hand-made documents: folded stacks (aioprof.report.collapsed), the
Chrome trace (aioprof.report.trace), the call tree and blocking stacks of the text report,
and aioprof.report.write for the new formats (docs/stacks.md)."""
from __future__ import annotations

import copy
import io
import json
import math
from collections import Counter, defaultdict

import pytest

from aioprof import report
from aioprof.report import collapsed, text, trace

APP = "/srv/app/app.py"
LIB = "/srv/app/lib;v2/db.py"     # a ';' in a path must not split the frame


def frames():
    return [
        {"kind": "task", "coroutine": "main"},                                    # 0
        {"kind": "code", "file": APP, "line": 30, "function": "main"},            # 1
        {"kind": "code", "file": APP, "line": 12, "function": "crunch"},          # 2
        {"kind": "code", "file": APP, "line": 20, "function": "parse"},           # 3
        {"kind": "asyncio"},                                                      # 4
        {"kind": "task", "coroutine": "child"},                                   # 5
        {"kind": "code", "file": LIB, "line": 7, "function": "query"},            # 6
        {"kind": "callback", "callback": "on_timer"},                             # 7
        {"kind": "code", "file": APP, "line": 40, "function": "odd\nname"},       # 8
    ]


@pytest.fixture
def doc() -> dict:
    return {
        "aioprof": 1, "python": "3.11.7", "wall_s": 2.0, "slow_s": 0.1,
        "tasks": [{"id": 1, "name": "Task-1", "coroutine": "main", "busy_s": 0.0009},
                  {"id": 3, "name": "Task-3", "coroutine": "child"}],
        "coroutines": [], "callbacks": [], "sites": [], "dropped_tasks": 0, "warnings": [],
        "loops": [{"id": 1, "type": "_UnixSelectorEventLoop", "thread": 777,
                   "slow_steps": [], "slow_total": 2}],
        "frames": frames(),
        "samples": {"interval_s": 0.001, "count": 1005, "stacks": [
            {"stack": [0, 1, 2], "samples": 600, "time_s": 0.6},
            {"stack": [0, 1, 2, 3], "samples": 200, "time_s": 0.2},
            {"stack": [0, 1, 3], "samples": 100, "time_s": 0.1},
            {"stack": [0, 1, 4, 5, 6], "samples": 95, "time_s": 0.095},
            {"stack": [7], "samples": 5, "time_s": 0.005},
            {"stack": [0, 1, 8], "samples": 1, "time_s": 0.0000004},   # rounds to 0 µs
        ]},
        "idle_stacks": [
            {"stack": [0, 1, 4, 5, 6], "count": 3, "idle_s": 0.25},
            {"stack": [0, 1], "count": 1, "idle_s": 1.0},
            {"stack": [0, 1, 2], "count": 1, "idle_s": 0.0000015},
        ],
        "blocking": [
            {"stack": [0, 1, 2], "count": 4},
            {"stack": [0, 1, 2, 3], "count": 2},
            {"stack": [0, 1, 4, 5, 6], "count": 3},
            {"stack": [7], "count": 1},
        ],
    }


def folded(out: str) -> dict:
    """{stack text: value} of folded lines; also checks the line syntax."""
    result = {}
    for line in out.splitlines():
        stack, _, value = line.rpartition(" ")
        assert stack and value.isdigit() and int(value) > 0, line
        assert stack not in result
        result[stack] = int(value)
    return result


# -- collapsed -------------------------------------------------------------------------
def test_collapsed_cpu_exact(doc):
    assert collapsed.render(doc, "cpu") == (
        "[callback on_timer] 5000\n"
        "[task main];main (app.py:30);[asyncio];[task child];query (db.py:7) 95000\n"
        "[task main];main (app.py:30);crunch (app.py:12) 600000\n"
        "[task main];main (app.py:30);crunch (app.py:12);parse (app.py:20) 200000\n"
        "[task main];main (app.py:30);parse (app.py:20) 100000\n"
    )


def test_collapsed_idle_exact(doc):
    assert collapsed.render(doc, "idle") == (
        "[task main];main (app.py:30) 1000000\n"
        "[task main];main (app.py:30);[asyncio];[task child];query (db.py:7) 250000\n"
        "[task main];main (app.py:30);crunch (app.py:12) 2\n"
    )


def test_collapsed_default_flame_is_cpu(doc):
    assert collapsed.render(doc) == collapsed.render(doc, "cpu")


def test_wall_is_cpu_plus_idle_per_stack(doc):
    cpu, idle = folded(collapsed.render(doc, "cpu")), folded(collapsed.render(doc, "idle"))
    wall = folded(collapsed.render(doc, "wall"))
    assert set(wall) == set(cpu) | set(idle)
    for stack in wall:
        assert wall[stack] == cpu.get(stack, 0) + idle.get(stack, 0)
    assert wall["[task main];main (app.py:30);crunch (app.py:12)"] == 600002
    assert sum(wall.values()) == sum(cpu.values()) + sum(idle.values())


def test_equal_stacks_are_summed_and_lines_sorted(doc):
    # Another frame entry with the same text (same base name, other directory).
    doc["frames"].append({"kind": "code", "file": "/other/app.py", "line": 12,
                          "function": "crunch"})
    doc["samples"]["stacks"].append({"stack": [0, 1, 9], "samples": 1, "time_s": 0.000001})
    out = collapsed.render(doc, "cpu")
    assert folded(out)["[task main];main (app.py:30);crunch (app.py:12)"] == 600001
    stacks = [line.rpartition(" ")[0] for line in out.splitlines()]
    assert stacks == sorted(stacks)


def test_separators_and_newlines_in_names_are_replaced(doc):
    doc["samples"]["stacks"].append({"stack": [0, 1, 8], "samples": 1, "time_s": 0.001})
    out = collapsed.render(doc, "cpu")
    assert "[task main];main (app.py:30);odd name (app.py:40) 1000\n" in out
    for line in out.splitlines():
        assert line.count("(") == line.count(")")
    doc["frames"][2]["function"] = "a;b"
    assert "crunch" not in collapsed.render(doc, "cpu")
    assert "[task main];main (app.py:30);a,b (app.py:12) 600000\n" in collapsed.render(doc)


def test_frame_texts():
    assert collapsed.frame_text({"kind": "code", "file": "/x/y/z.py", "line": 3,
                                 "function": "Cls.meth"}) == "Cls.meth (z.py:3)"
    assert collapsed.frame_text({"kind": "code", "file": None, "line": None,
                                 "function": "sleep"}) == "sleep"
    assert collapsed.frame_text({"kind": "task", "coroutine": "Srv.handle"}) == "[task Srv.handle]"
    assert collapsed.frame_text({"kind": "callback", "callback": "cb"}) == "[callback cb]"
    assert collapsed.frame_text({"kind": "asyncio"}) == "[asyncio]"


def test_zero_values_are_skipped(doc):
    assert "odd" not in collapsed.render(doc, "cpu")         # 0.4 µs rounds to 0
    doc["samples"]["stacks"] = []
    assert collapsed.render(doc, "cpu") == ""


@pytest.mark.parametrize("flame, remove, words", [
    ("cpu", "samples", "no samples"),
    ("wall", "samples", "no samples"),
    ("idle", "idle_stacks", "no idle stacks"),
    ("wall", "idle_stacks", "no idle stacks"),
])
def test_missing_part_is_a_clear_error(doc, flame, remove, words):
    del doc[remove]
    with pytest.raises(ValueError, match=words):
        collapsed.render(doc, flame)


def test_missing_samples_message_names_interval(doc):
    del doc["samples"]
    with pytest.raises(ValueError, match="--interval 0"):
        collapsed.render(doc, "cpu")


def test_unknown_flame(doc):
    with pytest.raises(ValueError, match="cpu, idle, wall"):
        collapsed.render(doc, "gpu")


# -- trace -----------------------------------------------------------------------------
def trace_doc() -> dict:
    """Loop 1 (thread 777): task 1 runs, creates task 3 and awaits it; a callback runs;
    loop 2 (thread 888): task 4. Times chosen on the µs grid and off it."""
    site = {"file": APP, "line": 31, "function": "main"}
    events = [
        {"kind": "create", "task": 1, "parent": None, "at_s": 0.0},
        {"kind": "scheduled", "task": 1, "start_s": 0.0, "end_s": 0.0001},
        {"kind": "tick", "loop": 1, "thread": 777, "start_s": 0.00005, "end_s": 0.0012,
         "handles": 2},
        {"kind": "select", "loop": 1, "thread": 777, "start_s": 0.00005, "end_s": 0.0001,
         "events": 0},
        {"kind": "run", "task": 1, "callback": None, "loop": 1, "thread": 777,
         "start_s": 0.0001, "end_s": 0.001},
        {"kind": "create", "task": 3, "parent": 1, "at_s": 0.0005},
        {"kind": "scheduled", "task": 3, "start_s": 0.0005, "end_s": 0.0011},
        {"kind": "await", "task": 1, "start_s": 0.001, "end_s": 0.2505, "site": site},
        {"kind": "run", "task": None, "callback": "on_timer", "loop": 1, "thread": 777,
         "start_s": 0.001, "end_s": 0.0011},
        {"kind": "run", "task": 3, "callback": None, "loop": 1, "thread": 777,
         "start_s": 0.0011, "end_s": 0.0012},
        {"kind": "await", "task": 3, "start_s": 0.0012, "end_s": 0.25, "site": None},
        {"kind": "scheduled", "task": 3, "start_s": 0.25, "end_s": 0.2500001234},
        {"kind": "run", "task": 3, "callback": None, "loop": 1, "thread": 777,
         "start_s": 0.2500001234, "end_s": 0.2503333333},
        {"kind": "run", "task": 4, "callback": None, "loop": 2, "thread": 888,
         "start_s": 0.01, "end_s": 0.0125},
        {"kind": "create", "task": 5, "parent": 4, "at_s": 0.011},   # child never seen
    ]
    return {"aioprof": 1, "python": "3.11.7", "wall_s": 0.3,
            "tasks": [{"id": 1, "name": "Task-1", "coroutine": "main", "thread": 777},
                      {"id": 3, "name": "Task-3", "coroutine": "child", "thread": 777},
                      {"id": 4, "name": "worker-A", "coroutine": "Worker.run", "thread": 888}],
            "loops": [{"id": 1, "type": "_UnixSelectorEventLoop", "thread": 777},
                      {"id": 2, "type": "_UnixSelectorEventLoop", "thread": 888}],
            "trace": {"capacity": 1000, "dropped": 0, "events": events}}


REQUIRED = {"X": {"name", "cat", "ph", "ts", "dur", "pid", "tid"},
            "M": {"name", "ph", "pid", "tid", "args"},
            "s": {"name", "cat", "ph", "ts", "pid", "tid", "id"},
            "f": {"name", "cat", "ph", "ts", "pid", "tid", "id", "bp"}}


def test_trace_every_event_has_the_fields_of_its_phase():
    out = trace.render(trace_doc())
    assert set(out) == {"traceEvents", "displayTimeUnit", "otherData"}
    assert out["displayTimeUnit"] == "ms"
    assert out["otherData"]["trace_capacity"] == 1000
    for ev in out["traceEvents"]:
        assert ev["ph"] in REQUIRED, ev
        assert REQUIRED[ev["ph"]] <= set(ev), ev
        assert isinstance(ev["pid"], int) and isinstance(ev["tid"], int)
        assert 0 < ev["pid"] < 2 ** 31 and 0 < ev["tid"] < 2 ** 31
        if ev["ph"] != "M":
            assert isinstance(ev["ts"], (int, float)) and math.isfinite(ev["ts"]) and ev["ts"] >= 0
        if ev["ph"] == "X":
            assert isinstance(ev["dur"], (int, float)) and ev["dur"] >= 0
        if ev["ph"] == "f":
            assert ev["bp"] == "e"
        if ev["ph"] == "M":
            assert ev["name"] in ("process_name", "thread_name", "process_sort_index",
                                  "thread_sort_index")


def test_trace_json_round_trips():
    out = trace.render(trace_doc())
    text_ = json.dumps(out, allow_nan=False)
    assert json.loads(text_) == out


def xs(out, **match):
    return [e for e in out["traceEvents"] if e["ph"] == "X"
            and all(e.get(k) == v for k, v in match.items())]


def test_trace_microseconds_exact():
    out = trace.render(trace_doc())
    run, = [e for e in xs(out, name="running", tid=1)]
    assert (run["ts"], run["dur"]) == (100.0, 900.0)
    aw, = xs(out, cat="await", tid=1)
    assert (aw["ts"], aw["dur"]) == (1000.0, 249500.0)
    tick, = xs(out, name="tick")
    assert (tick["ts"], tick["dur"]) == (50.0, 1150.0)
    # Off the grid: ends rounded to 1/8 µs, dur the difference of the rounded ends.
    late = [e for e in xs(out, name="running", tid=3) if e["ts"] > 200000]
    assert late[0]["ts"] == round(0.2500001234 * 8e6) / 8 == 250000.125
    assert late[0]["dur"] == round(0.2503333333 * 8e6) / 8 - 250000.125 == 333.25
    for e in xs(out):
        # Every time survives the readers' microseconds -> integer nanoseconds conversion.
        for v in (e["ts"], e["dur"]):
            assert v * 1000.0 == int(v * 1000.0)
            assert (v * 8).is_integer()


def test_trace_adjacent_intervals_stay_adjacent():
    out = trace.render(trace_doc())
    spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in xs(out, tid=3))
    for (_, end), (start, _) in zip(spans, spans[1:]):
        assert end == start


def test_trace_tracks_and_names():
    out = trace.render(trace_doc())
    meta = [e for e in out["traceEvents"] if e["ph"] == "M"]
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in meta if e["name"] == "thread_name"}
    procs = {e["pid"]: e["args"]["name"] for e in meta if e["name"] == "process_name"}
    assert procs == {1: "loop 1 (_UnixSelectorEventLoop), thread 777",
                     2: "loop 2 (_UnixSelectorEventLoop), thread 888"}
    assert threads[(1, 1)] == "Task-1 main"
    assert threads[(1, 3)] == "Task-3 child"
    assert threads[(2, 4)] == "worker-A Worker.run"
    loop_tid = trace.LOOP_TID_BASE + 2
    assert threads[(1, loop_tid)] == "loop 1"
    assert threads[(1, loop_tid + 1)] == "loop 1 callbacks"
    # Every event is on a named track.
    for e in out["traceEvents"]:
        assert (e["pid"], e["tid"]) in threads
    assert {e["name"] for e in xs(out, tid=loop_tid)} == {"tick", "select"}
    cb, = xs(out, tid=loop_tid + 1)
    assert cb["name"] == "on_timer" and (cb["ts"], cb["dur"]) == (1000.0, 100.0)
    assert {e["name"] for e in xs(out, tid=1)} == {"scheduled", "running", "await app.py:31"}
    assert {e["name"] for e in xs(out, tid=3)} == {"scheduled", "running", "await"}
    aw, = xs(out, cat="await", tid=1)
    assert aw["args"]["function"] == "main" and aw["args"]["line"] == 31
    # Tasks that ran on loop 2 are in its process; loop 2 has only its task track.
    assert {(e["pid"], e["tid"]) for e in xs(out, pid=2)} == {(2, 4)}


def test_trace_creation_flow_from_parent_run_to_child():
    out = trace.render(trace_doc())
    flows = [e for e in out["traceEvents"] if e["ph"] in "sf"]
    by_id = defaultdict(list)
    for e in flows:
        by_id[e["id"]].append(e)
    assert list(by_id) == [3]        # task 1 -> 3; no arrow for task 5 (nothing to bind)
    s, f = sorted(by_id[3], key=lambda e: e["ph"] == "f")
    assert (s["ph"], f["ph"]) == ("s", "f")
    assert (s["name"], s["cat"]) == (f["name"], f["cat"]) == ("create", "create")
    assert (s["pid"], s["tid"], s["ts"]) == (1, 1, 500.0)
    assert (f["pid"], f["tid"]) == (1, 3)
    # "s" inside the parent's running slice, "f" inside the child's first slice.
    run, = xs(out, name="running", tid=1)
    assert run["ts"] <= s["ts"] <= run["ts"] + run["dur"]
    first = min(xs(out, tid=3), key=lambda e: e["ts"])
    assert first["ts"] < f["ts"] < first["ts"] + first["dur"]
    assert f["ts"] - s["ts"] <= 0.125


def test_trace_events_sorted_slices_before_nested():
    out = trace.render(trace_doc())
    evs = [e for e in out["traceEvents"] if e["ph"] != "M"]
    assert [e["ts"] for e in evs] == sorted(e["ts"] for e in evs)
    names = [e["name"] for e in evs if e["ts"] == 50.0]
    assert names == ["tick", "select"]
    metas = [i for i, e in enumerate(out["traceEvents"]) if e["ph"] == "M"]
    assert metas == list(range(len(metas)))


def test_trace_task_totals_match_events():
    out = trace.render(trace_doc())
    total = Counter()
    for e in xs(out, tid=3):
        total[e["cat"]] += e["dur"]
    assert total == {"run": 100.0 + 333.25, "scheduled": 600.0 + 0.125, "await": 248800.0}


def test_trace_missing_is_a_clear_error():
    with pytest.raises(ValueError, match="no trace"):
        trace.render({"aioprof": 1})


def test_trace_without_tasks_or_loops_still_valid():
    doc = {"trace": {"capacity": 10, "dropped": 5, "events": [
        {"kind": "run", "task": 9, "callback": None, "loop": 2, "thread": 1,
         "start_s": 0.5, "end_s": 0.25},                      # end before start: dur 0
        {"kind": "await", "task": 8, "start_s": 0.1, "end_s": 0.2, "site": None}]}}
    out = trace.render(doc)
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in out["traceEvents"]
             if e["name"] == "thread_name"}
    assert names[(2, 9)] == "task 9"
    run, = xs(out, tid=9)
    assert run["dur"] == 0
    assert out["otherData"]["trace_dropped"] == 5
    json.dumps(out, allow_nan=False)


# -- text: call tree and blocking stacks -----------------------------------------------
def tree_rows(out: str):
    """(total ms, percent, self ms, depth, frame) of the call tree rows."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if "call stack" in line and "total ms" in line)
    col = lines[start].index("call stack")
    rows = []
    for line in lines[start + 1:]:
        if not line.strip() or line.startswith("("):
            break
        total, pct, self_ = line[:col].split()
        label = line[col:]
        depth = (len(label) - len(label.lstrip(" "))) // text.TREE_INDENT
        rows.append((total, pct, self_, depth, label.strip()))
    return rows


def test_call_tree_numbers_exact(doc):
    out = text.render(doc, by="stack", width=120)
    assert ("Sampled on-loop time by call stack: 1000.0 ms in 1005 samples, one per 1.0 ms on "
            "average, asked every 1.0 ms\n") in out
    assert tree_rows(out) == [
        ("995.0", "99.5%", "0.0", 0, "[task main]"),
        ("995.0", "99.5%", "0.0", 1, "main (app.py:30)"),
        ("800.0", "80.0%", "600.0", 2, "crunch (app.py:12)"),
        ("200.0", "20.0%", "200.0", 3, "parse (app.py:20)"),
        ("100.0", "10.0%", "100.0", 2, "parse (app.py:20)"),
        ("95.0", "9.5%", "0.0", 2, "[asyncio]"),
        ("95.0", "9.5%", "0.0", 3, "[task child]"),
        ("95.0", "9.5%", "95.0", 4, "query (db.py:7)"),
    ]
    # [callback on_timer] (0.5%) and odd name (0.0%) are below 1%.
    assert "(2 nodes below 1% of the sampled time left out)" in out
    assert "on_timer" not in out.split("call stack", 1)[1].split("\n\n")[0]


def test_call_tree_header_says_the_real_count_and_spacing(doc):
    """64 samples over 306 ms asked every 1 ms: the header gives the samples there are and
    their mean spacing (4.8 ms), never the interval asked as if it were what happened;
    on-loop time that no sample saw (samples.uncharged_s) is said too."""
    doc["samples"] = {"interval_s": 0.001, "count": 64, "uncharged_s": 0.012, "stacks": [
        {"stack": [0, 1, 2], "samples": 64, "time_s": 0.306}]}
    out = text.render(doc, by="stack", width=160)
    assert ("Sampled on-loop time by call stack: 306.0 ms in 64 samples, one per 4.8 ms on "
            "average, asked every 1.0 ms, 12.0 ms no sample saw\n") in out
    assert "every 1.0 ms," not in out.replace("asked every 1.0 ms,", "")


def test_call_tree_limit_children_per_node(doc):
    out = text.render(doc, by="stack", limit=1, width=120)
    assert [r[4] for r in tree_rows(out)] == ["[task main]", "main (app.py:30)",
                                              "crunch (app.py:12)", "parse (app.py:20)"]
    assert "2 more past 1 children per node, --limit" in out


def test_call_tree_without_samples(doc):
    del doc["samples"]
    out = text.render(doc, by="stack", width=120)
    assert "Sampled on-loop time by call stack: no samples (sampling was off: --interval 0)" in out


def test_call_tree_fits_the_width(doc):
    deep = {"kind": "code", "file": APP, "line": 99, "function": "f" * 60}
    doc["frames"].append(deep)
    doc["samples"]["stacks"].append({"stack": [0, 1] + [9] * 40, "samples": 500,
                                     "time_s": 0.5})
    out = text.render(doc, by="stack", width=80)
    assert all(len(line) <= 80 for line in out.splitlines())
    assert any(line.endswith(":99)") for line in out.splitlines())


def test_blocking_stacks_by_innermost_line(doc):
    out = text.render(doc, width=120)
    lines = out.splitlines()
    i = next(i for i, line in enumerate(lines) if "blocking stacks" in line)
    assert lines[i] == ("  blocking stacks captured during slow steps (>= 100.0 ms), "
                        "by innermost line")
    assert [line.split() for line in lines[i + 1:i + 5]] == [
        ["4x", "app.py:12", "crunch", "in", "[task", "main]"],
        ["3x", "db.py:7", "query", "in", "[task", "child]"],
        ["2x", "app.py:20", "parse", "in", "[task", "main]"],
        ["1x", "[callback", "on_timer]", "in", "[callback", "on_timer]"],
    ]
    assert i > next(i for i, line in enumerate(lines) if line.startswith("Event loops"))


def test_blocking_same_line_is_summed_and_top_listed(doc):
    doc["blocking"].append({"stack": [0, 1, 4, 5, 6], "count": 5})   # same innermost line
    for n in range(6):
        doc["frames"].append({"kind": "code", "file": APP, "line": 100 + n, "function": "g"})
        doc["blocking"].append({"stack": [0, 1, 9 + n], "count": 1})
    out = text.render(doc, width=120)
    lines = out.splitlines()
    i = next(i for i, line in enumerate(lines) if "blocking stacks" in line)
    assert lines[i].endswith(f"(top {text.BLOCKING_STACKS} of 10)")
    assert lines[i + 1].split()[:3] == ["8x", "db.py:7", "query"]


def test_blocking_none_captured_and_absent(doc):
    doc["blocking"] = []
    assert "blocking stacks captured during slow steps (>= 100.0 ms), by innermost line: " \
           "none captured" in text.render(doc, width=120)
    doc["loops"][0]["slow_total"] = 0
    assert "blocking" not in text.render(doc, width=120)
    del doc["blocking"]
    doc["loops"][0]["slow_total"] = 3
    assert "blocking" not in text.render(doc, width=120)


def test_other_views_unchanged_by_stack_parts(doc):
    bare = copy.deepcopy(doc)
    for key in ("frames", "samples", "idle_stacks", "blocking"):
        del bare[key]
    for by in ("coroutine", "task", "site", "callback"):
        with_parts = text.render(doc, by=by, width=120).splitlines()
        without = text.render(bare, by=by, width=120).splitlines()
        assert [line for line in with_parts if "blocking" not in line
                and not line.startswith("        ")] == \
            [line for line in without if not line.startswith("        ")]


# -- report.write ----------------------------------------------------------------------
def test_write_collapsed_and_flame(doc):
    for flame in ("cpu", "idle", "wall"):
        buf = io.StringIO()
        report.write(doc, format="collapsed", file=buf, flame=flame)
        assert buf.getvalue() == collapsed.render(doc, flame)
    buf = io.StringIO()
    report.write(doc, format="collapsed", file=buf)
    assert buf.getvalue() == collapsed.render(doc, "cpu")


def test_write_trace_is_json():
    buf = io.StringIO()
    report.write(trace_doc(), format="trace", file=buf)
    assert buf.getvalue().endswith("\n")
    assert json.loads(buf.getvalue()) == trace.render(trace_doc())


def test_write_errors(doc):
    buf = io.StringIO()
    with pytest.raises(ValueError, match="unknown flame"):
        report.write(doc, format="text", file=buf, flame="gpu")
    with pytest.raises(ValueError, match="no trace"):
        report.write(doc, format="trace", file=buf)
    del doc["samples"]
    with pytest.raises(ValueError, match="no samples"):
        report.write(doc, format="collapsed", file=buf)
    assert buf.getvalue() == ""
    with pytest.raises(ValueError, match="text, json, collapsed, trace"):
        report.write(doc, format="svg", file=buf)


def test_write_text_and_json_unchanged(doc):
    buf = io.StringIO()
    report.write(doc, format="json", file=buf)
    assert json.loads(buf.getvalue()) == doc
    buf = io.StringIO()
    report.write(doc, format="text", file=buf, by="stack", width=120)
    assert buf.getvalue() == text.render(doc, by="stack", width=120)
