"""The pprof writer, read back by a real reader (`go tool pprof -raw`), under the fake clock:
every figure is known to the nanosecond.

Timeline (ms) of test_fake_clock.py's `two_jobs`: A runs 0-5 (2.5 ms CPU) then waits
on the event at [WAIT]; B is ready at 0 and runs 5-9 (1.5 ms CPU), setting the event at 8;
A runs again 9-11. main awaits the gather for 11 ms.
"""
import asyncio
import io

import pytest

import aioprof
from aioprof.report import pprof as pprof_report
from conftest import go_pprof, read_pprof

from test_fake_clock import MS, fake_clock, job, line_of, two_jobs  # noqa: F401 (fixture)


def profile(adv, **kw):
    with aioprof.Profiler(cpu_window_ms=1e-6, **kw) as p:
        asyncio.run(two_jobs(adv))
    return p.stats()


def write_pprof(doc, path):
    with open(path, "wb") as f:
        aioprof.report.write(doc, format="pprof", file=f)
    return read_pprof(path)


def test_exact_figures_read_back_by_go(fake_clock, tmp_path):
    doc = profile(fake_clock)
    prof = write_pprof(doc, tmp_path / "p.pb.gz")
    assert prof.types == ["cpu/nanoseconds", "busy/nanoseconds", "scheduled/nanoseconds",
                          "idle/nanoseconds"]
    qual = job.__qualname__
    # busy and scheduled at the coroutine frame, per task label
    assert prof.flat("busy", qual, task="A") == 7 * MS
    assert prof.flat("busy", qual, task="B") == 4 * MS
    assert prof.flat("scheduled", qual, task="A") == 1 * MS
    assert prof.flat("scheduled", qual, task="B") == 5 * MS
    # no sampling: cpu is each task's thread CPU time
    assert prof.flat("cpu", qual, task="A") == 5 * MS // 2
    assert prof.flat("cpu", qual, task="B") == 3 * MS // 2
    # idle at the await line, with the coroutine label and the task marker at the root
    wait, gather = line_of(job, "# [WAIT]"), line_of(two_jobs, "# [GATHER]")
    assert prof.flat("idle", qual, wait, task="A", coroutine=qual) == 3 * MS
    assert prof.flat("idle", two_jobs.__qualname__, gather) == 11 * MS
    (a_idle,) = [s for v, s, lab in prof.samples if lab.get("task") == "A" and v[3]]
    assert a_idle[-1] == (f"[task {qual}]", "", 0)
    # per coroutine and in total, the same figures as the JSON document
    for coro in doc["coroutines"]:
        for kind in ("busy", "scheduled"):
            assert prof.flat(kind, coro["coroutine"], coroutine=coro["coroutine"]) == round(coro[kind + "_s"] * 1e9)
    for kind in ("busy", "scheduled", "idle", "cpu"):
        expect = sum(round(t[kind + "_s"] * 1e9) for t in doc["tasks"])
        if kind in ("busy", "cpu"):
            expect += sum(round(c[kind + "_s"] * 1e9) for c in doc["callbacks"])
        assert prof.total(kind) == expect
    assert prof.total("busy") >= 11 * MS
    labels = {k for _, _, lab in prof.samples for k in lab}
    assert {"task", "coroutine", "loop", "pid"} <= labels
    # -top shows them too: A and B's 11 ms of busy time under job's name
    top = go_pprof("-top", "-sample_index=busy", tmp_path / "p.pb.gz")
    assert "Type: busy" in top and qual in top and "11ms" in top


def test_tasks_past_max_tasks_keep_their_coroutine_sums(fake_clock, tmp_path):
    doc = profile(fake_clock, max_tasks=1)   # only main is kept
    assert [t["coroutine"] for t in doc["tasks"]] == [two_jobs.__qualname__]
    prof = write_pprof(doc, tmp_path / "p.pb.gz")
    qual = job.__qualname__
    assert prof.flat("busy", qual, task="(not kept)") == 11 * MS
    assert prof.flat("scheduled", qual, task="(not kept)") == 6 * MS
    assert prof.flat("idle", qual, task="(not kept)") == 3 * MS


def test_sampled_stacks_are_the_cpu_values(tmp_path):
    # No clock is read here: a document with samples, as the sampler writes it.
    doc = {"aioprof": 1, "pid": 7, "wall_s": 1.0, "tasks": [], "coroutines": [], "callbacks": [],
           "frames": [{"kind": "task", "coroutine": "main"},
                      {"kind": "code", "file": "/x/app.py", "line": 12, "function": "main"},
                      {"kind": "code", "file": "/x/app.py", "line": 40, "function": "parse"},
                      {"kind": "callback", "callback": "cb"}],
           "samples": {"interval_s": 0.001, "count": 3, "uncharged_s": 0.0,
                       "stacks": [{"stack": [0, 1, 2], "samples": 2, "time_s": 0.25},
                                  {"stack": [0, 1], "samples": 1, "time_s": 0.125},
                                  {"stack": [3], "samples": 1, "time_s": 0.5}]}}
    prof = write_pprof(doc, tmp_path / "p.pb.gz")
    assert prof.flat("cpu", "parse", 40, coroutine="main", pid="7") == 250 * MS
    assert prof.flat("cpu", "main", 12) == 125 * MS
    assert prof.flat("cpu", "[callback cb]") == 500 * MS
    (stack,) = [s for v, s, _ in prof.samples if v[0] == 250 * MS]
    assert stack == [("parse", "/x/app.py", 40), ("main", "/x/app.py", 12), ("[task main]", "", 0)]
    assert "Period: 1000000" in go_pprof("-raw", tmp_path / "p.pb.gz")


def test_refuses_a_terminal_and_a_text_stream_without_buffer():
    class Tty(io.BytesIO):
        def isatty(self):
            return True

    with pytest.raises(ValueError, match="binary"):
        aioprof.report.write({"aioprof": 1}, format="pprof", file=Tty())
    with pytest.raises(ValueError, match="binary"):
        aioprof.report.write({"aioprof": 1}, format="pprof", file=io.StringIO())
    assert pprof_report.render({"aioprof": 1})[:2] == b"\x1f\x8b"   # gzip
