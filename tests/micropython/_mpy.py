"""The MicroPython port's tests (micropython/): pytest on CPython runs `tools/micropython`
(Debian sid's micropython 1.26 unix port, in the root file system of tools/python).

They run in `make test-micropython` (a step of `make test`), not in the suite of each
CPython (`make test-py`): their file, micropython_checks.py, is not named test_*.py, so
pytest collects it only when it is named on the command line. There
AIOPROF_REQUIRE_MICROPYTHON=1 makes a micropython that cannot run a failure, where a bare
`pytest tests/micropython/micropython_checks.py` skips, saying why.
"""
from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import List, Tuple

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
MICROPYTHON = REPO / "tools" / "micropython"
PROGRAMS = HERE / "programs"
MICROPYTHON_DIR = REPO / "micropython"


def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """`tools/micropython ARGS...` in programs/, its output as text."""
    return subprocess.run([str(MICROPYTHON), *args], cwd=PROGRAMS, capture_output=True, text=True,
                          timeout=timeout)


def popen(*args: str) -> subprocess.Popen:
    """`tools/micropython ARGS...` in programs/, running, its output pipes as text."""
    return subprocess.Popen([str(MICROPYTHON), *args], cwd=PROGRAMS, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def json_lines(proc: subprocess.CompletedProcess, n: int) -> List[dict]:
    """The first n stdout lines of a program that exited 0, as JSON documents."""
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines()[:n]]


def addresses_out(text: str) -> str:
    """Text with object addresses (`at 7f3a...`) made equal: they differ from run to run."""
    return re.sub(r"\b(at|@)( ?0x| )?[0-9a-f]{6,}\b", r"\1 ADDR", text)


def ms(seconds: float) -> float:
    return seconds * 1e3


def by_coroutine(doc: dict) -> dict:
    return {r["coroutine"]: r for r in doc["coroutines"]}


def figures(row: dict) -> Tuple[int, float, float, float]:
    return row["steps"], ms(row["busy_s"]), ms(row["scheduled_s"]), ms(row["idle_s"])
