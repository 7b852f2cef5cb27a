"""The MicroPython port (micropython/aioprof) under Debian's micropython 1.26 unix port.

Every timing is checked against what the program measured itself with time.ticks_us in
the same run (tests/micropython/programs/ print it first), with slack only on the side a
busy machine pushes. One run of each program is shared by the tests that read it.
"""
from __future__ import annotations

import json
import os
import platform
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from _mpy import MICROPYTHON, MICROPYTHON_DIR, addresses_out, by_coroutine, figures, json_lines, ms, popen, run

pytestmark = pytest.mark.timing


@pytest.fixture(scope="module", autouse=True)
def micropython_runs() -> None:
    proc = run("-c", "import asyncio, aioprof; print(asyncio.Task)", timeout=900)
    if proc.returncode != 0 or "<class 'Task'>" not in proc.stdout:
        why = f"tools/micropython does not run (exit {proc.returncode}): {proc.stderr.strip()[-500:]}"
        if os.environ.get("AIOPROF_REQUIRE_MICROPYTHON"):
            pytest.fail(why)
        pytest.skip(why)


@pytest.fixture(scope="module")
def slow_quicker():
    proc = run("slow_quicker.py", "-v")
    own, doc = json_lines(proc, 2)
    return own, doc, proc.stdout


# A busy machine lengthens steps (a preemption between the loop's resuming a task and the
# task's first clock reading is busy time the program cannot see): the upper bounds of busy
# time have that slack, the lower bounds none.
LOAD_MS = 15
LOAD_SHARE = 0.25


def test_slow_quicker_steps_and_busy(slow_quicker):
    own, doc, _ = slow_quicker
    rows = by_coroutine(doc)
    for name in ("slow", "quicker"):
        steps, busy, _, _ = figures(rows[name])
        assert steps == 6   # 1 start + 5 resumptions
        own_busy = own["busy_us"][name] / 1e3   # the program's own measure, inside the steps
        assert own_busy - 0.5 <= busy <= own_busy + LOAD_MS + LOAD_SHARE * own_busy, (name, busy, own_busy)
    assert rows["main"]["steps"] == 2
    assert ms(rows["main"]["busy_s"]) <= LOAD_MS


def test_slow_quicker_waits(slow_quicker):
    """quicker's awaits took ~415 ms (the program says how long, itself): ~100 ms its own
    sleeps (idle), the rest waiting behind slow's blocking (scheduled); its first step was
    late by slow's first block."""
    own, doc, _ = slow_quicker
    rows = by_coroutine(doc)
    for name in ("slow", "quicker"):
        _, busy, sched, idle = figures(rows[name])
        own_wait = own["wait_us"][name] / 1e3 + own["first_late_us"][name] / 1e3
        # the profiler's waits lie inside the program's own await intervals (and the time
        # from main's start to the first step; the start comes from a 1 ms tick); what the
        # program's intervals hold beyond them is loop work in the task's steps: busy time
        # past the program's own
        beyond = busy - own["busy_us"][name] / 1e3
        assert own_wait - beyond - 2 <= sched + idle <= own_wait + 2, (name, sched, idle, own_wait, beyond)
        # 5 sleeps of 20 ms (their ends in 1 ms ticks; their starts inside the steps)
        assert 100 - 6 - beyond <= idle <= 100 + 6, (name, idle, beyond)
    _, busy_q, sched_q, _ = figures(rows["quicker"])
    _, _, sched_s, _ = figures(rows["slow"])
    slow_busy = own["busy_us"]["slow"] / 1e3
    # quicker waited behind each of slow's 5 blocks of 80 ms, less its own sleep of 20 ms
    assert sched_q >= slow_busy - 5 * 21 - 6, (sched_q, slow_busy)
    # slow is late only by what its awaits took past their 20 ms (a busy machine's late
    # wake-ups, quicker's 1 ms blocks): nothing like quicker's
    slow_late = own["wait_us"]["slow"] / 1e3 - 5 * 20
    assert sched_s <= slow_late + 6, (sched_s, slow_late)
    task = {t["coroutine"]: t for t in doc["tasks"]}["quicker"]
    assert ms(task["first_step_s"] - task["start_s"]) >= own["first_late_us"]["quicker"] / 1e3 - 2


