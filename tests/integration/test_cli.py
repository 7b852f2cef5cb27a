"""`python -m aioprof` end to end: the program sees what `python` would give it, its
output and exit status are unchanged, and the report is written in every case."""
from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path
from typing import Optional, Sequence

import pytest

REPO = Path(__file__).resolve().parents[2]


def _import_root() -> Path:
    """Where this process imports aioprof from (src/, or another build under a sanitizer)."""
    spec = importlib.util.find_spec("aioprof")
    if spec is None or not spec.submodule_search_locations:
        return REPO / "src"
    return Path(list(spec.submodule_search_locations)[0]).parent


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(_import_root())]
                                        + [p for p in [env.get("PYTHONPATH")] if p])
    env.pop("PYTHONSAFEPATH", None)
    env["COLUMNS"] = "120"
    return env


def run(args: Sequence[str], *, cwd: Path, aioprof: Optional[Sequence[str]] = None,
        timeout: float = 60) -> "subprocess.CompletedProcess[bytes]":
    """Run `python *args`, or `python -m aioprof *aioprof *args` when aioprof is not None."""
    cmd = [sys.executable] + (["-m", "aioprof", *aioprof] if aioprof is not None else []) + list(args)
    return subprocess.run(cmd, cwd=cwd, env=_env(), capture_output=True, timeout=timeout)


def write(path: Path, source: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(source), encoding="utf-8")
    return path


ASYNC_PROGRAM = """\
    import asyncio, sys

    async def my_worker(n):
        for i in range(n):
            await asyncio.sleep(0.001)
        return n

    async def main():
        t = asyncio.create_task(my_worker(3))  # [create]
        print("result", await t, "\\u00e9", flush=False)
        sys.stdout.buffer.write(b"raw \\xff\\x00 bytes\\r\\n")

    asyncio.run(main())
    print("end", end="")
"""


# -- the program's view and output ---------------------------------------------------------
def test_stdout_is_identical_and_report_goes_to_stderr(tmp_path):
    write(tmp_path / "prog.py", ASYNC_PROGRAM)
    plain = run(["prog.py"], cwd=tmp_path)
    prof = run(["prog.py"], cwd=tmp_path, aioprof=[])
    assert plain.returncode == prof.returncode == 0
    assert prof.stdout == plain.stdout
    assert b"raw \xff\x00 bytes\r\n" in prof.stdout
    assert prof.stderr.decode().startswith("aioprof: wall ")
    assert "my_worker" in prof.stderr.decode()


def test_argv_path_and_main_module_as_python_gives_them(tmp_path):
    write(tmp_path / "sub" / "prog.py", """\
        import json, sys, __main__
        print(json.dumps({"argv": sys.argv, "path0": sys.path[0], "file": __file__,
                          "name": __name__, "main": sys.modules["__main__"] is __main__,
                          "spec": repr(__spec__), "globals": sorted(globals())}))
    """)
    # The program's own options, even those aioprof also has, must reach it untouched.
    args = ["sub/prog.py", "a", "-o", "x.json", "--format", "text", "-m", "--", "b"]
    plain = run(args, cwd=tmp_path)
    prof = run(args, cwd=tmp_path, aioprof=["--sort", "idle"])
    assert plain.returncode == prof.returncode == 0, prof.stderr
    assert prof.stdout == plain.stdout
    seen = json.loads(prof.stdout)
    assert seen["argv"] == args
    assert seen["path0"] == str((tmp_path / "sub").resolve())
    assert seen["file"] == str(tmp_path / "sub" / "prog.py")
    assert seen["name"] == "__main__" and seen["main"] and seen["spec"] == "None"
    assert not (tmp_path / "x.json").exists()


