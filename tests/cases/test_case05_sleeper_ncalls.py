"""Case 05 (../shared/cases/05_cprofile_sleeper_ncalls.py): two tasks of one coroutine
function gathered; calls vs steps, await time per task, creation sites and parent.

The program prints when each napper finished and how long gather was awaited (its
perf_counter, from just before the tasks were created): durations are checked between the
header's value (a timer never fires early) and those printed values (issue 7 item 15)."""
from __future__ import annotations

import re

import pytest

import _harness as H

pytestmark = [pytest.mark.slow, pytest.mark.timing]

TOL = 0.020   # the header's +-20 ms


def noisy(run: H.CaseRun):
    return H.printed(run.stdout, r"napper\(0\.5\) finished after (\d+\.\d+) s\n"
                             r"napper\(1\.0\) finished after (\d+\.\d+) s\n"
                             r"gather awaited (\d+\.\d+) s",
                     [("napper(0.5)", 0.5 - TOL, 0.5 + TOL), ("napper(1.0)", 1.0 - TOL, 1.0 + TOL),
                      ("gather", 1.0 - TOL, 1.0 + TOL)])


@pytest.fixture(scope="module")
def run(shared_cases, tmp_path_factory) -> H.CaseRun:
    return H.run_or_fail(shared_cases, "05", tmp_path_factory, noisy=noisy)


def printed(run):
    """(napper(0.5) finished, napper(1.0) finished, gather awaited), seconds as printed."""
    m = re.search(r"napper\(0\.5\) finished after (\d+\.\d+) s\nnapper\(1\.0\) finished after "
                  r"(\d+\.\d+) s\ngather awaited (\d+\.\d+) s", run.stdout)
    assert m, run.stdout
    return tuple(map(float, m.groups()))


def test_program_ran(run):
    H.check_ran(run, r"napper\(0\.5\) finished after \d+\.\d{3} s\n"
                     r"napper\(1\.0\) finished after \d+\.\d{3} s\n"
                     r"gather awaited \d+\.\d{3} s\n")
    H.check_lifetimes(run)


def test_header_tags(run):
    assert H.tag_mismatches(run) == []


def test_internal_tasks(run):
    H.check_internal_tasks(run)


def test_creation_sites(run):
    main, t2, t3 = run.user_tasks()
    assert main["parent"] is None
    for t, tag in ((t2, "C1"), (t3, "C2")):
        assert run.is_site(t["created_at"], run.line(tag)), t["created_at"]
        assert t["created_at"]["function"] == "main"
        assert t["parent"] == main["id"]     # Task-1


def test_tasks(run):
    main, t2, t3 = run.user_tasks()
    assert [t["coroutine"] for t in (main, t2, t3)] == ["main", "napper", "napper"]
    assert [t["name"] for t in (main, t2, t3)] == ["Task-1", "Task-2", "Task-3"]
    for t, life, done in ((t2, 0.50, printed(run)[0]), (t3, 1.00, printed(run)[1])):
        assert t["steps"] == 2
        assert t["busy_s"] <= TOL
        H.within(t["end_s"] - t["start_s"], life - 0.002, done + 0.002, f"{t['name']} lifetime")
        [site] = t["await_sites"]
        assert run.is_site(site, run.line("A1")) and site["count"] == 1, site
        H.within(H.await_time(t), life - TOL, done + 0.002, f"{t['name']} await at [A1]")


def test_napper(run):
    # 2 calls = 2 coroutine instances = 2 tasks; 4 steps in all (not 4 "calls").
    c = run.coroutine("napper")
    assert (c["tasks"], c["steps"]) == (2, 4), c
    assert c["busy_s"] <= TOL
    s = run.site(run.line("A1"))
    assert s["count"] == s["innermost_count"] == 2, s
    H.within(s["idle_s"], 1.50 - TOL, sum(printed(run)[:2]) + 0.004, "await at [A1] over both tasks")


def test_main(run):
    main = run.user_tasks()[0]
    assert main["steps"] == 2
    [site] = main["await_sites"]
    assert run.is_site(site, run.line("A2")) and site["count"] == 1, site
    gather = printed(run)[2]
    H.within(H.await_time(main), 1.00 - 0.002, gather + 0.002, "main await at [A2] (gather)")


def test_loop(run):
    loop = run.the_loop()
    H.check_loop_consistent(loop)
    gather = printed(run)[2]
    H.within(loop["select_wait_s"], 1.00 - TOL, gather + 0.002, "loop select_wait_s")
    H.within(loop["wall_s"], gather - 0.002, gather + 3 * TOL, "loop wall_s (whole run; the program's gather)")
    assert loop["utilization"] <= TOL / 1.00, f"load ~0%, got {loop['utilization']:.4f}"
    assert loop["slow_steps"] == []
    assert loop["io_events"] == 0
