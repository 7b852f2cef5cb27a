"""Under uvloop: task figures are measured, the loop figures uvloop cannot give are null
(never 0), the program's results are unchanged, and uvloop.Loop is restored at stop."""
import asyncio
import inspect
import os
import time

import pytest

import aioprof

uvloop = pytest.importorskip("uvloop")

# Under ASan or valgrind the program runs many times slower: timing bounds scale up.
SLACK = 10 if os.environ.get("AIOPROF_SANITIZER") else 1


def off_cpu():
    """Seconds this thread has waited for a CPU so far (the kernel's run delay), or, where
    /proc does not give it, wall minus CPU time (a looser bound of the same)."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return time.perf_counter() - time.thread_time()


SPANS = {}   # i -> times the program took: see blocker


async def blocker(i):
    t = time.perf_counter()
    time.sleep(0.02 * i)
    t1 = time.perf_counter()
    await asyncio.sleep(0.05)  # [AWAIT]
    t2 = time.perf_counter()
    # first step: t .. t1; the timer is due 50 ms after t1; second step from t2
    SPANS[i] = (t, t1 - t, t1, t2, time.perf_counter() - t2)
    return i


async def main():
    SPANS["gather"] = time.perf_counter()
    return await asyncio.gather(*(blocker(i) for i in (1, 2, 3)))  # [GATHER]


def line(marker, fn):
    src, first = inspect.getsourcelines(fn)
    return first + next(i for i, text in enumerate(src) if marker in text)


def run_uvloop(coro_fn):
    loop = uvloop.new_event_loop()
    try:
        return loop.run_until_complete(coro_fn())
    finally:
        loop.close()


@pytest.mark.sanitize
@pytest.mark.timing
def test_task_figures_under_uvloop():
    assert "call_soon" not in uvloop.Loop.__dict__
    with aioprof.Profiler() as p:
        delay0 = off_cpu()
        result = run_uvloop(main)
        starved = off_cpu() - delay0
    assert result == [1, 2, 3]
    assert "call_soon" not in uvloop.Loop.__dict__    # the hook is gone again
    doc = p.stats()
    tasks = [t for t in doc["tasks"] if t["coroutine"] == "blocker"]
    assert len(tasks) == 3
    for i, t in enumerate(tasks, 1):
        assert t["steps"] == 2 and t["state"] == "done"
        # Against the program's own spans of the same steps; past them only the task
        # machinery (well under 5 ms) and the time the thread waited for a CPU there.
        start, first, t1, t2, second = SPANS[i]
        assert first + second - 1e-4 <= t["busy_s"] <= first + second + 0.005 * SLACK + starved
        # Each waits behind the blocking first steps of the ones before it: from gather
        # to its first line, as the program saw it; then from its timer's firing (not
        # before it was due) to its second step.
        waited = start - SPANS["gather"]
        late = max(0.0, t2 - (t1 + 0.05))
        assert waited - 0.005 * SLACK - starved <= t["scheduled_s"] <= waited + late + 1e-4
        assert t["created_at"]["line"] == line("# [GATHER]", main)
        (site,) = t["await_sites"]
        assert site["line"] == line("# [AWAIT]", blocker) and site["count"] == 1
        life = t["end_s"] - t["start_s"]
        assert t["busy_s"] + t["scheduled_s"] + t["idle_s"] == pytest.approx(life, abs=1e-6)
    (loop,) = doc["loops"]
    for key in ("ticks", "select_calls", "select_wait_s", "wall_s", "load"):
        assert loop[key] is None, key
    assert loop["lag_max_s"] is not None and loop["lag_count"] >= 6
    # busy: the task steps, which hold the blocking sleeps (0.12 s in all).
    assert loop["busy_s"] == pytest.approx(sum(t["busy_s"] for t in doc["tasks"]), abs=1e-3)
    assert 0 < loop["utilization"] <= 1
    assert (loop["type"], loop["module"], loop["thread_name"]) == ("Loop", "uvloop", "MainThread")


@pytest.mark.sanitize
def test_uvloop_shutdown_tasks_are_internal():
    async def nothing():
        return 5

    with aioprof.Profiler() as p:
        assert uvloop.run(nothing()) == 5 if hasattr(uvloop, "run") else True
    internal = [t["coroutine"] for t in p.stats()["tasks"] if t["internal"]]
    if hasattr(uvloop, "run"):   # Cython's code objects carry the plain name
        assert any(name.endswith("shutdown_asyncgens") for name in internal), internal


MS = 1_000_000


@pytest.fixture
def fake_clock():
    from aioprof import _core
    _core.set_fake_clock(True)
    yield _core.fake_advance
    _core.set_fake_clock(False)


def fake_program(adv):
    """Task steps of 100 ms and 50 ms with a plain callback of 300 ms between them."""
    async def main():
        adv(100 * MS, 0)
        asyncio.get_running_loop().call_soon(adv, 300 * MS, 0)   # not a task step: idle
        await asyncio.sleep(0)
        adv(50 * MS, 0)
    return main


@pytest.mark.sanitize
def test_loop_monitor_on_uvloop_exact(fake_clock):
    """uvloop has no ticks or select to hook: its busy time is the time in task steps
    (150 of 450 fake ms), and the load is that share, smoothed as for any loop."""
    import math

    loop = uvloop.new_event_loop()
    try:
        with aioprof.LoopMonitor(loop) as mon:
            loop.run_until_complete(fake_program(fake_clock)())
            stats = mon.stats()
            load = mon.load()
            assert mon.available and not mon.ticks_seen
    finally:
        loop.close()
    assert round(stats["busy_s"] * 1e9) == 150 * MS and stats["handles"] == 2
    assert round(stats["age_s"] * 1e9) == 450 * MS
    assert stats["utilization"] == pytest.approx(1 / 3, rel=1e-12)
    expect = 1 - math.exp(-0.1)            # 100 ms busy
    expect *= math.exp(-0.3)               # 300 ms outside task steps
    expect = expect * math.exp(-0.05) + (1 - math.exp(-0.05))   # 50 ms busy
    assert load == pytest.approx(expect, rel=1e-9) and stats["load"] == load
    for key in ("wall_s", "select_wait_s", "capped_load", "ticks", "select_calls", "running"):
        assert stats[key] is None, key


@pytest.mark.sanitize
def test_profiler_uvloop_busy_exact(fake_clock):
    loop = uvloop.new_event_loop()
    try:
        with aioprof.Profiler() as p:
            loop.run_until_complete(fake_program(fake_clock)())
    finally:
        loop.close()
    (row,) = p.stats()["loops"]
    assert round(row["busy_s"] * 1e9) == 150 * MS
    assert row["utilization"] == pytest.approx(1 / 3, rel=1e-12)   # from the first call_soon


def test_load_inside_a_handler_under_uvloop():
    """The README's load-shedding snippet runs inside a task step: no TypeError, and the
    step's own time so far counts as busy."""
    async def handler(mon):
        t = time.perf_counter()
        while time.perf_counter() - t < 0.03:
            pass
        return mon.load() > 0.9, mon.load(), mon.stats()["busy_s"]

    loop = uvloop.new_event_loop()
    try:
        with aioprof.LoopMonitor(loop) as mon:
            shed, load, busy = loop.run_until_complete(handler(mon))
    finally:
        loop.close()
    assert shed is False and 0 < load < 0.9
    assert busy >= 0.03


