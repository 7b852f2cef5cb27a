"""aioprof.metrics: the Prometheus collectors' names, types, labels and values.

The values are exact, under aioprof's fake clock (tests/unit/test_fake_clock.py): the
programs advance the clock by known amounts inside their steps, so busy, scheduled and idle
seconds, the lag histogram and its sum are known to the nanosecond. The exposition is read
back with prometheus_client's own parser, so the names (`_total`, `_bucket`) and types are
those a Prometheus server sees.
"""
import asyncio
import math
import os
import sys
import threading
import time

import pytest

import aioprof
from aioprof import _core
from conftest import importable

if not importable("prometheus_client"):
    reason = (f"prometheus_client is not installed for {sys.executable} (tests/requirements.txt; "
              f"make deps)")
    if os.environ.get("AIOPROF_REQUIRE_REAL"):
        pytest.fail(f"{reason} (AIOPROF_REQUIRE_REAL is set)", pytrace=False)
    pytest.skip(reason, allow_module_level=True)

from prometheus_client import CollectorRegistry, generate_latest  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from aioprof.metrics import LAG_BUCKETS, ProfilerCollector  # noqa: E402

from test_fake_clock import MS, fake_clock  # noqa: E402,F401  (the fixture)


def registry_of(collector):
    reg = CollectorRegistry(auto_describe=False)
    reg.register(collector)
    return reg


def exposition(reg):
    """{family name: (type, [(sample name, labels, value)])} as Prometheus reads the text."""
    out = {}
    for fam in text_string_to_metric_families(generate_latest(reg).decode()):
        out[fam.name] = (fam.type, [(s.name, s.labels, s.value) for s in fam.samples])
    return out


def value(reg, name, **labels):
    v = reg.get_sample_value(name, labels)
    assert v is not None, (name, labels, generate_latest(reg).decode())
    return v


def exact_ns(seconds):
    return round(seconds * 1e9)


