"""Case 11 (../shared/cases/11_slow_callback_nested_frame.py): one command blocks the loop
0.3 s inside a nested coroutine that never suspends; the slow step must name that task
(and its user creation site), and the other tasks' late wake-ups must show."""
from __future__ import annotations

import pytest

import _harness as H

pytestmark = pytest.mark.slow


def tol(expected: float) -> float:
    return H.tol_pct(expected, 0.10, 0.020)   # the header's +-10% or +-20 ms


def noisy(run: H.CaseRun):
    return H.printed(run.stdout, r"on_message\(long\) took (\d+\.\d+) s\n"
                             r"on_message\(ping\) took (\d+\.\d+) s\n"
                             r"on_message\(ping\) took (\d+\.\d+) s\n"
                             r"total (\d+\.\d+) s",
                     [("long", 0.30 - tol(0.30), 0.30 + tol(0.30)), ("ping1", 0.30 - tol(0.30), 0.30 + tol(0.30)),
                      ("ping2", 0.05 - tol(0.05), 0.05 + tol(0.05)), ("total", 0.35 - tol(0.35), 0.35 + tol(0.35))]) + H.starved(run, 0.30)


@pytest.fixture(scope="module")
def run(shared_cases, tmp_path_factory) -> H.CaseRun:
    return H.run_or_fail(shared_cases, "11", tmp_path_factory, noisy=noisy)


def tasks(run):
    """main, ping1, long, ping2 (gather's argument order)."""
    main, *msgs = run.user_tasks()
    assert main["coroutine"] == "main"
    assert [t["coroutine"] for t in msgs] == ["on_message"] * 3
    return (main, *msgs)


def test_program_ran(run):
    H.check_ran(run, r"on_message\(long\) took \d+\.\d{3} s\n"
                     r"on_message\(ping\) took \d+\.\d{3} s\n"
                     r"on_message\(ping\) took \d+\.\d{3} s\n"
                     r"total \d+\.\d{3} s\n")
    H.check_lifetimes(run)


def test_header_tags(run):
    assert H.tag_mismatches(run) == []


def test_internal_tasks(run):
    H.check_internal_tasks(run)


def test_creation_sites(run):
    main, ping1, long, ping2 = tasks(run)
    for t in (ping1, long, ping2):
        # the user's gather line, not asyncio/tasks.py as debug mode says
        assert run.is_site(t["created_at"], run.line("G1")), t["created_at"]
        assert t["parent"] == main["id"]


def test_steps(run):
    main, ping1, long, ping2 = tasks(run)
    assert [t["steps"] for t in (ping1, long, ping2)] == [2, 1, 2]   # long never suspends


def test_long(run):
    _, _, long, _ = tasks(run)
    H.near(long["busy_s"], 0.30, tol(0.30), "long busy_s")
    H.near(long["max_step_s"], 0.30, tol(0.30), "long's one step")
    assert long["await_sites"] == [] and long["idle_s"] == 0.0   # await time 0


def test_long_cpu(run):
    # CPU ~0.30 s. spin() runs on time.perf_counter (wall): on a loaded machine the thread
    # gets less CPU than wall time, so CPU is only bounded (<= busy + 20 ms, >= 0.15 s).
    _, _, long, _ = tasks(run)
    H.check_wall_cpu_split(run, long, 0.30, "long")


def test_pings(run):
    _, ping1, _, ping2 = tasks(run)
    a2, a3 = run.line("A2"), run.line("A3")
    for name, t, total, late in (("ping1", ping1, 0.30, 0.25), ("ping2", ping2, 0.05, 0.0)):
        [site] = t["await_sites"]
        assert site["count"] == 1 and run.is_site(site, a3), site
        assert run.chain_lines(site) == [("on_message", a2), ("invoke", a3)], site
        H.near(site["idle_s"], 0.05, tol(0.05), f"{name}: the timer itself at [A3]")
        H.near(H.await_time(t), total, tol(total), f"{name}: await at [A3]")
        H.near(H.late_wakeup(t), late, tol(late), f"{name}: late wake-up at [A3]")
    # ping2's first step waits behind long's 0.3 s step (before any await).
    H.near(H.first_step_delay(ping2), 0.30, tol(0.30), "ping2: creation to first step")


def test_sites(run):
    # The outer frame on_message at [A2] is charged with invoke's suspensions at [A3].
    a2, a3 = run.site(run.line("A2")), run.site(run.line("A3"))
    assert (a2["count"], a2["innermost_count"]) == (2, 0), a2
    assert (a3["count"], a3["innermost_count"]) == (2, 2), a3
    H.near(a3["idle_s"], 0.10, tol(0.10), "sites[A3] idle_s")
    assert abs(a2["idle_s"] - a3["idle_s"]) <= 1e-6
    # long's chain on_message [A2] -> invoke [A1] never suspended: no await-site row.
    assert not run.has_site(run.line("A1")) and not run.has_site(run.line("B1"))


def test_loop(run):
    loop = run.the_loop()
    H.check_loop_consistent(loop)
    _, _, long, _ = tasks(run)
    # Exactly one step >= 100 ms (~0.30 s): long's, in coroutine on_message.
    [step] = run.slow(loop, "step")
    assert step["task"] == long["id"] and step["coroutine"] == "on_message", step
    H.near(step["duration_s"], 0.30, tol(0.30), "the slow step")
    assert step["step_start"] is None and step["step_end"] is None   # started and finished in it
    assert run.slow(loop, "callback") == []
    # ping1's timer was due at ~0.05 s and ran at ~0.30 s.
    H.near(loop["timer_lag_max_s"], 0.25, tol(0.25), "loop timer_lag_max_s")
    H.near(loop["wall_s"], 0.35, tol(0.35), "loop wall_s (whole run)")


def test_blocking_frame_sampled(run):
    # The slow step's innermost coroutine long_computation at [B1], under the coroutine
    # stack on_message [A2] -> invoke [A1], in an on_message task.
    path = (("on_message", run.line("A2")), ("invoke", run.line("A1")),
            ("long_computation", run.line("B1")))
    H.near(run.sampled_under_task("on_message", *path), 0.30, tol(0.30),
           "sampled time at on_message [A2] -> invoke [A1] -> long_computation [B1]")
