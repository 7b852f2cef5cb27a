"""Case 18, the awaited-by side: with async stacks on, the idle time of every leaf task is
charged to an async call stack that runs through the tasks awaiting it, down to their
await lines: runner at the TaskGroup exit [A5], then branch [A4] -> middle [A3] ->
fanout's gather [A2], then the leaf at [A1] (docs/stacks.md)."""
from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

import _harness as H

pytestmark = [pytest.mark.slow, pytest.mark.timing,
              pytest.mark.skipif(sys.version_info < (3, 11), reason="asyncio.TaskGroup is new in 3.11")]

TOL = 0.020   # the header's +-20 ms per value

RUNNER = (
    "import sys, runpy, json, aioprof\n"
    "case, out = sys.argv[1], sys.argv[2]\n"
    "sys.argv = [case]\n"
    "p = aioprof.Profiler(async_stacks=True).start()\n"
    "try:\n"
    "    runpy.run_path(case, run_name='__main__')\n"
    "finally:\n"
    "    p.stop()\n"
    "    json.dump(p.stats(), open(out, 'w'))\n"
)


@pytest.fixture(scope="module")
def doc_and_tags(shared_cases, tmp_path_factory):
    path = H.case_file(shared_cases, "18")
    tags, _ = H.parse_tags(path)
    out = tmp_path_factory.mktemp("case18stacks") / "report.json"
    p = subprocess.run([sys.executable, "-c", RUNNER, str(path), str(out)], cwd=str(path.parent),
                       env=H._env(), capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    # When the runner was done, by the program's clock: the waits lie between their timers'
    # nominal time and this (a leaf's late wake-up keeps the tasks awaiting it suspended).
    m = re.search(r"runner done at (\d+\.\d+) s", p.stdout)
    assert m, p.stdout
    with open(out, encoding="utf-8") as f:
        return json.load(f), tags, float(m.group(1))


def readable(doc, stack):
    out = []
    for i in stack:
        f = doc["frames"][i]
        if f["kind"] == "task":
            out.append(("task", f["coroutine"]))
        elif f["kind"] == "code":
            out.append((f["function"].rsplit(".", 1)[-1], f["line"]))
        else:
            out.append((f["kind"], None))
    return out


def test_leaf_waits_are_charged_through_their_awaiting_tasks(doc_and_tags):
    doc, tags, done = doc_and_tags
    expected = [("task", "runner"), ("runner", tags["A5"]), ("task", "branch"), ("branch", tags["A4"]),
                ("middle", tags["A3"]), ("fanout", tags["A2"]), ("task", "leaf"), ("leaf", tags["A1"])]
    stacks = [(readable(doc, s["stack"]), s) for s in doc["idle_stacks"]]
    under_branches = [s for r, s in stacks if r == expected]
    assert under_branches, [r for r, _ in stacks]
    count = sum(s["count"] for s in under_branches)
    idle = sum(s["idle_s"] for s in under_branches)
    assert count == 6                                   # leaf-a and leaf-b of 3 branches
    H.within(idle, 6 * (0.2 - TOL), 6 * (done + 0.002), "idle under the branches")


def test_leaf_top_and_branches(doc_and_tags):
    doc, tags, done = doc_and_tags
    stacks = {tuple(readable(doc, s["stack"])): s for s in doc["idle_stacks"]}
    top = stacks[(("task", "runner"), ("runner", tags["A5"]), ("task", "leaf"), ("leaf", tags["A1"]))]
    assert top["count"] == 1
    H.within(top["idle_s"], 0.2 - TOL, done + 0.002, "leaf-top")
    # Each branch waits at the gather of its two leaves, awaited by runner's TaskGroup.
    branch = stacks[(("task", "runner"), ("runner", tags["A5"]), ("task", "branch"), ("branch", tags["A4"]),
                     ("middle", tags["A3"]), ("fanout", tags["A2"]))]
    assert branch["count"] == 3
    H.within(branch["idle_s"], 3 * (0.2 - TOL), 3 * (done + 0.002), "the 3 branches at [A2]")
