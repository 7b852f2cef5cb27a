"""Shared test setup: markers, Hypothesis settings and the fixtures every test directory uses.

Markers: ``sanitize`` tests also run under `make asan` and `make valgrind` (keep them fast and
in-process); ``slow`` marks long tests; ``bench`` tests are left out of `make test`;
``timing`` marks tests that check real (wall-clock) durations.
Under `make asan` / `make valgrind` the environment variable AIOPROF_SANITIZER is "asan" or
"valgrind", so a test can relax its timing checks there.

Environment (tools/pytest.sh sets the first two for every run of `make test`):
  AIOPROF_TIMING_RERUNS=N   a failed ``timing`` test runs again, up to N times
                            (pytest-rerunfailures), with its module's fixtures run afresh;
                            no other test is ever rerun. Default 0.
  AIOPROF_RERUN_LOG=FILE    the tests that passed only on a rerun, one node id a line.
  AIOPROF_REQUIRE_CASES=1   a missing shared-cases folder fails the case tests (else they
                            skip, saying why).
  AIOPROF_CASES=DIR         the shared cases; default ../shared/cases next to the repo.
See docs/testing.md.
"""
from __future__ import annotations

import functools
import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Set, Union

import pytest

REPO = Path(__file__).resolve().parent.parent
SANITIZER = os.environ.get("AIOPROF_SANITIZER", "")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "sanitize: also run under ASan/UBSan and valgrind (fast, in-process)")
    config.addinivalue_line("markers", "slow: takes seconds, not milliseconds")
    config.addinivalue_line("markers", "bench: a benchmark; not part of `make test`")
    config.addinivalue_line("markers", "timing: checks real durations; rerun once on failure "
                                       "under `make test` (AIOPROF_TIMING_RERUNS)")
    if TIMING_RERUNS and not config.pluginmanager.hasplugin("rerunfailures"):
        raise pytest.UsageError("AIOPROF_TIMING_RERUNS is set but pytest-rerunfailures is not "
                                "installed (make deps)")


# ---------------------------------------------------------------- reruns of timing tests

TIMING_RERUNS = int(os.environ.get("AIOPROF_TIMING_RERUNS") or 0)
_items: Dict[str, pytest.Item] = {}
_rerun: Set[str] = set()
_passed: Set[str] = set()


def pytest_collection_modifyitems(config: pytest.Config, items: List[pytest.Item]) -> None:
    if not TIMING_RERUNS:
        return
    for item in items:
        if item.get_closest_marker("timing") and not item.get_closest_marker("flaky"):
            item.add_marker(pytest.mark.flaky(reruns=TIMING_RERUNS))
            _items[item.nodeid] = item


def _refresh_shared_fixtures(item: pytest.Item) -> None:
    """Before a rerun: forget the results of the module- and class-scoped fixtures the test
    uses (e.g. the one subprocess run its module's tests share), so the rerun measures a new
    run of the program instead of asserting again on the run that failed."""
    info = getattr(item, "_fixtureinfo", None)
    for defs in getattr(info, "name2fixturedefs", {}).values():
        for fd in defs:
            if fd.scope in ("module", "class") and fd.cached_result is not None:
                finalizers = getattr(fd, "_finalizers", [])
                while finalizers:
                    finalizers.pop()()
                fd.cached_result = None


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.outcome == "rerun":
        _rerun.add(report.nodeid)
        item = _items.get(report.nodeid)
        if item is not None:
            _refresh_shared_fixtures(item)
    elif report.when == "call" and report.passed:
        _passed.add(report.nodeid)


def pytest_sessionfinish(session: pytest.Session) -> None:
    log = os.environ.get("AIOPROF_RERUN_LOG")
    if log:
        with open(log, "w", encoding="utf-8") as f:
            f.writelines(f"{nodeid}\n" for nodeid in sorted(_rerun & _passed))


def pytest_sessionstart(session: pytest.Session) -> None:
    # Without a built extension, `import aioprof._core` finds the C source directory
    # src/aioprof/_core/ as a namespace package and tests fail with puzzling AttributeErrors.
    spec = importlib.util.find_spec("aioprof._core")
    if spec is None or spec.origin in (None, "namespace"):
        pytest.exit(f"aioprof._core is not built for {sys.executable}: "
                    f"run `make build PY={sys.executable}`", returncode=4)


try:
    from hypothesis import HealthCheck, settings
except ImportError:  # Hypothesis is a test dependency, but conftest must not need it.
    pass
else:
    # No deadlines: a loaded CI machine or a sanitizer must not turn slowness into failures.
    settings.register_profile("aioprof", deadline=None, print_blob=True)
    settings.register_profile("sanitize", parent=settings.get_profile("aioprof"), max_examples=20,
                              suppress_health_check=[HealthCheck.too_slow])
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "sanitize" if SANITIZER else "aioprof"))


def _import_root() -> Path:
    """The sys.path entry this process imports aioprof from (src/, or build/asan under ASan)."""
    spec = importlib.util.find_spec("aioprof")
    if spec is None or not spec.submodule_search_locations:
        return REPO / "src"
    return Path(list(spec.submodule_search_locations)[0]).parent


@functools.lru_cache(maxsize=None)
def importable(module: str) -> bool:
    """Found, and imports: checked in a child, so this process imports nothing (a package
    found but built for another version, as Debian's uvloop on 3.15, counts as missing)."""
    return importlib.util.find_spec(module) is not None and subprocess.run(
        [sys.executable, "-c", f"import {module}"], capture_output=True).returncode == 0


RunAioprof = Callable[..., "subprocess.CompletedProcess[str]"]