def test_slow_quicker_task_sums(slow_quicker):
    """busy + scheduled + idle == end - start for every task, and each ended done."""
    _, doc, _ = slow_quicker
    for t in doc["tasks"]:
        assert t["state"] == "done" and t["exception"] is None
        total = t["busy_s"] + t["scheduled_s"] + t["idle_s"]
        assert abs(total - (t["end_s"] - t["start_s"])) < 1e-5, t


def test_text_table(slow_quicker):
    """The seed's `function name | count | ms` table, with scheduled and idle columns."""
    own, doc, out = slow_quicker
    lines = out.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("function name"))
    assert [c.strip() for c in lines[head].split("|")] == [
        "function name", "tasks", "count", "busy ms", "sched ms", "idle ms", "max ms"]
    rows = {}
    for line in lines[head + 1:]:
        if not line.strip():
            break
        cells = [c.strip() for c in line.split("|")]
        rows[cells[0]] = cells
    coro = by_coroutine(doc)
    assert set(rows) == {"slow", "quicker", "main"}
    assert list(rows) == sorted(rows, key=lambda name: -coro[name]["busy_s"])   # most busy first
    for name, cells in rows.items():
        assert cells[2] == str(coro[name]["steps"])
        # (MicroPython rounds its own way: within 0.05 ms plus float noise)
        assert abs(float(cells[3]) - ms(coro[name]["busy_s"])) <= 0.051
        assert abs(float(cells[5]) - ms(coro[name]["idle_s"])) <= 0.051
    assert any(line.startswith("task | function name | label | state") for line in lines)


def test_json_shape(slow_quicker):
    """The CPython document's shape (docs/json.md) for the figures that exist."""
    _, doc, _ = slow_quicker
    assert doc["aioprof"] == 1 and doc["implementation"].startswith("micropython 1.26")
    assert {"wall_s", "tasks", "coroutines", "labels", "dropped_tasks", "warnings"} <= set(doc)
    task_fields = {"id", "coroutine", "label", "state", "exception", "steps", "busy_s", "scheduled_s",
                   "idle_s", "max_step_s", "start_s", "first_step_s", "end_s"}
    coro_fields = {"coroutine", "tasks", "steps", "busy_s", "scheduled_s", "idle_s", "max_step_s"}
    assert all(set(t) == task_fields for t in doc["tasks"])
    assert all(set(c) == coro_fields for c in doc["coroutines"])
    assert all(set(c) == coro_fields | {"label"} for c in doc["labels"])
    assert [t["id"] for t in doc["tasks"]] == [1, 2, 3]
    for t in doc["tasks"]:
        assert isinstance(t["steps"], int) and all(isinstance(t[k], float) for k in task_fields if k.endswith("_s"))
    assert doc["not_measured"] and "cpu_s" not in doc["tasks"][0]   # not faked


@pytest.fixture(scope="module")
def identity(tmp_path_factory):
    out = tmp_path_factory.mktemp("mpy") / "doc.json"
    off = run("identity.py", "off", str(out))
    on = run("identity.py", "on", str(out))
    return off, on, json.loads(out.read_text())


def test_same_behaviour_with_and_without_profiler(identity):
    """gather, wait_for, wait_for_ms, create_task, isinstance(t, asyncio.Task),
    run_until_complete, cancellation, caught and uncaught exceptions: the same output,
    tracebacks included, and exit status."""
    off, on, _ = identity
    assert off.returncode == on.returncode == 1   # the uncaught KeyError at the end
    assert "gather [1, 2, 3]" in off.stdout and "isinstance True True True True False" in off.stdout
    assert "KeyError: uncaught" in off.stderr and "Task exception wasn't retrieved" in off.stderr
    assert on.stdout == off.stdout
    assert addresses_out(on.stderr) == addresses_out(off.stderr)


def test_identity_task_states(identity):
    """The profiled run's document: each task's end as asyncio saw it."""
    _, _, doc = identity
    states = {}
    for t in doc["tasks"]:
        states.setdefault((t["coroutine"], t["state"], t["exception"]), 0)
        states[(t["coroutine"], t["state"], t["exception"])] += 1
    assert states[("boom", "failed", "ValueError")] == 4
    assert states[("sleeper", "cancelled", None)] == 3
    assert states[("gather", "cancelled", None)] == 1
    assert states[("value", "cancelled", None)] == 3   # 2 timed out, 1 before its first step
    assert states[("main", "done", None)] == 1
    never = [t for t in doc["tasks"] if t["coroutine"] == "value" and t["steps"] == 1]
    assert [t["state"] for t in never] == ["cancelled"]


