"""Run a library's own test suite with aioprof started in every process.

    python tests/suites/run_suites.py SUITE [--interval MS] [--plain]

SUITE is uvloop, anyio, pytest-asyncio or aiohttp. The suite is the one in the library's
sdist, of the version pinned in tests/requirements.txt (pytest-asyncio's in
tests/suites/requirements.txt): `pip download --no-binary :all: --no-deps` fetches it once
into build/suites/dl/, and its tests are unpacked into build/suites/src/NAME-VERSION/
(without the library's own source, so the tests import the installed library, the one
aioprof's own tests run). The suites' test requirements (tests/suites/requirements.txt) go
into build/suites/venv-X.Y, a venv over the interpreter's site-packages, so they never
reach aioprof's own test runs.

The suite runs with tests/suites/site on PYTHONPATH, whose sitecustomize starts
aioprof.Profiler in every process (the test runner, and every Python subprocess a test
starts) and records at exit what it profiled (site/sitecustomize.py). The run passes when
every test passes or fails without aioprof too, processes ran under aioprof and profiled
tasks, and no process had an aioprof warning. Tests that fail under aioprof run once more
under aioprof (a test that passes then was the suite's own timing flake: printed), then
the ones still failing run without aioprof: one that fails there too is the suite's own
failure on this machine (printed, not aioprof's); one that passes without aioprof fails the
run. What each suite leaves out, and why, is in SUITES below (docs/testing.md lists it).
--plain runs the suite without aioprof only. Exit status 0 on success, 1 on failure.
"""
from __future__ import annotations

import argparse
import hashlib
import re
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Dict, List, NamedTuple, Optional, Tuple

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
BUILD = REPO / "build" / "suites"
sys.path.insert(0, str(HERE))
from run_stdlib import check_records, own_failures, suite_env, verdict  # noqa: E402


class Suite(NamedTuple):
    dist: str              # the name on PyPI (and in the requirements files)
    package: str           # the library's source directory in the sdist, left out
    runner: str            # "pytest" or "unittest"
    args: List[str]        # what to run, relative to the unpacked sdist
    leave_out: Dict[str, str]   # files of the sdist not unpacked -> why


# Per-test timeouts: a hang fails by name instead of eating CI's time.
PYTEST = ["-p", "no:cacheprovider", "-rfE", "-q", "-o", "timeout=60"]

SUITES = {
    # unittest, as its Makefile's `testinstalled` runs it: against the installed uvloop.
    "uvloop": Suite("uvloop", "uvloop", "unittest", ["discover", "-s", "tests", "-t", "."], {
        "tests/test_sourcecode.py": "flake8 and mypy over uvloop's source: lint, no event loop",
    }),
    # On asyncio (with and without uvloop, and eager tasks on 3.12+); not on trio (some
    # interpreters here have a trio older than anyio's tests need). Left out for time: test_pytest_plugin (45 s of pytester
    # runs of anyio's plugin), test_sockets and streams/test_tls (25 s; their IPv6 and
    # happy-eyeballs cases fail here without aioprof), test_to_process and test_lazyimport
    # (a fresh interpreter per test).
    "anyio": Suite("anyio", "src", "pytest", [*PYTEST, "-m", "not network", *(
        f"tests/{m}.py" for m in (
            "test_taskgroups", "test_synchronization", "test_from_thread", "test_to_thread",
            "test_eventloop", "test_lowlevel", "test_debugging", "test_contextmanagers",
            "test_futures", "test_concurrency_utils", "test_signals", "test_subprocesses",
            "test_fileio", "test_tempfile", "test_functools", "test_itertools",
            "streams/test_memory", "streams/test_stapled", "streams/test_buffered",
            "streams/test_text", "streams/test_file")), "-k", "not trio"], {}),
    # Most of these tests run nested pytester sessions, ~1-2 s each on a loaded 2-core machine,
    # as slow without aioprof: for time, its core only (about 50 of its 271 tests: async
    # fixtures, function-scoped loops, hypothesis, the asyncio fixture and mark, task
    # clean-up, subprocesses; left out: test_set_event_loop.py, up to 30 s a case, the
    # class/module/package/session loop-scope and loop-factory matrices, the modes, debug
    # mode, packaging and doctest checks).
    "pytest-asyncio": Suite("pytest-asyncio", "pytest_asyncio", "pytest", [
        *PYTEST, "tests/async_fixtures", "tests/hypothesis", "tests/markers/test_function_scope.py",
        "tests/test_simple.py", "tests/test_asyncio_fixture.py", "tests/test_event_loop_fixture.py",
        "tests/test_task_cleanup.py", "tests/test_subprocess.py"], {}),
    # aiohttp's core, its server and client end to end: its pytest.ini's addopts (xdist,
    # coverage, doctests) are replaced, and only these modules run (all of the suite's 900
    # functional tests take ~8 min here); the zlib back-ends isal and zlib-ng (not
    # installed) are left out.
    "aiohttp": Suite("aiohttp", "aiohttp", "pytest", [
        *PYTEST, "-o", "addopts=", "-m", "not dev_mode and not autobahn and not internal",
        "-p", "no:pytest_codspeed", "tests/test_web_functional.py", "tests/test_web_server.py",
        "tests/test_client_ws_functional.py", "tests/test_web_websocket_functional.py",
        "-k", "not isal and not zlib_ng"], {}),
}