# One workload on both loops: 4 workers, each 8 rounds of 2 ms of spinning and a 20 ms
# sleep. The program measures its own busy time (each step from its resumption to its next
# await) and the wall time around the run; each loop's utilization must be at least that
# busy share (those spans lie inside the task steps) and at most that plus a little per
# step (loop and hook work the program cannot time). A starved machine stretches the
# spinning, which the program measures too.
WORKERS, ROUNDS, SPIN, PAUSE = 4, 8, 0.002, 0.020
STEP_ALLOWANCE = 0.0003 * SLACK   # seconds per step not inside the program's spans


async def workload():
    mon = aioprof.LoopMonitor()
    busy = [0.0]
    delay0 = off_cpu()

    async def worker():
        t = time.perf_counter()
        for _ in range(ROUNDS):
            while time.perf_counter() - t < SPIN:
                pass
            busy[0] += time.perf_counter() - t
            await asyncio.sleep(PAUSE)
            t = time.perf_counter()
        busy[0] += time.perf_counter() - t

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(WORKERS)))
    wall = time.perf_counter() - t0
    stats = mon.stats()
    mon.close()
    return busy[0], wall, stats, off_cpu() - delay0


@pytest.fixture(scope="module")
def both_loops():
    out = {"asyncio": asyncio.new_event_loop(), "uvloop": uvloop.new_event_loop()}
    try:
        return {name: loop.run_until_complete(workload()) for name, loop in out.items()}
    finally:
        for loop in out.values():
            loop.close()


@pytest.mark.timing
@pytest.mark.parametrize("name", ["asyncio", "uvloop"])
def test_utilization_matches_the_programs_busy_share(both_loops, name):
    """Same workload on both loops: the loop's busy time is at least the program's own
    busy spans and at most those plus STEP_ALLOWANCE per step and the time the thread
    waited for a CPU (a starved thread is also preempted outside the spans); the
    utilization is that busy time over the loop's wall (uvloop: the monitor's age)."""
    busy, wall, stats, starved = both_loops[name]
    steps = WORKERS * (ROUNDS + 1) + 1
    assert busy - 1e-4 <= stats["busy_s"] <= busy + steps * STEP_ALLOWANCE + starved, (name, busy, stats)
    span = stats["wall_s"] if name == "asyncio" else stats["age_s"]
    assert stats["utilization"] == pytest.approx(stats["busy_s"] / span, rel=1e-9)
    # (the tick the monitor opened in is not counted: the program's clock started in it)
    assert span >= wall - 0.005 * SLACK - starved and 0 < stats["load"] <= 1
    if starved < 0.01:   # a machine that let it run: the shares agree closely too
        assert busy / wall - 0.01 <= stats["utilization"] <= (busy + steps * STEP_ALLOWANCE) / wall + 0.01


@pytest.mark.sanitize
def test_uvloop_loops_fold_too(fake_clock):
    """Ended uvloop loops fold like the standard ones: busy (task steps) summed exactly."""
    keep = 8   # AP_LOOPS_ENDED_KEEP
    with aioprof.Profiler() as p:
        for _ in range(keep + 3):
            loop = uvloop.new_event_loop()
            try:
                loop.run_until_complete(fake_program(fake_clock)())
            finally:
                loop.close()
    doc = p.stats()
    (group,) = doc["loops_folded"]
    assert (group["type"], group["module"], group["loops"]) == ("Loop", "uvloop", 3)
    assert round(group["busy_s"] * 1e9) == 3 * 150 * MS and group["handles"] == 3 * 2
    assert group["utilization"] is None and group["ticks"] is None
    assert len(doc["loops"]) == keep