async def job(ev_wait, ev_set, adv, first, second):
    adv(first * MS, first * MS // 2)
    if ev_wait is not None:
        await ev_wait.wait()
    if ev_set is not None:
        ev_set.set()
    adv(second * MS, 0)


async def two_jobs(adv):
    # test_fake_clock's timeline: A busy 7, scheduled 1, idle 3; B busy 4, scheduled 5.
    e = asyncio.Event()
    a = asyncio.create_task(job(e, None, adv, 5, 2), name="A")
    b = asyncio.create_task(job(None, e, adv, 3, 1), name="B")
    await asyncio.gather(a, b)


def noop():
    pass


async def lagging(adv):
    asyncio.get_running_loop().call_soon(noop)   # ready now, runs after this step: 3 ms late
    adv(3 * MS)
    await asyncio.sleep(0)


@pytest.mark.sanitize
def test_coroutine_counters_exact(fake_clock):
    with aioprof.Profiler(cpu_window_ms=1e-6) as p:
        asyncio.run(two_jobs(fake_clock))
    reg = registry_of(ProfilerCollector(p))
    assert exact_ns(value(reg, "aioprof_coroutine_busy_seconds_total", coroutine="job")) == 11 * MS
    assert exact_ns(value(reg, "aioprof_coroutine_scheduled_seconds_total", coroutine="job")) == 6 * MS
    assert exact_ns(value(reg, "aioprof_coroutine_idle_seconds_total", coroutine="job")) == 3 * MS
    assert exact_ns(value(reg, "aioprof_coroutine_cpu_seconds_total", coroutine="job")) == 4 * MS
    assert value(reg, "aioprof_coroutine_steps_total", coroutine="job") == 3
    assert value(reg, "aioprof_coroutine_tasks_total", coroutine="job") == 2
    assert exact_ns(value(reg, "aioprof_coroutine_idle_seconds_total", coroutine="two_jobs")) == 11 * MS
    # The loop ran 11 ms of steps under the fake clock, and select never waited.
    assert exact_ns(value(reg, "aioprof_loop_busy_seconds_total", loop="ended", type="", thread="")) == 11 * MS
    assert value(reg, "aioprof_loop_select_wait_seconds_total", loop="ended", type="", thread="") == 0
    assert value(reg, "aioprof_tasks_finished_total", state="done") >= 3
    assert value(reg, "aioprof_tasks", state="running") == 0


@pytest.mark.sanitize
def test_a_scrape_reads_no_task_records(fake_clock, monkeypatch):
    """collect() reads _core.metrics(), whose cost does not grow with the tasks recorded,
    never the report's snapshot() (86 ms at 10,000 tasks, where metrics() took 0.15 ms)."""
    def no_snapshot():
        raise AssertionError("a scrape took the report's snapshot")

    with aioprof.Profiler(cpu_window_ms=1e-6) as p:
        monkeypatch.setattr(_core, "snapshot", no_snapshot)
        reg = registry_of(ProfilerCollector(p))
        asyncio.run(two_jobs(fake_clock))
        mid = value(reg, "aioprof_coroutine_busy_seconds_total", coroutine="job")
        monkeypatch.undo()
    assert exact_ns(mid) == 11 * MS


@pytest.mark.sanitize
def test_names_types_and_top_n(fake_clock):
    with aioprof.Profiler(cpu_window_ms=1e-6) as p:
        asyncio.run(two_jobs(fake_clock))
    doc = p.stats()
    reg = registry_of(ProfilerCollector(p, top=1))
    fams = exposition(reg)
    expected = {
        "aioprof_loop_busy_seconds": "counter", "aioprof_loop_wall_seconds": "counter",
        "aioprof_loop_select_wait_seconds": "counter", "aioprof_loop_ticks": "counter",
        "aioprof_loop_handles": "counter", "aioprof_loop_select_calls": "counter",
        "aioprof_loop_slow_steps": "counter", "aioprof_loop_lag_seconds": "histogram",
        "aioprof_tasks": "gauge", "aioprof_tasks_finished": "counter",
        "aioprof_coroutine_busy_seconds": "counter", "aioprof_coroutine_scheduled_seconds": "counter",
        "aioprof_coroutine_idle_seconds": "counter", "aioprof_coroutine_cpu_seconds": "counter",
        "aioprof_coroutine_steps": "counter", "aioprof_coroutine_tasks": "counter",
        "aioprof_coroutine_slow_steps": "counter",
    }
    assert {name: fams[name][0] for name in expected} == expected
    for name, (kind, samples) in fams.items():
        assert name.startswith("aioprof_")
        for sample, labels, _ in samples:
            if kind == "counter":
                assert sample == name + "_total"
            if kind == "histogram":
                assert sample in (name + "_bucket", name + "_sum", name + "_count")
    # top=1: "job" (11 ms busy) has its label; every other coroutine is summed in "other".
    coros = {labels["coroutine"] for _, labels, _ in fams["aioprof_coroutine_busy_seconds"][1]}
    assert coros == {"job", "other"}
    total = sum(c["busy_s"] for c in doc["coroutines"])
    other = value(reg, "aioprof_coroutine_busy_seconds_total", coroutine="other")
    assert exact_ns(other) == exact_ns(total) - 11 * MS
    steps = sum(c["steps"] for c in doc["coroutines"])
    assert value(reg, "aioprof_coroutine_steps_total", coroutine="other") == steps - 3


@pytest.mark.sanitize
def test_lag_histogram_exact(fake_clock):
    with aioprof.Profiler(cpu_window_ms=1e-6) as p:
        asyncio.run(lagging(fake_clock))
    (loop,) = p.stats()["loops"]
    reg = registry_of(ProfilerCollector(p))
    labels = dict(loop="ended", type="", thread="")
    count = value(reg, "aioprof_loop_lag_seconds_count", **labels)
    assert count == loop["lag_count"] and count >= 2
    # Only noop was late (3 ms); every other handle ran at the instant it was ready.
    assert exact_ns(value(reg, "aioprof_loop_lag_seconds_sum", **labels)) == 3 * MS
    bounds = {b: value(reg, "aioprof_loop_lag_seconds_bucket", le=le, **labels)
              for b, le in [(b, _le(b)) for b in LAG_BUCKETS]}
    assert bounds[2 ** 12] == count - 1           # the zero lags
    assert bounds[2 ** 21] == count - 1           # 2.097 ms < 3 ms
    assert bounds[2 ** 22] == count               # 4.194 ms > 3 ms
    assert value(reg, "aioprof_loop_lag_seconds_bucket", le="+Inf", **labels) == count
    assert list(bounds.values()) == sorted(bounds.values())


def _le(bound_ns):
    from prometheus_client.utils import floatToGoString
    return floatToGoString(bound_ns / 1e9)


@pytest.mark.sanitize
def test_running_figures_and_task_states(fake_clock):
    async def waiter(ev):
        await ev.wait()

    async def fails():
        raise ValueError("x")

    async def main(reg):
        ev = asyncio.Event()
        w = asyncio.create_task(waiter(ev))
        f = asyncio.create_task(fails())
        c = asyncio.create_task(asyncio.sleep(3600))
        await asyncio.sleep(0)          # w waits, f fails, c sleeps
        c.cancel()
        await asyncio.sleep(0)          # c is cancelled
        r = asyncio.create_task(waiter(ev))   # ready, not started
        fake_clock(4 * MS)
        mid = exposition(reg)           # from inside main's step
        ev.set()
        await asyncio.gather(w, r, return_exceptions=True)
        await asyncio.gather(f, return_exceptions=True)
        return mid

    with aioprof.Profiler(cpu_window_ms=1e-6) as p:
        reg = registry_of(ProfilerCollector(p))
        mid = asyncio.run(main(reg))
    states = {labels["state"]: v for _, labels, v in mid["aioprof_tasks"][1]}
    assert states == {"running": 1, "scheduled": 1, "idle": 1}
    finished = {labels["state"]: v for _, labels, v in mid["aioprof_tasks_finished"][1]}
    assert (finished["failed"], finished["cancelled"], finished["destroyed"]) == (1, 1, 0)
    busy = {labels["coroutine"]: v for _, labels, v in mid["aioprof_coroutine_busy_seconds"][1]}
    idle = {labels["coroutine"]: v for _, labels, v in mid["aioprof_coroutine_idle_seconds"][1]}
    sched = {labels["coroutine"]: v for _, labels, v in mid["aioprof_coroutine_scheduled_seconds"][1]}
    name = "test_running_figures_and_task_states.<locals>."
    assert exact_ns(busy[name + "main"]) == 4 * MS          # its step so far
    assert exact_ns(idle[name + "waiter"]) == 4 * MS        # w, suspended since the clock was 0
    assert exact_ns(sched[name + "waiter"]) == 4 * MS       # r, ready since the clock was 0
    (loop_busy,) = [v for _, labels, v in mid["aioprof_loop_busy_seconds"][1] if labels["loop"] != "ended"]
    assert loop_busy == 0   # the loop's figures count ticks that ended: none has yet
    assert [labels["loop"] for _, labels, _ in mid["aioprof_loop_ticks"][1]] == ["1"]
    assert "aioprof_loop_utilization" not in mid   # busy / wall with no wall yet: left out
    # After stop(), the final figures.
    final = exposition(reg)
    assert {labels["state"]: v for _, labels, v in final["aioprof_tasks"][1]} == {
        "running": 0, "scheduled": 0, "idle": 0}


@pytest.mark.sanitize
def test_loop_monitor_is_a_collector(fake_clock):
    async def main():
        m = aioprof.LoopMonitor()
        reg = registry_of(m)
        await asyncio.sleep(0)         # the tick that opened the monitor is not counted
        for _ in range(3):
            fake_clock(2 * MS)
            await asyncio.sleep(0)
        fams = exposition(reg)
        stats = m.stats()          # the same instant: the fake clock has not moved
        m.close()
        return fams, stats, exposition(reg)

    fams, stats, closed = asyncio.run(main())
    (_, labels, busy), = fams["aioprof_loop_busy_seconds"][1]
    assert labels["type"] == "_UnixSelectorEventLoop" and labels["thread"] == "MainThread"
    assert exact_ns(busy) == exact_ns(stats["busy_s"]) == 6 * MS   # the steps; select never waited
    (_, _, ticks), = fams["aioprof_loop_ticks"][1]
    assert ticks == stats["ticks"] == 3
    (_, _, util), = fams["aioprof_loop_utilization"][1]
    assert util == 1.0
    assert {"aioprof_loop_load", "aioprof_loop_wall_seconds", "aioprof_loop_select_wait_seconds",
            "aioprof_loop_handles", "aioprof_loop_select_calls"} <= set(fams)
    assert closed == {}
    assert not _core.is_active()   # the monitor ran without a profiler


def test_monitor_busy_read_from_another_thread_never_counts_select():
    """A scrape from another thread while the loop blocks in select: the select so far is
    select wait, so busy (a counter) does not go back down when the select ends."""
    reads = {}

    async def main():
        m = aioprof.LoopMonitor()
        loop = asyncio.get_running_loop()
        fut = loop.create_future()

        def scrape():
            time.sleep(0.05)                    # the loop is blocked in select, no timeout
            t0 = time.perf_counter()
            reads["mid"] = m.stats()
            time.sleep(0.05)
            reads["waited"] = time.perf_counter() - t0
            loop.call_soon_threadsafe(fut.set_result, None)

        threading.Thread(target=scrape).start()
        await fut
        reads["end"] = m.stats()
        m.close()

    asyncio.run(main())
    mid, end = reads["mid"], reads["end"]
    assert mid["busy_s"] <= end["busy_s"]
    assert end["select_wait_s"] - mid["select_wait_s"] >= reads["waited"] - 0.001
    assert not math.isnan(mid["utilization"])


@pytest.mark.sanitize
def test_scrapes_from_a_thread_while_loops_come_and_go_and_the_profiler_stops():
    """A scrape thread reads the core while the main thread makes and ends 30 loops (the
    ended ones are folded, their records freed) and then stops the profiler: no scrape
    fails or reads freed memory (ASan runs this), and the sums of the counters never go
    down from one scrape to the next."""
    async def job(i):
        await asyncio.gather(*(asyncio.sleep(0) for _ in range(i % 5)))

    p = aioprof.Profiler().start()
    reg = registry_of(ProfilerCollector(p, top=3))
    done = threading.Event()
    seen, errors = [], []

    def totals():
        fams = exposition(reg)
        return tuple(sum(v for _, _, v in fams.get(name, ("", []))[1])
                     for name in ("aioprof_loop_ticks", "aioprof_coroutine_steps",
                                  "aioprof_tasks_finished"))

    def scrape():
        try:
            while not done.is_set():
                seen.append(totals())
            seen.append(totals())   # the final figures, after stop()
        except Exception as e:  # pragma: no cover - the failure is reported below
            errors.append(e)

    thread = threading.Thread(target=scrape)
    thread.start()
    try:
        for i in range(30):
            asyncio.run(job(i))
    finally:
        p.stop()
        done.set()
        thread.join()
    assert not errors, errors
    assert len(seen) >= 2
    for before, after in zip(seen, seen[1:]):
        assert all(b <= a for b, a in zip(before, after)), (before, after)
    doc = p.stats()
    assert seen[-1][0] == sum(lp["ticks"] for lp in doc["loops"] + doc["loops_folded"])
    assert seen[-1][1] == sum(c["steps"] for c in doc["coroutines"])


@pytest.mark.sanitize
def test_stop_waits_for_a_scrape_that_runs_python_code():
    """A scrape asks each loop is_closed() (Python code: the GIL can pass to another
    thread). stop() called then, from the main thread, must wait for that scrape to end
    instead of freeing the session under it (ASan caught the read of freed memory)."""
    inside, scraper = threading.Event(), []

    class SlowToSay(asyncio.SelectorEventLoop):
        def is_closed(self):
            if threading.current_thread() in scraper:
                inside.set()
                time.sleep(0.1)        # releases the GIL: the main thread runs stop()
            return super().is_closed()

    p = aioprof.Profiler().start()
    loop = SlowToSay()
    loop.run_until_complete(asyncio.sleep(0))     # seen by the profiler, left open
    reg = registry_of(ProfilerCollector(p))
    got = []
    thread = threading.Thread(target=lambda: got.append(exposition(reg)))
    scraper.append(thread)
    thread.start()
    try:
        assert inside.wait(30)
        p.stop()
    finally:
        thread.join()
        loop.close()
    (fams,) = got
    ticks = {labels["loop"]: v for _, labels, v in fams["aioprof_loop_ticks"][1]}
    assert ticks == {"1": p.stats()["loops"][0]["ticks"]}


@pytest.mark.skipif(not importable("uvloop"), reason="needs uvloop that imports here")
def test_loop_monitor_collector_under_uvloop_leaves_out_what_uvloop_hides():
    import uvloop

    async def main():
        m = aioprof.LoopMonitor()
        await asyncio.sleep(0.01)
        fams = exposition(registry_of(m))
        after = m.stats()
        m.close()
        return fams, after

    fams, after = uvloop.run(main())
    # uvloop has no ticks or select that aioprof can see: left out, never 0.
    assert set(fams) == {"aioprof_loop_utilization", "aioprof_loop_load",
                         "aioprof_loop_busy_seconds", "aioprof_loop_handles"}
    (_, labels, busy), = fams["aioprof_loop_busy_seconds"][1]
    assert labels["type"] == "Loop"
    assert 0 <= busy <= after["busy_s"]


# -- multiprocess mode (publish_multiprocess) ----------------------------------------------
MULTIPROC_PROGRAM = r"""
import asyncio, json, sys, time
import aioprof
from aioprof.metrics import publish_multiprocess

async def worker(n):
    for _ in range(n):
        time.sleep(0.002)             # busy
        await asyncio.sleep(0.001)    # idle

async def main(n):
    await asyncio.gather(*(asyncio.create_task(worker(n)) for _ in range(3)))

p = aioprof.Profiler().start()
publish_multiprocess(p, interval_s=0.01)     # publishes many times during the run
asyncio.run(main(int(sys.argv[1])))
p.stop()                                     # the last publish: the final figures
with open(sys.argv[2], "w") as f:
    json.dump(p.stats(), f)
"""


@pytest.fixture(scope="module")
def multiprocess_runs(tmp_path_factory):
    """Two processes, each profiled and publishing into one PROMETHEUS_MULTIPROC_DIR,
    and each one's own JSON report; then the merged exposition of a MultiProcessCollector
    here (prometheus_client reads the value files, whatever this process's mode)."""
    import json
    import subprocess
    from prometheus_client import multiprocess

    tmp = tmp_path_factory.mktemp("multiproc")
    mdir = tmp / "prom"
    mdir.mkdir()
    env = dict(os.environ, PROMETHEUS_MULTIPROC_DIR=str(mdir), PYTHONPATH=os.pathsep.join(
        [os.path.join(os.path.dirname(__file__), "..", "..", "src")]
        + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])))
    procs = [subprocess.Popen([sys.executable, "-c", MULTIPROC_PROGRAM, str(n), str(tmp / f"r{n}.json")],
                              env=env, stderr=subprocess.PIPE, text=True) for n in (20, 30)]
    reports = []
    for proc, n in zip(procs, (20, 30)):
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        assert "aioprof" not in err, err            # no warning: publishing never failed
        reports.append(json.loads((tmp / f"r{n}.json").read_text()))
    reg = CollectorRegistry()
    multiprocess.MultiProcessCollector(reg, path=str(mdir))
    return reports, reg, [p.pid for p in procs]


