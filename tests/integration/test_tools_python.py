"""tools/python VERSION ARGS...: runs that CPython like `pythonX.Y ARGS...` in the current
directory, with the in-place build importable (docs/interpreters.md).

Run from the host only: inside the Debian root file system of 3.14/3.15 there is neither
pyenv nor a way to nest it. The 3.14 route is checked when its root file system is set up."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TOOL = REPO / "tools" / "python"
SID = Path(os.environ.get("AIOPROF_SID_ROOT", REPO / "build" / "sid"))
HOST_VERSION = "%d.%d" % sys.version_info[:2]

PROGRAM = r"""
import os, sys, aioprof._core as c
print(sys.version.split()[0], os.getcwd(), sys.stdin.read().strip(), os.environ.get("AIOPROF_T"))
print(os.environ["PYTHONPATH"].split(os.pathsep)[0], c.__file__.startswith(sys.argv[1]))
print("to stderr", file=sys.stderr)
sys.exit(7)
"""


def versions():
    out = []
    if sys.executable.startswith(os.path.expanduser("~/.pyenv/")):
        out.append(HOST_VERSION)        # a pyenv interpreter: this run is on the host
        if os.geteuid() == 0 and (SID / ".aioprof-complete").exists():
            out.append("3.14")
    return out


def run_tool(*args, **kw):
    return subprocess.run([str(TOOL), *args], capture_output=True, text=True, timeout=60, **kw)


@pytest.mark.parametrize("version", versions() or [pytest.param(None, marks=pytest.mark.skip(
    reason="tools/python runs from the host's pyenv interpreters only"))])
def test_runs_like_python_in_the_current_directory(tmp_path, version):
    (tmp_path / "prog.py").write_text(PROGRAM)
    proc = run_tool(version, "prog.py", str(REPO / "src"), cwd=tmp_path, input="from stdin\n",
                    env={**os.environ, "AIOPROF_T": "env seen"})
    assert proc.returncode == 7, proc.stderr
    first, second = proc.stdout.splitlines()
    assert first.startswith(version + ".")
    assert first.split(" ", 1)[1] == f"{tmp_path} from stdin env seen"
    assert second == f"{REPO / 'src'} True"
    assert proc.stderr.splitlines()[-1] == "to stderr"

    # The process the caller started is the interpreter itself: a signal ends it.
    child = subprocess.Popen([str(TOOL), version, "-c", "import time; print(1, flush=True); time.sleep(30)"],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=tmp_path)
    assert child.stdout.readline() == b"1\n"
    child.send_signal(signal.SIGTERM)
    assert child.wait(timeout=20) == -signal.SIGTERM


def test_bad_version_one_line_exit_2():
    proc = run_tool("2.7", "-c", "pass")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == "tools/python: unknown version '2.7' (3.10 3.11 3.12 3.13 3.14 3.15 3.14-dbg)\n"
