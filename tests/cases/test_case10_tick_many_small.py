"""Case 10 (../shared/cases/10_loop_tick_many_small.py): a ~100 ms loop tick made of ten
10 ms steps; no single handle is slow, yet the tick is.

Run with --slow-ms 40 so that every tick of at least 40 ms is listed in
`loops[0].slow_steps` (kind "tick", with its handle count): the ~100 ms tick and the two
~50 ms ticks after it. No step or callback reaches 40 ms, let alone 100 ms."""
from __future__ import annotations

import pytest

import _harness as H

pytestmark = pytest.mark.slow

N = 10


def tol(expected: float) -> float:
    return H.tol_pct(expected, 0.10, 0.010)   # the header's +-10% or +-10 ms


def noisy(run: H.CaseRun):
    return H.printed(run.stdout, r"first steps of 10 tasks span (\d+\.\d+) s \(max gap between starts "
                             r"(\d+\.\d+) ms\); total (\d+\.\d+) s",
                     [("span of the first steps (tick #1)", 0.1 - tol(0.1), 0.1 + tol(0.1)),
                      ("max gap (one step, ms)", 0, 1e3 * (0.01 + tol(0.01))),
                      ("total", 0.2 - tol(0.2), 0.2 + tol(0.2))]) + H.starved(run, 0.20)


@pytest.fixture(scope="module")
def run(shared_cases, tmp_path_factory) -> H.CaseRun:
    return H.run_or_fail(shared_cases, "10", tmp_path_factory, slow_ms=40, noisy=noisy)


def tasks(run):
    main, *workers = run.user_tasks()
    assert main["coroutine"] == "main"
    assert [t["coroutine"] for t in workers] == ["worker"] * N
    return main, workers


def test_program_ran(run):
    H.check_ran(run, r"first steps of 10 tasks span \d+\.\d{3} s \(max gap between starts "
                     r"\d+\.\d ms\); total \d+\.\d{3} s\n")
    H.check_lifetimes(run)


def test_header_tags(run):
    assert H.tag_mismatches(run) == []


def test_internal_tasks(run):
    H.check_internal_tasks(run)


def test_creation_sites(run):
    main, workers = tasks(run)
    for t in workers:
        assert run.is_site(t["created_at"], run.line("G1")), t["created_at"]
        assert t["parent"] == main["id"]


def test_workers(run):
    main, workers = tasks(run)
    for i, t in enumerate(workers):
        what = f"worker {i} ({t['name']})"
        assert t["steps"] == 2
        H.near(t["busy_s"], 0.020, tol(0.020), f"{what} busy_s (10 ms at [B1] + 10 ms at [B2])")
        H.near(t["max_step_s"], 0.010, tol(0.010), f"{what} longest step")
        [site] = t["await_sites"]
        assert run.is_site(site, run.line("A1")) and site["count"] == 1, site
        # ~50-100 ms each: the 50 ms timer plus the wait behind the other workers' steps.
        H.within(H.await_time(t), 0.050 - tol(0.050), 0.100 + tol(0.100), f"{what}: await at [A1]")


def test_workers_cpu(run):
    # spin() runs on time.perf_counter (wall): on a loaded machine the thread gets less CPU
    # than wall time, so CPU is only bounded (<= busy + 20 ms, >= half the expected 20 ms).
    _, workers = tasks(run)
    for i, t in enumerate(workers):
        H.check_wall_cpu_split(run, t, 0.020, f"worker {i} ({t['name']})")


def test_coroutine(run):
    c = run.coroutine("worker")
    assert (c["tasks"], c["steps"]) == (N, 2 * N), c
    H.near(c["busy_s"], 0.200, tol(0.200), "worker busy_s over 10 tasks")
    H.near(c["max_step_s"], 0.010, tol(0.010), "worker longest step")
    s = run.site(run.line("A1"))
    assert s["count"] == s["innermost_count"] == N, s


def test_main(run):
    main, _ = tasks(run)
    assert main["steps"] == 2
    [site] = main["await_sites"]
    assert run.is_site(site, run.line("G1")) and site["count"] == 1, site
    H.near(H.await_time(main), 0.20, tol(0.20), "main: await at [G1]")


def test_loop_ticks(run):
    loop = run.the_loop()
    H.check_loop_consistent(loop)
    main, workers = tasks(run)
    # Tick #1 runs the 10 first steps: ~100 ms, 10 handles, the largest ~10 ms; then ~2
    # more busy ticks of ~50 ms with 5 handles each. Ticks are listed when >= 40 ms.
    ticks = run.slow(loop, "tick")
    assert [t["handles"] for t in ticks] == [N, 5, 5], ticks
    H.near(ticks[0]["duration_s"], 0.100, tol(0.100), "tick #1")
    for t in ticks[1:]:
        H.near(t["duration_s"], 0.050, tol(0.050), "later busy tick")
    assert ticks[0]["at_s"] <= min(w["first_step_s"] for w in workers)
    H.near(loop["tick_busy_max_s"], 0.100, tol(0.100), "loop tick_busy_max_s (max tick)")
    assert loop["handles_per_tick_max"] == N
    # ... but no handle is >= 100 ms (nor >= 40 ms): no slow step or callback at all.
    assert run.slow(loop, "step") == [] and run.slow(loop, "callback") == []
    assert max(w["max_step_s"] for w in workers) < 0.100
    # The last worker's first step waited ~90 ms behind the other nine.
    H.near(loop["lag_max_s"], 0.090, tol(0.090), "loop lag_max_s")


def test_loop_load(run):
    loop = run.the_loop()
    # load ~100% over the ~0.20 s run
    H.near(loop["wall_s"], 0.20, tol(0.20), "loop wall_s")
    H.near(loop["utilization"], 1.0, tol(0.20) / 0.20, "loop load")
    H.near(loop["busy_s"], 0.20, tol(0.20), "loop busy_s")


def test_spin_lines_sampled(run):
    # 10 ms at [B1] and 10 ms at [B2] in each of the 10 workers.
    for tag in ("B1", "B2"):
        H.near(run.sampled_under_task("worker", ("worker", run.line(tag))), 0.100, tol(0.100),
               f"sampled time at [{tag}] over 10 workers")