def test_multiprocess_merged_equals_the_sum_of_the_reports(multiprocess_runs):
    reports, reg, _ = multiprocess_runs
    for coro in ("worker", "main"):
        rows = [next(r for r in rep["coroutines"] if r["coroutine"] == coro) for rep in reports]
        for key in ("busy", "idle", "scheduled"):
            merged = value(reg, f"aioprof_coroutine_{key}_seconds_total", coroutine=coro)
            assert exact_ns(merged) == sum(exact_ns(row[f"{key}_s"]) for row in rows), (coro, key)
        assert value(reg, "aioprof_coroutine_steps_total", coroutine=coro) == sum(r["steps"] for r in rows)
        assert value(reg, "aioprof_coroutine_tasks_total", coroutine=coro) == sum(r["tasks"] for r in rows)
    # The programs' own structure: 3 workers of n+1 steps each, in each process.
    assert value(reg, "aioprof_coroutine_tasks_total", coroutine="worker") == 6
    assert value(reg, "aioprof_coroutine_steps_total", coroutine="worker") == 3 * 21 + 3 * 31
    # Each loop's counters went from its own series (loop="1", while it ran) to
    # loop="ended": summed over the loops, the value files give each total once.
    busy = sum(s.value for m in reg.collect() if m.name == "aioprof_loop_busy_seconds"
               for s in m.samples if s.name.endswith("_total"))
    assert exact_ns(busy) == sum(exact_ns(loop["busy_s"]) for rep in reports for loop in rep["loops"])
    assert reg.get_sample_value("aioprof_loop_handles_total", dict(
        loop="1", type="_UnixSelectorEventLoop", thread="MainThread")) in (None, 0.0)
    # The lag histograms of the ended loops, merged bucket by bucket: a valid histogram
    # whose count is every handle the two loops ran.
    count = value(reg, "aioprof_loop_lag_seconds_count", loop="ended", type="", thread="")
    assert count == sum(loop["lag_count"] for rep in reports for loop in rep["loops"])
    assert value(reg, "aioprof_loop_lag_seconds_bucket", loop="ended", type="", thread="", le="+Inf") == count
    assert value(reg, "aioprof_tasks_finished_total", state="done") == sum(
        sum(1 for t in rep["tasks"] if t.get("state") == "done") for rep in reports)