@pytest.fixture
def run_aioprof() -> RunAioprof:
    """Return ``run(args, *, cwd=None, env=None, timeout=120, input=None)``.

    It runs ``sys.executable -m aioprof *args`` in a subprocess that imports the same aioprof
    build as this process, captures stdout and stderr as text, and returns the
    CompletedProcess (it does not check the exit code). `env` adds to os.environ.
    """
    return _aioprof_runner()


@pytest.fixture(scope="module")
def run_aioprof_module() -> RunAioprof:
    """`run_aioprof` for a module-scoped fixture: one run that several tests share."""
    return _aioprof_runner()


def _aioprof_runner() -> RunAioprof:
    """The `run` function of `run_aioprof`."""

    def run(args: Sequence[Union[str, os.PathLike]], *, cwd: Optional[os.PathLike] = None,
            env: Optional[Mapping[str, str]] = None, timeout: float = 120,
            input: Optional[str] = None) -> "subprocess.CompletedProcess[str]":
        full_env = dict(os.environ)
        full_env.update(env or {})
        path = [str(_import_root())] + [p for p in [full_env.get("PYTHONPATH")] if p]
        full_env["PYTHONPATH"] = os.pathsep.join(path)
        return subprocess.run([sys.executable, "-m", "aioprof", *map(str, args)], cwd=cwd,
                              env=full_env, input=input, capture_output=True, text=True,
                              timeout=timeout)

    return run


def cases_dir() -> Path:
    """Where the shared case programs are: $AIOPROF_CASES, else ../shared/cases next to the
    repository (docs/testing.md). Nowhere else is looked at."""
    named = os.environ.get("AIOPROF_CASES")
    return Path(named).resolve() if named else REPO.parent / "shared" / "cases"


@pytest.fixture(scope="session")
def shared_cases() -> Path:
    """The folder of the shared case programs (cases_dir()). When it is missing, the case
    tests fail if AIOPROF_CASES names it or AIOPROF_REQUIRE_CASES is set (`make test`, CI),
    and skip, saying so, otherwise."""
    cases = cases_dir()
    if cases.is_dir():
        return cases
    how = "AIOPROF_CASES names" if os.environ.get("AIOPROF_CASES") else \
        "no AIOPROF_CASES, and the default location"
    msg = (f"shared cases not found: {how} {cases}, which is not a directory "
           f"(set AIOPROF_CASES to the folder of the case programs; see docs/testing.md)")
    if os.environ.get("AIOPROF_CASES") or os.environ.get("AIOPROF_REQUIRE_CASES"):
        pytest.fail(msg, pytrace=False)
    pytest.skip(msg)


# ---------------------------------------------------------------- a real pprof reader

class PprofRaw:
    """A pprof file as `go tool pprof -raw` (Debian's golang-go) reads it back.

    ``types``: the sample types, e.g. ["cpu/nanoseconds", ...]; ``samples``: a list of
    (values, stack as [(function, file, line)] leaf first, labels {key: value}).
    """

    def __init__(self, types: List[str], samples: list) -> None:
        self.types, self.samples = types, samples

    def total(self, kind: str) -> int:
        i = self.types.index(kind + "/nanoseconds")
        return sum(values[i] for values, _, _ in self.samples)

    def flat(self, kind: str, function: str, line: Optional[int] = None, **labels: str) -> int:
        """The sum of `kind` over samples whose leaf is `function` (at `line`) and whose
        labels include `labels`."""
        i = self.types.index(kind + "/nanoseconds")
        return sum(values[i] for values, stack, have in self.samples
                   if stack and stack[0][0] == function and (line is None or stack[0][2] == line)
                   and all(have.get(k) == v for k, v in labels.items()))


def go_pprof(*args: Union[str, os.PathLike]) -> str:
    """The stdout of `go tool pprof ARGS`; skips when go is missing (fails under make test,
    AIOPROF_REQUIRE_REAL, where tools/install-deps.sh installs golang-go)."""
    import shutil

    go = shutil.which("go") or ("/usr/lib/go/bin/go" if os.path.exists("/usr/lib/go/bin/go") else None)
    if go is None:
        reason = "go is not installed (Debian package golang-go): no real pprof reader"
        if os.environ.get("AIOPROF_REQUIRE_REAL"):
            pytest.fail(reason + " (AIOPROF_REQUIRE_REAL is set)", pytrace=False)
        pytest.skip(reason)
    env = dict(os.environ, HOME=os.environ.get("HOME") or "/tmp", PPROF_TMPDIR="/tmp")
    done = subprocess.run([go, "tool", "pprof", *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def read_pprof(path: Union[str, os.PathLike]) -> PprofRaw:
    """Read a pprof file with `go tool pprof -raw` and parse what it prints."""
    import re

    out = go_pprof("-raw", path)
    lines = out.splitlines()
    start = lines.index("Samples:")
    types = [t.replace("[dflt]", "") for t in lines[start + 1].split()]
    locations: Dict[int, tuple] = {}
    at = lines.index("Locations")
    for line in lines[at + 1:]:
        if line == "Mappings":
            break
        m = re.match(r"^\s*(\d+): 0x0 M=\d+ (.*) (\S*):(\d+) s=\d+$", line)
        assert m, line
        locations[int(m.group(1))] = (m.group(2), m.group(3), int(m.group(4)))
    samples: list = []
    for line in lines[start + 2:at]:
        if ":" in line and re.match(r"^\s*-?\d+(\s+-?\d+)*:", line):
            values, ids = line.split(":", 1)
            samples.append(([int(v) for v in values.split()],
                            [locations[int(i)] for i in ids.split()], {}))
        elif line.strip():
            for key, value in re.findall(r"(\w+):\[(.*?)\]", line):
                samples[-1][2][key] = value
    return PprofRaw(types, samples)