def pinned(dist: str) -> str:
    """The version of `dist` pinned in tests/requirements.txt or tests/suites/requirements.txt."""
    for req in (REPO / "tests" / "requirements.txt", HERE / "requirements.txt"):
        for line in req.read_text().splitlines():
            m = re.match(r"([A-Za-z0-9_.-]+)(?:\[[^]]*\])?==(\S+)", line.strip())
            if m and m.group(1).lower().replace("_", "-") == dist:
                return m.group(2)
    raise SystemExit(f"run_suites: {dist} is pinned in neither requirements file")


def pip(python: str, *args: str) -> None:
    subprocess.run([python, "-m", "pip", "--disable-pip-version-check", "-q", *args], check=True)


def unpacked(suite: Suite) -> Path:
    """The suite's sdist, downloaded once and unpacked (without the library's source)."""
    version = pinned(suite.dist)
    where = BUILD / "src" / f"{suite.dist}-{version}"
    if (where / ".unpacked").exists():
        return where
    dl = BUILD / "dl"
    dl.mkdir(parents=True, exist_ok=True)
    prefix = suite.dist.replace("-", "_").lower() + "-" + version
    sdists = [p for p in dl.glob("*.tar.gz") if p.name.lower().replace("-", "_") ==
              prefix.replace("-", "_") + ".tar.gz"]
    if not sdists:
        pip(sys.executable, "download", "--no-binary", ":all:", "--no-deps", "-d", str(dl),
            f"{suite.dist}=={version}")
        return unpacked(suite)
    (BUILD / "src").mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".unpack-", dir=BUILD / "src"))
    with tarfile.open(sdists[0]) as tar:
        members = []
        for m in tar.getmembers():
            rel = m.name.split("/", 1)[1] if "/" in m.name else ""
            if not (rel == suite.package or rel.startswith(suite.package + "/") or rel in suite.leave_out):
                m.name = rel or "."
                members.append(m)
        kw = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tar.extractall(tmp, members=[m for m in members if m.name != "."], **kw)
    (tmp / ".unpacked").write_text(sdists[0].name + "\n")
    if where.exists():
        subprocess.run(["rm", "-rf", str(where)], check=True)
    tmp.rename(where)
    return where


def venv_python() -> str:
    """build/suites/venv-X.Y's python, made (and its requirements installed) if needed."""
    req = HERE / "requirements.txt"
    venv = BUILD / f"venv-{sys.version_info[0]}.{sys.version_info[1]}"
    python = venv / "bin" / "python"
    stamp = venv / ".requirements"
    want = hashlib.sha256(req.read_bytes()).hexdigest()
    if not (python.exists() and stamp.exists() and stamp.read_text() == want):
        subprocess.run([sys.executable, "-m", "venv", "--clear", "--system-site-packages", str(venv)],
                       check=True)
        pip(str(python), "install", "-r", str(req))
        stamp.write_text(want)
    return str(python)