def test_multiprocess_names_and_types_parse(multiprocess_runs):
    _, reg, pids = multiprocess_runs
    fams = exposition(reg)
    assert fams["aioprof_coroutine_busy_seconds"][0] == "counter"
    assert fams["aioprof_coroutine_steps"][0] == "counter"
    assert fams["aioprof_tasks_finished"][0] == "counter"
    assert fams["aioprof_loop_lag_seconds"][0] == "histogram"
    assert fams["aioprof_tasks"][0] == "gauge"
    # Live tasks are summed over the processes (none alive now: the dead were not marked).
    assert value(reg, "aioprof_tasks", state="running") == 0
    # Per-process gauges carry a pid; the loops ended, so their utilization is NaN.
    utils = fams["aioprof_loop_utilization"][1]
    assert {s[1]["pid"] for s in utils} == {str(p) for p in pids}
    assert all(math.isnan(s[2]) for s in utils)
    bounds = [float(s[1]["le"]) for s in fams["aioprof_loop_lag_seconds"][1]
              if s[0].endswith("_bucket") and s[1]["loop"] == "ended"]
    assert bounds == [b / 1e9 for b in LAG_BUCKETS] + [math.inf]


def test_publish_multiprocess_needs_the_directory(monkeypatch):
    from aioprof.metrics import publish_multiprocess
    for name in ("PROMETHEUS_MULTIPROC_DIR", "prometheus_multiproc_dir"):
        monkeypatch.delenv(name, raising=False)
    with aioprof.Profiler() as p:
        with pytest.raises(ValueError, match="PROMETHEUS_MULTIPROC_DIR"):
            publish_multiprocess(p)


