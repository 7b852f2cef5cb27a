"""Case 01 (../shared/cases/01_aioprof_slow_quicker.py): busy time, resumption counts and
late wake-ups of two tasks, one of which blocks the loop 80 ms per step.

Run with --slow-ms 50 so that the five ~80 ms blocking steps are listed one by one in
`loops[0].slow_steps` (at the default 100 ms none is, which is the header's point too:
nothing reaches 100 ms)."""
from __future__ import annotations

import pytest

import _harness as H

pytestmark = [pytest.mark.slow, pytest.mark.timing]

TOL = 0.025          # the header's +-25 ms (slow's busy); "~0" values use it too
N = 5


def noisy(run: H.CaseRun):
    """The program's own busy/await figures (ms) outside the header's brackets."""
    return H.printed(run.stdout, r"slow +busy= *(\d+\.\d) ms  await= *(\d+\.\d) ms\n"
                             r"quicker +busy= *(\d+\.\d) ms  await= *(\d+\.\d) ms\n"
                             r"main +await\(gather\)=(\d+\.\d+) s",
                     [("slow busy", 375, 425), ("slow await", 80, 140), ("quicker busy", 2, 15),
                      ("quicker await", 360, 470), ("main await", 0.48, 0.56)])


@pytest.fixture(scope="module")
def run(shared_cases, tmp_path_factory) -> H.CaseRun:
    return H.run_or_fail(shared_cases, "01", tmp_path_factory, slow_ms=50, noisy=noisy)


def tasks(run):
    main, slow, quicker = run.user_tasks()
    return main, slow, quicker


def test_program_ran(run):
    num = r" *\d+\.\d"
    H.check_ran(run, rf"slow +busy={num} ms  await={num} ms\n"
                     rf"quicker +busy={num} ms  await={num} ms\n"
                     r"main +await\(gather\)=\d+\.\d{3} s\n")
    H.check_lifetimes(run)


def test_header_tags(run):
    assert H.tag_mismatches(run) == []


def test_internal_tasks(run):
    H.check_internal_tasks(run)


def test_creation_sites(run):
    assert [t["coroutine"] for t in run.user_tasks()] == ["main", "slow", "quicker"]
    main, slow, quicker = tasks(run)
    assert main["parent"] is None
    for t in (slow, quicker):   # gather wraps both coroutines in tasks at [A_MAIN]
        assert run.is_site(t["created_at"], run.line("A_MAIN")), t["created_at"]
        assert t["parent"] == main["id"]
        assert t["state"] == "done"


def test_slow(run):
    _, slow, _ = tasks(run)
    assert slow["steps"] == N + 1                           # 1 start + 5 resumptions
    H.near(slow["busy_s"], 0.400, TOL, "slow busy_s")
    assert slow["cpu_s"] <= TOL, f"slow blocks in time.sleep: CPU ~0, got {slow['cpu_s']:.4f}"
    [site] = slow["await_sites"]
    assert run.is_site(site, run.line("A_SLOW")) and site["count"] == N, site
    H.within(H.await_time(slow), 0.080, 0.140, "slow: await time at [A_SLOW]")
    H.near(slow["max_step_s"], 0.080, TOL, "slow: longest step")


def test_quicker(run):
    _, _, quicker = tasks(run)
    assert quicker["steps"] == N + 1
    H.within(quicker["busy_s"], 0.002, 0.015, "quicker busy_s")
    [site] = quicker["await_sites"]
    assert run.is_site(site, run.line("A_QUICK")) and site["count"] == N, site
    # ~415 ms await in all [360..470], of which ~100 ms is the timer itself (idle: the
    # same 5 x 20 ms sleeps as slow's, so slow's bracket) and the rest the late wake-up.
    H.within(H.await_time(quicker), 0.360, 0.470, "quicker: await time at [A_QUICK]")
    H.within(site["idle_s"], 0.080, 0.140, "quicker: timer part (idle) at [A_QUICK]")
    assert H.late_wakeup(quicker) > 2 * site["idle_s"], "most of quicker's await is late wake-up"
    # Its first step starts ~80 ms late, behind slow's first block.
    H.near(H.first_step_delay(quicker), 0.080, TOL, "quicker: creation to first step")


def test_main(run):
    main, _, _ = tasks(run)
    assert main["steps"] == 2
    assert main["busy_s"] <= TOL
    [site] = main["await_sites"]
    assert run.is_site(site, run.line("A_MAIN")) and site["count"] == 1, site
    H.within(H.await_time(main), 0.48, 0.56, "main: await time at [A_MAIN]")


def test_sites(run):
    for tag, count in (("A_SLOW", N), ("A_QUICK", N), ("A_MAIN", 1)):
        s = run.site(run.line(tag))
        assert s["count"] == s["innermost_count"] == count, s


def test_coroutines(run):
    for name, steps in (("main", 2), ("slow", N + 1), ("quicker", N + 1)):
        c = run.coroutine(name)
        assert (c["tasks"], c["steps"]) == (1, steps), c
    H.near(run.coroutine("slow")["p50_step_s"], 0.080, TOL, "slow: median step")


def test_loop(run):
    loop = run.the_loop()
    H.check_loop_consistent(loop)
    _, slow, _ = tasks(run)
    # 5 blocking steps of ~80 ms, all in slow's task; none >= 100 ms (so asyncio's default
    # slow_callback_duration, like aioprof's default --slow-ms, flags nothing).
    steps = run.slow(loop, "step")
    assert [s["task"] for s in steps] == [slow["id"]] * N, steps
    for s in steps:
        H.near(s["duration_s"], 0.080, TOL, "blocking step of slow")
        assert s["duration_s"] < 0.100
        assert s["coroutine"] == "slow"
        assert run.is_site(s["step_end"], run.line("A_SLOW")), s   # it then awaits at [A_SLOW]
    assert steps[0]["step_start"] is None                            # the first step
    assert all(run.is_site(s["step_start"], run.line("A_SLOW")) for s in steps[1:])
    assert run.slow(loop, "callback") == []
    # load ~81%: busy ~405 ms of ~500 ms.
    H.near(loop["busy_s"], 0.405, TOL, "loop busy_s")
    H.within(loop["wall_s"], 0.48, 0.56, "loop wall_s")
    H.near(loop["utilization"], 0.81, TOL / 0.5, "loop load (1 - select wait / wall)")
    # quicker's wake-ups wait behind slow's 80 ms blocks.
    H.near(loop["lag_max_s"], 0.080, TOL, "loop lag_max_s")
    assert loop["thread"] == slow["thread"]
    assert loop["io_events"] == 0


def test_blocking_line_sampled(run):
    # The five ~80 ms blocking steps are all in slow, at [B_SLOW] (time.sleep inside
    # block(): a sample charges the whole blocked time to the line that called it).
    b = run.line("B_SLOW")
    H.near(run.sampled_under_task("slow", ("slow", b)), 0.400, TOL, "sampled time at [B_SLOW] in task slow")
    H.near(run.sampled_time(("slow", b)), 0.400, TOL, "sampled time at [B_SLOW]")