def test_pickle_and_spawned_processes_find_main(tmp_path):
    # Objects defined in the script pickle by reference to __main__, and a spawned child
    # re-imports the script from __main__.__file__: both need a real __main__ module.
    write(tmp_path / "prog.py", """\
        import multiprocessing, pickle

        def square(x):
            return x * x

        class Point:
            pass

        if __name__ == "__main__":
            with multiprocessing.get_context("spawn").Pool(2) as pool:
                print(pool.map(square, [1, 2, 3]))
            print(type(pickle.loads(pickle.dumps(Point()))).__name__)
    """)
    prof = run(["prog.py"], cwd=tmp_path, aioprof=["-o", str(tmp_path / "r.txt")])
    assert prof.returncode == 0, prof.stderr
    assert prof.stdout.decode().splitlines() == ["[1, 4, 9]", "Point"]


@pytest.mark.parametrize("target", ["app", "app.zip"])
def test_directory_and_zip_with_main(tmp_path, target):
    source = """\
        import sys
        print(sys.argv, sys.path[0], __file__, __spec__.name, sorted(globals()))
    """
    write(tmp_path / "app" / "__main__.py", source)
    with zipfile.ZipFile(tmp_path / "app.zip", "w") as z:
        z.writestr("__main__.py", textwrap.dedent(source))
    plain = run([target, "x"], cwd=tmp_path)
    prof = run([target, "x"], cwd=tmp_path, aioprof=["-o", str(tmp_path / "r.txt")])
    assert plain.returncode == prof.returncode == 0, prof.stderr
    assert prof.stdout == plain.stdout


def test_annotations_globals_as_python_gives_them(tmp_path):
    # 3.10-3.13 give __main__ an __annotations__ dict; 3.14 evaluates annotations lazily
    # (PEP 649): no such global, and the module's __annotations__ comes from __annotate__.
    write(tmp_path / "plain.py", "print(sorted(globals()))\n")
    write(tmp_path / "annotated.py", """\
        import __main__
        x: int = 1
        def f(a: "str") -> None: pass
        print(sorted(globals()), __main__.__annotations__, f.__annotations__)
    """)
    for name in ("plain.py", "annotated.py"):
        plain = run([name], cwd=tmp_path)
        prof = run([name], cwd=tmp_path, aioprof=["-o", str(tmp_path / "r.txt")])
        assert plain.returncode == prof.returncode == 0, prof.stderr
        assert prof.stdout == plain.stdout
    assert b"{'x': <class 'int'>}" in prof.stdout


def test_symlinked_script_path0_is_the_real_directory(tmp_path):
    write(tmp_path / "real" / "prog.py", "import sys; print(sys.path[0], __file__)\n")
    (tmp_path / "links").mkdir()
    (tmp_path / "links" / "prog.py").symlink_to(tmp_path / "real" / "prog.py")
    plain = run(["links/prog.py"], cwd=tmp_path)
    prof = run(["links/prog.py"], cwd=tmp_path, aioprof=[])
    assert prof.stdout == plain.stdout and plain.returncode == prof.returncode == 0


def test_module_mode(tmp_path):
    write(tmp_path / "pkg" / "__init__.py", "")
    body = """\
        import json, sys
        print(json.dumps({"argv": sys.argv, "path0": sys.path[0], "name": __name__,
                          "spec": __spec__.name}))
    """
    write(tmp_path / "pkg" / "mod.py", body)
    write(tmp_path / "pkg" / "__main__.py", body)
    for module in ("pkg.mod", "pkg"):
        plain = run(["-m", module, "x", "--y"], cwd=tmp_path)
        prof = run(["-m", module, "x", "--y"], cwd=tmp_path, aioprof=["--limit", "3"])
        assert plain.returncode == prof.returncode == 0, prof.stderr
        assert prof.stdout == plain.stdout
        seen = json.loads(prof.stdout)
        assert seen["argv"][1:] == ["x", "--y"]
        assert Path(seen["argv"][0]).name == ("mod.py" if module == "pkg.mod" else "__main__.py")
        assert seen["path0"] == str(tmp_path)
        assert seen["name"] == "__main__"
        assert prof.stderr.decode().startswith("aioprof: wall ")