def test_a_publishing_fault_stops_it_with_one_warning(fake_clock):
    from aioprof.metrics import MultiprocessPublisher

    def broken():
        raise OSError("disk full")

    with aioprof.Profiler(cpu_window_ms=1e-6) as p:
        asyncio.run(two_jobs(fake_clock))
        pub = MultiprocessPublisher(p, interval_s=60)   # no thread: publish() by hand
        pub.publish()
        busy = pub._metrics["aioprof_coroutine_busy_seconds"].labels("job")._value.get()
        assert exact_ns(busy) == 11 * MS
        pub.collector.collect = broken
        with pytest.warns(RuntimeWarning, match="multiprocess metrics stopped .OSError: disk full") as w:
            pub.publish()
            pub.publish()
        assert len([x for x in w if "multiprocess" in str(x.message)]) == 1
        assert pub.failed == "OSError: disk full"


class _Figures:
    """A profiler stand-in whose core figures are set by the test (ns)."""

    def __init__(self):
        self.idle_ns = 0

    def _metrics(self):
        return {"loops": [], "loops_folded": [], "tasks_now": {"idle": 1}, "tasks_ended": {},
                "coroutines": [{"coroutine": "handler", "busy_ns": 5 * MS, "scheduled_ns": 0,
                                "idle_ns": self.idle_ns, "cpu_ns": 0, "steps": 2, "tasks": 1,
                                "slow_steps": 0}]}


