"""`python -m aioprof --subprocesses`: children made by os.fork, multiprocessing (fork,
spawn, forkserver, a spawn Pool) and subprocess running python are profiled, each with its
own pid, and merged into the parent's report; each child's figures match what the child
measured itself in the same run; the program sees what it sees without aioprof; a child
killed with SIGKILL loses only its tail, and a child still running at the parent's end
does not hold the parent (its last part is used, and said)."""
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from conftest import _import_root

HERE = Path(__file__).resolve().parent
BUSY_SLACK = 0.010    # a step holds a little more than the spin it measured


def _env(extra_path=None):
    env = dict(os.environ)
    parts = [str(_import_root())] + ([str(extra_path)] if extra_path else [])
    env["PYTHONPATH"] = os.pathsep.join(parts + [p for p in [env.get("PYTHONPATH")] if p])
    env.pop("AIOPROF_SUBPROCESSES", None)
    return env


@pytest.fixture(scope="module")
def children(tmp_path_factory):
    d = tmp_path_factory.mktemp("children")
    done = subprocess.run([sys.executable, "-m", "aioprof", "--subprocesses", "--format", "json",
                           "-o", d / "out.json", HERE / "_children_prog.py"],
                          capture_output=True, text=True, env=_env(), timeout=120)
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    doc = json.loads((d / "out.json").read_text())
    text = subprocess.run([sys.executable, "-m", "aioprof", "report", d / "out.json", "--by", "process"],
                          capture_output=True, text=True, env=_env(), timeout=120)
    return lines, doc, done.stderr, text


def test_every_kind_of_child_is_profiled_with_its_pid(children):
    lines, doc, stderr, _ = children
    tags = sorted(line["tag"] for line in lines)
    assert tags == sorted(["os.fork", "mp-fork", "mp-spawn", "mp-forkserver", "pool-a", "pool-b",
                           "subprocess", "parent"])
    pids = {line["pid"] for line in lines}
    assert pids <= set(doc["pids"]), (pids, doc["pids"])
    assert "did not write its final figures" not in stderr, stderr
    # Each process's `work` tasks are its own: a forked child holds none of its parent's.
    for pid in pids:
        mine = [t for t in doc["tasks"] if t["pid"] == pid and t["coroutine"] == "work"]
        assert len(mine) == sum(1 for line in lines if line["pid"] == pid), (pid, mine)
    work = [c for c in doc["coroutines"] if c["coroutine"] == "work"]
    assert len(work) == 1 and work[0]["tasks"] == len(lines)


def test_each_childs_figures_match_what_it_measured(children):
    lines, doc, _, _ = children
    for pid in {line["pid"] for line in lines}:
        measured = [line for line in lines if line["pid"] == pid]
        tasks = [t for t in doc["tasks"] if t["pid"] == pid and t["coroutine"] == "work"]
        spun = sum(line["spun_s"] for line in measured)
        slept = sum(line["slept_s"] for line in measured)
        busy = sum(t["busy_s"] for t in tasks)
        waited = sum(t["idle_s"] + t["scheduled_s"] for t in tasks)
        assert spun <= busy <= spun + BUSY_SLACK * len(tasks), (pid, busy, spun)
        # The wait (idle, then scheduled) lies inside the program's own measurement
        # around its await, which also holds the two steps' edges.
        assert slept - 0.015 * len(tasks) <= waited <= slept + 0.002 * len(tasks), \
            (pid, waited, slept)
        assert all(t["steps"] == 2 for t in tasks)


def test_by_process_shows_a_row_per_process(children):
    lines, doc, _, text = children
    assert text.returncode == 0, text.stderr
    out = text.stdout.splitlines()
    start = next(i for i, row in enumerate(out) if row.startswith("Processes by busy ms"))
    end = out.index("", start)
    assert out[start + 1].split()[:2] == ["pid", "tasks"]
    rows = {int(row.split()[0]): row.split() for row in out[start + 2:end]}
    assert set(rows) == set(doc["pids"]), (rows, doc["pids"])
    for line in lines:
        assert int(rows[line["pid"]][1]) >= 2    # its tasks: child_main and work
    by_pid = {p["pid"]: p for p in doc["processes"]}
    assert all(p["final"] for p in doc["processes"])
    for pid in {line["pid"] for line in lines}:
        spun = sum(line["spun_s"] for line in lines if line["pid"] == pid)
        assert by_pid[pid]["busy_s"] >= spun


VIEW = textwrap.dedent("""\
    import json, multiprocessing as mp, os, subprocess, sys

    def view(tag):
        site = sys.modules.get("sitecustomize")
        return {"tag": tag, "path": sys.path[1:], "env": {k: v for k, v in os.environ.items()
                                                          if "AIOPROF" in k or k in ("PYTHONPATH", "SITE_MARK")},
                "site": getattr(site, "__file__", None), "mark": getattr(site, "MARK", None)}

    def show(tag):
        import asyncio
        asyncio.run(asyncio.sleep(0))   # (a process that runs no asyncio is left out)
        print(json.dumps(view(tag)), flush=True)

    if __name__ == "__main__":
        show("parent")
        subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, %r); import view; view.show('sub')"
                        % os.path.dirname(os.path.abspath(__file__))], check=True)
        p = mp.get_context("spawn").Process(target=show, args=("spawn",))
        p.start(); p.join()
        sys.stderr.write("err line\\n")
        sys.exit(3)
""")


