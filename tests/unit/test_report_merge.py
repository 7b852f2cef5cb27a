"""Merging saved reports (`aioprof.report.merge`, `python -m aioprof report A.json B.json`)
under the fake clock: two runs of test_fake_clock.py's `two_jobs`, whose figures are
known to the nanosecond (A: busy 7 ms, scheduled 1, idle 3; B: busy 4, scheduled 5), so
every merged sum is known exactly."""
import asyncio
import json
import os
import subprocess
import sys

import pytest

import aioprof
from aioprof.report import merge
from conftest import _import_root, read_pprof

from test_fake_clock import MS, fake_clock, job, two_jobs  # noqa: F401 (fixture)


def ns(seconds):
    return round(seconds * 1e9)


@pytest.fixture
def two_docs(fake_clock):
    docs = []
    for _ in range(2):
        with aioprof.Profiler(cpu_window_ms=1e-6, async_stacks=True) as p:
            asyncio.run(two_jobs(fake_clock))
        docs.append(p.stats())
    docs[1]["pid"] = docs[0]["pid"] + 1   # as if from a second process (a worker)
    return docs


def test_one_report_is_itself(two_docs):
    assert merge.merge(two_docs[:1]) is two_docs[0]


def test_merge_sums_coroutines_and_lists_tasks_and_loops(two_docs):
    a, b = two_docs
    m = merge.merge(two_docs)
    (coro,) = [c for c in m["coroutines"] if c["coroutine"] == job.__qualname__]
    assert (coro["tasks"], coro["steps"]) == (4, 6)
    assert (ns(coro["busy_s"]), ns(coro["scheduled_s"]), ns(coro["idle_s"])) == (22 * MS, 12 * MS, 6 * MS)
    assert ns(coro["max_step_s"]) == 5 * MS
    assert coro["p99_step_s"] is None and coro["p50_step_s"] is None   # not mergeable
    assert len(m["tasks"]) == len(a["tasks"]) + len(b["tasks"])
    ids = [t["id"] for t in m["tasks"]]
    assert len(set(ids)) == len(ids)
    by_id = {t["id"]: t for t in m["tasks"]}
    for t in m["tasks"]:
        if t["parent"] is not None:
            assert by_id[t["parent"]]["pid"] == t["pid"]
    assert [t["pid"] for t in m["tasks"] if t["name"] == "A"] == [a["pid"], b["pid"]]
    assert [(lp["pid"], lp["id"]) for lp in m["loops"]] == [(a["pid"], 1), (b["pid"], 2)]
    assert m["pids"] == [a["pid"], b["pid"]]
    assert ns(m["wall_s"]) == max(ns(a["wall_s"]), ns(b["wall_s"]))
    assert "samples" not in m   # neither run sampled
    idle = {tuple(m["frames"][i].get("coroutine") or m["frames"][i].get("function") for i in e["stack"]): e["idle_s"]
            for e in m["idle_stacks"]}
    single = {tuple(a["frames"][i].get("coroutine") or a["frames"][i].get("function") for i in e["stack"]): e["idle_s"]
              for e in a["idle_stacks"]}
    assert {k: ns(v) for k, v in idle.items()} == {k: 2 * ns(v) for k, v in single.items()}


def test_cli_report_merges_files_into_json_text_and_pprof(two_docs, tmp_path):
    paths = []
    for i, doc in enumerate(two_docs):
        paths.append(tmp_path / f"r{i}.json")
        paths[-1].write_text(json.dumps(doc))
    env = dict(os.environ, PYTHONPATH=str(_import_root()))

    def report(*args):
        done = subprocess.run([sys.executable, "-m", "aioprof", "report", *map(str, paths), *args],
                              capture_output=True, text=True, env=env, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert json.loads(report("--format", "json")) == json.loads(json.dumps(merge.merge(two_docs)))
    text = report()
    assert f"2 reports merged (pids {two_docs[0]['pid']}, {two_docs[1]['pid']})" in text.splitlines()[0]
    assert f"loop 2 (_UnixSelectorEventLoop), thread MainThread, pid {two_docs[1]['pid']}" in text
    report("--format", "pprof", "-o", tmp_path / "m.pb.gz")
    prof = read_pprof(tmp_path / "m.pb.gz")
    for doc in two_docs:
        pid = str(doc["pid"])
        assert prof.flat("busy", job.__qualname__, task="A", pid=pid) == 7 * MS
        assert prof.flat("idle", job.__qualname__, task="A", pid=pid) == 3 * MS
    assert prof.flat("busy", job.__qualname__) == 22 * MS