# -- exit status ---------------------------------------------------------------------------
@pytest.mark.parametrize("ending, status", [
    ("sys.exit(3)", 3),
    ("sys.exit(0)", 0),
    ("sys.exit()", 0),
    ("sys.exit(None)", 0),
    ("raise SystemExit(True)", 1),
    ("sys.exit('bye bye')", 1),
    ("sys.exit(256 + 7)", 7),
])
def test_exit_status_passes_through(tmp_path, ending, status):
    write(tmp_path / "prog.py", f"import sys\nprint('out')\n{ending}\n")
    out = tmp_path / "report.txt"
    plain = run(["prog.py"], cwd=tmp_path)
    prof = run(["prog.py"], cwd=tmp_path, aioprof=["-o", str(out)])
    assert plain.returncode == prof.returncode == status
    assert prof.stdout == plain.stdout
    assert prof.stderr == plain.stderr            # e.g. "bye bye\n" for a string code
    assert out.read_text().startswith("aioprof: wall ")


def test_exit_inside_asyncio(tmp_path):
    write(tmp_path / "prog.py", """\
        import asyncio, sys
        async def main():
            await asyncio.sleep(0.001)
            sys.exit(3)
        asyncio.run(main())
    """)
    prof = run(["prog.py"], cwd=tmp_path, aioprof=[])
    assert prof.returncode == 3
    assert "main" in prof.stderr.decode()


def test_uncaught_exception_prints_the_same_traceback(tmp_path):
    write(tmp_path / "prog.py", """\
        import asyncio

        async def fail():
            await asyncio.sleep(0)
            raise ValueError("boom")

        async def main():
            await asyncio.gather(fail())

        print("before")
        asyncio.run(main())
    """)
    out = tmp_path / "report.txt"
    plain = run(["prog.py"], cwd=tmp_path)
    prof = run(["prog.py"], cwd=tmp_path, aioprof=["-o", str(out)])
    assert plain.returncode == prof.returncode == 1
    assert prof.stdout == plain.stdout
    assert prof.stderr.splitlines()[-1] == b"ValueError: boom"
    # No frame of aioprof or runpy: the whole traceback is python's.
    assert prof.stderr == plain.stderr
    assert out.read_text().startswith("aioprof: wall ")


def test_uncaught_exception_report_on_stderr_after_the_traceback(tmp_path):
    write(tmp_path / "prog.py", "def f():\n    raise KeyError('k')\nf()\n")
    plain = run(["prog.py"], cwd=tmp_path)
    prof = run(["prog.py"], cwd=tmp_path, aioprof=[])
    assert prof.returncode == 1
    assert prof.stderr.startswith(plain.stderr)
    assert prof.stderr[len(plain.stderr):].startswith(b"aioprof: wall ")


def test_syntax_error_is_reported_like_python(tmp_path):
    write(tmp_path / "prog.py", "print('x'\n")
    plain = run(["prog.py"], cwd=tmp_path)
    prof = run(["prog.py"], cwd=tmp_path, aioprof=["-o", str(tmp_path / "r.txt")])
    assert plain.returncode == prof.returncode == 1
    assert prof.stderr == plain.stderr


@pytest.mark.skipif(os.name != "posix", reason="death by SIGINT is POSIX")
def test_keyboard_interrupt_exits_like_python_and_writes_the_report(tmp_path):
    write(tmp_path / "prog.py", """\
        import asyncio
        async def main():
            await asyncio.sleep(0.001)
            raise KeyboardInterrupt
        print("started", flush=True)
        print("buffered")
        asyncio.run(main())
    """)
    out = tmp_path / "report.json"
    plain = run(["prog.py"], cwd=tmp_path)
    prof = run(["prog.py"], cwd=tmp_path, aioprof=["-o", str(out), "--format", "json"])
    assert plain.returncode == prof.returncode == -signal.SIGINT
    assert prof.stdout == plain.stdout == b"started\nbuffered\n"
    assert prof.stderr == plain.stderr
    doc = json.loads(out.read_text())
    (main,) = [t for t in doc["tasks"] if t["coroutine"] == "main"]
    assert main["state"] == "failed" and main["exception"] == "KeyboardInterrupt"