def test_children_see_what_they_see_without_aioprof(tmp_path):
    (tmp_path / "view.py").write_text(VIEW)
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import os\nMARK = 'mine'\nos.environ['SITE_MARK'] = '1'\n")
    env = _env(site)
    plain = subprocess.run([sys.executable, tmp_path / "view.py"], capture_output=True, text=True,
                           env=env, timeout=120)
    profiled = subprocess.run([sys.executable, "-m", "aioprof", "--subprocesses", "-o", tmp_path / "r.txt",
                               tmp_path / "view.py"], capture_output=True, text=True, env=env, timeout=120)
    assert plain.returncode == profiled.returncode == 3
    assert [json.loads(x)["mark"] for x in plain.stdout.splitlines()] == ["mine"] * 3
    assert profiled.stdout == plain.stdout
    assert profiled.stderr == plain.stderr == "err line\n"
    assert "3 reports merged" in (tmp_path / "r.txt").read_text()


KILLED = textwrap.dedent("""\
    import asyncio, json, os, signal, subprocess, sys, time

    CHILD = '''
    import asyncio, json, os, sys, time

    def part_dir():   # aioprof's variable, hidden from os.environ, is in the process's
        env = open("/proc/self/environ", "rb").read().split(b"\\\\0")
        raw = [e for e in env if e.startswith(b"AIOPROF_SUBPROCESSES=")][0]
        return json.loads(raw.split(b"=", 1)[1])["dir"]

    async def phase_a():
        t = time.perf_counter()
        while time.perf_counter() - t < 0.05:
            pass
        return time.perf_counter() - t

    async def tail():
        while True:
            t = time.perf_counter()
            while time.perf_counter() - t < 0.01:
                pass
            await asyncio.sleep(0.001)

    async def main():
        spun = await asyncio.create_task(phase_a())
        asyncio.create_task(tail())
        path = os.path.join(part_dir(), f"{os.getpid()}.json")
        while True:          # until a part holding phase_a's end is written
            await asyncio.sleep(0.05)
            try:
                doc = json.load(open(path))
            except (OSError, ValueError):
                continue
            if any(t["coroutine"] == "phase_a" and t["state"] == "done" for t in doc["tasks"]):
                break
        print(json.dumps({"pid": os.getpid(), "spun_s": spun}), flush=True)
        await asyncio.sleep(3600)

    asyncio.run(main())
    '''

    async def main():
        procs = [subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL, text=True)
                 for _ in range(2)]
        for p in procs:
            line = await asyncio.to_thread(p.stdout.readline)
            print(line, end="", flush=True)
        procs[0].kill()          # SIGKILL: it loses what it did since its last part
        procs[0].wait()
        # procs[1] still runs when this process ends.

    asyncio.run(main())
""")


def test_killed_and_still_running_children(tmp_path):
    (tmp_path / "killed.py").write_text(KILLED)
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "aioprof", "--subprocesses", "--format", "json",
                           "-o", tmp_path / "out.json", tmp_path / "killed.py"],
                          capture_output=True, text=True, env=_env(), timeout=120)
    assert done.returncode == 0, done.stderr
    killed, running = [json.loads(x) for x in done.stdout.splitlines()]
    try:
        os.kill(running["pid"], 0)     # the parent did not wait for it
        alive = True
    except ProcessLookupError:
        alive = False
    finally:
        try:
            os.kill(running["pid"], signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert alive, time.monotonic() - started
    doc = json.loads((tmp_path / "out.json").read_text())
    for child in (killed, running):
        assert f"process {child['pid']} did not write its final figures" in done.stderr, done.stderr
        tasks = [t for t in doc["tasks"] if t["pid"] == child["pid"] and t["coroutine"] == "phase_a"]
        assert len(tasks) == 1 and tasks[0]["state"] == "done"
        assert child["spun_s"] <= tasks[0]["busy_s"] <= child["spun_s"] + BUSY_SLACK
    rows = {p["pid"]: p for p in doc["processes"]}
    assert rows[killed["pid"]]["final"] is False and rows[running["pid"]]["final"] is False


SIGTERM_IN_WRITE = textwrap.dedent("""\
    import os, signal, sys
    from aioprof import subprocesses

    real = subprocesses._write_json

    def write(path, doc):
        if doc["process"]["final"]:
            os.kill(os.getpid(), signal.SIGTERM)   # its handler runs inside this write
        real(path, doc)

    subprocesses._write_json = write
    subprocesses.start_child({"dir": sys.argv[1], "kwargs": {}, "period_s": 0})
    sys.exit(0)
""")


def test_sigterm_during_the_final_write_dies_after_it(tmp_path):
    """A SIGTERM whose handler runs inside the child's own final write (a Pool terminating
    its workers as they exit) lets that write end, then the child dies of SIGTERM: no
    deadlock on the write's lock."""
    (tmp_path / "prog.py").write_text(SIGTERM_IN_WRITE)
    parts = tmp_path / "parts"
    parts.mkdir()
    done = subprocess.run([sys.executable, tmp_path / "prog.py", parts], capture_output=True,
                          text=True, env=_env(), timeout=60)
    assert done.returncode == -signal.SIGTERM, done.stderr
    (part,) = parts.iterdir()
    assert part.name == f"{json.loads(part.read_text())['pid']}.json"
    assert json.loads(part.read_text())["process"]["final"] is True
