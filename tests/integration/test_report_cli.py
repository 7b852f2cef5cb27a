"""`python -m aioprof report FILE.json`: a saved report re-rendered gives the text report of
the run itself; bad input and formats the report has no data for give one line and a
non-zero exit; a script named `report` still runs as ./report."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

from conftest import _import_root

PROGRAM = textwrap.dedent("""\
    import asyncio, sys, time
    import aioprof

    async def waiter(i):
        await asyncio.sleep(0.02 * i)
        t = time.perf_counter()
        while time.perf_counter() - t < 0.005:
            pass

    async def main():
        await asyncio.gather(*(waiter(i) for i in range(1, 4)))

    with aioprof.Profiler(interval_ms=1, async_stacks=True) as p:
        asyncio.run(main())
    with open(sys.argv[1], "w") as f:
        p.report("json", f)
    with open(sys.argv[2], "w") as f:
        p.report("text", f, by=sys.argv[3])
""")


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(_import_root())] + [p for p in [env.get("PYTHONPATH")] if p])
    return env


def aioprof(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "aioprof", *map(str, args)], capture_output=True,
                          text=True, env=_env(), cwd=cwd, timeout=120)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    d = tmp_path_factory.mktemp("saved")
    (d / "prog.py").write_text(PROGRAM)
    for by in ("coroutine", "stack"):
        done = subprocess.run([sys.executable, str(d / "prog.py"), d / f"{by}.json", d / f"{by}.txt", by],
                              capture_output=True, text=True, env=_env(), timeout=120)
        assert done.returncode == 0, done.stderr
    return d


@pytest.mark.parametrize("by", ["coroutine", "stack"])
def test_report_text_is_the_runs_text(saved, by):
    done = aioprof("report", saved / f"{by}.json", "--by", by)
    assert done.returncode == 0 and done.stderr == ""
    assert done.stdout == (saved / f"{by}.txt").read_text()


def test_report_json_and_collapsed_round_trip(saved, tmp_path):
    done = aioprof("report", saved / "coroutine.json", "--format", "json", "-o", tmp_path / "again.json")
    assert done.returncode == 0 and done.stdout == done.stderr == ""
    assert json.loads((tmp_path / "again.json").read_text()) == json.loads((saved / "coroutine.json").read_text())
    done = aioprof("report", saved / "coroutine.json", "--format", "collapsed", "--flame", "idle")
    assert done.returncode == 0 and "[task main]" in done.stdout


def _one_line_error(done, status, text):
    assert done.returncode == status and done.stdout == ""
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("aioprof: error: "), done.stderr
    assert text in done.stderr


def test_bad_input_is_one_line(saved, tmp_path):
    (tmp_path / "not.json").write_text("{nope")
    (tmp_path / "other.json").write_text('{"traceEvents": []}')
    (tmp_path / "newer.json").write_text('{"aioprof": 2, "tasks": []}')
    _one_line_error(aioprof("report", tmp_path / "missing.json"), 2, "No such file or directory")
    _one_line_error(aioprof("report", tmp_path / "not.json"), 2, "is not JSON")
    _one_line_error(aioprof("report", tmp_path / "other.json"), 2, "is not an aioprof report")
    _one_line_error(aioprof("report", tmp_path / "newer.json"), 2, "of version 2; this aioprof reads version 1")
    _one_line_error(aioprof("report"), 2, "the following arguments are required: FILE.json")
    _one_line_error(aioprof("report", saved / "coroutine.json", "--format", "trace"), 1, "no trace in the report")
    _one_line_error(aioprof("report", saved / "coroutine.json", "--format", "pprof"), 2, "is binary")
    nosamples = json.loads((saved / "coroutine.json").read_text())
    del nosamples["samples"]
    (tmp_path / "nosamples.json").write_text(json.dumps(nosamples))
    _one_line_error(aioprof("report", tmp_path / "nosamples.json", "--by", "stack"), 1,
                    "no samples in the report for --by stack")
    (tmp_path / "keep.txt").write_text("earlier")
    _one_line_error(aioprof("report", saved / "coroutine.json", saved / "stack.json", "--format", "trace",
                            "-o", tmp_path / "keep.txt"), 1, "from these 2 reports: no trace")
    assert (tmp_path / "keep.txt").read_text() == "earlier"


def test_a_script_named_report_runs_as_dot_slash(tmp_path):
    (tmp_path / "report").write_text("print('the script ran')\n")
    done = aioprof("-o", os.devnull, "./report", cwd=tmp_path)
    assert done.returncode == 0 and done.stdout == "the script ran\n"
    _one_line_error(aioprof("report", cwd=tmp_path), 2, "(to run the script named report, write ./report)")


def _into_closed_pipe(args, cwd):
    """Run `python -m aioprof *args` with stdout a pipe whose reader is gone (as after
    `| head` has read its lines): (exit status, stderr)."""
    r, w = os.pipe()
    os.close(r)
    try:
        done = subprocess.run([sys.executable, "-m", "aioprof", *map(str, args)], stdout=w,
                              stderr=subprocess.PIPE, text=True, env=_env(), cwd=cwd, timeout=120)
    finally:
        os.close(w)
    return done.returncode, done.stderr


def test_a_reader_that_stops_reading_is_no_error(saved, tmp_path):
    """`aioprof report r.json | head` and `python -m aioprof -o - prog.py | head`: the
    closed pipe is not reported as an error (nothing on stderr); the re-render exits 1 as
    Python's note on SIGPIPE advises, a run keeps the program's exit status."""
    assert _into_closed_pipe(["report", saved / "coroutine.json", "--format", "json"], saved) == (1, "")
    prog = tmp_path / "p.py"
    prog.write_text("import asyncio, sys\nasyncio.run(asyncio.sleep(0))\nsys.exit(3)\n")
    assert _into_closed_pipe(["--format", "json", "-o", "-", prog], tmp_path) == (3, "")