@pytest.mark.skipif(os.name != "posix", reason="signals are POSIX")
def test_real_sigint_exits_like_python_and_writes_the_report(tmp_path):
    write(tmp_path / "prog.py", """\
        import asyncio
        async def serve():
            print("ready", flush=True)
            await asyncio.sleep(60)
        asyncio.run(serve())
    """)
    out = tmp_path / "report.json"
    results = []
    for extra in (None, ["-o", str(out), "--format", "json"]):
        cmd = [sys.executable] + (["-m", "aioprof", *extra] if extra else []) + ["prog.py"]
        # SIGINT at its default in the child: a harness run in the background (or under
        # nohup-like tools) ignores SIGINT, and its children inherit that.
        with subprocess.Popen(cmd, cwd=tmp_path, env=_env(), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE,
                              preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)) as proc:
            assert proc.stdout is not None
            assert proc.stdout.readline() == b"ready\n"
            proc.send_signal(signal.SIGINT)
            _, err = proc.communicate(timeout=60)
            results.append((proc.returncode, err.splitlines()[-1:]))
    assert results[0] == results[1] == (-signal.SIGINT, [b"KeyboardInterrupt"])
    (task,) = [t for t in json.loads(out.read_text())["tasks"] if t["coroutine"] == "serve"]
    # 3.11+: asyncio.run cancels the main task on SIGINT; 3.10: KeyboardInterrupt fails it.
    assert task["state"] in ("cancelled", "failed")


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
@pytest.mark.parametrize("ending, status", [("", 0), ("sys.exit(3)", 3)])
def test_report_write_failure_keeps_the_programs_status(tmp_path, ending, status):
    write(tmp_path / "prog.py", f"import sys\nprint('out')\n{ending}\n")
    prof = run(["prog.py"], cwd=tmp_path, aioprof=["-o", "/dev/full"])
    assert prof.returncode == status
    assert prof.stdout == b"out\n"
    lines = prof.stderr.decode().splitlines()
    assert len(lines) == 1 and lines[0].startswith("aioprof: error: could not write the report")


def test_relative_report_path_is_where_aioprof_started(tmp_path):
    # The program changes its directory; -o report.txt is still next to where it started.
    write(tmp_path / "prog.py", "import os\nos.mkdir('sub')\nos.chdir('sub')\n")
    prof = run(["prog.py"], cwd=tmp_path, aioprof=["-o", "report.txt"])
    assert prof.returncode == 0 and prof.stderr == b""
    assert (tmp_path / "report.txt").read_text().startswith("aioprof: wall ")
    assert os.listdir(tmp_path / "sub") == []


@pytest.mark.parametrize("close", ["os.close(2)", "sys.stderr.close()"])
@pytest.mark.parametrize("output", [None, "report.json"])
def test_program_closing_stderr_keeps_its_status(tmp_path, close, output):
    # The report's own stream is gone: no report (without -o), but the status is the
    # program's 0, and a report to -o is written as usual.
    write(tmp_path / "prog.py", f"""\
        import asyncio, os, sys
        async def main():
            await asyncio.sleep(0)
        asyncio.run(main())
        print("out")
        {close}
    """)
    plain = run(["prog.py"], cwd=tmp_path)
    prof = run(["prog.py"], cwd=tmp_path,
               aioprof=[] if output is None else ["-o", output, "--format", "json"])
    assert plain.returncode == prof.returncode == 0
    assert prof.stdout == plain.stdout == b"out\n"
    assert prof.stderr == plain.stderr == b""
    if output is not None:
        doc = json.loads((tmp_path / output).read_text())
        assert [t["state"] for t in doc["tasks"] if t["coroutine"] == "main"] == ["done"]


# -- report ----------------------------------------------------------------------------
def test_json_report_has_the_programs_coroutine(tmp_path):
    write(tmp_path / "prog.py", ASYNC_PROGRAM)
    out = tmp_path / "out.json"
    prof = run(["prog.py"], cwd=tmp_path, aioprof=["--format", "json", "-o", str(out)])
    assert prof.returncode == 0, prof.stderr
    assert prof.stderr == b""
    doc = json.loads(out.read_text(encoding="utf-8"))
    assert doc["aioprof"] == 1 and isinstance(doc["tasks"], list)
    workers = [t for t in doc["tasks"] if t["coroutine"] == "my_worker"]
    assert len(workers) == 1
    worker = workers[0]
    assert worker["state"] == "done" and worker["steps"] == 4
    assert Path(worker["created_at"]["file"]).name == "prog.py"
    assert worker["created_at"]["line"] == 9
    assert any(c["coroutine"] == "my_worker" for c in doc["coroutines"])