def test_counters_never_go_down_between_scrapes():
    """A pending task's idle time counts up to the scrape and is revised down by a few ms
    when its wake-up turns out to have been earlier (a hand-over from another thread): the
    collector's counter keeps the most it showed until the figure passes it again, as
    Prometheus counters must; monotonic=False gives the core's figures as they are."""
    figures = _Figures()
    reg, raw = registry_of(ProfilerCollector(figures)), registry_of(ProfilerCollector(figures, monotonic=False))
    shown = []
    for idle_ms in (10, 14, 11, 13, 20):   # revised down twice
        figures.idle_ns = idle_ms * MS
        shown.append((exact_ns(value(reg, "aioprof_coroutine_idle_seconds_total", coroutine="handler")),
                      exact_ns(value(raw, "aioprof_coroutine_idle_seconds_total", coroutine="handler"))))
    assert shown == [(10 * MS, 10 * MS), (14 * MS, 14 * MS), (14 * MS, 11 * MS), (14 * MS, 13 * MS),
                     (20 * MS, 20 * MS)]
    assert value(reg, "aioprof_coroutine_busy_seconds_total", coroutine="handler") == 0.005


def test_a_scrape_as_stop_begins_still_gets_the_figures():
    """stop() is not running any more before it takes the lock under which it reads the
    final figures: a scrape in between gets the core's figures, not nothing (which showed
    every counter dropping to 0 once, on 3.15 in CI)."""
    async def job():
        for _ in range(3):
            await asyncio.sleep(0)

    p = aioprof.Profiler().start()
    try:
        asyncio.run(job())
        reg = registry_of(ProfilerCollector(p))
        before = value(reg, "aioprof_coroutine_steps_total", coroutine=job.__qualname__)
        assert before == 4
        p._unhook()   # where stop() begins: not running, the lock not taken yet
        assert value(reg, "aioprof_coroutine_steps_total", coroutine=job.__qualname__) == before
        p._running = True
    finally:
        p.stop()
    assert value(reg, "aioprof_coroutine_steps_total", coroutine=job.__qualname__) == before
