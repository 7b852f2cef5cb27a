"""Ended event loops fold into bounded aggregates (issue 7, item 2).

A program that makes a loop per call (``asyncio.run()`` in a sync wrapper, a loop per
test) must not cost aioprof memory per loop: past the biggest few, ended loops (closed,
or garbage-collected) are folded into one aggregate per thread name and loop class,
and the text report rolls them up instead of printing each.
"""
from __future__ import annotations

import asyncio
import gc
import json
import os
import subprocess
import sys
import textwrap

import pytest

import aioprof
from aioprof.report import text
from test_fake_clock import fake_clock, ns  # noqa: F401 (a fixture)

MS = 1_000_000
KEEP = 8   # AP_LOOPS_ENDED_KEEP: ended loops kept in full
SANITIZER = os.environ.get("AIOPROF_SANITIZER", "")


@pytest.mark.sanitize
def test_folded_totals_exact(fake_clock):
    """Run i of 20 (asyncio.run each) spends exactly i fake ms in its one step, so loop i
    is busy i ms; with slow_ms=10, runs 10..20 have one slow step each. The 8 busiest
    ended loops stay in full, the other 12 fold into one group whose totals are the
    exact sums."""
    async def work(i):
        fake_clock(i * MS, 0)

    with aioprof.Profiler(slow_ms=10, cpu_window_ms=1e-6) as p:
        for i in range(1, 21):
            asyncio.run(work(i))
    doc = p.stats()
    assert doc["warnings"] == [] and doc["loop_notes"] == []   # nothing hidden from the hooks
    kept = doc["loops"]
    assert sorted(ns(loop["busy_s"]) for loop in kept) == [i * MS for i in range(13, 21)]
    assert all(loop["destroyed"] and loop["thread_name"] == "MainThread" for loop in kept)
    (group,) = doc["loops_folded"]
    ticks = {loop["ticks"] for loop in kept}
    assert len(ticks) == 1                       # every run makes the same ticks
    lags = {loop["lag_count"] for loop in kept}
    assert len(lags) == 1
    assert group["loops"] == 12
    assert group["thread_name"] == "MainThread" and group["thread"] == kept[0]["thread"]
    assert (group["type"], group["module"]) == (kept[0]["type"], kept[0]["module"])
    assert ns(group["busy_s"]) == sum(range(1, 13)) * MS
    assert ns(group["wall_s"]) == ns(group["busy_s"]) and group["select_wait_s"] == 0
    assert group["utilization"] == 1.0
    assert group["ticks"] == 12 * ticks.pop()
    assert group["lag_count"] == 12 * lags.pop()
    assert group["handles"] == sum(loop["handles"] for loop in kept) // KEEP * 12
    assert group["slow_total"] == 3              # runs 10, 11, 12
    assert [ns(s["duration_s"]) for s in group["slow_steps"]] == [12 * MS, 11 * MS, 10 * MS]
    assert ns(group["tick_busy_max_s"]) == 12 * MS
    assert "id" not in group and group["load_smoothed"] is None
    # Nothing lost: kept + folded = every run's busy time.
    assert sum(ns(loop["busy_s"]) for loop in kept) + ns(group["busy_s"]) == 210 * MS


@pytest.mark.sanitize
def test_closed_loops_fold_while_still_referenced(fake_clock):
    """A closed loop runs nothing again: it is folded even if the program keeps it."""
    async def work():
        fake_clock(1 * MS, 0)

    keep = []
    with aioprof.Profiler() as p:
        for _ in range(KEEP + 4):
            loop = asyncio.new_event_loop()
            loop.run_until_complete(work())
            loop.close()
            keep.append(loop)
        live = asyncio.new_event_loop()
        live.run_until_complete(work())
        doc = p.stats()
    live.close()
    ended = [loop for loop in doc["loops"] if loop["destroyed"]]
    running = [loop for loop in doc["loops"] if not loop["destroyed"]]
    assert len(ended) == KEEP and len(running) == 1
    (group,) = doc["loops_folded"]
    assert group["loops"] == 4 and ns(group["busy_s"]) == 4 * MS