def test_json_report_to_stderr(tmp_path):
    write(tmp_path / "prog.py", ASYNC_PROGRAM)
    prof = run(["prog.py"], cwd=tmp_path, aioprof=["--format=json"])
    assert prof.returncode == 0
    assert "tasks" in json.loads(prof.stderr)


def test_text_report_options(tmp_path):
    write(tmp_path / "prog.py", ASYNC_PROGRAM)
    out = tmp_path / "out.txt"
    prof = run(["prog.py"], cwd=tmp_path, aioprof=["--by", "task", "--sort", "idle", "--limit",
                                                   "1", "--show-internal", "-o", str(out)])
    assert prof.returncode == 0 and prof.stderr == b""
    report = out.read_text(encoding="utf-8")
    assert "Tasks by idle ms" in report
    assert "internal hidden" not in report


def test_threads_are_measured_to_their_end(tmp_path):
    # main returns while a non-daemon thread still runs its own loop: python waits for the
    # thread, and the report is written after that, so the thread's task is complete.
    write(tmp_path / "prog.py", """\
        import asyncio, threading
        async def in_thread():
            await asyncio.sleep(0.2)
        threading.Thread(target=asyncio.run, args=(in_thread(),)).start()
    """)
    out = tmp_path / "out.json"
    prof = run(["prog.py"], cwd=tmp_path, aioprof=["--format", "json", "-o", str(out)])
    assert prof.returncode == 0, prof.stderr
    doc = json.loads(out.read_text())
    (task,) = [t for t in doc["tasks"] if t["coroutine"] == "in_thread"]
    assert task["state"] == "done" and task["idle_s"] > 0.1


# -- errors before the program runs --------------------------------------------------------
@pytest.mark.parametrize("args", [
    ["missing.py"],
    ["--no-such-option", "prog.py"],
    ["--limit", "-1", "prog.py"],
    ["--sort", "wall", "prog.py"],
    ["-o", "/nonexistent-dir/x.json", "prog.py"],
    ["-m", "no_such_module_xyz"],
    ["-m", "no_such_pkg_xyz.mod"],
    ["-m", "pkg"],                 # a package without __main__
    ["pkg"],                       # a directory without __main__.py
    ["--out", "x.txt", "prog.py"], # long options are not abbreviated
    ["-m"],
    ["-c"],
    [],
    ["--max-tasks", "10"],
    ["-o", "prog.py", "prog.py"],  # the report would overwrite the script
])
def test_bad_command_line(tmp_path, args):
    write(tmp_path / "prog.py", "open('ran', 'w').close()\n")
    write(tmp_path / "pkg" / "__init__.py", "")
    prof = run(args, cwd=tmp_path, aioprof=[])
    assert prof.returncode == 2
    assert prof.stdout == b""
    lines = prof.stderr.decode().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("aioprof: error: ")
    assert not (tmp_path / "ran").exists()
    assert (tmp_path / "prog.py").read_text() == "open('ran', 'w').close()\n"


DASH_C = """\
import asyncio, sys
async def waiter():
    await asyncio.sleep(0.001)
asyncio.run(waiter())
print(sys.argv, repr(sys.path[0]), sorted(globals()), __loader__, __spec__, __name__)
raise SystemExit(sys.argv[1])
"""


