"""Case 04 (../shared/cases/04_yappi_task_coro_overlap.py): asyncio.sleep run as a task and
awaited directly, overlapping; two asyncio.run calls, so two event loops.

The program prints its awaits at [A1] and [A2] and each run's wall time (perf_counter): the
figures are checked between the header's value (a timer never fires early) and what the
program measured in the same run (issue 7 item 15)."""
from __future__ import annotations

import re

import pytest

import _harness as H

pytestmark = [pytest.mark.slow, pytest.mark.timing]

TOL = 0.020   # the header's +-20 ms
# d, the task's sleep, await at [A1], at [A2], run wall, asyncio.sleep total
RUNS = [(-0.2, 0.30, 0.50, 0.00, 0.50, 0.80),
        (+0.2, 0.70, 0.50, 0.20, 0.70, 1.20)]


def noisy(run: H.CaseRun):
    out = []
    for d, _, a1, a2, wall, _ in RUNS:
        out += H.printed(run.stdout, re.escape(f"d={d:+.1f}: ") + r"await sleep=(\d+\.\d+) s  "
                                 r"await task=(\d+\.\d+) s  run=(\d+\.\d+) s",
                         [(f"d={d} await sleep", a1 - TOL, a1 + TOL), (f"d={d} await task", a2 - TOL, a2 + TOL),
                          (f"d={d} run", wall - TOL, wall + TOL)])
    return out


@pytest.fixture(scope="module")
def run(shared_cases, tmp_path_factory) -> H.CaseRun:
    return H.run_or_fail(shared_cases, "04", tmp_path_factory, noisy=noisy)


def printed(run):
    """[(await at [A1], await at [A2], run wall)] of the two runs, as printed."""
    out = []
    for d, *_ in RUNS:
        m = re.search(re.escape(f"d={d:+.1f}: ") + r"await sleep=(\d+\.\d+) s  await task=(\d+\.\d+) s  "
                      r"run=(\d+\.\d+) s", run.stdout)
        assert m, run.stdout
        out.append(tuple(map(float, m.groups())))
    return out


def per_run(run):
    """[(overlap task, its sleep task)] in run order (the order aioprof saw them)."""
    ts = run.user_tasks()
    assert [t["coroutine"] for t in ts] == ["overlap", "sleep"] * 2
    return [(ts[0], ts[1]), (ts[2], ts[3])]


def test_program_ran(run):
    line = r"d=[+-]0\.2: await sleep=\d+\.\d{3} s  await task=\d+\.\d{3} s  run=\d+\.\d{3} s\n"
    H.check_ran(run, line * 2)
    H.check_lifetimes(run)


def test_header_tags(run):
    assert H.tag_mismatches(run) == []


def test_internal_tasks(run):
    H.check_internal_tasks(run, runs=2)


def test_creation_sites(run):
    for overlap, sleeper in per_run(run):
        assert overlap["parent"] is None
        assert run.is_site(sleeper["created_at"], run.line("C1")), sleeper["created_at"]
        assert sleeper["parent"] == overlap["id"]


@pytest.mark.parametrize("i", [0, 1], ids=["d=-0.2", "d=+0.2"])
def test_run(run, i):
    d, task_sleep, a1, a2, wall, sleep_total = RUNS[i]
    overlap, sleeper = per_run(run)[i]
    loop = run.loops[i]
    assert sleeper["steps"] == 2
    p1, p2, pwall = printed(run)[i]
    # The task finishes task_sleep after the run started, and before overlap resumes from
    # its last await (its timer is due first).
    H.within(sleeper["end_s"] - overlap["start_s"], task_sleep - TOL, p1 + p2 + TOL, f"d={d}: task done at")
    H.within(H.await_time(sleeper), task_sleep - TOL, p1 + p2 + TOL, f"d={d}: task's await")
    count, idle = run.awaits_through(overlap, run.line("A1"))
    assert count == 1
    H.within(idle, a1 - TOL, p1 + 0.002, f"d={d}: await at [A1] (the program measured {p1:.3f} s)")
    count, idle = run.awaits_through(overlap, run.line("A2"))
    if d < 0:
        # The task is already done: no suspension at [A2], no loop round-trip.
        assert count == 0 and overlap["steps"] == 2, overlap
    else:
        assert count == 1 and overlap["steps"] == 3, overlap
        H.within(idle, a2 - TOL, p2 + 0.002, f"d={d}: await at [A2] (the program measured {p2:.3f} s)")
    # the loop runs within the program's run time, and at least through overlap's awaits
    H.within(loop["wall_s"], p1 + p2 - 0.002, pwall + 0.002, f"d={d}: run wall (loops[{i}].wall_s)")
    # asyncio.sleep over both instances: the task's and the one awaited directly at [A1]
    # (aioprof charges the latter to the line [A1]: no row for a directly awaited coroutine).
    H.within(H.await_time(sleeper) + run.awaits_through(overlap, run.line("A1"))[1], sleep_total - TOL,
             p1 + (p1 + p2) + TOL, f"d={d}: asyncio.sleep total")


def test_loops_separate(run):
    # Two asyncio.run calls: two loops, reported separately, each with its own timeline.
    assert len(run.loops) == 2
    first, second = run.loops
    assert first["id"] != second["id"]
    for loop in run.loops:
        H.check_loop_consistent(loop)
        assert loop["utilization"] <= TOL / 0.5, loop["utilization"]
    (o1, s1), (o2, s2) = per_run(run)
    # The second run's tasks start after the first run's tasks end.
    assert o2["start_s"] >= max(o1["end_s"], s1["end_s"])
    (_, _, w1), (_, _, w2) = printed(run)
    H.within(first["select_wait_s"], 0.50 - TOL, w1 + 0.002, "loops[0].select_wait_s")
    H.within(second["select_wait_s"], 0.70 - TOL, w2 + 0.002, "loops[1].select_wait_s")


def test_coroutines(run):
    c = run.coroutine("overlap")
    assert (c["tasks"], c["steps"]) == (2, 5), c
    sleep = [c for c in run.doc["coroutines"] if c["coroutine"] == "sleep"]
    assert len(sleep) == 1 and (sleep[0]["tasks"], sleep[0]["steps"]) == (2, 4), sleep
    (a1, a2, _), (b1, b2, _) = printed(run)
    H.within(sleep[0]["idle_s"], 1.00 - 2 * TOL, a1 + a2 + b1 + b2 + 2 * TOL,
             "coroutine sleep idle_s (0.3 s + 0.7 s as tasks)")
    s = run.site(run.line("A1"))
    assert s["count"] == 2
    H.within(s["idle_s"], 1.00 - 2 * TOL, a1 + b1 + 0.004, "sites[A1] idle_s")
    s = run.site(run.line("A2"))
    assert s["count"] == 1
    H.within(s["idle_s"], 0.20 - TOL, b2 + 0.002, "sites[A2] idle_s")