@pytest.mark.sanitize
def test_loops_of_threads_fold_per_thread_name(fake_clock):
    """Groups are per thread name: loops of two named threads fold apart."""
    import threading

    async def work():
        fake_clock(1 * MS, 0)

    def runs(n):
        for _ in range(n):
            asyncio.run(work())

    with aioprof.Profiler() as p:
        for name, n in (("alpha", KEEP + 3), ("beta", 5)):
            t = threading.Thread(target=runs, args=(n,), name=name)
            t.start()
            t.join()
    doc = p.stats()
    groups = {g["thread_name"]: g for g in doc["loops_folded"]}
    kept = [loop["thread_name"] for loop in doc["loops"]]
    # 8 + 5 = 13 ended loops, all of the same size: 5 folded, in the order they ended.
    assert sum(g["loops"] for g in groups.values()) == KEEP + 3 + 5 - KEEP
    for name, n in (("alpha", KEEP + 3), ("beta", 5)):
        folded = groups[name]["loops"] if name in groups else 0
        assert kept.count(name) + folded == n
        if name in groups:
            assert ns(groups[name]["busy_s"]) == folded * MS


RSS_PROGRAM = textwrap.dedent("""
    import asyncio, gc, json, os, sys
    PAGE = os.sysconf("SC_PAGE_SIZE")
    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * PAGE
    async def work():
        await asyncio.sleep(0)
    profiled = sys.argv[1] == "1"
    if profiled:
        import aioprof
        p = aioprof.Profiler(max_tasks=100).start()   # task records are capped: loops only
    for _ in range(100):      # warm up: allocator pools, code caches
        asyncio.run(work())
    gc.collect()
    before = rss()
    for _ in range(2000):
        asyncio.run(work())
    gc.collect()
    out = {"growth": rss() - before}
    if profiled:
        p.stop()
        doc = p.stats()
        from aioprof.report import text
        out["report"] = text.render(doc, width=120)
        out["loops"] = len(doc["loops"])
        out["folded"] = [g["loops"] for g in doc["loops_folded"]]
        out["ticks"] = sum(l["ticks"] for l in doc["loops"] + doc["loops_folded"])
    print(json.dumps(out))
""")


