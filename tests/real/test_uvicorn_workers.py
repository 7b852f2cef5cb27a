"""`python -m aioprof --subprocesses -m uvicorn app:app --workers 2`: uvicorn's two
workers (multiprocessing spawn) are profiled, and the report of the run merges them: each
worker's request tasks are listed with its pid, as many as the responses that carried
that pid, each at least as busy as the spin the worker measured in it."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from _real import PROGRAMS, _env, need
from test_gunicorn_metrics import free_ports, get

DEADLINE = 60.0
WORKERS = 2


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    need("uvicorn")
    tmp = tmp_path_factory.mktemp("uvicorn")
    port = free_ports(1)
    deadline = time.monotonic() + DEADLINE
    log = open(tmp / "uvicorn.log", "w+")
    proc = subprocess.Popen([sys.executable, "-m", "aioprof", "--subprocesses", "--format", "json",
                             "-o", str(tmp / "out.json"), "-m", "uvicorn", "uvicorn_workers_app:app",
                             "--app-dir", str(PROGRAMS), "--workers", str(WORKERS),
                             "--port", str(port), "--log-level", "warning"],
                            cwd=str(tmp), env=_env(None), stdout=log, stderr=log)
    answered: dict = {}
    try:
        while len(answered) < WORKERS and time.monotonic() < deadline:
            try:
                r = json.loads(get(f"http://127.0.0.1:{port}/"))
            except OSError:
                if proc.poll() is not None:
                    break
                time.sleep(0.05)
                continue
            answered.setdefault(r["pid"], []).append(r)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)   # uvicorn stops its workers, then itself
            try:
                proc.wait(timeout=DEADLINE)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.seek(0)
        text = log.read()
        log.close()
    assert len(answered) == WORKERS, (answered, proc.returncode, text)
    return answered, json.loads((tmp / "out.json").read_text()), text


def test_both_workers_requests_are_in_the_report(served):
    answered, doc, log = served
    assert set(answered) <= set(doc["pids"]), (list(answered), doc["pids"], log)
    assert "did not write its final figures" not in log, log
    for pid, responses in answered.items():
        tasks = [t for t in doc["tasks"] if t["pid"] == pid and t["coroutine"] == "RequestResponseCycle.run_asgi"]
        assert len(tasks) == len(responses), (pid, len(responses), [t["coroutine"] for t in doc["tasks"] if t["pid"] == pid])
        spins = sorted(r["spun_s"] for r in responses)
        busy = sorted(t["busy_s"] for t in tasks)
        assert all(b >= s for b, s in zip(busy, spins)), (busy, spins)
    rows = {p["pid"]: p for p in doc["processes"]}
    assert all(rows[pid]["final"] for pid in answered)
