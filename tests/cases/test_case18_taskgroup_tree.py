"""Case 18 (../shared/cases/18_taskgroup_gather_tree.py): a task tree built with TaskGroup,
nested coroutines and gather; names, creation sites, creators and await chains."""
from __future__ import annotations

import sys

import re

import pytest

import _harness as H

pytestmark = [pytest.mark.slow, pytest.mark.timing,
              pytest.mark.skipif(sys.version_info < (3, 11), reason="asyncio.TaskGroup is new in 3.11")]

TOL = 0.020   # the header's +-20 ms
BRANCHES = 3


def noisy(run: H.CaseRun):
    return H.printed(run.stdout, r"runner done at (\d+\.\d+) s", [("runner done", 0.2 - TOL, 0.2 + TOL)])


def done_at(run) -> float:
    """When the runner was done, in seconds from the program's start, as it printed it: the
    waits below lie between their timer's nominal time (a timer never fires early) and this
    (issue 7 item 15)."""
    m = re.search(r"runner done at (\d+\.\d+) s", run.stdout)
    assert m, run.stdout
    return float(m.group(1))


@pytest.fixture(scope="module")
def run(shared_cases, tmp_path_factory) -> H.CaseRun:
    return H.run_or_fail(shared_cases, "18", tmp_path_factory, noisy=noisy)


def tree(run):
    """runner, [branch.0, branch.1, branch.2], leaf-top, [[leaf-a, leaf-b] of each branch].

    Found by coroutine and creation order, not by name, creation site or parent, which have
    their own tests: runner's first step creates the three branches, then leaf-top; then
    each branch's first step, in order, creates its leaf-a and leaf-b."""
    ts = run.user_tasks()
    assert len(ts) == 11, [(t["name"], t["coroutine"]) for t in ts]
    [runner] = run.tasks_of("runner")
    branches = run.tasks_of("branch")
    leaves = run.tasks_of("leaf")
    assert len(branches) == BRANCHES and len(leaves) == 2 * BRANCHES + 1
    assert H.ids(ts) == sorted(H.ids(ts))
    return runner, branches, leaves[0], [leaves[1 + 2 * i:3 + 2 * i] for i in range(BRANCHES)]


def test_program_ran(run):
    H.check_ran(run, r"runner done at \d+\.\d{3} s, tasks left: 1\n")
    H.check_lifetimes(run)


def test_header_tags(run):
    assert H.tag_mismatches(run) == []


def test_internal_tasks(run):
    H.check_internal_tasks(run)


def test_names(run):
    runner, branches, top, by_branch = tree(run)
    names = [runner["name"]] + [b["name"] for b in branches] + [top["name"]]
    for pair in by_branch:
        names += [t["name"] for t in pair]
    expected = ["Task-1"] + [f"branch.{i}" for i in range(BRANCHES)] + ["leaf-top"]
    for i in range(BRANCHES):
        expected += [f"branch.{i}/leaf-a", f"branch.{i}/leaf-b"]
    assert names == expected


def test_creation_sites(run):
    runner, branches, top, by_branch = tree(run)
    for b in branches:
        assert run.is_site(b["created_at"], run.line("C3")), b["created_at"]
    assert run.is_site(top["created_at"], run.line("C4")), top["created_at"]
    for leaf_a, leaf_b in by_branch:     # created in this order, inside fanout
        assert run.is_site(leaf_a["created_at"], run.line("C1")), leaf_a["created_at"]
        assert run.is_site(leaf_b["created_at"], run.line("C2")), leaf_b["created_at"]
        assert leaf_a["created_at"]["function"] == leaf_b["created_at"]["function"] == "fanout"


def test_creation_parents(run):
    """The creator of branch.i and leaf-top is the runner; of each leaf, its branch."""
    runner, branches, top, by_branch = tree(run)
    assert runner["parent"] is None
    assert [b["parent"] for b in branches] == [runner["id"]] * BRANCHES
    assert top["parent"] == runner["id"]
    for b, pair in zip(branches, by_branch):
        assert [t["parent"] for t in pair] == [b["id"], b["id"]], (b["name"], [t["name"] for t in pair])


def test_leaves(run):
    for t in run.tasks_of("leaf"):
        assert t["steps"] == 2
        assert t["busy_s"] <= TOL
        [site] = t["await_sites"]
        assert run.is_site(site, run.line("A1")) and site["count"] == 1, site
        H.within(H.await_time(t), 0.20 - TOL, done_at(run) + 0.002, f"{t['name']}: await at [A1]")


def test_branches(run):
    a4, a3, a2 = run.line("A4"), run.line("A3"), run.line("A2")
    for b in run.tasks_of("branch"):
        assert b["steps"] == 2
        assert b["busy_s"] <= TOL
        # suspended ~0.20 s at [A2] (gather of its two leaves), under the coroutine stack
        # branch [A4] -> middle [A3] -> fanout.
        [site] = b["await_sites"]
        assert site["count"] == 1 and run.is_site(site, a2), site
        assert run.chain_lines(site) == [("branch", a4), ("middle", a3), ("fanout", a2)], site
        H.within(site["idle_s"], 0.20 - TOL, done_at(run) + 0.002, f"{b['name']}: await at [A2]")
    for tag in ("A4", "A3", "A2"):   # every line of the chain is charged, once per branch
        s = run.site(run.line(tag))
        assert s["count"] == BRANCHES, s
        H.within(s["idle_s"], 0.60 - BRANCHES * TOL, BRANCHES * (done_at(run) + 0.002), f"sites[{tag}] idle_s")


def test_runner(run):
    runner, _, _, _ = tree(run)
    assert runner["steps"] == 3
    [a6] = run.await_sites_at(runner, run.line("A6"))
    [a5] = run.await_sites_at(runner, run.line("A5"))
    assert a6["count"] == a5["count"] == 1
    done = done_at(run)
    H.within(a6["idle_s"], 0.10 - TOL, done + 0.002, "runner: await at [A6]")
    # the rest of the 0.2 s leaves after [A6], until the runner was done
    H.within(a5["idle_s"], 0.10 - TOL, done - a6["idle_s"] + 0.002, "runner: await at the TaskGroup exit [A5]")


def test_coroutines(run):
    for name, tasks, steps in (("runner", 1, 3), ("branch", BRANCHES, 2 * BRANCHES),
                               ("leaf", 2 * BRANCHES + 1, 2 * (2 * BRANCHES + 1))):
        c = run.coroutine(name)
        assert (c["tasks"], c["steps"]) == (tasks, steps), c


def test_loop(run):
    loop = run.the_loop()
    H.check_loop_consistent(loop)
    H.within(loop["wall_s"], 0.20 - TOL, done_at(run) + 3 * TOL, "loop wall_s (whole run)")
    assert loop["utilization"] <= TOL / 0.20
    assert loop["slow_steps"] == []