@pytest.fixture(scope="module")
def rss_runs():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.join(os.path.dirname(__file__), "..", "..", "src")]
        + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])))
    runs = {}
    for profiled in ("0", "1"):
        out = subprocess.run([sys.executable, "-c", RSS_PROGRAM, profiled], env=env,
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        runs[profiled] = json.loads(out.stdout)
    return runs


@pytest.mark.skipif(bool(SANITIZER), reason="RSS of a sanitizer build says nothing")
def test_2000_asyncio_runs_bounded_memory(rss_runs):
    """2,000 asyncio.run() calls: aioprof adds under 5 MB (it kept ~67 KB per loop: 140 MB)."""
    plain, profiled = rss_runs["0"]["growth"], rss_runs["1"]["growth"]
    assert profiled - plain < 5 * 1024 * 1024, (plain, profiled)
    got = rss_runs["1"]
    assert got["loops"] == KEEP and got["folded"] == [2100 - KEEP]
    assert got["ticks"] > 2100   # every loop's ticks are still counted


@pytest.mark.skipif(bool(SANITIZER), reason="slow under a sanitizer")
def test_2000_asyncio_runs_bounded_report(rss_runs):
    """The text report rolls the loops up: a few lines, not 7 per loop."""
    report = rss_runs["1"]["report"]
    section = report[report.index("Event loops"):].splitlines()
    assert section[0] == f"Event loops  (2100; {2100 - KEEP} ended ones folded per thread and class)"
    assert len(section) < 60, report
    assert any(line.startswith(f"  {2100 - text.LOOPS_SHOWN} more loops (_UnixSelectorEventLoop), "
                               "thread MainThread") for line in section), section
    assert any(line.startswith("  all 2100 loops") for line in section), section


def loop_row(**extra) -> dict:
    row = {"id": 1, "type": "_UnixSelectorEventLoop", "module": "asyncio.unix_events",
           "thread": 4242, "thread_name": "MainThread", "ticks": 10, "handles": 12,
           "busy_s": 0.002, "select_wait_s": 0.5, "lag_max_s": 0.001, "slow_total": 0,
           "destroyed": True}
    row.update(extra)
    return row


def render(loops, folded=()):
    doc = {"aioprof": 1, "wall_s": 1.0, "tasks": [], "coroutines": [], "callbacks": [],
           "sites": [], "loops": list(loops), "loops_folded": list(folded), "warnings": []}
    return text.render(doc, width=120)


def test_report_rolls_up_loops_past_the_shown_ones():
    loops = [loop_row(id=i, busy_s=i / 1000) for i in range(1, 8)]
    loops.append(loop_row(id=8, busy_s=0.0001, destroyed=False, type="Loop", module="uvloop",
                          thread_name="worker"))
    group = loop_row(loops=30, busy_s=0.5, ticks=300, handles=360, select_wait_s=2.0,
                     lag_max_s=0.004, slow_total=2)
    del group["id"], group["destroyed"]
    out = render(loops, [group])
    section = out[out.index("Event loops"):].splitlines()
    heads = [line for line in section if line.startswith("  ") and not line.startswith("   ")]
    # The running loop first (however small), then the busiest ended ones.
    assert heads[:5] == ["  loop 4 (_UnixSelectorEventLoop), thread MainThread, ended",
                         "  loop 5 (_UnixSelectorEventLoop), thread MainThread, ended",
                         "  loop 6 (_UnixSelectorEventLoop), thread MainThread, ended",
                         "  loop 7 (_UnixSelectorEventLoop), thread MainThread, ended",
                         "  loop 8 (uvloop.Loop), thread worker"]
    assert section[0] == "Event loops  (38; 30 ended ones folded per thread and class)"
    i = section.index("  33 more loops (_UnixSelectorEventLoop), thread MainThread")
    assert section[i + 1] == ("      busy 506.0 ms, ticks 330, handles 396, select wait 3500.0 ms, "
                              "lag max 4.0 ms, slow steps 2")
    i = section.index("  all 38 loops")
    assert section[i + 1].startswith("      busy 528.1 ms, ticks 380, handles 456")


def test_report_says_when_no_loop_ran():
    out = render([])
    assert text.NO_LOOP_NOTE in out.splitlines()
    assert "Event loops" not in out


def test_sync_program_gets_the_note():
    """A profiled program that never runs a loop (trio, plain code) is told so."""
    with aioprof.Profiler() as p:
        sum(range(1000))
    assert text.NO_LOOP_NOTE in text.render(p.stats(), width=120)
    gc.collect()


def test_loops_named_by_thread_and_qualified_class():
    """uvloop's loop was "Loop": its class is module-qualified and the thread named, in the
    text report and in the trace's process names."""
    from aioprof.report import trace

    loop = loop_row(type="Loop", module="uvloop", thread_name="worker", destroyed=False)
    assert "  loop 1 (uvloop.Loop), thread worker\n" in render([loop])
    doc = {"loops": [loop], "tasks": [], "trace": {"capacity": 10, "dropped": 0, "events": [
        {"kind": "tick", "loop": 1, "thread": 4242, "start_s": 0.0, "end_s": 0.001, "handles": 1}]}}
    names = [e["args"]["name"] for e in trace.render(doc)["traceEvents"] if e["name"] == "process_name"]
    assert names == ["loop 1 (uvloop.Loop), thread worker"]
    std = loop_row()
    assert "  loop 1 (_UnixSelectorEventLoop), thread MainThread, ended\n" in render([std])
