"""Case 08 (../shared/cases/08_outside_loop_select_wait.py): with the profiler started
before asyncio.run, the same 0.5 s must show as loop select wait (idle) and at the two
await sites, one woken by a timer and one by fd readiness."""
from __future__ import annotations

import re

import pytest

import _harness as H

pytestmark = [pytest.mark.slow, pytest.mark.timing]

TOL = 0.020   # the header's +-20 ms


def noisy(run: H.CaseRun):
    return H.printed(run.stdout, r"sleep await=(\d+\.\d+) s  sock_recv await=(\d+\.\d+) s",
                     [("sleep await", 0.2 - TOL, 0.2 + TOL), ("sock_recv await", 0.3 - TOL, 0.3 + TOL)])


@pytest.fixture(scope="module")
def run(shared_cases, tmp_path_factory) -> H.CaseRun:
    return H.run_or_fail(shared_cases, "08", tmp_path_factory, noisy=noisy)


def printed(run):
    """(sleep await, sock_recv await) as the program printed them, in seconds."""
    m = re.search(r"sleep await=(\d+\.\d+) s  sock_recv await=(\d+\.\d+) s", run.stdout)
    assert m, run.stdout
    return float(m.group(1)), float(m.group(2))


def main_task(run) -> dict:
    [t] = run.user_tasks()
    assert t["coroutine"] == "main"
    return t


def test_program_ran(run):
    H.check_ran(run, r"sleep await=\d+\.\d{3} s  sock_recv await=\d+\.\d{3} s  data=b'x'\n")
    H.check_lifetimes(run)


def test_header_tags(run):
    assert H.tag_mismatches(run) == []


def test_internal_tasks(run):
    H.check_internal_tasks(run)


def test_main(run):
    t = main_task(run)
    assert t["steps"] == 3
    assert t["busy_s"] <= TOL
    # Each wait at least its nominal time (a timer never fires early) and at most what the
    # program measured around it; together, the program's 0.5 s, also as the lifetime.
    for tag, expected, took in zip(("A1", "A2"), (0.20, 0.30), printed(run)):
        [site] = run.await_sites_at(t, run.line(tag))
        assert site["count"] == 1 and run.chain_lines(site) == [("main", run.line(tag))], site
        H.within(site["idle_s"], expected - TOL, took + 0.002, f"main: await at [{tag}]")
    took = sum(printed(run))
    H.near(H.await_time(t), took, TOL, f"main: await time at [A1] + [A2] (the program measured {took:.3f} s)")
    H.within(t["end_s"] - t["start_s"], took - 0.002, took + TOL, "main lifetime")


def test_wakeups(run):
    loop = run.the_loop()
    # [A2] is woken by fd readiness of socket a: one I/O event, and the I/O callback of
    # sock_recv ran once (asyncio's, so internal); [A1] by a timer.
    assert loop["io_events"] == 1
    [recv] = run.callbacks_named("_sock_recv")
    assert recv["count"] == 1 and recv["internal"], recv
    # The call_later callback [CB1] (b.send, a built-in: no file/line) ran once, ~0 busy.
    [send] = run.callbacks_named("send")
    assert send["count"] == 1 and not send["internal"], send
    assert send["file"] is None and send["line"] is None
    assert send["busy_s"] <= TOL


def test_loop(run):
    loop = run.the_loop()
    H.check_loop_consistent(loop)
    took = sum(printed(run))
    H.within(loop["select_wait_s"], 0.50 - TOL, took + 0.002, "loop select_wait_s")
    assert loop["select_wait_s"] >= 0.95 * loop["wall_s"], "select wait >= 95% of the run"
    assert loop["utilization"] <= TOL / 0.50, f"load ~0%, got {loop['utilization']:.4f}"
    H.within(loop["wall_s"], took - 0.002, took + 3 * TOL, "loop wall_s (whole run; the program's waits)")
    # The select wait is loop idle time, the same time as at the await sites.
    H.near(loop["select_wait_s"], H.await_time(main_task(run)), TOL, "select wait vs await time")
    assert loop["slow_steps"] == []
