"""Shared test setup: markers, Hypothesis settings and the fixtures every test directory uses.

Markers: ``sanitize`` tests also run under `make asan` and `make valgrind` (keep them fast and
in-process); ``slow`` marks long tests; ``bench`` tests are left out of `make test`.
Under `make asan` / `make valgrind` the environment variable AIOPROF_SANITIZER is "asan" or
"valgrind", so a test can relax its timing checks there.
"""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from typing import Callable, Mapping, Optional, Sequence, Union

import pytest

REPO = Path(__file__).resolve().parent.parent
SANITIZER = os.environ.get("AIOPROF_SANITIZER", "")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "sanitize: also run under ASan/UBSan and valgrind (fast, in-process)")
    config.addinivalue_line("markers", "slow: takes seconds, not milliseconds")
    config.addinivalue_line("markers", "bench: a benchmark; not part of `make test`")


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


@pytest.fixture(scope="session")
def shared_cases() -> Path:
    """The programs of ../shared/cases next to the repo (or /work/shared/cases); skip if absent."""
    for cases in (REPO.parent / "shared" / "cases", Path("/work/shared/cases")):
        if cases.is_dir():
            return cases
    pytest.skip("shared/cases not found next to the repository nor in /work/shared")
