"""Case 08 (../shared/cases/08_outside_loop_select_wait.py): with the profiler started
before asyncio.run, the same 0.5 s must show as loop select wait (idle) and at the two
await sites, one woken by a timer and one by fd readiness."""
from __future__ import annotations

import pytest

import _harness as H

pytestmark = pytest.mark.slow

TOL = 0.020   # the header's +-20 ms


def noisy(run: H.CaseRun):
    return H.printed(run.stdout, r"sleep await=(\d+\.\d+) s  sock_recv await=(\d+\.\d+) s",
                     [("sleep await", 0.2 - TOL, 0.2 + TOL), ("sock_recv await", 0.3 - TOL, 0.3 + TOL)])


@pytest.fixture(scope="module")
def run(shared_cases, tmp_path_factory) -> H.CaseRun:
    return H.run_or_fail(shared_cases, "08", tmp_path_factory, noisy=noisy)


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
    for tag, expected in (("A1", 0.20), ("A2", 0.30)):
        [site] = run.await_sites_at(t, run.line(tag))
        assert site["count"] == 1 and run.chain_lines(site) == [("main", run.line(tag))], site
        H.near(site["idle_s"], expected, TOL, f"main: await at [{tag}]")
    # The same 0.5 s, at the await sites and as the task's lifetime.
    H.near(H.await_time(t), 0.50, TOL, "main: await time at [A1] + [A2]")
    H.near(t["end_s"] - t["start_s"], 0.50, TOL, "main lifetime")


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
    H.near(loop["select_wait_s"], 0.50, TOL, "loop select_wait_s")
    assert loop["select_wait_s"] >= 0.95 * loop["wall_s"], "select wait >= 95% of the run"
    assert loop["utilization"] <= TOL / 0.50, f"load ~0%, got {loop['utilization']:.4f}"
    H.near(loop["wall_s"], 0.50, TOL, "loop wall_s (whole run)")
    # The select wait is loop idle time, the same time as at the await sites.
    H.near(loop["select_wait_s"], H.await_time(main_task(run)), TOL, "select wait vs await time")
    assert loop["slow_steps"] == []