def test_dash_c_runs_like_python_c(tmp_path):
    plain = run(["-c", DASH_C, "7", "--limit"], cwd=tmp_path)
    prof = run(["-c", DASH_C, "7", "--limit"], cwd=tmp_path, aioprof=["--format", "json"])
    assert plain.returncode == prof.returncode == 1       # SystemExit("7"): printed, status 1
    assert prof.stdout == plain.stdout
    assert prof.stdout.decode().startswith("['-c', '7', '--limit'] '' ")
    assert prof.stderr.startswith(plain.stderr) and plain.stderr == b"7\n"
    doc = json.loads(prof.stderr[len(plain.stderr):])
    (task,) = [t for t in doc["tasks"] if t["coroutine"] == "waiter"]
    assert task["steps"] == 2 and task["created_at"]["file"] == "<string>"
    # A traceback shows the program's "<string>" frames only, as python's.
    plain = run(["-c", "def f():\n    1/0\nf()"], cwd=tmp_path)
    prof = run(["-c", "def f():\n    1/0\nf()"], cwd=tmp_path, aioprof=["-o", "r.txt"])
    assert plain.returncode == prof.returncode == 1 and prof.stderr == plain.stderr


@pytest.mark.parametrize("options, warned", [
    (["--format", "json", "--sort", "idle", "--limit=3"], "--sort and --limit do nothing with --format json"),
    (["--format", "trace", "--by", "task", "--show-internal"],
     "--by and --show-internal do nothing with --format trace"),
    (["--flame", "idle"], "--flame does nothing with --format text"),
    (["--format", "collapsed", "--flame", "idle", "--trace-buffer", "9"],
     "--trace-buffer does nothing with --format collapsed"),
    (["--format", "json", "--by", "stack"], None),       # records the stacks the JSON holds
    (["--sort", "idle", "--limit", "3", "--by", "task"], None),
])
def test_options_that_do_nothing_are_warned_about(tmp_path, options, warned):
    write(tmp_path / "prog.py", "print('ran')\n")
    prof = run(["prog.py"], cwd=tmp_path, aioprof=[*options, "-o", "report.out"])
    assert prof.returncode == 0 and prof.stdout == b"ran\n"
    expected = [] if warned is None else [f"aioprof: warning: {warned}; the run goes on"]
    assert prof.stderr.decode().splitlines() == expected
    assert (tmp_path / "report.out").exists()


def test_report_to_stdout_with_dash(tmp_path):
    prog = write(tmp_path / "prog.py", "print('from the program')\n")
    prof = run(["--format", "json", "-o", "-", str(prog)], cwd=tmp_path, aioprof=[])
    assert prof.returncode == 0 and prof.stderr == b""
    first, rest = prof.stdout.decode().split("\n", 1)
    assert first == "from the program"
    assert json.loads(rest)["aioprof"] == 1
    assert not (tmp_path / "-").exists()


def test_version_and_help(tmp_path):
    version = run(["--version"], cwd=tmp_path, aioprof=[])
    assert version.returncode == 0
    assert version.stdout.decode().strip() == "aioprof 0.1.0"
    usage = run(["--help"], cwd=tmp_path, aioprof=[])
    assert usage.returncode == 0
    for option in ("-o", "--output FILE", "--format", "--sort", "--limit N", "--by", "--show-internal",
                   "--max-tasks N", "--cpu-window MS", "--slow-ms MS", "-m MODULE"):
        assert option in usage.stdout.decode()


def test_a_core_older_than_the_python_code_stops_before_the_program(tmp_path):
    """An in-place build older than the sources (a function the stub declares is missing:
    `make build` not run after a pull) is an error before the program starts, in one
    line with exit 2, not a run that goes unprofiled and fails at its end."""
    import shutil

    pkg = tmp_path / "site" / "aioprof"
    shutil.copytree(_import_root() / "aioprof", pkg, ignore=shutil.ignore_patterns("__pycache__"))
    with open(pkg / "_core.pyi", "a", encoding="utf-8") as f:
        f.write("\ndef brand_new_function() -> None: ...\n")
    (tmp_path / "prog.py").write_text("print('the program ran')\n")
    env = dict(_env(), PYTHONPATH=str(tmp_path / "site"))
    proc = subprocess.run([sys.executable, "-m", "aioprof", "prog.py"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stdout) == (2, ""), proc
    (line,) = proc.stderr.splitlines()
    assert line.startswith("aioprof: error: cannot start the profiler: ") and \
        "has no brand_new_function()" in line and "make build" in line, line