def test_labels_tell_instances_apart():
    own, doc = json_lines(run("labels.py"), 2)
    rows = {(r["coroutine"], r["label"]): r for r in doc["labels"]}
    names = [own["object_label"], "sensor 1", "sensor 2", "sensor 3"]
    assert set(rows) == {("run", n) for n in names} | {("main", None)}
    assert by_coroutine(doc)["run"]["tasks"] == 4
    busiest = max((r for r in doc["labels"]), key=lambda r: r["busy_s"])
    assert busiest["label"] == "sensor 2"
    for n, own_us in zip(names, own["busy_us"]):
        busy = ms(rows[("run", n)]["busy_s"])
        assert own_us / 1e3 - 0.5 <= busy <= own_us / 1e3 + LOAD_MS + LOAD_SHARE * own_us / 1e3, (n, busy, own_us)
        assert rows[("run", n)]["steps"] == 5
    assert {t["label"] for t in doc["tasks"] if t["coroutine"] == "run"} == set(names)


def test_fault_stops_profiling_with_one_warning():
    proc = run("fault.py")
    assert proc.returncode == 0
    assert proc.stdout.splitlines()[:2] == ["results [3, 4]", "running False"]
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("aioprof:")]
    assert len(warnings) == 1 and "internal error" in warnings[0], proc.stderr


def wait_in_poll(pid: int, timeout_ms: int) -> None:
    """Until the process blocks in poll(2) with that timeout: the loop's wait (x86-64's
    poll is syscall 7, the timeout its third argument; /proc/PID/syscall)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        fields = Path(f"/proc/{pid}/syscall").read_text().split()
        if fields[0] == "7" and int(fields[3], 16) == timeout_ms:
            return
        time.sleep(0.01)
    pytest.fail(f"micropython (pid {pid}) did not reach its poll: {fields}")


@pytest.mark.skipif(platform.machine() != "x86_64", reason="wait_in_poll knows x86-64's syscall numbers")
def test_ctrl_c_while_waiting():
    """KeyboardInterrupt in the loop's wait: the same exception, exit status and traceback,
    but for the one line of the hook it passed through (micropython/README.md says so)."""
    outs = {}
    for mode in ("off", "on"):
        proc = popen("sleep_forever.py", mode)
        assert proc.stdout.readline() == "ready\n"
        wait_in_poll(proc.pid, 60_000)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
        outs[mode] = (proc.returncode, err.splitlines())
    (rc_off, off), (rc_on, on) = outs["off"], outs["on"]
    assert rc_off == rc_on == 1 and off[-1].startswith("KeyboardInterrupt")
    extra = [line for line in on if line not in off]
    assert len(extra) == 1 and "aioprof/__init__.py" in extra[0] and "in wait_io_event" in extra[0]
    assert [line for line in on if line not in extra] == off


def test_package_json_lists_the_package():
    """mip's package.json: every file of micropython/aioprof, by a URL relative to it."""
    pkg = json.loads((MICROPYTHON_DIR / "package.json").read_text())
    files = sorted(str(p.relative_to(MICROPYTHON_DIR)) for p in (MICROPYTHON_DIR / "aioprof").glob("*.py"))
    assert sorted(target for target, _ in pkg["urls"]) == files
    assert all(url == target for target, url in pkg["urls"])   # relative: the same path
    source = (MICROPYTHON_DIR / "aioprof" / "__init__.py").read_text()
    assert pkg["version"] == re.search(r'__version__ = "(.*)"', source).group(1)


@pytest.fixture(scope="module")
def snapshot():
    return json_lines(run("snapshot.py"), 3)


