"""`--format pprof` and `Profiler.report("pprof")` on a program with real sleeps, read back by
`go tool pprof` and checked against the JSON report of the same run and against what the
program measured itself (perf_counter) in that run.

Bounds, from how the intervals nest (not from nominal values): the spinner's spin lies
inside one step, so its busy time is at least the spin; the sleeper's measured sleep
holds its suspension (idle, then scheduled) and the edges of its two steps (busy), so
its idle at the sleep line is at most the sleep and at least the sleep less its busy and
scheduled time.
"""
import json
import os
import subprocess
import sys
import textwrap

import pytest

from conftest import _import_root, go_pprof, read_pprof

pytestmark = pytest.mark.timing

PROGRAM = textwrap.dedent("""\
    import asyncio, json, sys, time

    async def sleeper():
        t0 = time.perf_counter()
        await asyncio.sleep(0.2)  # [SLEEP]
        return time.perf_counter() - t0

    async def spinner():
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 0.15:
            pass
        return time.perf_counter() - t0

    async def main():
        return await asyncio.gather(asyncio.create_task(sleeper(), name="sleeper"),
                                    asyncio.create_task(spinner(), name="spinner"))

    def run():
        slept, spun = asyncio.run(main())
        print(json.dumps({"slept": slept, "spun": spun}))

    if __name__ == "__main__" and sys.argv[1:2] == ["api"]:
        import aioprof
        with aioprof.Profiler(interval_ms=1) as p:
            run()
        with open(sys.argv[2], "w") as f:
            p.report("json", f)
        with open(sys.argv[3], "wb") as f:
            p.report("pprof", f)
    elif __name__ == "__main__":
        run()
""")
SLEEP_LINE = PROGRAM.splitlines().index("    await asyncio.sleep(0.2)  # [SLEEP]") + 1
NS = 1e9


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(_import_root())] + [p for p in [env.get("PYTHONPATH")] if p])
    return env


@pytest.fixture(scope="module")
def api_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("pprof_api")
    (d / "prog.py").write_text(PROGRAM)
    done = subprocess.run([sys.executable, str(d / "prog.py"), "api", str(d / "r.json"), str(d / "r.pb.gz")],
                          capture_output=True, text=True, env=_env(), timeout=120)
    assert done.returncode == 0, done.stderr
    measured = json.loads(done.stdout)
    return measured, json.loads((d / "r.json").read_text()), read_pprof(d / "r.pb.gz")


@pytest.fixture(scope="module")
def cli_run(tmp_path_factory, run_aioprof_module):
    d = tmp_path_factory.mktemp("pprof_cli")
    (d / "prog.py").write_text(PROGRAM)
    done = run_aioprof_module(["--format", "pprof", "-o", d / "r.pb.gz", d / "prog.py"], cwd=d)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout), d / "r.pb.gz"


def _task(doc, name):
    (task,) = [t for t in doc["tasks"] if t["name"] == name]
    return task


def test_api_pprof_sums_are_the_json_report(api_run):
    _, doc, prof = api_run
    for name in ("sleeper", "spinner"):
        task = _task(doc, name)
        for kind in ("busy", "scheduled"):
            assert prof.flat(kind, name, task=name) == round(task[kind + "_s"] * NS)
        assert sum(v[3] for v, _, lab in prof.samples if lab.get("task") == name) == round(task["idle_s"] * NS)
    (site,) = [s for s in _task(doc, "sleeper")["await_sites"] if s["line"] == SLEEP_LINE]
    assert prof.flat("idle", "sleeper", SLEEP_LINE) == round(site["idle_s"] * NS)
    (loop,) = doc["loops"]   # one loop: the sampled values carry it too
    assert all(lab["loop"].startswith(f"#{loop['id']} ") for v, _, lab in prof.samples if v[0])
    stacks = doc["samples"]["stacks"]
    assert abs(prof.total("cpu") - sum(round(s["time_s"] * NS) for s in stacks)) <= len(stacks)
    for kind in ("busy", "scheduled", "idle"):
        expect = sum(round(t[kind + "_s"] * NS) for t in doc["tasks"])
        if kind == "busy":
            expect += sum(round(c["busy_s"] * NS) for c in doc["callbacks"])
        assert prof.total(kind) == expect


def _check_against_program(measured, busy, scheduled, idle_at_sleep, sleeper_busy, sleeper_scheduled):
    assert busy >= measured["spun"] * NS
    assert idle_at_sleep <= measured["slept"] * NS
    assert idle_at_sleep >= measured["slept"] * NS - sleeper_busy - sleeper_scheduled - 1000


def test_api_pprof_against_the_programs_clock(api_run):
    measured, _, prof = api_run
    _check_against_program(measured, prof.flat("busy", "spinner"), prof.flat("scheduled", "spinner"),
                           prof.flat("idle", "sleeper", SLEEP_LINE), prof.flat("busy", "sleeper"),
                           prof.flat("scheduled", "sleeper"))


def test_cli_pprof_against_the_programs_clock(cli_run):
    measured, path = cli_run
    prof = read_pprof(path)
    _check_against_program(measured, prof.flat("busy", "spinner", task="spinner"),
                           prof.flat("scheduled", "spinner"), prof.flat("idle", "sleeper", SLEEP_LINE),
                           prof.flat("busy", "sleeper"), prof.flat("scheduled", "sleeper"))
    raw = go_pprof("-raw", path)
    assert "Period: 1000000" in raw and "cpu/nanoseconds[dflt]" in raw   # sampled by default
    top = go_pprof("-top", "-sample_index=busy", path)
    assert "spinner" in top.split("flat%", 1)[1]
    labels = {k for _, _, lab in prof.samples for k in lab}
    assert {"task", "coroutine", "loop", "pid"} <= labels


def test_cli_pprof_refuses_stderr_and_a_terminal(run_aioprof, tmp_path):
    (tmp_path / "prog.py").write_text("print('ran')\n")
    done = run_aioprof(["--format", "pprof", tmp_path / "prog.py"])
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == "aioprof: error: --format pprof is binary: give -o FILE (or -o - into a pipe)\n"
    piped = subprocess.run([sys.executable, "-m", "aioprof", "--format", "pprof", "-o", "-",
                            str(tmp_path / "prog.py")], capture_output=True, env=_env(), timeout=120)
    assert piped.returncode == 0, piped.stderr
    assert piped.stdout.startswith(b"ran\n\x1f\x8b")   # the program's line, then the gzip