def run(suite: Suite, root: Path, python: str, tests: Optional[List[str]], record_dir: Optional[str],
        interval_ms: float, label: str) -> Tuple[int, str]:
    env = suite_env(record_dir, interval_ms)
    env["PYTHONUNBUFFERED"] = "1"   # the runner's output as it comes
    if suite.runner == "pytest":
        args = suite.args if tests is None else [a for a in suite.args if not a.startswith("tests/")
                                                 and a != "tests"]
        if tests is not None:   # the named tests only: drop -k and its pattern
            args = [a for i, a in enumerate(args) if a != "-k" and (i == 0 or args[i - 1] != "-k")]
        cmd = [python, "-m", "pytest", *args, *(tests or [])]
    else:
        cmd = [python, "-m", "unittest", *(suite.args if tests is None else tests)]
    print(f"run_suites: {label}:", " ".join(cmd[1:])[:300], flush=True)
    t0 = time.monotonic()
    out = []
    with subprocess.Popen(cmd, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, errors="replace") as p:
        assert p.stdout is not None
        for line in p.stdout:   # as it comes: a CI log shows how far a slow run got
            sys.stdout.write(line)
            sys.stdout.flush()
            out.append(line)
    print(f"run_suites: {label}: exit {p.returncode} in {time.monotonic() - t0:.0f} s", flush=True)
    return p.returncode, "".join(out)


def failed_tests(runner: str, output: str) -> List[str]:
    """The tests that failed or had errors, as ids that the runner takes back."""
    names = []
    if runner == "pytest":
        for m in re.finditer(r"^(?:FAILED|ERROR) (.+?)(?: - .*)?$", output, re.M):
            names.append(m.group(1))
    else:
        # "FAIL: test_x (tests.mod.Class.test_x)" (3.11+), "(tests.mod.Class)" (3.10);
        # "ERROR: setUpClass (tests.mod.Class)".
        for m in re.finditer(r"^(?:FAIL|ERROR): (\S+) \(([\w.]+)\)", output, re.M):
            name, where = m.groups()
            if where.endswith("." + name):
                names.append(where)
            elif name.startswith("test"):
                names.append(f"{where}.{name}")
            else:
                names.append(where)
    return sorted(set(names))


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("suite", choices=sorted(SUITES))
    ap.add_argument("--interval", type=float, default=0.0, metavar="MS",
                    help="sampling interval in ms (0: no sampling)")
    ap.add_argument("--plain", action="store_true", help="run without aioprof only")
    args = ap.parse_args(argv)
    suite = SUITES[args.suite]
    t0 = time.monotonic()
    root = unpacked(suite)
    python = venv_python()
    name = f"{args.suite} {pinned(suite.dist)}"
    if args.plain:
        rc, _ = run(suite, root, python, None, None, 0, f"{name} without aioprof")
        return 0 if rc == 0 else 1
    problems = []
    with tempfile.TemporaryDirectory(prefix="aioprof-suite-") as records:
        mode = f"{name} under aioprof" + (f" (sampling every {args.interval:g} ms)" if args.interval else "")
        rc, out = run(suite, root, python, None, records, args.interval, mode)
        failed = failed_tests(suite.runner, out) if rc != 0 else []
        if rc != 0 and not failed:
            problems.append(f"exit {rc} under aioprof without naming a failed test")
        if failed:
            rc, out = run(suite, root, python, failed, records, args.interval, mode + ", failed tests again")
            flaky = [t for t in failed if t not in failed_tests(suite.runner, out)] if rc != 0 else failed
            if flaky:
                print(f"run_suites: passed when run again under aioprof (the suite's own flakes): "
                      f"{' '.join(flaky)}")
            failed = [t for t in failed if t not in flaky]
        problems += check_records(records, None)
    if failed:
        prc, pout = run(suite, root, python, failed, None, 0, f"{name} without aioprof, failed tests")
        own = set(failed_tests(suite.runner, pout)) if prc != 0 else set()
        if prc != 0 and not own:
            own = set(failed)   # the whole run failed (a collection error): not aioprof's
        problems += own_failures("run_suites", failed, own, "not aioprof's")
    return verdict("run_suites", f"{name}: ", problems, t0)


if __name__ == "__main__":
    sys.exit(main())