def test_stats_while_running(snapshot):
    """stats() from inside main, as the seed used its report: the running step and the
    pending tasks counted up to that moment."""
    own, during, _ = snapshot
    tasks = {t["coroutine"]: t for t in during["tasks"] if t["coroutine"] != "short"}
    assert (tasks["main"]["state"], tasks["main"]["steps"]) == ("pending", 3)   # its third step runs
    assert (tasks["forever"]["state"], tasks["forever"]["steps"]) == ("pending", 1)
    for t in tasks.values():
        assert t["end_s"] is None
        total = t["busy_s"] + t["scheduled_s"] + t["idle_s"]
        assert abs(total - (during["wall_s"] - t["start_s"])) < 1e-5, t
    main = tasks["main"]
    # its two awaits (the gather, a 20 ms sleep) inside what main measured itself
    assert 20 - 1 <= ms(main["idle_s"] + main["scheduled_s"]) <= own["main_us"] / 1e3


def test_max_tasks_folds_the_rest(snapshot):
    _, during, final = snapshot
    for doc in (during, final):
        assert len(doc["tasks"]) == 10 and doc["dropped_tasks"] == 22   # 30 short + main + forever
        short = by_coroutine(doc)["short"]
        assert (short["tasks"], short["steps"]) == (30, 60)
    states = {t["coroutine"]: t["state"] for t in final["tasks"]}
    # main ended; forever's cancellation never ran (the loop had stopped): still pending
    assert states["main"] == "done" and states["forever"] == "pending"


def test_seed_example_report_from_inside_main():
    """The seed's use: start() and the report inside main; main, seen from its running
    step on, shows 2 steps and its 500 ms sleep; the endless tasks' steps and busy time
    are what they counted themselves at that moment."""
    own, doc = json_lines(run("seed_report.py"), 2)
    rows = by_coroutine(doc)
    assert rows["main"]["steps"] == 2
    slept = own["slept_us"] / 1e3
    waited = ms(rows["main"]["idle_s"] + rows["main"]["scheduled_s"])
    assert 500 - 1 <= waited <= slept + 1, (waited, slept)
    for name in ("slow", "quicker"):
        assert rows[name]["steps"] == own["steps"][name]
        own_busy = own["busy_us"][name] / 1e3
        busy = ms(rows[name]["busy_s"])
        assert own_busy - 0.5 <= busy <= own_busy + LOAD_MS + LOAD_SHARE * own_busy, (name, busy, own_busy)


def test_tools_micropython_runs_like_micropython(tmp_path):
    """Like `micropython ARGS...` in the current directory: stdin, environment, exit status
    and stderr are the program's; the port comes first on the path, then MicroPython's own
    default path."""
    (tmp_path / "prog.py").write_text(
        "import os, sys, aioprof\n"
        "print(os.getcwd(), sys.stdin.read().strip(), os.getenv('AIOPROF_T'))\n"
        "print(sys.path[1:], aioprof.__file__)\n"
        "print('to stderr', file=sys.stderr)\n"
        "sys.exit(7)\n")
    proc = subprocess.run([str(MICROPYTHON), "prog.py"], cwd=tmp_path, input="from stdin\n",
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "AIOPROF_T": "env seen"})
    assert proc.returncode == 7, proc.stderr
    first, second = proc.stdout.splitlines()
    assert first == f"{tmp_path} from stdin env seen"
    port = str(MICROPYTHON_DIR)
    home = os.path.expanduser("~")
    path = [port, ".frozen", home + "/.micropython/lib", "/usr/lib/micropython"]
    assert second == f"{path} {port}/aioprof/__init__.py"
    assert proc.stderr == "to stderr\n"


def test_bad_arguments_one_clear_error():
    proc = run("-c", "import aioprof, asyncio\n"
               "for call in (lambda: aioprof.Profiler(max_tasks='1'), lambda: aioprof.Profiler(max_tasks=-1),\n"
               "             lambda: aioprof.Profiler().stats(), lambda: aioprof.label('t', 'x'),\n"
               "             lambda: aioprof.Profiler().start().report('xml')):\n"
               "    try:\n"
               "        call()\n"
               "    except Exception as e:\n"
               "        print(type(e).__name__, e)\n")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "TypeError max_tasks must be an int, not str '1'",
        "ValueError max_tasks must be an int >= 0, not -1",
        "RuntimeError this Profiler was never started",
        "TypeError label() needs a Task, not str",
        "ValueError format must be 'text' or 'json', not 'xml'",
    ]
